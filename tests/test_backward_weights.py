"""ConvTransposeBackwardWeights against the float64 reference, including weights_shape as
input or attribute (spec D7) and auto_pad with src mod stride != 0 (D8)."""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close, seeded_configs

from onednn_convt import plan as plans
from onednn_convt.lowering import weights as lowering_weights
from onednn_convt.problem import gemm_grouped

pytestmark = pytest.mark.usefixtures("hand_rules")  # asserts the hand-written rules' routes

OP = "ConvTransposeBackwardWeights"


def make_op(cfg: Config, **extra) -> oc.ConvTransposeBackwardWeights:
    return oc.ConvTransposeBackwardWeights(**{**cfg.attrs(OP), "weights_shape": cfg.weights_shape, **extra})


@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_cases_match_reference(cfg):
    t = cfg.tensors(np.random.default_rng(21))
    op = make_op(cfg)
    got = op(t["src"], t["diff_dst"])
    assert got.shape == cfg.weights_shape and got.dtype == np.float32
    # 2-D/3-D NXC: the convolution's backward weights (onednn_convt.lowerings), but for a grouped
    # 3-D layer that oneDNN runs on its gemm kernels (problem.gemm_grouped)
    nxc = cfg.rank >= 2 and cfg.data_format == "NXC" and not gemm_grouped(cfg.rank, cfg.groups, cfg.ic, cfg.oc)
    assert op.lowering == ("ConvolutionBackwardWeights" if nxc else OP)
    ref = cfg.ref_backward_weights(t["src"], t["diff_dst"])
    assert_close(got, ref, "f32", cfg.bwd_weights_reduction, str(cfg))


@pytest.mark.parametrize("cfg", seeded_configs(60, seed=303), ids=str)
def test_random_configs_match_reference(cfg):
    t = cfg.tensors(np.random.default_rng(22))
    got = make_op(cfg)(t["src"], t["diff_dst"])
    assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction, str(cfg))


SHAPE_INPUTS = {
    "tuple": tuple,
    "list": list,
    "int32_array": lambda s: np.array(s, np.int32),
    "int64_array": lambda s: np.array(s, np.int64),
    "uint16_array": lambda s: np.array(s, np.uint16),
}


@pytest.mark.parametrize("kind", list(SHAPE_INPUTS))
def test_weights_shape_as_input_equals_attribute(kind):
    cfg = CASES[CASE_IDS.index("2d_groups3_bias")]
    t = cfg.tensors(np.random.default_rng(23))
    by_attr = make_op(cfg)(t["src"], t["diff_dst"])
    no_attr = oc.ConvTransposeBackwardWeights(**cfg.attrs(OP))
    by_input = no_attr(t["src"], t["diff_dst"], SHAPE_INPUTS[kind](cfg.weights_shape))
    np.testing.assert_array_equal(by_input, by_attr)
    assert no_attr.last_plan.lowering.attrs["weights_shape"] == list(cfg.weights_shape)


@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
def test_weights_shape_input_wins_over_attribute(weights_format):
    """Attribute says kernel 3x3; the input says 2x2, a different valid problem: input wins (D7)."""
    small = Config(src=(5, 5), kernel=(2, 2), strides=2, pads_end=1, output_padding=1, weights_format=weights_format)
    big = small.with_(kernel=(3, 3), output_padding=0)  # same src and dst sizes as `small`
    assert big.dst_shape == small.dst_shape
    t = small.tensors(np.random.default_rng(24))
    attrs = small.attrs(OP, output_padding=False)
    op = oc.ConvTransposeBackwardWeights(**attrs, weights_shape=big.weights_shape)
    np.testing.assert_equal(op(t["src"], t["diff_dst"]).shape, big.weights_shape)  # attribute alone
    got = op(t["src"], t["diff_dst"], np.array(small.weights_shape))
    assert got.shape == small.weights_shape
    assert_close(got, small.ref_backward_weights(t["src"], t["diff_dst"]), "f32", small.bwd_weights_reduction)
    functional = oc.conv_transpose_backward_weights(
        t["src"], t["diff_dst"], small.weights_shape, **attrs, weights_shape=big.weights_shape
    )
    np.testing.assert_array_equal(functional, got)


@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
def test_alternating_weights_shape_sources_each_get_their_own_kernel(weights_format):
    """Same src and diff_dst, two kernels (the attribute's and the input's), called in turn:
    each call gets its own kernel. The lean path (C++ checks src and diff_dst alone) once
    reused the input's plan for a later call by the attribute, a wrong-shaped result."""
    small = Config(src=(5, 5), kernel=(2, 2), strides=2, pads_end=1, output_padding=1, weights_format=weights_format)
    big = small.with_(kernel=(3, 3), output_padding=0)
    t = small.tensors(np.random.default_rng(26))
    op = oc.ConvTransposeBackwardWeights(**small.attrs(OP, output_padding=False), weights_shape=big.weights_shape)
    for given in (None, np.array(small.weights_shape), None, np.array(small.weights_shape, np.int32),
                  np.array(big.weights_shape), np.array(small.weights_shape)):
        cfg = small if given is not None and tuple(given) == small.weights_shape else big
        got = op(t["src"], t["diff_dst"]) if given is None else op(t["src"], t["diff_dst"], given)
        assert got.shape == cfg.weights_shape, (given, got.shape)
        assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction)


# D8: the library computes BackwardWeights' SAME pads from src mod stride, which differs
# from the forward's pads when src mod s != 0 (spec 4.3: src 5, k3, s2, SAME_UPPER).
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize(("src", "k", "s", "d"), [(5, 3, 2, 1), (6, 3, 2, 1), (7, 4, 3, 1), (5, 3, 2, 2), (4, 5, 3, 1)])
def test_auto_pad_uses_forward_pads(auto_pad, src, k, s, d):
    cfg = Config(src=(src, 4), kernel=(k, 2), strides=(s, 1), dilations=(d, 1), auto_pad=auto_pad)
    t = cfg.tensors(np.random.default_rng(25))
    op = make_op(cfg)
    got = op(t["src"], t["diff_dst"])
    lowered = op.last_plan.lowering.attrs
    assert lowered["auto_pad"] == "None"
    assert (tuple(lowered["pads_begin"]), tuple(lowered["pads_end"])) == cfg.pads
    assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction)


def test_spec_example_src5_k3_s2_same_upper():
    """The forward uses pads 0/1; the gradient must be the forward's, not the library's 1/1."""
    cfg = Config(src=(5,), kernel=(3,), strides=2, auto_pad="SAME_UPPER")
    assert cfg.pads == ((0,), (1,))
    t = cfg.tensors(np.random.default_rng(26))
    got = make_op(cfg)(t["src"], t["diff_dst"])
    explicit = make_op(cfg.with_(auto_pad="None", pads_begin=0, pads_end=1))(t["src"], t["diff_dst"])
    np.testing.assert_array_equal(got, explicit)
    assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction)


@pytest.mark.parametrize("given", [False, True], ids=["op_not_given", "op_given"])
def test_forward_output_padding_is_accepted(given):
    cfg = Config(src=(5, 4), kernel=(3, 2), strides=(3, 2), output_padding=(2, 1), pads_begin=1, dilations=(1, 2))
    t = cfg.tensors(np.random.default_rng(27))
    op = make_op(cfg, **({} if given else {"output_padding": None}))
    got = op(t["src"], t["diff_dst"])
    assert "output_padding" not in op.last_plan.lowering.attrs
    assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction)


def test_repository_case_deconv_bwd_w_json():
    """oneDNN's op/f32/deconv_bwd_w.json: weights_shape [32, 128, 3, 3]."""
    cfg = Config(src=(28, 28), kernel=(3, 3), n=1, ic=32, oc=128, strides=2, pads_begin=0, pads_end=41)
    t = cfg.tensors(np.random.default_rng(28))
    got = make_op(cfg)(t["src"], t["diff_dst"])
    assert got.shape == (32, 128, 3, 3)
    assert_close(got, cfg.ref_backward_weights(t["src"], t["diff_dst"]), "f32", cfg.bwd_weights_reduction)


#: problems on which oneDNN 3.2's bf16 backward-weights kernels returned wrong weights
#: (uninitialized memory, zeros), found by a random scan (lowering_weights.backward_weights_needs_f32)
LIBRARY_BF16_WRONG = [
    # the first: found by test_fuzz (CI, hypothesis); group 0's taps came out 0 or garbage
    Config(src=(2, 1, 1), kernel=(2, 1, 1), n=1, ic=2, oc=2, groups=2, pads_begin=(1, 0, 0), pads_end=(1, 0, 0),
           data_format="NXC", weights_format="IOX"),
    Config(src=(3, 2, 5), kernel=(3, 2, 2), n=2, ic=2, oc=1, pads_begin=(2, 1, 0), pads_end=(1, 0, 0),
           data_format="NXC", weights_format="XOI"),
    Config(src=(2, 1), kernel=(1, 3), n=1, ic=2, oc=16, strides=(1, 2), pads_begin=(1, 0), pads_end=(0, 2),
           data_format="NXC", weights_format="XOI"),
    Config(src=(2, 1, 2), kernel=(2, 3, 1), n=1, ic=32, oc=32, pads_begin=(1, 0, 0), pads_end=(1, 0, 0),
           data_format="NXC", weights_format="XOI"),
    Config(src=(3, 1), kernel=(2, 3), n=2, ic=3, oc=3, groups=3, strides=(1, 2), dilations=(2, 1),
           pads_begin=(0, 2), data_format="NCX", weights_format="IOX"),
    Config(src=(1,), kernel=(3,), n=2, ic=2, oc=16, strides=2, pads_end=2, data_format="NXC", weights_format="XOI"),
]


@pytest.mark.parametrize("cfg", LIBRARY_BF16_WRONG, ids=str)
def test_bf16_where_the_library_is_wrong_is_computed_in_f32(cfg):
    """Every such problem has a spatial dim of src no longer than the dilated kernel: bf16
    runs in f32 there (even with strict=True, as a native kernel exists) and matches the
    reference on repeated calls (the library's wrong results varied from run to run)."""
    assert lowering_weights.backward_weights_needs_f32(cfg.src, cfg.kernel, cfg.dilations)
    t = cfg.tensors(np.random.default_rng(0), "bf16")
    ref = cfg.ref_backward_weights(t["src"].astype(np.float64), t["diff_dst"].astype(np.float64))
    guarded = oc.guards.active(oc.guards.BF16_BACKWARD_WEIGHTS_SHORT_SRC, "bf16")  # native bf16 here
    for strict in (False, True):
        op = make_op(cfg, strict=strict)
        if strict and not guarded:  # no native bf16 kernel at all (AVX2): strict raises
            with pytest.raises(oc.UnsupportedError):
                op(t["src"], t["diff_dst"])
            continue
        for _ in range(3):
            got = op(t["src"], t["diff_dst"])
            assert got.dtype == t["src"].dtype
            assert_close(got, ref, "bf16", cfg.bwd_weights_reduction, str(cfg))
        assert op.lowering.endswith("(f32 emulation)")
        assert op.guard == ("bf16_backward_weights_short_src" if guarded else None)


def test_bf16_with_src_longer_than_the_kernel_stays_native():
    """The rule is narrow: src longer than the dilated kernel in every dim runs the library's
    bf16 kernel where the CPU has one."""
    cfg = Config(src=(6, 5), kernel=(3, 2), n=2, ic=4, oc=6, groups=2, strides=2, pads_begin=1,
                 data_format="NXC", weights_format="XOI")
    assert not lowering_weights.backward_weights_needs_f32(cfg.src, cfg.kernel, cfg.dilations)
    t = cfg.tensors(np.random.default_rng(1), "bf16")
    op = make_op(cfg)
    got = op(t["src"], t["diff_dst"])
    ref = cfg.ref_backward_weights(t["src"].astype(np.float64), t["diff_dst"].astype(np.float64))
    assert_close(got, ref, "bf16", cfg.bwd_weights_reduction, str(cfg))
    native = plans.native_support(op.last_plan.lowering.kind, "bf16")
    assert op.lowering.endswith("(f32 emulation)") == (not native)

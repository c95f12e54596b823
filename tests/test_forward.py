"""ConvTranspose (forward) against the float64 reference over the attribute space."""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close, seeded_configs

from onednn_convt.lowering import forward
from onednn_convt.problem import gemm_grouped

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")


def run_forward(cfg: Config, t: dict[str, np.ndarray], bias: bool) -> tuple[np.ndarray, oc.ConvTranspose]:
    op = oc.ConvTranspose(**cfg.attrs())
    return op(t["src"], t["weights"], t["bias"] if bias else None), op


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_cases_match_reference(cfg, bias):
    t = cfg.tensors(np.random.default_rng(1))
    got, op = run_forward(cfg, t, bias)
    assert got.shape == cfg.dst_shape and got.dtype == np.float32
    # (in 3-D a depthwise layer runs the library's ConvTranspose: problem.gemm_grouped)
    depthwise_s1 = (cfg.ic == cfg.oc == cfg.groups and set(cfg.strides) == {1}
                    and all(d * (k - 1) >= max(b, e) for k, d, b, e in zip(cfg.kernel, cfg.dilations, *cfg.pads))
                    and not gemm_grouped(cfg.rank, cfg.groups, cfg.ic, cfg.oc))
    # the library ops run without the bias (lowering.forward.bias_apart); the core adds it to
    # a small f32 result, a second partition to a larger one
    core = int(np.prod(cfg.dst_shape)) <= forward.HOST_BIAS_ELEMENTS
    expected = "Convolution" if depthwise_s1 else "ConvolutionBackwardData" if cfg.groups == 1 else "ConvTranspose"
    if bias and not depthwise_s1:
        expected += "+bias (core)" if core else "+BiasAdd: 2 partitions"
    assert op.lowering == expected  # onednn_convt.lowering.rules
    ref = cfg.ref_forward(t["src"], t["weights"], t["bias"] if bias else None)
    assert_close(got, ref, "f32", cfg.fwd_reduction, str(cfg))


@pytest.mark.parametrize("cfg", seeded_configs(60, seed=101), ids=str)
def test_random_configs_match_reference(cfg):
    t = cfg.tensors(np.random.default_rng(2))
    got, _ = run_forward(cfg, t, cfg.bias)
    ref = cfg.ref_forward(t["src"], t["weights"], t["bias"] if cfg.bias else None)
    assert_close(got, ref, "f32", cfg.fwd_reduction, str(cfg))


def test_functional_form_equals_op_class():
    cfg = CASES[CASE_IDS.index("2d_groups3_bias")]
    t = cfg.tensors(np.random.default_rng(3))
    by_class = oc.ConvTranspose(**cfg.attrs())(t["src"], t["weights"], t["bias"])
    by_function = oc.conv_transpose(t["src"], t["weights"], t["bias"], **cfg.attrs())
    np.testing.assert_array_equal(by_class, by_function)


def test_repository_case_deconv_json():
    """oneDNN's tests/benchdnn/inputs/graph/op/f32/deconv.json: pads 0/41 crop 57 -> 16."""
    cfg = Config(src=(28, 28), kernel=(3, 3), n=1, ic=32, oc=128, strides=2, pads_begin=0, pads_end=41)
    t = cfg.tensors(np.random.default_rng(4))
    got, _ = run_forward(cfg, t, False)
    assert got.shape == (1, 128, 16, 16)
    assert_close(got, cfg.ref_forward(t["src"], t["weights"]), "f32", cfg.fwd_reduction)


def test_dcgan_layer_with_default_layouts():
    """Defaults are NXC activations and XOI weights (spec section 2)."""
    cfg = Config(src=(4, 4), kernel=(4, 4), n=4, ic=64, oc=32, strides=2, pads_begin=1, pads_end=1,
                 data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(5))
    got = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1)(t["src"], t["weights"], t["bias"])
    assert got.shape == (4, 8, 8, 32)
    assert_close(got, cfg.ref_forward(t["src"], t["weights"], t["bias"]), "f32", cfg.fwd_reduction)


# spec Part II 4.1, verified pad table: (k, s, d, src) -> dst for SAME_* and VALID
SIZE_TABLE = [(3, 2, 1, 5, 10, 11), (3, 2, 1, 6, 12, 13), (3, 2, 2, 5, 10, 13),
              (4, 2, 1, 5, 10, 12), (1, 2, 1, 5, 9, 9), (5, 3, 1, 5, 15, 17)]


@pytest.mark.parametrize(("k", "s", "d", "src", "same", "valid"), SIZE_TABLE)
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_auto_pad_sizes_and_values(k, s, d, src, same, valid, auto_pad):
    cfg = Config(src=(src,), kernel=(k,), strides=s, dilations=d, auto_pad=auto_pad,
                 pads_begin=7, pads_end=7)  # explicit pads are ignored when auto_pad is set
    t = cfg.tensors(np.random.default_rng(k * 100 + s * 10 + d))
    got, _ = run_forward(cfg, t, False)
    assert got.shape[-1] == (valid if auto_pad == "VALID" else same)
    assert_close(got, cfg.ref_forward(t["src"], t["weights"]), "f32", cfg.fwd_reduction)


def test_same_upper_and_lower_differ_only_in_alignment():
    """k3 s2: SAME_UPPER pads 0/1, SAME_LOWER pads 1/0; explicit pads give the same numbers."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 5)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3)).astype(np.float32)
    kw = {"strides": 2, "data_format": "NCX", "weights_format": "IOX"}
    for mode, pads in (("SAME_UPPER", (0, 1)), ("SAME_LOWER", (1, 0))):
        auto = oc.ConvTranspose(auto_pad=mode, **kw)(x, w)
        explicit = oc.ConvTranspose(pads_begin=pads[0], pads_end=pads[1], **kw)(x, w)
        np.testing.assert_array_equal(auto, explicit)
    assert not np.allclose(oc.ConvTranspose(auto_pad="SAME_UPPER", **kw)(x, w),
                           oc.ConvTranspose(auto_pad="SAME_LOWER", **kw)(x, w))


@pytest.mark.parametrize("auto_pad", ["None", "SAME_UPPER", "VALID"])
def test_output_padding_only_appends_at_the_end(auto_pad):
    base = Config(src=(5, 4), kernel=(3, 3), strides=(2, 3), pads_begin=1, pads_end=(1, 2), auto_pad=auto_pad)
    padded = base.with_(output_padding=(1, 2))
    t = base.tensors(np.random.default_rng(7))
    plain, _ = run_forward(base, t, False)
    more, _ = run_forward(padded, t, False)
    assert more.shape[2:] == (plain.shape[2] + 1, plain.shape[3] + 2)
    np.testing.assert_allclose(more[:, :, : plain.shape[2], : plain.shape[3]], plain, rtol=1e-6, atol=1e-6)
    assert_close(more, padded.ref_forward(t["src"], t["weights"]), "f32", padded.fwd_reduction)


def test_layouts_agree_with_each_other():
    """The same problem in NCX/NXC x IOX/XOI gives the same numbers, transposed."""
    base = Config(src=(4, 5), kernel=(3, 2), ic=4, oc=6, groups=2, strides=2, dilations=(1, 2), pads_begin=(1, 0))
    t = base.tensors(np.random.default_rng(8))
    want, _ = run_forward(base, t, True)
    for df in ("NCX", "NXC"):
        for wf in ("IOX", "XOI"):
            cfg = base.with_(data_format=df, weights_format=wf)
            x = t["src"] if df == "NCX" else np.ascontiguousarray(np.moveaxis(t["src"], 1, -1))
            w = t["weights"] if wf == "IOX" else np.ascontiguousarray(np.moveaxis(t["weights"], (0, 1), (-1, -2)))
            got = oc.ConvTranspose(**cfg.attrs())(x, w, t["bias"])
            got_ncx = got if df == "NCX" else np.moveaxis(got, -1, 1)
            np.testing.assert_allclose(got_ncx, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_bias_is_added_per_output_channel():
    cfg = Config(src=(4, 4), kernel=(2, 2), ic=6, oc=9, groups=3, strides=2, data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(9))
    with_bias, _ = run_forward(cfg, t, True)
    without, _ = run_forward(cfg, t, False)
    np.testing.assert_allclose(with_bias - without, np.broadcast_to(t["bias"], with_bias.shape), rtol=1e-5, atol=1e-5)

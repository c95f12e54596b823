"""ConvTransposeBackwardData against the float64 reference, including dilation (spec D9) and
auto_pad resolved to the forward op's pads (D8)."""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close, seeded_configs
from onednn_convt import reference
from onednn_convt.problem import gemm_grouped

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

OP = "ConvTransposeBackwardData"


def run(cfg: Config, diff_dst: np.ndarray, weights: np.ndarray, **extra) -> tuple[np.ndarray, oc.ConvTransposeBackwardData]:
    op = oc.ConvTransposeBackwardData(**{**cfg.attrs(OP), **extra})
    return op(diff_dst, weights), op


@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_cases_match_reference(cfg):
    t = cfg.tensors(np.random.default_rng(11))
    got, op = run(cfg, t["diff_dst"], t["weights"])
    assert got.shape == cfg.src_shape and got.dtype == np.float32
    # D9: Convolution where dilated; the library's own op only where faster and undilated
    # (a grouped 3-D layer that oneDNN runs on its gemm kernels: problem.gemm_grouped)
    undilated = all(d == 1 for d in cfg.dilations)
    faster = cfg.rank == 1 or cfg.data_format == "NCX" or gemm_grouped(cfg.rank, cfg.groups, cfg.ic, cfg.oc)
    assert op.lowering == ("ConvTransposeBackwardData" if undilated and faster else "Convolution")
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction, str(cfg))


@pytest.mark.parametrize("cfg", seeded_configs(60, seed=202), ids=str)
def test_random_configs_match_reference(cfg):
    t = cfg.tensors(np.random.default_rng(12))
    got, _ = run(cfg, t["diff_dst"], t["weights"])
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction, str(cfg))


# D9: the library's own BackwardData drops dilations: s=1, 2 fail to compile, s=3 silently
# computes undilated (spec Part II 4.2). Every one of these must match the dilated reference.
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("dilation", [2, 3])
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_dilations_are_honoured(rank, dilation, stride):
    cfg = Config(src=(4, 3, 3)[:rank], kernel=(3, 2, 2)[:rank], strides=stride, dilations=dilation,
                 pads_begin=1, pads_end=(0, 2, 1)[:rank], ic=4, oc=6, groups=2)
    t = cfg.tensors(np.random.default_rng(13))
    got, _ = run(cfg, t["diff_dst"], t["weights"])
    ref = cfg.ref_backward_data(t["diff_dst"], t["weights"])
    assert_close(got, ref, "f32", cfg.bwd_data_reduction, str(cfg))
    # Where the undilated formula gives the same diff_src size (the library's silent case,
    # e.g. stride 3), ours must differ from the undilated result.
    undilated = reference.conv_transpose_backward_data(
        t["diff_dst"], t["weights"], **{**cfg.ref_attrs(), "dilations": 1}
    )
    if undilated.shape == got.shape:
        assert not np.allclose(got, undilated, atol=1e-3)


@pytest.mark.parametrize("given", [False, True], ids=["op_not_given", "op_given"])
@pytest.mark.parametrize(("stride", "output_padding"), [(2, 1), (3, 1), (3, 2)])
def test_forward_output_padding_is_absorbed(stride, output_padding, given):
    """diff_dst has the forward's dst size including output_padding; diff_src is src (D6)."""
    cfg = Config(src=(5, 4), kernel=(3, 3), strides=stride, output_padding=(output_padding, 0), pads_begin=1, pads_end=1)
    t = cfg.tensors(np.random.default_rng(14))
    op = oc.ConvTransposeBackwardData(**cfg.attrs(OP, output_padding=given))
    got = op(t["diff_dst"], t["weights"])
    assert got.shape == cfg.src_shape
    assert "output_padding" not in op.last_plan.lowering.attrs  # never passed on (D6)
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction)


# D8: with auto_pad the pads are the forward's (from k, d, s). The library's own rule uses
# diff_dst mod s, which differs when the forward used output_padding or dilation.
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "same_upper"])
@pytest.mark.parametrize(("k", "s", "d", "op"), [(3, 2, 1, 1), (3, 2, 2, 0), (4, 3, 1, 2), (5, 2, 1, 1), (2, 3, 1, 0)])
def test_auto_pad_uses_forward_pads(auto_pad, k, s, d, op):
    cfg = Config(src=(5, 6), kernel=(k, k), strides=s, dilations=d, output_padding=(op, 0), auto_pad=auto_pad)
    t = cfg.tensors(np.random.default_rng(15))
    got, bwd = run(cfg, t["diff_dst"], t["weights"])
    assert got.shape == cfg.src_shape
    lowered = bwd.last_plan.lowering.attrs
    assert lowered["auto_pad"] == "None"
    assert (tuple(lowered["pads_begin"]), tuple(lowered["pads_end"])) == cfg.pads
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction)


def test_repository_case_deconv_bwd_d_json():
    """oneDNN's op/f32/deconv_bwd_d.json: diff_dst 1x128x16x16 -> diff_src 1x32x28x28."""
    cfg = Config(src=(28, 28), kernel=(3, 3), n=1, ic=32, oc=128, strides=2, pads_begin=0, pads_end=41)
    t = cfg.tensors(np.random.default_rng(16))
    got, _ = run(cfg, t["diff_dst"], t["weights"])
    assert got.shape == (1, 32, 28, 28)
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction)


def test_grouped_3d_benchdnn_case():
    """harness_f32_all line 320: diff_dst 2x16x5x5x5, IOX weights 20x4x3x3x3, groups 4."""
    cfg = Config(src=(5, 5, 5), kernel=(3, 3, 3), n=2, ic=20, oc=16, groups=4, pads_begin=1, pads_end=1)
    assert cfg.weights_shape == (20, 4, 3, 3, 3) and cfg.dst_shape == (2, 16, 5, 5, 5)
    t = cfg.tensors(np.random.default_rng(17))
    got, _ = run(cfg, t["diff_dst"], t["weights"])
    assert got.shape == (2, 20, 5, 5, 5)
    assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "f32", cfg.bwd_data_reduction)


def test_functional_form_equals_op_class():
    cfg = CASES[CASE_IDS.index("3d_groups_nxc_xoi")]
    t = cfg.tensors(np.random.default_rng(18))
    by_class, _ = run(cfg, t["diff_dst"], t["weights"])
    by_function = oc.conv_transpose_backward_data(t["diff_dst"], t["weights"], **cfg.attrs(OP))
    np.testing.assert_array_equal(by_class, by_function)

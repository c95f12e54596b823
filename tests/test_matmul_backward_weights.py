"""bf16 BackwardWeights as a MatMul over frames of diff_dst, where the library's bf16
kernels are wrong (:mod:`onednn_convt.lowering.matmul_backward_weights`; the guard
``bf16_backward_weights_short_src``). f16 never takes it: its kernels were right on the same
problems (unguarded scans, AVX512_CORE_FP16 and AMX), and elsewhere f16 is computed in f32.

Results are checked against the float64 reference; small problems force the lowering by
lowering its size threshold.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import Config, assert_close, random_config, require_native
from onednn_convt.lowering import matmul_backward_weights as mbw
from onednn_convt.lowering import weights as lowering_weights

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

OP = "ConvTransposeBackwardWeights"
LOW = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def make_op(cfg: Config) -> oc.ConvTransposeBackwardWeights:
    return oc.ConvTransposeBackwardWeights(**{**cfg.attrs(OP), "weights_shape": cfg.weights_shape})


def ruled_out_configs(count: int, seed: int) -> list[Config]:
    """Random groups-1 problems on which the library's bf16 kernels are ruled out."""
    rng, found = np.random.default_rng(seed), []
    while len(found) < count:
        cfg = random_config(rng)
        cfg = cfg.with_(groups=1, ic=cfg.ic // cfg.groups or 1, oc=cfg.oc // cfg.groups or 1)
        if cfg.valid and lowering_weights.backward_weights_needs_f32(cfg.src, cfg.kernel, cfg.dilations):
            found.append(cfg)
    return found


@pytest.fixture
def native_bf16():
    """The MatMul serves native bf16 kernels only: where bf16 is computed in f32, the f32
    kernels run every problem (test_small_ruled_out_problems_keep_the_f32_kernel's route)."""
    require_native("bf16", OP)


@pytest.fixture
def any_size(native_bf16, monkeypatch):
    """Every ruled-out problem takes the MatMul, however small."""
    monkeypatch.setattr(mbw, "MIN_MACS", 0)
    monkeypatch.setattr(mbw, "MAX_FRAMES_RATIO", 10**9)


@pytest.mark.parametrize("xoi_two_step", [False, True], ids=["xoi_one_copy", "xoi_two_steps"])
@pytest.mark.parametrize("code", ["bf16"])
@pytest.mark.parametrize("cfg", ruled_out_configs(40, 5), ids=str)
def test_random_problems_match_the_reference(any_size, monkeypatch, cfg, code, xoi_two_step):
    """XOI's frames in one copy (small problems) and in two (every size forced)."""
    if xoi_two_step:
        monkeypatch.setattr(mbw, "XOI_TWO_STEP_FROM", 0)
    t = cfg.tensors(np.random.default_rng(3), code)
    op = make_op(cfg)
    got = op(t["src"], t["diff_dst"])
    assert op.lowering.startswith("MatMul") and got.dtype == LOW[code] and got.shape == tuple(cfg.weights_shape)
    ref = cfg.ref_backward_weights(t["src"].astype(np.float64), t["diff_dst"].astype(np.float64))
    assert_close(got, ref, code, cfg.bwd_weights_reduction, str(cfg))


DCGAN_LIKE = [  # the DCGAN 4x4 -> 8x8 layer, fewer channels: above the size threshold as is
    Config(src=(4, 4), kernel=(4, 4), n=4, ic=128, oc=64, strides=2, pads_begin=1, pads_end=1,
           data_format=df, weights_format=wf)
    for df in ("NCX", "NXC") for wf in ("IOX", "XOI")
]


#: frames of XOI_TWO_STEP_FROM elements: XOI copies them in two steps by its own size rule
LARGE_FRAMES = [
    Config(src=(4, 4), kernel=(4, 4), n=16, ic=16, oc=128, strides=2, pads_begin=1, pads_end=1,
           data_format=df, weights_format="XOI")
    for df in ("NCX", "NXC")
]


@pytest.mark.parametrize("cfg", DCGAN_LIKE + LARGE_FRAMES, ids=str)
def test_a_model_layer_takes_it_by_the_rule(native_bf16, cfg):
    assert mbw.applies(cfg.src_shape, cfg.dst_shape, cfg.kernel, 1, cfg.data_format)
    t = cfg.tensors(np.random.default_rng(4), "bf16")
    op = make_op(cfg)
    got = op(t["src"], t["diff_dst"])
    assert op.lowering == "MatMul"
    ref = cfg.ref_backward_weights(t["src"].astype(np.float64), t["diff_dst"].astype(np.float64))
    assert_close(got, ref, "bf16", cfg.bwd_weights_reduction, str(cfg))
    out = np.full(got.shape, np.nan, got.dtype)
    assert op(t["src"], t["diff_dst"], out=out) is out
    np.testing.assert_array_equal(out.view(np.uint16), got.view(np.uint16))


def test_the_rule():
    cfg = DCGAN_LIKE[0]
    src, dst, k = cfg.src_shape, cfg.dst_shape, cfg.kernel
    assert mbw.applies(src, dst, k, 1, "NCX")
    assert not mbw.applies(src, dst, k, 2, "NCX")  # groups
    tiny = Config(src=(4, 4), kernel=(4, 4), n=1, ic=8, oc=8, strides=2, pads_begin=1, pads_end=1)
    assert not mbw.applies(tiny.src_shape, tiny.dst_shape, tiny.kernel, 1, "NCX")  # below MIN_MACS
    # stride 1, long kernel: frames 64 times diff_dst
    wide = Config(src=(64,), kernel=(64,), n=4, ic=64, oc=64)
    frames = wide.n * 64 * wide.oc * 64
    assert frames > mbw.MAX_FRAMES_RATIO * math.prod(wide.dst_shape)
    assert not mbw.applies(wide.src_shape, wide.dst_shape, wide.kernel, 1, "NCX")


def test_small_ruled_out_problems_keep_the_f32_kernel():
    cfg = Config(src=(2, 2), kernel=(3, 3), n=1, ic=4, oc=4)
    t = cfg.tensors(np.random.default_rng(6), "bf16")
    op = make_op(cfg)
    op(t["src"], t["diff_dst"])
    assert op.lowering.endswith("(f32 emulation)") and not op.lowering.startswith("MatMul")


@pytest.mark.parametrize("code", ["bf16"])
@pytest.mark.parametrize("layout", [("NCX", "IOX"), ("NXC", "XOI")])
def test_non_finite_src_is_redone_by_the_library(any_size, code, layout):
    """An Inf in src meets the frames' padding zeros (0 * Inf = NaN) on taps the op does not
    have: such calls are computed by the library's f32 kernel, whose NaN/Inf pattern the
    result keeps. The check can fail: the plain product gives NaNs there."""
    df, wf = layout
    cfg = Config(src=(3, 3), kernel=(3, 3), n=1, ic=2, oc=3, strides=2, pads_begin=1, pads_end=1,
                 data_format=df, weights_format=wf)
    t = cfg.tensors(np.random.default_rng(7), code)
    src = t["src"].copy()
    src[0, 0, 0, 0] = np.inf  # the first position of the first channel: taps 0 fall in the pads
    op = make_op(cfg)
    got = op(src, t["diff_dst"])
    assert op.lowering.startswith("MatMul")
    exact = make_op(cfg)(src.astype(np.float32), t["diff_dst"].astype(np.float32))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float32)), np.isnan(exact))
    np.testing.assert_array_equal(np.isinf(got.astype(np.float32)), np.isinf(exact))
    finite = np.isfinite(exact)
    assert finite.any() and np.isinf(exact).any()
    np.testing.assert_allclose(got.astype(np.float32)[finite], exact[finite], rtol=2e-2, atol=1e-2)
    # the plain product over zero-padded frames (what the lowering would give unchecked)
    low = op.last_plan.lowering
    a, b = (x.astype(np.float32) for x in low.prepare([src.astype(np.float32), t["diff_dst"].astype(np.float32)]))
    with np.errstate(invalid="ignore"):
        plain = (a @ b).reshape(exact.shape)
    assert np.isnan(plain).sum() > np.isnan(exact).sum()


def test_strided_inputs(any_size):
    cfg = Config(src=(3,), kernel=(4,), n=2, ic=3, oc=2, strides=2, data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(8), "bf16")
    src = np.repeat(t["src"], 2, axis=2)[:, :, ::2]  # channel stride 2
    dd = np.asfortranarray(t["diff_dst"])
    op = make_op(cfg)
    got = op(src, dd)
    assert op.lowering == "MatMul"
    ref = cfg.ref_backward_weights(t["src"].astype(np.float64), t["diff_dst"].astype(np.float64))
    assert_close(got, ref, "bf16", cfg.bwd_weights_reduction, str(cfg))

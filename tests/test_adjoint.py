"""The three ops are adjoint: <fwd(x, W), y> = <x, bwd_data(y, W)> = <W, bwd_weights(x, y)>.

Computed with the binding in f32, compared in float64. With auto_pad this holds only
because the backward ops use the forward's pads (D8), and with dilation only because
BackwardData honours it (D9).
"""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import EPS, Config, configs, inner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def check_adjoint(cfg: Config, seed: int) -> None:
    t = cfg.tensors(np.random.default_rng(seed))
    x, w, y = t["src"], t["weights"], t["diff_dst"]
    fwd = oc.ConvTranspose(**cfg.attrs())(x, w)
    bwd_d = oc.ConvTransposeBackwardData(**cfg.attrs("ConvTransposeBackwardData"))(y, w)
    bwd_w = oc.ConvTransposeBackwardWeights(**cfg.attrs("ConvTransposeBackwardWeights"))(x, y, cfg.weights_shape)
    assert fwd.shape == y.shape and bwd_d.shape == x.shape and bwd_w.shape == w.shape
    a, b, c = inner(fwd, y), inner(x, bwd_d), inner(w, bwd_w)
    # Each side is a sum of f32 products accumulated in f32 inside the op: bound the error by
    # the reduction length times f32 epsilon, relative to the Cauchy-Schwarz scale.
    norm = lambda v: float(np.linalg.norm(np.asarray(v, np.float64)))
    scale = max(norm(fwd) * norm(y), norm(x) * norm(bwd_d), norm(w) * norm(bwd_w), 1e-30)
    reduction = max(cfg.fwd_reduction, cfg.bwd_data_reduction, cfg.bwd_weights_reduction)
    tol = 8 * reduction * EPS["f32"] * scale
    assert abs(a - b) <= tol, f"<fwd(x,W),y>={a} != <x,bwd_data(y,W)>={b} (tol {tol}) for {cfg}"
    assert abs(a - c) <= tol, f"<fwd(x,W),y>={a} != <W,bwd_weights(x,y)>={c} (tol {tol}) for {cfg}"


COMMON = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings(COMMON, max_examples=40, derandomize=True)  # the same examples on every run
@given(cfg=configs(), seed=st.integers(0, 2**16))
def test_adjoint_identity(cfg, seed):
    check_adjoint(cfg, seed)


@pytest.mark.slow
@settings(COMMON, max_examples=400)
@given(cfg=configs(), seed=st.integers(0, 2**32 - 1))
def test_adjoint_identity_long_run(cfg, seed):
    check_adjoint(cfg, seed)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_adjoint_with_auto_pad_and_src_mod_stride(auto_pad):
    """The cases the library gets wrong on its own: src mod s != 0, dilation, output_padding."""
    cfg = Config(src=(5, 7), kernel=(3, 3), strides=(2, 3), dilations=(2, 1), output_padding=(1, 2), auto_pad=auto_pad)
    check_adjoint(cfg, 0)


def test_adjoint_check_detects_a_wrong_gradient():
    """The tolerance is tight enough to catch pads off by one (the library's D8 defect)."""
    cfg = Config(src=(5,), kernel=(3,), strides=2, auto_pad="SAME_UPPER")  # forward pads 0/1
    t = cfg.tensors(np.random.default_rng(1))
    fwd = oc.ConvTranspose(**cfg.attrs())(t["src"], t["weights"])
    library_pads = cfg.with_(auto_pad="None", pads_begin=1, pads_end=1)  # its src-based pads
    wrong = oc.ConvTransposeBackwardWeights(**library_pads.attrs("x"), weights_shape=cfg.weights_shape)
    bwd_w = wrong(t["src"], t["diff_dst"])
    a, c = inner(fwd, t["diff_dst"]), inner(t["weights"], bwd_w)
    assert abs(a - c) > 1e-3 * abs(a)

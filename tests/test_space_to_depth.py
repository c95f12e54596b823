"""The space-to-depth BackwardData (onednn_convt.lowering.space_to_depth): a native bf16 NXC
call with few diff_dst channels as a stride-1 op over diff_dst's blocks along the last
spatial dim, against the reference on random problems of every rank and weights format,
allocated and into a NaN-filled out=, with Inf and NaN where its zeros meet them."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Config, assert_close, assert_lowering_matches, require_native
from test_backward_taps import loop_backward
from test_numerics import classes, with_non_finite

import onednn_convt as oc
from onednn_convt import guards, lowering
from onednn_convt.lowering import base, space_to_depth

BWD_D = "ConvTransposeBackwardData"


def _random_config(rng: np.random.Generator) -> Config:
    """A problem the lowering applies to: NXC, groups 1, no dilation, 1-8 diff_dst channels,
    a stride of 2-4 along the last dim whose zero taps stay within its growth limit."""
    rank = int(rng.integers(1, 4))
    while True:
        kernel = tuple(int(k) for k in rng.integers(1, 10, rank))
        strides = tuple(int(s) for s in rng.integers(1, 4, rank))
        s = int(rng.integers(2, 5))
        strides = (*strides[:-1], s)
        k = kernel[-1]
        if s * -(-k // s) <= space_to_depth.MAX_GROWTH * k:
            break
    src = tuple(int(x) for x in rng.integers(1, 7, rank))
    pads_begin = tuple(int(rng.integers(0, k)) for k in kernel)
    pads_end = tuple(int(rng.integers(0, k)) for k in kernel)
    output_padding = tuple(int(rng.integers(0, st)) for st in strides)
    cfg = Config(src=src, kernel=kernel, strides=strides, pads_begin=pads_begin, pads_end=pads_end,
                 output_padding=output_padding, n=int(rng.integers(1, 3)), ic=int(rng.integers(1, 13)),
                 oc=int(rng.integers(1, 9)), data_format="NXC", weights_format=str(rng.choice(["XOI", "IOX"])))
    return cfg if cfg.valid and all(d > 0 for d in cfg.dst) else _random_config(rng)


def _call(cfg: Config, rng: np.random.Generator, code: str = "bf16"):
    t = cfg.tensors(rng, code)
    op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
    arrays = [t["diff_dst"], t["weights"]]
    return op, arrays, cfg.ref_backward_data(t["diff_dst"], t["weights"]), op._problem(arrays, code)


def test_space_to_depth_matches_the_reference():
    require_native("bf16", BWD_D)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        cfg = _random_config(rng)
        op, arrays, ref, problem = _call(cfg, rng)
        assert space_to_depth.applies(problem), cfg
        assert base.SPACE_TO_DEPTH in lowering.candidates(problem)
        low = lowering.build(problem, base.SPACE_TO_DEPTH)
        assert low.name == base.SPACE_TO_DEPTH and low.kind in (base.CONVOLUTION, base.CONV_TRANSPOSE_BACKWARD_DATA)
        assert low.attrs["strides"][-1] == 1
        assert_lowering_matches(op, low, arrays, ref, "bf16", cfg.bwd_data_reduction, str(cfg))
        checked += 1
    assert checked == 60


@pytest.mark.parametrize("weights_format", ["XOI", "IOX"])
@pytest.mark.parametrize("layer", ["fsrcnn_x3", "fsrcnn_x2", "k4s2"])
def test_the_measured_layers_shapes(layer: str, weights_format: str):
    """FSRCNN's k9 s3 p4 (the stride divides the kernel) and k9 s2 p4 (a zero tap) with
    their output_padding, and a k4 s2 p1 layer of three channels, on small images."""
    require_native("bf16", BWD_D)
    k, s, p, op_, oc_ = {"fsrcnn_x3": (9, 3, 4, 2, 1), "fsrcnn_x2": (9, 2, 4, 1, 1), "k4s2": (4, 2, 1, 0, 3)}[layer]
    cfg = Config(src=(7, 9), kernel=(k, k), strides=s, pads_begin=p, pads_end=p, output_padding=op_, n=2, ic=5,
                 oc=oc_, data_format="NXC", weights_format=weights_format)
    op, arrays, ref, problem = _call(cfg, np.random.default_rng(1))
    low = lowering.build(problem, base.SPACE_TO_DEPTH)
    assert low.prepared_elems > 0 and low.exact is not None and low.exact.name in (
        base.CONVOLUTION, base.CONV_TRANSPOSE_BACKWARD_DATA)
    assert_lowering_matches(op, low, arrays, ref, "bf16", cfg.bwd_data_reduction, layer)


def _forced(monkeypatch: pytest.MonkeyPatch) -> None:
    real_rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: (
        base.SPACE_TO_DEPTH if space_to_depth.applies(p) else real_rule(p, native=native, phase=phase)))


def _nan_equal(got: np.ndarray, want: np.ndarray, code: str, reduction: int) -> None:
    """Same NaN and Inf positions (Infs of the same sign), the finite values within tolerance."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(want64))
    np.testing.assert_array_equal(np.isposinf(got64), np.isposinf(want64))
    np.testing.assert_array_equal(np.isneginf(got64), np.isneginf(want64))
    finite = np.isfinite(want64)
    assert finite.any()
    assert_close(np.where(finite, got64, 0), np.where(finite, want64, 0), code, reduction)


@pytest.mark.parametrize("where", ["weight_meets_padding", "diff_dst_meets_zero_tap"])
def test_a_non_finite_input_meets_no_zero(monkeypatch: pytest.MonkeyPatch, where: str):
    """The lowering multiplies zeros: diff_dst's padding (an Inf weight tap reaching it
    would give 0 * Inf = NaN in the first outputs), and the weights' taps past the kernel
    (k9 s2: an Inf in diff_dst would meet one). The op's result has the reference's Infs
    and NaNs: the native result is checked and redone in f32."""
    require_native("bf16", BWD_D)
    _forced(monkeypatch)
    k, s, p = (9, 3, 4) if where == "weight_meets_padding" else (9, 2, 4)
    cfg = Config(src=(6, 8), kernel=(k, k), strides=s, pads_begin=p, pads_end=p, n=1, ic=3, oc=1,
                 data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(2), "bf16")
    dd, w = t["diff_dst"], t["weights"]
    if where == "weight_meets_padding":
        w[0, 0, 0, 1] = np.inf  # tap 0 of both dims: reaches the padding for output 0
    else:
        dd[0, 5, 7, 0] = np.inf
    op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
    assert lowering.rule(op._problem([dd, w], "bf16")) == base.SPACE_TO_DEPTH
    with np.errstate(invalid="ignore", over="ignore"):
        want = cfg.ref_backward_data(dd, w)
        got = op(dd, w)
    assert np.isinf(want).any()
    _nan_equal(got, want, "bf16", cfg.bwd_data_reduction)


def test_non_finite_results_lie_between_the_two_readings(monkeypatch: pytest.MonkeyPatch):
    """Random problems with a NaN, +Inf and -Inf per input, run as space-to-depth: as every
    backward op here (docs/deviations.md, tests/test_backward_taps.py), non-finite wherever
    the exact sum is, NaN only where the zero-padded sum is non-finite too (its own zero
    taps add none: the native result is redone by the library's op in f32), finite
    elements close to the reference."""
    require_native("bf16", BWD_D)
    _forced(monkeypatch)
    rng = np.random.default_rng(12)
    for _ in range(40):
        cfg = _random_config(rng)
        t = cfg.tensors(rng, "bf16")
        arrays = with_non_finite([t["diff_dst"], t["weights"]], rng)
        op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
        with np.errstate(invalid="ignore", over="ignore"):
            exact = cfg.ref_backward_data(*arrays)
            result = op(*arrays)
        got, want = classes(result), classes(exact)
        widest = classes(loop_backward(BWD_D, cfg, arrays, all_pairs=True))
        assert ((got == want) | ((got == 1) & (want != 0)) | ((got == 1) & (widest != 0))).all(), cfg
        assert ((got == 0) | (widest != 0)).all(), cfg
        both = (got == 0) & (want == 0)
        if both.any():
            assert_close(np.where(both, result, 0), np.where(both, exact, 0), "bf16", 10**4, str(cfg))


def test_the_op_says_it_ran_space_to_depth_and_binds_weights(monkeypatch: pytest.MonkeyPatch):
    require_native("bf16", BWD_D)
    _forced(monkeypatch)
    cfg = Config(src=(5, 6), kernel=(4, 4), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=3,
                 data_format="NXC", weights_format="XOI")
    rng = np.random.default_rng(3)
    t = cfg.tensors(rng, "bf16")
    op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
    want = cfg.ref_backward_data(t["diff_dst"], t["weights"])
    assert_close(op(t["diff_dst"], t["weights"]), want, "bf16", cfg.bwd_data_reduction)
    assert op.lowering.endswith(" (space-to-depth)"), op.lowering
    bound = op.with_constant_weights(t["weights"])
    for _ in range(2):
        assert_close(bound(t["diff_dst"]), want, "bf16", cfg.bwd_data_reduction)


@pytest.mark.parametrize("change", ["f32", "NCX", "groups", "channels", "dilation", "last_stride_1", "growth"])
def test_where_it_does_not_apply(change: str):
    base_cfg = dict(src=(5, 6), kernel=(4, 4), strides=2, pads_begin=1, pads_end=1, n=1, ic=4, oc=2,
                    data_format="NXC", weights_format="XOI")
    code = "bf16"
    changed = {
        "f32": {}, "NCX": dict(data_format="NCX", weights_format="IOX"), "groups": dict(groups=2),
        "channels": dict(oc=space_to_depth.MAX_CHANNELS + 1), "dilation": dict(dilations=(1, 2)),
        "last_stride_1": dict(strides=(2, 1)), "growth": dict(kernel=(4, 1), pads_begin=0, pads_end=0),
    }[change]
    if change == "f32":
        code = "f32"
    cfg = Config(**{**base_cfg, **changed})
    _, _, _, problem = _call(cfg, np.random.default_rng(0), code)
    assert not space_to_depth.applies(problem)
    assert base.SPACE_TO_DEPTH not in lowering.candidates(problem)


def test_it_needs_native_bf16(monkeypatch: pytest.MonkeyPatch):
    """Below AVX-512 bf16 is computed in f32, where no result check redoes a NaN its zeros made."""
    cfg = Config(src=(5, 6), kernel=(4, 4), strides=2, pads_begin=1, pads_end=1, n=1, ic=4, oc=2,
                 data_format="NXC", weights_format="XOI")
    _, _, _, problem = _call(cfg, np.random.default_rng(0))
    monkeypatch.setattr(guards, "dispatch_isa", lambda: "avx2")
    assert not space_to_depth.applies(problem)
    monkeypatch.setattr(guards, "dispatch_isa", lambda: "avx512_core_bf16")
    assert space_to_depth.applies(problem)

"""Numerics and buffers: NaN and Inf propagate as in the reference, f16 overflow rounds to Inf
as the reference does, read-only inputs work, and every output element is written (checked
with the debug fill, which starts outputs as NaN)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, DTYPES, OPS, Config, assert_close
from onednn_convt import _core
from onednn_convt import plan as plans

FWD, BWD_D, BWD_W = OPS
#: A ConvTranspose lowered to MatMul + overlap-add (kernel >= 128), the other code path.
LONG = Config(src=(6,), kernel=(130,), n=2, ic=3, oc=2, strides=64, pads_begin=5, pads_end=3, bias=True)
SMALL = CASES[CASE_IDS.index("2d_groups3_bias")]


@pytest.fixture
def debug_fill():
    before = oc.debug_fill()
    oc.set_debug_fill(True)
    yield
    oc.set_debug_fill(before)


def inputs_of(op: str, t: dict[str, np.ndarray], cfg: Config) -> list[Any]:
    if op == FWD:
        return [t["src"], t["weights"]] + ([t["bias"]] if cfg.bias else [])
    if op == BWD_D:
        return [t["diff_dst"], t["weights"]]
    return [t["src"], t["diff_dst"]]


def call(op: str, cfg: Config, arrays: list[Any], out: Any = None) -> np.ndarray:
    if op == FWD:
        return oc.ConvTranspose(**cfg.attrs())(*arrays, out=out)
    if op == BWD_D:
        return oc.ConvTransposeBackwardData(**cfg.attrs(op))(*arrays, out=out)
    return oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))(*arrays, out=out)


def reference(op: str, cfg: Config, arrays: list[Any]) -> np.ndarray:
    a = [np.asarray(x, np.float64) for x in arrays]
    with np.errstate(invalid="ignore", over="ignore"):
        if op == FWD:
            return cfg.ref_forward(*a)
        if op == BWD_D:
            return cfg.ref_backward_data(*a)
        return cfg.ref_backward_weights(*a)


def classes(x: np.ndarray) -> np.ndarray:
    """Per element: 0 finite, 1 NaN, 2 +Inf, 3 -Inf."""
    x = np.asarray(x, np.float64)
    return np.select([np.isnan(x), np.isposinf(x), np.isneginf(x)], [1, 2, 3], 0)


# -- NaN and Inf -----------------------------------------------------------------------------
def with_non_finite(arrays: list[Any], rng: np.random.Generator) -> list[Any]:
    """Copies of ``arrays`` with one NaN, one +Inf and one -Inf each, at random elements."""
    arrays = [a.copy() for a in arrays]
    for a in arrays:
        flat = a.reshape(-1)
        spots = rng.choice(flat.size, size=min(3, flat.size), replace=False)
        for spot, value in zip(spots, (np.nan, np.inf, -np.inf)):
            flat[spot] = value
    return arrays


#: Every op on a grouped 2-D problem, and the forward op lowered to MatMul.
PATHS = [(SMALL, op) for op in OPS] + [(LONG, FWD)]
PATH_IDS = [f"conv-{op}" for op in OPS] + ["matmul-ConvTranspose"]


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("cfg", "op"), PATHS, ids=PATH_IDS)
def test_nan_and_inf_propagate_like_the_reference(cfg, op, code):
    """One NaN, one +Inf and one -Inf in each input: the same elements of the result are NaN,
    +Inf or -Inf as in the float64 reference, and the rest stay finite and close."""
    rng = np.random.default_rng(3)
    t = cfg.tensors(rng, code)
    arrays = with_non_finite(inputs_of(op, t, cfg), rng)
    got = call(op, cfg, arrays)
    ref = reference(op, cfg, arrays)
    assert (classes(got) == classes(ref)).all(), f"NaN/Inf pattern differs: {np.argwhere(classes(got) != classes(ref))[:5]}"
    assert (classes(ref) != 0).any()
    finite = classes(ref) == 0
    if finite.any():
        assert_close(np.where(finite, got, 0), np.where(finite, ref, 0), code, 10**4)


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("op", OPS)
def test_non_finite_inputs_on_every_call_path(op, code):
    """A grouped problem with NaN and Inf in its inputs, on a first call (planning), a
    repeated call (the C++ fast path) and with out=: each time the NaN/Inf pattern is the
    reference's. oneDNN 3.2's native bf16 kernels (AVX-512) spread non-finite values into
    other groups (seed 3, BackwardData); the binding then recomputes the call in f32.
    Finite data keeps the fast path."""
    cfg = SMALL
    rng = np.random.default_rng(3)
    finite = inputs_of(op, cfg.tensors(rng, code), cfg)
    arrays = with_non_finite(finite, rng)
    ref = classes(reference(op, cfg, arrays))
    instance = {FWD: oc.ConvTranspose(**cfg.attrs()), BWD_D: oc.ConvTransposeBackwardData(**cfg.attrs(op)),
                BWD_W: oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))}[op]
    out = np.empty(instance(*finite).shape, DTYPES[code])
    for result in (instance(*arrays), instance(*arrays), instance(*arrays, out=out)):
        np.testing.assert_array_equal(classes(result), ref)
    assert (ref == 0).any() and (ref != 0).any()
    want = instance(*finite)
    plan = instance.last_plan
    # no C++ fast path: an emulated dtype, or a guard's lowering that prepares its inputs
    assert instance._fast is not None or plans.native_support(plan.lowering.kind, code) is False or (
        instance.guard is not None and (plan.lowering.prepare is not None or plan.emulated)
    )
    np.testing.assert_array_equal(instance(*finite), want)
    assert_close(want, reference(op, cfg, finite), code, 10**4)


@pytest.mark.parametrize("code", ["bf16", "f16"])
def test_all_finite_agrees_with_numpy_on_every_bit_pattern(code):
    """The C++ scan behind the NaN guard: every one of the 65536 values alone, at odd
    lengths (the vector loop's tail), and whole arrays."""
    values = np.arange(2**16, dtype=np.uint16).view(DTYPES[code])
    want = np.isfinite(values.astype(np.float32))
    got = np.array([_core.all_finite(values[i : i + 1], code) for i in range(values.size)])
    np.testing.assert_array_equal(got, want)
    good = values[want]
    assert _core.all_finite(good, code) and not _core.all_finite(values, code)
    for n in (1, 7, 15, 17, 33, 1000):
        a = good[:n].copy()
        assert _core.all_finite(a, code)
        a[-1] = np.inf
        assert not _core.all_finite(a, code)
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.all_finite(good[::2], code)


@pytest.mark.parametrize("code", ["bf16", "f16"])
def test_all_finite_finds_one_value_in_a_large_array(code):
    """Large arrays are scanned in parallel chunks of 16384: one Inf or NaN anywhere, chunk
    edges included, is found."""
    n = 5 * 16384 + 7
    a = np.ones(n, DTYPES[code])
    assert _core.all_finite(a, code)
    for pos in (0, 16383, 16384, 3 * 16384 + 1, n - 1):
        for bad in (np.inf, -np.inf, np.nan):
            b = a.copy()
            b[pos] = bad
            assert not _core.all_finite(b, code), (pos, bad)


@pytest.mark.parametrize("op", OPS)
def test_f16_overflow_rounds_to_inf_like_the_reference(op):
    """Sums beyond float16's 65504 become Inf when the f32 result is rounded, as the reference
    rounded to float16 does; smaller ones stay finite."""
    cfg = SMALL
    t = cfg.tensors(np.random.default_rng(4), "f16")
    arrays = [np.asarray(a, np.float32) for a in inputs_of(op, t, cfg)]
    arrays[0] = (arrays[0] * 150).astype(np.float16)
    arrays[1] = (arrays[1] * 150).astype(np.float16)
    arrays = [np.asarray(a, np.float16) for a in arrays]
    got = call(op, cfg, arrays)
    with np.errstate(over="ignore"):
        ref = reference(op, cfg, arrays).astype(np.float16)
    assert np.isinf(ref).any() and np.isfinite(ref).any()
    assert (classes(got) == classes(ref)).all()


# -- read-only inputs ------------------------------------------------------------------------
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("cfg", "op"), PATHS, ids=PATH_IDS)
def test_read_only_inputs(cfg, op, code):
    t = cfg.tensors(np.random.default_rng(5), code)
    arrays = inputs_of(op, t, cfg)
    expected = call(op, cfg, arrays)
    frozen = []
    for a in arrays:
        a = a.copy()
        a.flags.writeable = False
        frozen.append(a)
    before = [a.copy() for a in frozen]
    got = call(op, cfg, frozen)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
    for a, b in zip(frozen, before):
        np.testing.assert_array_equal(a, b)  # inputs untouched


# -- every output element written ------------------------------------------------------------
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cfg", CASES + [LONG], ids=CASE_IDS + ["matmul"])
def test_every_output_element_is_written(cfg, op, code, debug_fill):
    """With the debug fill, outputs (new and out=) start as NaN: an element the library left
    unwritten would stay NaN. Every element is finite and matches the reference."""
    t = cfg.tensors(np.random.default_rng(6), code)
    arrays = inputs_of(op, t, cfg)
    ref = reference(op, cfg, arrays)
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    got = call(op, cfg, arrays)
    assert_close(got, ref, code, reduction, f"{op} {code} {cfg}")  # asserts finite too
    out = np.zeros(ref.shape, DTYPES[code])
    assert call(op, cfg, arrays, out=out) is out
    assert_close(out, ref, code, reduction, f"{op} {code} {cfg} out=")


class _WritesNothing:
    """A compiled op whose execute leaves the output as it finds it."""

    def __init__(self, compiled: Any) -> None:
        self.key = compiled.key

    def execute(self, inputs: Any, output: Any) -> None:
        pass


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("op", OPS)
def test_debug_fill_fills_with_nan(op, code, debug_fill, monkeypatch):
    """The mechanism: with a library that writes nothing, every output element is NaN, on
    the direct and the emulated path, for a new output and for out=; and the C++ fast path
    (which allocates without filling) is not taken. (The NaN guard of native bf16/f16
    plans is switched off: it would recompute the NaN result in f32.)"""
    cfg = SMALL
    t = cfg.tensors(np.random.default_rng(7), code)
    arrays = inputs_of(op, t, cfg)
    instance = {FWD: oc.ConvTranspose(**cfg.attrs()), BWD_D: oc.ConvTransposeBackwardData(**cfg.attrs(op)),
                BWD_W: oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))}[op]
    out = np.zeros(instance(*arrays).shape, DTYPES[code])
    instance(*arrays, out=out)  # both plans made: a new result, and out=
    instance(*arrays)  # again: the fast path would be set up by now
    assert len(instance._plans) == 2
    for plan in instance._plans.values():
        monkeypatch.setattr(plan, "compiled", _WritesNothing(plan.compiled))
        monkeypatch.setattr(plan, "make_fallback", None)
    assert np.isnan(np.asarray(instance(*arrays), np.float32)).all()
    out[...] = 0
    assert instance(*arrays, out=out) is out
    assert np.isnan(np.asarray(out, np.float32)).all()


def test_debug_fill_off_takes_the_fast_path(monkeypatch):
    """Off (the default), a repeated call goes through the C++ executor, never through the
    Python plan: the debug mode costs a flag test."""
    assert not oc.debug_fill()
    t = SMALL.tensors(np.random.default_rng(8))
    op = oc.ConvTranspose(**SMALL.attrs())
    op(t["src"], t["weights"])
    runs = []
    monkeypatch.setattr(plans.Plan, "run", lambda self, *a: runs.append(1))
    for _ in range(10):
        op(t["src"], t["weights"])
    assert runs == []
    oc.set_debug_fill(True)
    try:
        op(t["src"], t["weights"])
    finally:
        oc.set_debug_fill(False)
    assert runs == [1]


def test_debug_fill_from_the_environment():
    code = "import onednn_convt as oc; print(oc.debug_fill())"
    for value, expected in (("1", "True"), ("0", "False"), ("", "False"), ("yes", "True")):
        env = {**os.environ, "ONEDNN_CONVT_DEBUG_FILL": value}
        proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=60)
        assert proc.stdout.strip() == expected, (value, proc.stderr)

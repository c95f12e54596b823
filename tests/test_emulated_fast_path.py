"""The C++ fast path of emulated calls: bf16/f16 arrays (dense, or of other strides) are
converted into per-thread f32 staging memory, the f32 partition runs, and the result is
rounded back, all in one C++ call (src/cpp/staging.hpp).

Its results must be the Python plan's results bit for bit (the same conversions and the
same partition) and match the float64 reference; each thread must have its own staging
memory; and the library's input order (which a lowering may swap) must be kept. bf16 runs
this path here too: the tests mark it as having no native kernel, as on CPUs without
AVX-512 bf16.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import Config, assert_close, emulated_dtype
from onednn_convt import _core
from onednn_convt import lowering
from onednn_convt import plan as plans
from test_numerics import BWD_D, BWD_W, FWD, OPS, inputs_of, reference
from test_threads import run_threads

pytestmark = pytest.mark.skipif(not _core.fast_conversion, reason="this CPU has no AVX2/F16C")

KINDS = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights", "Convolution",
         "ConvolutionBackwardData", "ConvolutionBackwardWeights", "MatMul")

#: 2-D NCX/IOX and NXC/XOI with groups and a bias; the NXC one lowers BackwardData and
#: BackwardWeights to Convolution ops (the latter with its inputs swapped)
CFGS = [
    Config(src=(6, 5), kernel=(3, 2), n=2, ic=6, oc=4, groups=2, strides=2, pads_begin=1, bias=True),
    Config(src=(5, 6), kernel=(2, 3), n=2, ic=4, oc=6, groups=2, strides=(2, 1), pads_end=(0, 1), bias=True,
           data_format="NXC", weights_format="XOI"),
]
#: stride 1 and IC = OC: src and diff_dst have one shape, so swapped inputs would go unnoticed
#: by the signature check (the kernel would come out flipped)
SAME_SHAPES = Config(src=(5, 5), kernel=(3, 3), n=2, ic=4, oc=4, pads_begin=1, pads_end=1,
                     data_format="NXC", weights_format="XOI")


@pytest.fixture(params=["f16", "bf16"])
def code(request, monkeypatch) -> str:
    """The emulated dtype code; bf16 is made emulated for the test where it is native. The
    calls run as the hand-written rules choose (one library op, Convolution forms in NXC),
    not as this CPU's measured table does (which may pick a polyphase or channels-last form:
    several plans, not the one this file tests)."""
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: lowering.rules.fallback(p))
    if request.param == "f16" and emulated_dtype() != np.float16:
        pytest.skip("f16 has a native kernel on this CPU")
    if request.param == "bf16":
        for kind in KINDS:
            monkeypatch.setitem(plans._NATIVE, (kind, "bf16"), False)
        # the guards keep native kernels away from problems; with none, none apply
        monkeypatch.setattr(oc.guards, "_enabled", False)
    return str(request.param)


def make(op: str, cfg: Config) -> Any:
    if op == FWD:
        return oc.ConvTranspose(**cfg.attrs())
    if op == BWD_D:
        return oc.ConvTransposeBackwardData(**cfg.attrs(op))
    return oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))


def reduction(op: str, cfg: Config) -> int:
    return {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]


def no_python_plan(monkeypatch) -> list[int]:
    """Make the Python plan path record its runs; returns the record."""
    runs: list[int] = []
    real = plans.Plan.run

    def run(self: Any, *a: Any) -> Any:
        runs.append(1)
        return real(self, *a)

    monkeypatch.setattr(plans.Plan, "run", run)
    return runs


@pytest.mark.parametrize("cfg", [*CFGS, SAME_SHAPES], ids=["ncx", "nxc", "same-shapes"])
@pytest.mark.parametrize("op", OPS)
def test_fast_path_equals_the_python_plan_and_the_reference(op, cfg, code, monkeypatch):
    dtype = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}[code]
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(11), code), cfg)
    instance = make(op, cfg)
    first = instance(*arrays)  # compiles; the Python plan runs
    plan = instance.last_plan
    assert plan.emulated and plan.executor is not None
    runs = no_python_plan(monkeypatch)
    out = np.full(first.shape, np.nan, dtype)
    results = [instance(*arrays), instance(*arrays), instance(*arrays, out=out)]
    assert runs == [], "a repeated dense call took the Python plan"
    assert results[2] is out
    ref = reference(op, cfg, arrays)
    for got in [first, *results]:
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(np.uint16), first.view(np.uint16))
        assert_close(got, ref, code, reduction(op, cfg), f"{op} {code}")
    assert _core.staging_bytes() > 0


def _views(a: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """``a``'s values in memory of other strides: each axis order, every other element of a
    larger array, and reversed-axis memory (a transposed copy, transposed back)."""
    views = []
    for order in ([1, 0, 2, 3], [0, 2, 3, 1], [3, 2, 1, 0], list(rng.permutation(a.ndim))):
        inverse = np.argsort(order)
        views.append(np.ascontiguousarray(a.transpose(order)).transpose(inverse))
    wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    wide[..., ::2] = a
    views.append(wide[..., ::2])
    return views


def test_other_strides_are_converted_as_they_are(code, monkeypatch):
    """Arrays of other (non-negative) strides, channels-last weights say, run through the
    executor too: its converter reads them in their memory order into the dense f32 staging,
    and the result is the dense call's bit for bit; no Python plan runs after the first."""
    cfg = CFGS[0]
    rng = np.random.default_rng(12)
    x, w, b = (cfg.tensors(rng, code)[k] for k in ("src", "weights", "bias"))
    op = oc.ConvTranspose(**cfg.attrs())
    expected = op(x, w, b)
    runs = no_python_plan(monkeypatch)
    for xv, wv in zip(_views(x, rng), _views(w, rng)):
        assert not (xv.flags.c_contiguous or wv.flags.c_contiguous)
        for args in ((xv, w, b), (x, wv, b), (xv, wv, b)):
            planned = len(runs)
            got = [op(*args), op(*args), op(*args, out=np.full(expected.shape, np.nan, expected.dtype))]
            assert op.last_plan.executor is not None
            assert len(runs) <= planned + 1, "a repeated strided call took the Python plan"
            for g in got:
                np.testing.assert_array_equal(g.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("kind", ["large", "broadcast"])
def test_strided_conversion_of_large_and_broadcast_arrays(code, kind, monkeypatch):
    """The converter's parallel rows (Fortran-order weights past its threshold) and a
    broadcast src (a stride of 0): the result is that of dense copies, bit for bit."""
    rng = np.random.default_rng(3)
    dtype = {"f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}[code]
    ic, oc_ = (280, 250) if kind == "large" else (4, 3)
    x = rng.standard_normal((2, ic, 3, 3)).astype(dtype)
    w = rng.standard_normal((ic, oc_, 1, 2)).astype(dtype)
    if kind == "large":  # 140,000 elements
        xv, wv = x, np.asfortranarray(w)
    else:
        xv, wv = np.broadcast_to(x[:, :, :1], x.shape), w
    op = oc.ConvTranspose(data_format="NCX", weights_format="IOX")
    expected = op(np.ascontiguousarray(xv), np.ascontiguousarray(wv))
    runs = no_python_plan(monkeypatch)
    for _ in range(3):
        np.testing.assert_array_equal(op(xv, wv).view(np.uint16), expected.view(np.uint16))
    assert op.last_plan.executor is not None and len(runs) <= 1


def test_threads_have_their_own_staging(code):
    """Eight threads run one op object on different inputs at once; each gets its own result
    (shared staging memory would mix them)."""
    cfg = CFGS[1]
    op = oc.ConvTranspose(**cfg.attrs())
    problems = [cfg.tensors(np.random.default_rng(100 + i), code) for i in range(8)]
    expected = [op(t["src"], t["weights"], t["bias"]) for t in problems]  # serially first
    assert op.last_plan.executor is not None

    def work(i: int) -> list[np.ndarray]:
        t = problems[i]
        return [op(t["src"], t["weights"], t["bias"]) for _ in range(30)]

    for i, results in enumerate(run_threads(8, work)):
        for r in results:
            np.testing.assert_array_equal(r.view(np.uint16), expected[i].view(np.uint16))


def test_large_calls_do_not_keep_their_staging(hand_rules):
    """A call needing more than 64 MiB of f32 staging frees it when it ends; smaller calls
    keep theirs for the next call. (The hand rules run this k2 s2 forward as the library's
    op, which stages; the measured table may pick the tiles MatMul, which does not.)"""
    low = emulated_dtype()
    op = oc.ConvTranspose(strides=2, data_format="NXC")
    small = np.ones((1, 8, 8, 4), low), np.ones((2, 2, 4, 4), low)
    op(*small)
    op(*small)
    kept = _core.staging_bytes()
    assert 0 < kept <= 64 << 20
    big = np.ones((1, 1024, 1024, 8), low), np.ones((2, 2, 2, 8), low)  # f32: 32 MiB in, 32 MiB out
    first = op(*big)
    result = op(*big)
    assert _core.staging_bytes() == 0
    assert np.array_equal(result.view(np.uint16), first.view(np.uint16))
    assert float(result[0, 0, 0, 0]) == 8.0  # sum over 8 input channels of 1 * 1


def test_large_staging_goes_back_to_the_kept_blocks(hand_rules):
    """A large call's staging returns to the engine's kept blocks (``host_memory_info``),
    so that the next large call takes no fresh pages: freed to the system, it cost WaveGAN's
    64x64x4096 bf16 layer about 40 ms of page faults a call on a Zen3."""
    low = emulated_dtype()
    op = oc.ConvTranspose(strides=2, data_format="NXC")
    src, w = np.ones((1, 1024, 1024, 8), low), np.ones((2, 2, 2, 8), low)  # f32: 32 MiB in, 32 MiB out
    out = np.empty((1, 2048, 2048, 2), low)
    op(src, w, out=out)
    op(src, w, out=out)  # the executor now, which stages
    _core.release_host_memory()
    op(src, w, out=out)
    assert _core.staging_bytes() == 0
    after_one = _core.host_memory_info()
    assert after_one["kept_bytes"] >= 64 << 20, after_one  # the staging block, kept
    out[...] = 0
    op(src, w, out=out)
    after_two = _core.host_memory_info()
    assert after_two["reused"] > after_one["reused"], (after_one, after_two)
    assert after_two["allocated"] == after_one["allocated"], (after_one, after_two)
    assert after_two["kept_bytes"] >= 64 << 20, after_two
    assert float(out[0, 0, 0, 0]) == 8.0 and float(out[0, -1, -1, -1]) == 8.0


def test_clear_cache_frees_the_staging_memory():
    low = emulated_dtype()
    op = oc.ConvTranspose(strides=2, data_format="NCX", weights_format="IOX")
    x, w = np.ones((1, 4, 8, 8), low), np.ones((4, 4, 2, 2), low)
    first = op(x, w)
    op(x, w)
    assert _core.staging_bytes() > 0
    oc.clear_cache()
    assert _core.staging_bytes() == 0
    again = op(x, w)  # compiles again; then the fast path stages again
    assert np.array_equal(op(x, w).view(np.uint16), first.view(np.uint16))
    assert np.array_equal(again.view(np.uint16), first.view(np.uint16))
    assert _core.staging_bytes() > 0


def test_clear_cache_frees_a_large_staging_block(hand_rules):
    """Staging of 1 MiB and more comes from the engine's kept blocks: clear_cache() gives it
    back and then frees the kept blocks, so none stays kept."""
    low = emulated_dtype()
    op = oc.ConvTranspose(strides=2, data_format="NXC")
    src, w = np.ones((1, 256, 256, 8), low), np.ones((2, 2, 2, 8), low)  # f32: 2 MiB in, 2 MiB out
    op(src, w)
    op(src, w)
    assert _core.staging_bytes() >= 4 << 20
    oc.clear_cache()
    assert _core.staging_bytes() == 0
    assert _core.host_memory_info()["kept_bytes"] == 0
    assert float(op(src, w)[0, -1, -1, -1]) == 8.0


def test_executor_refuses_a_wrong_emulation():
    """The emulated Executor reads 2-byte arrays into an f32 partition: it checks the pairing."""
    op = oc.ConvTranspose()
    x, w = np.ones((1, 5, 3), np.float32), np.ones((2, 4, 3), np.float32)
    op(x, w)
    compiled = op.last_plan.compiled
    f16, bf16, f32 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    with pytest.raises(ValueError, match="emulated must be"):
        _core.Executor(compiled, [f16, f16], f16, "", [], "f8")
    with pytest.raises(ValueError, match="emulated must be"):
        _core.Executor(compiled, [f16, f16], f16, "f16", [], "f16")
    for ins, out, code in (([f32, f32], f32, "f16"), ([bf16, bf16], bf16, "f16"), ([f16, f16], f16, "bf16"),
                           ([f16, bf16], f16, "f16")):
        with pytest.raises(ValueError, match="emulation needs"):
            _core.Executor(compiled, ins, out, "", [], code)
    for strides, message in (([[1, 1, 1]], "one call_strides entry"), ([[1, 1], []], "one stride per dim"),
                             ([[-3, 1, 1], []], "not be negative")):
        with pytest.raises(ValueError, match=message):
            _core.Executor(compiled, [f16, f16], f16, "", [], "f16", call_strides=strides)
    with pytest.raises(ValueError, match="call_strides needs emulated"):
        _core.Executor(compiled, [f32, f32], f32, call_strides=[[15, 3, 1], []])
    ok = _core.Executor(compiled, [f16, f16], f16, "", [], "f16")
    got = ok.run((x.astype(f16), w.astype(f16)), None)
    np.testing.assert_array_equal(got.astype(np.float32), op(x, w))

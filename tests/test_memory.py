"""Memory: no growth over many calls, evicted compiled partitions freed, no allocation on the
``out=`` path, and huge problems refused with MemoryError before anything is allocated.

RSS is read from ``/proc/self/statm``. Figures are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import subprocess
import sys
import tracemalloc
from typing import Any

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import emulated_dtype
from onednn_convt import _core, limits, lowering
from onednn_convt.lowering import base

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

MB = 2**20
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident set size of this process, in bytes."""
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * PAGE


@pytest.fixture
def cache_capacity():
    """Set the compiled-partition cache capacity for the test; restore it after."""
    before = oc.cache_info()["capacity"]
    yield oc.set_cache_capacity
    oc.set_cache_capacity(before)


@pytest.fixture
def memory_limit():
    """Set the memory limit for the test; back to the default (or the environment's) after."""
    before = limits._limit
    yield oc.set_memory_limit
    limits._limit = before


# -- RSS -------------------------------------------------------------------------------------
def tiny_calls() -> list:
    """Tiny ops on each per-call path: the C++ fast path (new result, and out=) and the Python
    plan path (a reversed view, which the plan copies, and an emulated dtype)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, 3)).astype(np.float32)  # NXC: N=1, W=5, C=3
    w = rng.standard_normal((2, 4, 3)).astype(np.float32)  # XOI: k=2, OC=4, IC=3
    y = rng.standard_normal((1, 6, 4)).astype(np.float32)
    fwd = oc.ConvTranspose()
    out = fwd(x, w)
    bwd_w = oc.ConvTransposeBackwardWeights(weights_shape=w.shape)
    wout = bwd_w(x, y)
    xl, wl = x.astype(emulated_dtype()), w.astype(emulated_dtype())
    low = oc.ConvTranspose()
    return [
        lambda: fwd(x, w),
        lambda: fwd(x, w, out=out),
        lambda: bwd_w(x[:, ::-1], y, out=wout),
        lambda: low(xl, wl),
    ]


def test_100k_calls_keep_rss_flat():
    """100,000 calls of tiny ops, over every per-call path, after 10,000 to settle."""
    calls = tiny_calls()
    weights = (4, 2, 1, 1)  # calls per round of each: 50k fast, 25k out=, 12.5k plan, 12.5k emulated
    rounds = 100_000 // sum(weights)
    schedule = [c for c, n in zip(calls, weights) for _ in range(n)]
    for _ in range(rounds // 10):
        for call in schedule:
            call()
    settled = rss()
    for _ in range(rounds):
        for call in schedule:
            call()
    grown = rss() - settled
    print(f"\nRSS settled at {settled / MB:.1f} MB; after 100,000 calls {grown / MB:+.2f} MB")
    assert grown < 10 * MB


def compile_many(first: int, count: int) -> None:
    """Compile ``count`` distinct signatures (batch sizes), each in an op object then dropped.
    With a bias and stride 1, so they run as the library's ConvTranspose (strided, the bias
    goes to a partition of its own: the guard strided_deconvolution_epilogue), whose compiled
    partitions are larger than the bias-free ConvolutionBackwardData ones (12 MB for 150
    alone, 4 MB after the rest of the suite, against the control's 8 MB)."""
    w = np.ones((3, 3, 8, 8), np.float32)
    b = np.ones(8, np.float32)
    for n in range(first, first + count):
        oc.ConvTranspose(strides=1)(np.ones((n, 9, 8, 8), np.float32), w, b)


def trimmed_rss() -> int:
    """RSS after glibc returns its free pages to the system: what is still in use, less the
    free memory that earlier tests' threads left scattered over malloc's arenas."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss()


def retained_by_compiling(count: int) -> int:
    compile_many(1, 30)  # settle: allocator pools, oneDNN's first-use state
    before = trimmed_rss()
    compile_many(31, count)
    return trimmed_rss() - before


def test_evicted_compiled_partitions_are_freed(cache_capacity):
    """With room for 2, compiling 150 more signatures keeps RSS flat: oneDNN's primitive cache
    is bounded too and its compiled-partition cache is off (measured 0.0-0.5 MB, ~3 KB per
    distinct signature staying in oneDNN's graph backend)."""
    cache_capacity(2)
    grown = retained_by_compiling(150)
    print(f"\ncache capacity 2: RSS {grown / MB:+.2f} MB after compiling and evicting 150 partitions")
    assert oc.cache_info()["size"] <= 2
    assert grown < 3 * MB


def test_kept_compiled_partitions_are_what_the_measure_sees(cache_capacity):
    """The control: with room for all of them, the same 150 partitions stay, and RSS shows it
    (measured 14-25 MB, so the test above would see partitions that eviction failed to free)."""
    cache_capacity(10_000)
    grown = retained_by_compiling(150)
    print(f"\ncache capacity 10000: RSS {grown / MB:+.2f} MB after compiling 150 partitions")
    assert grown > 8 * MB


@pytest.mark.parametrize(
    "op_name", ["ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights", "depthwise"]
)
def test_out_path_allocates_nothing_per_call(op_name):
    """Native f32 with out=: no output-sized allocation and nothing kept, per tracemalloc
    (NumPy reports its array buffers to it). An emulated dtype converts, so it is not here.
    The depthwise stride-1 ConvTranspose (a Convolution over flipped weights) reuses its
    flipped-weights array: no weights-sized allocation either."""
    rng = np.random.default_rng(1)
    if op_name == "depthwise":
        x = rng.standard_normal((2, 16, 16, 256)).astype(np.float32)  # NXC
        w = rng.standard_normal((5, 5, 1, 256)).astype(np.float32)  # XOI, one channel per group
        op = oc.ConvTranspose(pads_begin=2, pads_end=2, groups=256)
        _assert_out_allocates_nothing(op, (x, w), limit=w.nbytes // 8)
        assert op.lowering == "Convolution"
        return
    x = rng.standard_normal((2, 32, 32, 16)).astype(np.float32)  # NXC
    w = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)  # XOI
    y = rng.standard_normal((2, 65, 65, 16)).astype(np.float32)
    if op_name == "ConvTranspose":
        op, args = oc.ConvTranspose(strides=2), (x, w)
    elif op_name == "ConvTransposeBackwardData":
        op, args = oc.ConvTransposeBackwardData(strides=2), (y, w)
    else:
        op, args = oc.ConvTransposeBackwardWeights(strides=2, weights_shape=w.shape), (x, y)
    _assert_out_allocates_nothing(op, args, limit=max(op(*args).nbytes, 64 * 1024) // 16)


def _assert_out_allocates_nothing(op: Any, args: tuple[np.ndarray, ...], limit: int) -> None:
    """At most ``limit`` bytes allocated at once during any of 500 out= calls; under 1 KiB kept."""
    out = op(*args)
    for _ in range(50):
        op(*args, out=out)
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        most = 0  # the most one call had allocated at once
        for _ in range(500):
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            assert op(*args, out=out) is out
            most = max(most, tracemalloc.get_traced_memory()[1] - before)
        gc.collect()  # NumPy's may_share_memory leaves 56 B per call until a collection
        end, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    print(f"\n{op!r} out=: at most {most} B allocated during one call, {end - start} B kept after 500")
    assert most < limit
    assert end - start < 1024


# -- huge problems ---------------------------------------------------------------------------
def huge_forward() -> tuple[oc.ConvTranspose, np.ndarray, np.ndarray, int]:
    """A forward call whose dst (NXC, 64 channels, ~2**36 elements, 256 GiB) cannot fit."""
    x = np.ones((1, 2**14, 1), np.float32)
    w = np.ones((1, 64, 1), np.float32)  # XOI: k=1, OC=64, IC=1
    op = oc.ConvTranspose(strides=2**16)
    dst_bytes = (2**16 * (2**14 - 1) + 1) * 64 * 4
    return op, x, w, dst_bytes


def test_huge_output_raises_memory_error_before_allocating():
    op, x, w, dst_bytes = huge_forward()
    available = limits.available_memory()
    assert available is not None and dst_bytes > available
    before = rss()
    with pytest.raises(MemoryError) as info:
        op(x, w)
    message = str(info.value)
    assert "ConvTranspose" in message and "memory available now" in message
    figure = f"{dst_bytes / 2**30:.1f} GiB"  # the estimate, which is mostly the result
    assert f"would allocate about {figure}" in message and f"result {figure}" in message
    assert rss() - before < 16 * MB
    assert op.last_plan is None  # nothing was compiled either


def test_set_memory_limit(memory_limit):
    x = np.ones((1, 64, 64, 16), np.float32)  # NXC
    w = np.ones((2, 2, 16, 16), np.float32)  # XOI; dst (1, 128, 128, 16): 1 MiB
    op = oc.ConvTranspose(strides=2)
    memory_limit(MB // 2)
    assert oc.memory_limit() == MB // 2
    with pytest.raises(MemoryError, match=r"over the limit of 512\.0 KiB \(set by set_memory_limit"):
        op(x, w)
    memory_limit(None)  # back to the available memory (read again: it moves a little)
    assert oc.memory_limit() == pytest.approx(limits.available_memory(), rel=0.05)
    assert op(x, w).shape == (1, 128, 128, 16)


def test_a_call_the_chosen_lowering_would_take_past_the_limit_runs_a_leaner_one(memory_limit, monkeypatch):
    """Where the rules' choice would pass the memory limit, the call runs the candidate that
    allocates least, if that one fits: a one-channel forward as ``MatMul (columns)`` needs its
    columns (16 taps a position), the library's op little more than the result. Under a
    limit that passes neither, MemoryError as before (the leaner one's need)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 32, 32, 16)).astype(np.float32)  # NXC
    w = rng.standard_normal((4, 4, 1, 16)).astype(np.float32)  # XOI: one output channel
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.COLUMNS)
    op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1)
    arrays = [x, w, None]
    problem = op._problem(arrays, "f32")

    def need(name: str) -> int:
        return sum(limits.estimate(lowering.build(problem, name), arrays, None, np.float32, False).values())

    lean = min(lowering.candidates(problem), key=need)
    assert need(base.COLUMNS) > 2 * need(lean)
    memory_limit((need(base.COLUMNS) + need(lean)) // 2)
    got = op(x, w)
    assert op.lowering == lean or op.lowering.startswith(lean + " ("), op.lowering
    want = oc.reference.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    memory_limit(need(lean) // 2)
    with pytest.raises(MemoryError, match="over the limit"):
        oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1)(x, w)


def test_out_is_not_counted_but_emulation_copies_are(memory_limit):
    """The estimate follows what the call allocates: out= needs no result buffer; an
    emulated dtype needs f32 copies of everything."""
    x = np.ones((1, 64, 64, 16), np.float32)
    w = np.ones((2, 2, 16, 16), np.float32)
    out = np.empty((1, 128, 128, 16), np.float32)
    op = oc.ConvTranspose(strides=2)
    memory_limit(MB // 2)
    op(x, w, out=out)  # 1 MiB result given: only the weights' working copy is allocated
    low = emulated_dtype()
    xb, wb = x.astype(low), w.astype(low)
    outb = np.empty(out.shape, low)
    with pytest.raises(MemoryError, match="f32 copies"):
        oc.ConvTranspose(strides=2)(xb, wb, out=outb)
    memory_limit(4 * MB)
    oc.ConvTranspose(strides=2)(xb, wb, out=outb)


#: (op, inputs): a library ConvTranspose, and BackwardData and ConvTranspose lowered to MatMul
#: (frames of diff_dst; a zero-padded weights copy and the overlap-add)
ESTIMATED = [
    (lambda: oc.ConvTranspose(strides=2), (np.ones((2, 48, 48, 8)), np.ones((3, 3, 8, 8)))),
    (lambda: oc.ConvTransposeBackwardData(strides=64, pads_begin=32, pads_end=32, data_format="NCX", weights_format="IOX"),
     (np.ones((2, 6, 64 * 40)), np.ones((8, 6, 128)))),
    (lambda: oc.ConvTranspose(strides=48, data_format="NCX", weights_format="IOX"), (np.ones((2, 8, 40)), np.ones((8, 6, 130)))),
    # bf16/f16: MatMul (frames), whose finish only reshapes (src no longer than the kernel)
    (lambda: oc.ConvTransposeBackwardWeights(strides=2), (np.ones((2, 4, 4, 128)), np.ones((2, 10, 10, 64)), (4, 4, 64, 128))),
    # ... with IOX weights: its frames copied in two steps
    (lambda: oc.ConvTransposeBackwardWeights(strides=2, weights_format="IOX"),
     (np.ones((2, 4, 4, 128)), np.ones((2, 10, 10, 64)), (128, 64, 4, 4))),
    # NCX BackwardData, run as the channels-last lowering (reordered back)
    (lambda: oc.ConvTransposeBackwardData(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX"),
     (np.ones((2, 32, 32, 32)), np.ones((16, 32, 4, 4)))),  # (each array below the kept blocks, 1 MiB)
    # NCX BackwardWeights, run as MatMul (tiles): diff_dst permuted into frames, src moved
    (lambda: oc.ConvTransposeBackwardWeights(strides=2, data_format="NCX", weights_format="IOX"),
     (np.ones((2, 32, 16, 16)), np.ones((2, 16, 32, 32)), (32, 16, 2, 2))),
    # ... by rows (diff_dst 8x src's elements): src moved too, the result transposed after
    (lambda: oc.ConvTransposeBackwardWeights(strides=2, data_format="NCX", weights_format="IOX"),
     (np.ones((2, 8, 16, 16)), np.ones((2, 16, 32, 32)), (8, 16, 2, 2))),
]


@pytest.mark.parametrize(("make", "inputs"), ESTIMATED,
                         ids=["conv_transpose", "matmul-bwd_d", "matmul-fwd", "frames-bwd_w", "frames-bwd_w-iox",
                              "channels-last-bwd_d", "tiles-bwd_w", "tiles-bwd_w-rows"])
def test_estimate_matches_the_bytes_a_call_allocates(make, inputs, monkeypatch, request):
    """The MemoryError figure is what tracemalloc sees the call allocate (NumPy buffers), to
    within the library's own working copies, which NumPy does not see."""
    forced = {"channels-last": base.CHANNELS_LAST, "tiles": base.TILES}
    for key, name in forced.items():
        if key in request.node.name:
            monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False, name=name: name)
    for dtype in (np.float32, ml_dtypes.bfloat16, np.float16):
        op = make()
        a, b = (x.astype(dtype) for x in inputs[:2])
        rest = [np.array(x, np.int64) for x in inputs[2:]]  # BackwardWeights: the weights' shape
        op(a, b, *rest)  # compile
        low = op.last_plan.lowering
        parts = limits.estimate(low, [a, b, *rest, None], None, np.dtype(dtype), op.last_plan.emulated)
        numpy_side = sum(v for k, v in parts.items() if k != "library working copies")
        copies = parts.get("f32 copies (emulated dtype)", 0)
        fast = op.last_plan.executor is not None and copies > 0
        if fast:  # the C++ fast path converts into the thread's staging memory, unseen below
            numpy_side -= copies
        tracemalloc.start()
        try:
            op(a, b, *rest)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        if fast:  # that memory holds the estimated copies
            assert _core.staging_bytes() >= copies, (dtype, parts, _core.staging_bytes())
        assert 0.8 * numpy_side <= peak <= 1.2 * numpy_side + 4096, (dtype, low.name, parts, peak)
        assert all(low.name == name for key, name in forced.items() if key in request.node.name)


def test_memory_limit_validation(memory_limit):
    for bad in ("1G", 1.5, True):
        with pytest.raises(TypeError, match="set_memory_limit"):
            memory_limit(bad)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="set_memory_limit"):
            memory_limit(bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [("4096", 4096), ("512K", 512 * 2**10), ("64M", 64 * MB), ("1.5G", 3 * 2**29), ("2 GiB", 2 * 2**30), ("1t", 2**40),
     ("9" * 400, 10**400 - 1), ("9" * 400 + ".5K", (10**400 - 1) * 1024 + 512)],
)
def test_byte_counts(text, value):
    assert limits.parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "0", "-1G", "1X", "G", "lots"])
def test_bad_byte_counts(text):
    with pytest.raises(ValueError, match="positive byte count"):
        limits.parse_bytes(text)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
        env={**os.environ, **env},
    )


def test_limit_from_the_environment():
    code = (
        "import numpy as np, onednn_convt as oc\n"
        "print(oc.memory_limit())\n"
        "try:\n"
        "    oc.ConvTranspose(strides=2)(np.ones((1, 64, 64, 16), np.float32), np.ones((2, 2, 16, 16), np.float32))\n"
        "except MemoryError as e:\n"
        "    print('MemoryError', e)\n"
    )
    proc = run_python(code, ONEDNN_CONVT_MEMORY_LIMIT="512K")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == str(512 * 1024)
    assert lines[1].startswith("MemoryError ConvTranspose:") and "ONEDNN_CONVT_MEMORY_LIMIT" in lines[1]
    # a value that is no byte count warns and leaves the default limit (the memory
    # available), as the package's switches do with values they do not know
    code = "from onednn_convt import limits\nprint(limits._limit is None)\n"
    bad = run_python(code, ONEDNN_CONVT_MEMORY_LIMIT="lots", PYTHONWARNINGS="always")
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.split() == ["True"]
    assert "RuntimeWarning: ONEDNN_CONVT_MEMORY_LIMIT='lots'" in bad.stderr and "the memory available" in bad.stderr


def test_an_unknown_debug_fill_value_warns_and_keeps_it_off():
    proc = run_python("from onednn_convt import limits\nprint(limits.debug_fill())\n",
                      ONEDNN_CONVT_DEBUG_FILL="2", PYTHONWARNINGS="always")
    assert proc.returncode == 0 and proc.stdout.split() == ["False"], proc.stderr
    assert "RuntimeWarning: ONEDNN_CONVT_DEBUG_FILL='2'" in proc.stderr
    proc = run_python("from onednn_convt import limits\nprint(limits.debug_fill())\n", ONEDNN_CONVT_DEBUG_FILL="yes")
    assert proc.returncode == 0 and proc.stdout.split() == ["True"], proc.stderr


def test_info_under_a_limit_below_its_dtype_probe(monkeypatch):
    """info()'s dtype probe compiles a problem of a few hundred bytes: under a smaller limit
    it says "unknown" (info and the bench and demo commands that read it still run), and the
    answer is not kept for when the limit is raised."""
    from onednn_convt.info import _probe_dtypes, dtype_support

    _probe_dtypes.cache_clear()
    monkeypatch.setattr(limits, "_limit", 1)
    assert {v for per_op in dtype_support().values() for v in per_op.values()} == {"unknown"}
    assert set(dtype_support()) == {"ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"}
    monkeypatch.setattr(limits, "_limit", None)
    assert dtype_support()["ConvTranspose"]["f32"] == "native"


def test_info_names_the_memory_limit_and_where_it_comes_from(memory_limit):
    memory_limit(3 * MB)
    assert oc.info()["memory_limit"] == {"bytes": 3 * MB, "from": "set by set_memory_limit() or ONEDNN_CONVT_MEMORY_LIMIT"}
    memory_limit(None)
    got = oc.info()["memory_limit"]
    assert got["from"].startswith("the memory available now") and got["bytes"] == pytest.approx(
        limits.available_memory(), rel=0.05)


def test_default_limit_reads_meminfo_and_cgroups(monkeypatch, tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8000000 kB\nMemFree:    100 kB\nMemAvailable:    3000000 kB\n")
    monkeypatch.setattr(limits, "MEMINFO", str(meminfo))
    none = (str(tmp_path / "missing1"), str(tmp_path / "missing2"))
    monkeypatch.setattr(limits, "CGROUP_V1", none)
    monkeypatch.setattr(limits, "CGROUP_V2", none)
    assert limits.available_memory() == 3_000_000 * 1024
    cap, used = tmp_path / "memory.max", tmp_path / "memory.current"
    cap.write_text("2000000000\n")
    used.write_text("500000000\n")
    monkeypatch.setattr(limits, "CGROUP_V2", (str(cap), str(used)))
    assert limits.available_memory() == 1_500_000_000  # the cgroup leaves less
    cap.write_text("max\n")  # no cgroup limit
    assert limits.available_memory() == 3_000_000 * 1024
    monkeypatch.setattr(limits, "MEMINFO", str(tmp_path / "missing3"))
    assert limits.available_memory() is None  # no figure: no check rather than a wrong one


@pytest.mark.parametrize(
    ("call", "words"),
    [
        # a dim of 2**31 (a broadcast view: no memory), the batch
        (lambda: oc.ConvTranspose()(np.broadcast_to(np.ones((1, 1, 1), np.float32), (2**31, 1, 1)),
                                    np.ones((1, 1, 1), np.float32)), "dimension of 2**31"),
        # a dilation oneDNN would truncate (pads_end crops the output back to 3)
        (lambda: oc.ConvTranspose(dilations=2**31, pads_end=2**31)(np.ones((1, 3, 2), np.float32),
                                                                    np.ones((2, 2, 2), np.float32)),
         "dilation 2147483648"),
        # pads and stride that overflow oneDNN's int arithmetic with a small, valid dst
        (lambda: oc.ConvTranspose(strides=2**31 - 1, pads_end=2**31 - 2)(
            np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32)), "below 2**31"),
        (lambda: oc.ConvTransposeBackwardData(strides=2**31 - 1)(
            np.ones((1, 3, 2), np.float32), np.ones((1, 2, 2), np.float32)), "below 2**31"),
        # a strided 1x1 BackwardWeights, which a guard of some CPUs runs at stride 1 (the
        # strided positions of diff_dst gathered): refused all the same, everywhere
        (lambda: oc.ConvTransposeBackwardWeights(strides=2**31 - 1, weights_shape=(1, 1, 1))(
            np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)), "stride 2147483647"),
        (lambda: oc.ConvTransposeBackwardWeights(strides=2**40, weights_shape=(1, 1, 1))(
            np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)), "stride 1099511627776"),
    ],
    ids=["dim", "dilation", "stride_pads", "bwd_d_stride", "bwd_w_1x1_stride", "bwd_w_1x1_huge_stride"],
)
def test_library_range_raises_value_error(call, words):
    """A call past oneDNN's 32-bit range is a ValueError naming the op and the sum, whichever
    lowering the rules of this CPU would run it as (the call's own geometry is checked)."""
    with pytest.raises(ValueError, match="32-bit") as info:
        call()
    assert words in str(info.value)


def test_a_dilation_out_of_range_is_refused_along_a_kernel_of_one_too():
    """Along a kernel of 1 a dilation changes nothing and is passed to the library as 1, but
    a value of 2**31 or more is still outside the attribute's range, and refused."""
    x, w = np.arange(6, dtype=np.float32).reshape(1, 3, 2), np.ones((1, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"ConvTranspose: attribute 'dilations' expected values below 2\*\*31 .*"
                                         r"got dilation 2147483648 in spatial dim 0"):
        oc.ConvTranspose(dilations=2**31)(x, w)
    np.testing.assert_array_equal(oc.ConvTranspose(dilations=2**31 - 1)(x, w), oc.ConvTranspose()(x, w))


def test_limits_are_exported():
    for name in ("set_memory_limit", "memory_limit", "set_debug_fill", "debug_fill"):
        assert name in oc.__all__ and callable(getattr(oc, name))
    assert math.isfinite(oc.memory_limit() or 0)

"""Steady-state timing: median and interquartile range of batched samples.

A call is first timed once (after one warm-up call). Each sample then runs a batch of
calls sized so that ``repeat`` samples fill about ``budget`` seconds, and records the mean
time per call of its batch; short calls are batched so that the clock's resolution and the
loop around them do not matter. Sampling stops after ``repeat`` samples, or earlier once
the budget is spent and 3 samples are in. A call slower than twice the budget is timed once.
The garbage collector is off while sampling.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Union

#: a batch runner: run the operation ``k`` times, return the seconds taken
BatchRunner = Callable[[int], float]

_MIN_SAMPLES = 3
_MAX_BATCH = 1_000_000


@dataclass
class Timing:
    """Seconds per call.

    Attributes:
        median: median over samples.
        q1: first quartile.
        q3: third quartile.
        samples: number of samples.
        batch: calls per sample.
        best: the fastest sample (less sensitive to other load on the machine).
    """

    median: float
    q1: float
    q3: float
    samples: int
    batch: int
    best: float

    @property
    def iqr(self) -> float:
        """Interquartile range, seconds."""
        return self.q3 - self.q1

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def python_runner(fn: Callable[[], Any]) -> BatchRunner:
    """A batch runner over a Python callable, timed with ``time.perf_counter``."""

    def run(k: int) -> float:
        f = fn
        start = time.perf_counter()
        for _ in range(k):
            f()
        return time.perf_counter() - start

    return run


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(q1, median, q3) of ``values`` (inclusive method; one value gives it three times)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, med, q3


def measure(
    run: BatchRunner, repeat: int, budget: float, once: Optional[float] = None, warm: bool = False
) -> Timing:
    """Time an operation.

    Args:
        run: batch runner (see :func:`python_runner`).
        repeat: the number of samples wanted (>= 1).
        budget: seconds to spend, about; at least 3 samples are taken unless a single call
            takes longer than twice the budget.
        once: the time of one call if already known (then no warm-up call is made).
        warm: the operation has run before, so no warm-up call is needed.

    Returns:
        the timing per call.
    """
    repeat = max(1, int(repeat))
    if once is None:
        if not warm:
            run(1)
        once = run(1)
    if once > 2 * budget:
        return Timing(once, once, once, 1, 1, once)
    batch = _batch(budget / repeat, once)
    [samples] = _sample([run], [batch], repeat, budget)
    return _timing(samples, batch)


def _batch(seconds: float, once: float) -> int:
    """Calls per batch so that a batch of calls taking ``once`` seconds each lasts about
    ``seconds`` (at least 1, at most ``_MAX_BATCH``)."""
    return int(min(_MAX_BATCH, max(1, round(seconds / max(once, 1e-9)))))


def _sample(
    runners: list[BatchRunner], batches: list[int], repeat: int, budget: float,
    gap: Union[float, Sequence[float]] = 0.0,
) -> list[list[float]]:
    """Rounds of one batch of each runner in turn (``batches``: calls per batch, one per
    runner), with the garbage collector off: up to ``repeat`` rounds, fewer (but 3 at least)
    once ``budget`` seconds are spent (``gap`` seconds of sleep before each batch, or one
    figure per runner, are not counted). Returns each runner's seconds per call, a list per
    runner."""
    gaps = [float(gap)] * len(runners) if isinstance(gap, (int, float)) else [float(g) for g in gap]
    samples: list[list[float]] = [[] for _ in runners]
    enabled = gc.isenabled()
    gc.disable()
    try:
        spent = 0.0
        while len(samples[0]) < repeat:
            for run, batch, out, pause in zip(runners, batches, samples, gaps):
                if pause:
                    settle(pause)
                seconds = run(batch)
                spent += seconds
                out.append(seconds / batch)
            if len(samples[0]) >= _MIN_SAMPLES and spent > budget:
                break
    finally:
        if enabled:
            gc.enable()
    return samples


def _timing(samples: list[float], batch: int) -> Timing:
    q1, med, q3 = quartiles(samples)
    return Timing(med, q1, q3, len(samples), batch, min(samples))


def measure_difference(
    a: BatchRunner, b: BatchRunner, repeat: int, budget: float, gap: float = 0.0
) -> tuple[Timing, Timing, list[float]]:
    """Time two operations in alternating batches (a, b, a, b, ...), so that both see the
    same state of a shared machine, for the cost that ``a`` adds over ``b`` (or their ratio).

    Both have run before (no warm-up). Each runner's batch is sized from its own single
    call, so that its batches take about ``budget / repeat / 2`` seconds: a fast call paired
    with a slow one is still averaged over many calls, not timed alone after the gap (cold
    caches, sleeping threads: up to 3x its steady time here). ``gap``: seconds to sleep
    before each batch (uncounted), e.g. for another OpenMP runtime's threads to stop spinning.

    Returns:
        the timing per call of ``a`` and of ``b``, and the per-call difference a - b of each
        pair of samples (seconds); its median is the figure to report.
    """
    repeat = max(_MIN_SAMPLES, int(repeat))
    batches = [_batch(budget / repeat / 2, run(1)) for run in (a, b)]
    sa, sb = _sample([a, b], batches, repeat, budget, gap)
    return _timing(sa, batches[0]), _timing(sb, batches[1]), [x - y for x, y in zip(sa, sb)]


def measure_rounds(
    runners: Sequence[BatchRunner], repeat: int, budget: float, gaps: Optional[Sequence[float]] = None
) -> tuple[list[Timing], list[list[float]]]:
    """Time several operations in rounds, one batch of each in turn (a, b, c, a, b, c, ...),
    so that all see the same state of a shared machine: :func:`measure_difference` for more
    than two.

    All have run before (no warm-up). Each runner's batch is sized from its own single call
    to take about ``budget / repeat / len(runners)`` seconds. ``gaps``: seconds to sleep
    (uncounted) before each runner's batch, one figure per runner, e.g. before and after
    another OpenMP runtime's batch.

    Returns:
        each runner's timing per call, and its samples (seconds per call), one list per
        runner, aligned by round: ``samples[i][k] - samples[j][k]`` pairs two batches that
        ran side by side.
    """
    runners = list(runners)
    repeat = max(_MIN_SAMPLES, int(repeat))
    batches = [_batch(budget / repeat / len(runners), run(1)) for run in runners]
    samples = _sample(runners, batches, repeat, budget, list(gaps) if gaps is not None else 0.0)
    return [_timing(s, b) for s, b in zip(samples, batches)], samples


def settle(seconds: float = 0.05) -> None:
    """Sleep briefly so that OpenMP worker threads of the previous runner stop spinning."""
    time.sleep(seconds)


# -- memory -------------------------------------------------------------------------------
def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs``); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_bytes() -> tuple[Optional[int], Optional[int]]:
    """(current RSS, peak RSS since the last reset) in bytes, from ``/proc/self/status``.

    Falls back to ``resource.getrusage`` (process-lifetime peak, no current) elsewhere.
    """
    try:
        values = {}
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name, kb = line.split()[:2]
                    values[name] = int(kb) * 1024
        return values.get("VmRSS:"), values.get("VmHWM:")
    except OSError:
        try:
            import resource

            return None, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        except ImportError:  # pragma: no cover - not POSIX
            return None, None


def allocated_per_call(fn: Callable[[], Any], calls: int = 3, warm: bool = False) -> int:
    """Bytes allocated during one call that tracemalloc sees (Python objects and NumPy buffers).

    Measured as the peak traced memory during the call minus the traced memory before it,
    so a returned array counts; the smallest over ``calls`` calls is returned (after a
    warm-up call unless ``warm``). Memory
    oneDNN allocates itself (its scratchpad) goes through C++ and is not included.
    """
    import tracemalloc

    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        if not warm:
            fn()
        best: Optional[int] = None
        for _ in range(max(1, calls)):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            result = fn()
            peak = tracemalloc.get_traced_memory()[1]
            del result
            best = peak - before if best is None else min(best, peak - before)
        return max(0, best or 0)
    finally:
        if not was_tracing:
            tracemalloc.stop()


class LoadMonitor:
    """CPU time used by other processes, in CPUs on average, between two readings.

    Linux only (``/proc/stat``); elsewhere :meth:`others` returns None. A busy machine makes
    timings slower and noisier; the report shows this figure per configuration.
    """

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> Optional[tuple[float, float, float]]:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / hz  # user..steal, no guest (already in user)
        t = os.times()
        return busy, t.user + t.system, time.monotonic()

    def restart(self) -> None:
        self._start = self._read()

    def others(self) -> Optional[float]:
        """CPUs busy with other processes since the start (or last restart), on average."""
        end = self._read()
        if self._start is None or end is None:
            return None
        busy = end[0] - self._start[0]
        mine = end[1] - self._start[1]
        wall = end[2] - self._start[2]
        return max(0.0, (busy - mine) / wall) if wall > 0 else None


def wait_for_quiet(limit: float, threshold: float = 0.15, probe: float = 0.5) -> Optional[float]:
    """Wait up to ``limit`` seconds until other processes use less than ``threshold`` CPUs.

    Returns the last load seen (None where it cannot be read).
    """
    deadline = time.monotonic() + limit
    while True:
        mon = LoadMonitor()
        time.sleep(probe)
        load = mon.others()
        if load is None or load < threshold or time.monotonic() >= deadline:
            return load

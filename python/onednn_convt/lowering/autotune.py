"""Measured autotuning: time every lowering of a problem once, keep the fastest.

Off by default. ``onednn_convt.set_autotune(True)``, or ``ONEDNN_CONVT_AUTOTUNE=1`` in the
environment (read at import), turns it on. The first call of each input signature then:

1. lists the problem's candidates (:func:`onednn_convt.lowering.candidates`: valid on this
   CPU, none a guard forbids); with one candidate there is nothing to tune;
2. compiles each one (natively, or in f32 where the library has no kernel in the dtype) and
   runs it on seeded random inputs of the call's shapes and dtype (never the caller's data,
   which may hold Inf or NaN);
3. drops a candidate whose result disagrees with the rules' choice beyond the dtype's
   rounding (:func:`agree`), or that the library refuses;
4. screens them on a batch of 1 (a candidate :data:`SLOW_FACTOR` times slower than the
   fastest there is not run at full size), then times the rest in alternating rounds: each
   round runs every candidate for about :data:`SAMPLE_SECONDS`; the median of up to
   :data:`ROUNDS` rounds, fewer where they would pass :data:`BUDGET_SECONDS`. A call that
   would take longer than :data:`LONG_CALL_SECONDS` is timed on a smaller batch. Every
   candidate's first run pays one-time costs (page faults, scratchpads) and is never
   timed; one whose faster of the next :data:`SCREEN_RUNS` runs took :data:`SLOW_FACTOR`
   times the fastest is not timed further. The rules' choice stays unless another is at least :data:`MARGIN` faster
   (noise does not flip choices), in these rounds and again in a second timing of the two
   alone (:func:`_confirmed`);
5. stores the choice in the persistent cache (:mod:`.tuning_cache`), so that another
   process with the same oneDNN, ISA and thread count compiles the chosen lowering only;
6. where the choice overturned the rules', the next process to use it times the two again,
   alone, before it trusts it (:func:`_rechecked`): a change must hold in :data:`CHECKS`
   processes, so that a choice made while the machine was in a slow phase (which slows
   memory-bound lowerings more than others) is not kept for good.

``op.lowering`` then ends in ``(tuned: <name>)`` and ``op.tuning`` holds the
:class:`Tuning`. Fused calls are not tuned (they run the rules' core).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from .. import dtypes, environment, limits, native
from ..errors import OneDNNError
from ..problem import BACKWARD_WEIGHTS, FORWARD, Problem
from . import build, candidates, tuning_cache

if TYPE_CHECKING:
    from ..plan import Target

#: rounds of timing, alternating the candidates (fewer when they would exceed BUDGET_SECONDS)
ROUNDS = 5
#: about the most the timing rounds of one problem take, in seconds (at least 2 rounds run)
BUDGET_SECONDS = 1.0
#: a candidate whose screening runs took this many times the fastest one's is not timed further
SLOW_FACTOR = 4.0
#: timed runs of each candidate after its first, the fastest kept as its screening time: one
#: run's stall (measured on an AMD Zen5 KVM guest: a 0.2 ms MatMul's second run at 1 s, a
#: 1 ms ConvTranspose's at 53 ms) must not drop a candidate as slow
SCREEN_RUNS = 2
#: the least time one timed sample of a candidate runs (repeating the call)
SAMPLE_SECONDS = 0.01
#: a call estimated (from its batch-1 screening run) to take longer than this, in seconds, is
#: timed on the largest batch whose calls take at most about this long (at least 1: then the
#: screening's compiled partitions serve again), and its times scaled to the call's batch:
#: every op's work grows linearly with the batch, and timing a 0.2 s call (HiFi-GAN) in
#: rounds cost 3-7 s a signature at full size
LONG_CALL_SECONDS = 0.015
#: another candidate replaces the rules' choice only when its median is this much lower, in
#: the timing of every candidate and in a second timing of the two (:func:`_confirmed`)
MARGIN = 0.05
#: processes whose timings must each show a change from the rules' choice MARGIN faster before
#: the cache holds it for good: the tuning process, then the first process to use the choice.
#: An autotuned bench on an AMD Zen4 KVM guest cached ConvolutionBackwardData for a 3-D k2 s2
#: bf16 forward, timed at 1.12 ms against 1.42 ms for the rules' MatMul in both of its timings;
#: in five other processes the MatMul took 0.58-0.76 ms and ConvolutionBackwardData 0.72-0.79
CHECKS = 2
#: largest |difference| between two candidates' results, over the largest |result|, per dtype
TOLERANCE = {"f32": 1e-4, "bf16": 2e-2, "f16": 4e-3}

#: the tuner's clock, in seconds: every time it measures (screening, timing rounds, what
#: tuning cost) is a difference of two readings of it. Tests replace it with a fake clock
#: (``monkeypatch.setattr(autotune, "clock", ...)``), so that no test's outcome depends on
#: how busy the machine is.
clock: Callable[[], float] = time.perf_counter

_enabled = environment.switch("ONEDNN_CONVT_AUTOTUNE", False)


def enabled() -> bool:
    """Whether autotuning is on."""
    return _enabled


def set_autotune(on: bool) -> None:
    """Turn autotuning on or off for this process (op objects already planned keep their
    plans; new signatures follow the setting). Turning it on reads the cache file (once per
    process), so that the first call of a signature tuned before pays for nothing but its
    compile.

    Raises:
        TypeError: ``on`` is not a bool.
    """
    global _enabled
    if not isinstance(on, bool):
        msg = f"set_autotune: argument 'on' expected a bool, got {on!r}"
        raise TypeError(msg)
    _enabled = on
    if on:  # the cache file is read here, not in the first call of a tuned signature
        tuning_cache.preload()


if _enabled:  # ONEDNN_CONVT_AUTOTUNE: the file is read at import, as set_autotune(True) reads it
    tuning_cache.preload()


@dataclass(frozen=True)
class Tuning:
    """How autotuning chose a problem's lowering.

    Attributes:
        name: the chosen lowering (a name from :func:`onednn_convt.lowering.candidates`).
        rule: the lowering the rules pick.
        times_us: median call time of each candidate that was timed, in microseconds, at the
            problem's batch (measured on ``batch``, scaled by the ratio of the batches).
        rejected: candidate -> why it was not timed (refused by the library, or disagreed).
        cached: the choice came from the cache file (no timing in this process).
        seconds: what tuning cost this process (compiling and timing; 0 from the cache).
        batch: the batch the candidates were timed on (the problem's, or smaller for a long
            call: :data:`LONG_CALL_SECONDS`).
        confirm_us: where a candidate beat the rules' choice, the second timing of the two
            (:func:`_confirmed`), in microseconds as ``times_us``; empty otherwise.
        checks: processes whose timings confirmed the change from the rules' choice (0 where
            the rules' choice stands); the choice is settled at :data:`CHECKS`.
        recheck_us: the timing of the two in the process after the tuning one
            (:func:`_rechecked`), in microseconds as ``times_us``; empty until then.
    """

    name: str
    rule: str
    times_us: dict[str, float]
    rejected: dict[str, str] = field(default_factory=dict)
    cached: bool = False
    seconds: float = 0.0
    batch: int = 0
    confirm_us: dict[str, float] = field(default_factory=dict)
    checks: int = 0
    recheck_us: dict[str, float] = field(default_factory=dict)

    @property
    def settled(self) -> bool:
        """Whether the cache may hold this choice without timing it again: the rules' own,
        or a change confirmed in :data:`CHECKS` processes."""
        return self.name == self.rule or self.checks >= CHECKS


def choice(target: Target, problem: Problem) -> Optional[Tuning]:
    """The tuned choice for ``problem`` planned for ``target`` (None: one candidate, nothing to tune)."""
    names = candidates(problem, native=target.strict)  # strict: no library op in f32 for speed
    if len(names) == 1 or not _affordable(problem):
        return None
    key = problem.key() + (" constant-weights" if target.constant_weights else "")
    entry = tuning_cache.lookup(key, names)
    if entry is not None:
        cached = Tuning(entry["name"], names[0], dict(entry["times_us"]), dict(entry.get("rejected", {})),
                        cached=True, batch=int(entry.get("batch", problem.n)),
                        confirm_us=dict(entry.get("confirm_us", {})),
                        checks=int(entry.get("checks", 0 if entry["name"] == names[0] else 1)),
                        recheck_us=dict(entry.get("recheck_us", {})))
        if cached.settled or tuning_cache.stored_here(key):  # (the tuning process trusts its own timing)
            return cached
        start = clock()
        tuning = replace(_rechecked(target, problem, cached), seconds=clock() - start)
    else:
        start = clock()
        tuning = replace(_measure(target, problem, names), seconds=clock() - start)
    tuning_cache.store(key, {"name": tuning.name, "candidates": names, "times_us": tuning.times_us,
                             "rejected": tuning.rejected, "batch": tuning.batch, "confirm_us": tuning.confirm_us,
                             "checks": tuning.checks, "recheck_us": tuning.recheck_us})
    return tuning


def _affordable(p: Problem) -> bool:
    """Whether the tuner's own arrays for ``p`` fit in :func:`onednn_convt.limits.memory_limit`:
    its random inputs, and a result and an ``out=`` per candidate, of the call's shapes in
    f32 at most (a bf16 candidate emulated in f32 widens them). A problem past it is not
    tuned: its call then meets the op's own limit checks (a documented error where the
    op's plan is past them too), not a MemoryError from the tuner's allocation."""
    limit = limits.memory_limit()
    if limit is None:
        return True
    elements = sum(math.prod(s) for s in p.input_shapes) + 3 * math.prod(p.out_shape)
    return elements * 4 <= limit


def _screened(target: Target, problem: Problem, names: list[str]) -> tuple[list[str], dict[str, float], float]:
    """The candidates worth timing at full size, the others' estimated seconds, and the
    fastest candidate's batch-1 seconds (0: not screened): each runs on a batch of 1 (every
    op's work grows linearly with the batch: the estimate is that time times the batch, an
    upper bound where a kernel's fixed costs dominate one sample), and one whose faster of
    :data:`SCREEN_RUNS` runs after the first took :data:`SLOW_FACTOR` times the fastest's is
    left out. Some of
    oneDNN 3.2's kernels are three orders of magnitude slower than the others (f16
    BackwardWeights on an AVX512-FP16 CPU: 15 s a call on the DCGAN layer where the f32
    kernel takes 15 ms); this keeps tuning from running them at full size."""
    if problem.n == 1:
        return names, {}, 0.0
    small = _with_batch(problem, 1)
    arrays = _inputs(small)
    seconds: dict[str, float] = {}
    for name in names:
        try:
            plan = target.plan(build(small, name), arrays, None, small.dtype)
            plan.run(arrays, None)  # a first run pays one-time costs (page faults, scratchpads)
            seconds[name] = min(_run_time(lambda: plan.run(arrays, None)) for _ in range(SCREEN_RUNS))  # noqa: B023
        except (OneDNNError, MemoryError, ValueError):
            seconds[name] = 0.0  # judged at full size, where the refusal is recorded
    fastest = min((s for s in seconds.values() if s > 0), default=0.0)
    if not fastest:
        return names, {}, 0.0
    keep = [n for n in names if seconds[n] <= SLOW_FACTOR * fastest]
    estimates = {n: seconds[n] * problem.n for n in names if n not in keep}
    return keep, estimates, fastest


def _with_batch(p: Problem, n: int) -> Problem:
    """``p`` with batch ``n`` (the activations' first axis in NCX and NXC alike)."""
    activations = {0, 1} if p.op == BACKWARD_WEIGHTS else {0}
    shapes = tuple((n, *s[1:]) if i in activations else s for i, s in enumerate(p.input_shapes))
    out = p.out_shape if p.op == BACKWARD_WEIGHTS else (n, *p.out_shape[1:])
    return replace(p, n=n, input_shapes=shapes, out_shape=out)


def _measure(target: Target, full: Problem, names: list[str]) -> Tuning:
    rule = names[0]
    names, estimates, one = _screened(target, full, names)
    batch = full.n
    if one * full.n > LONG_CALL_SECONDS:  # a long call: time a smaller batch
        batch = max(1, min(full.n, math.floor(LONG_CALL_SECONDS / one)))
    problem = _with_batch(full, batch)
    runs, results, once, rejected = _prepared(target, problem, names)
    # the results are checked against the rules' lowering's, or where screening left that
    # out (far too slow), the first candidate's
    judge = rule if rule in results else next(iter(results), None)
    if judge is None:  # nothing ran: keep the rules' choice
        return Tuning(rule, rule, {}, rejected, batch=batch)
    for name in list(runs):
        if not agree(results[name], results[judge], problem.dtype):
            rejected[name] = "disagreed with the rules' lowering" if judge == rule else f"disagreed with {judge}"
            del runs[name]
    fastest = min((once[n] for n in runs), default=0.0)
    slow = {n: once[n] for n in runs if once[n] > SLOW_FACTOR * fastest}
    for name in slow:  # far behind already: its second run stands as its time
        del runs[name]
    scale = full.n / batch
    times = {**{n: t * scale for n, t in {**_time(runs, once), **slow}.items()}, **estimates}
    best = min(times, key=times.__getitem__)
    chosen = best if times[best] < (1 - MARGIN) * times.get(rule, math.inf) else rule
    again: dict[str, float] = {}
    if chosen != rule and best in runs and rule in runs:
        again = {n: t * scale for n, t in _time({best: runs[best], rule: runs[rule]}, once).items()}
        chosen = _confirmed(best, rule, again)
    return Tuning(chosen, rule, _us(times), rejected, batch=batch, confirm_us=_us(again),
                  checks=int(chosen != rule))


def _prepared(target: Target, problem: Problem, names: list[str]) -> tuple[
        dict[str, Any], dict[str, np.ndarray], dict[str, float], dict[str, str]]:
    """Each candidate planned for ``problem`` and run once on the tuner's inputs: its
    runner, its result (float64), the faster of :data:`SCREEN_RUNS` timed runs after that
    first one (seconds), and for a candidate the library refuses here, why."""
    arrays = _inputs(problem)
    if target.constant_weights:  # the private op of a ConstantWeights: its weights are read-only
        arrays[1].flags.writeable = False
    runs: dict[str, Any] = {}
    results: dict[str, np.ndarray] = {}
    once: dict[str, float] = {}
    rejected: dict[str, str] = {}
    for name in names:
        try:
            plan = target.plan(build(problem, name), arrays, None, problem.dtype)
            results[name] = np.asarray(plan.run(arrays, None), np.float64)
        except (OneDNNError, MemoryError, ValueError) as e:  # refused here: not a candidate
            rejected[name] = f"{type(e).__name__}: {e}"
            continue
        out = np.empty(plan.lowering.out_shape, plan.dtype)
        runs[name] = _runner(plan, arrays, out)
        once[name] = min(_run_time(runs[name]) for _ in range(SCREEN_RUNS))
    return runs, results, once, rejected


def _rechecked(target: Target, full: Problem, cached: Tuning) -> Tuning:
    """``cached`` (a change from the rules' choice, confirmed in fewer than :data:`CHECKS`
    processes) after this process timed the two again, alone and alternated, on the batch
    the tuning process used: one more check where the change holds by :data:`MARGIN`, else
    the rules' choice (settled: it is not timed again). A change the library now refuses
    falls back to the rules' choice too."""
    batch = min(full.n, max(1, cached.batch or full.n))
    runs, _, once, refused = _prepared(target, _with_batch(full, batch), [cached.name, cached.rule])
    if refused:
        return replace(cached, name=cached.rule, cached=False, checks=0, rejected={**cached.rejected, **refused})
    again = {n: t * full.n / batch for n, t in _time(runs, once).items()}
    kept = _confirmed(cached.name, cached.rule, again)
    return replace(cached, name=kept, cached=False, checks=cached.checks + 1 if kept == cached.name else 0,
                   recheck_us=_us(again))


def _confirmed(best: str, rule: str, again: dict[str, float]) -> str:
    """``best`` where its second timing against the rules' choice (``again``: the two alone,
    alternated) is :data:`MARGIN` faster too, else ``rule``. A stall that slowed the rules'
    choice through the first timing's rounds does not decide: an autotuned bench on an AMD
    Zen4 KVM guest timed ConvolutionBackwardWeights at 1.64 ms there, against 0.61-0.79 ms in
    five other runs, and cached polyphase (0.83 ms; 1.16 ms in the bench) for good."""
    return best if again[best] < (1 - MARGIN) * again[rule] else rule


def _us(seconds: dict[str, float]) -> dict[str, float]:
    return {n: round(t * 1e6, 2) for n, t in seconds.items()}


def _run_time(run: Callable[[], Any]) -> float:
    """Seconds of one call of ``run`` on the tuner's clock."""
    start = clock()
    run()
    return clock() - start


def _runner(plan: Any, arrays: list[Any], out: np.ndarray) -> Any:
    """A call of ``plan`` as the op makes it: through the plan's C++ executor where it has
    one (as every call after the first does), else through ``plan.run``. Per-call costs
    decide small problems: the tiny suite's f16 forward computed in f32 took 3.7 us through
    the executor and 6.3 us through ``plan.run`` (Sapphire Rapids), its native f16 kernel
    5.8 us."""
    fast = plan.executor
    if fast is not None:
        given = tuple(arrays if arrays[-1] is not None else arrays[:-1])  # as the op's call does
        try:
            fast.run(given, out)
            return lambda: fast.run(given, out)
        except native.SignatureMismatch:  # (checked before and after the run: the plan's way)
            pass
    return lambda: plan.run(arrays, out)


def agree(a: np.ndarray, b: np.ndarray, code: str) -> bool:
    """Whether two lowerings' results of one problem agree: every element finite and within
    :data:`TOLERANCE` of the largest |element| (results of another summation order and,
    for bf16/f16, of rounding at other points)."""
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return False
    scale = max(float(np.abs(b).max()), 1e-30)
    return float(np.abs(a - b).max()) <= TOLERANCE.get(code, 1e-4) * scale


def _time(runs: dict[str, Any], once: dict[str, float]) -> dict[str, float]:
    """Median seconds per call of each runner, over alternating rounds (``once``: a run's
    seconds, for the calls per sample: at least SAMPLE_SECONDS of them)."""
    once = {name: max(once[name], 1e-7) for name in runs}
    repeats = {name: max(1, min(1000, math.ceil(SAMPLE_SECONDS / once[name]))) for name in runs}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    per_round = sum(repeats[n] * once[n] for n in runs) or SAMPLE_SECONDS
    rounds = max(2, min(ROUNDS, int(BUDGET_SECONDS / per_round)))
    for r in range(rounds):
        for name in order[r % len(order):] + order[: r % len(order)]:  # rotate who goes first
            run, k = runs[name], repeats[name]
            start = clock()
            for _ in range(k):
                run()
            samples[name].append((clock() - start) / k)
    return {name: float(np.median(s)) for name, s in samples.items()}


def _inputs(p: Problem) -> list[Any]:
    """Seeded random inputs of the problem's shapes, dense, in its dtype (values of the
    size a trained layer sees: standard normal activations, weights scaled by 1/sqrt(fan-in))."""
    rng = np.random.default_rng(0)
    dtype = dtypes.FLOAT_DTYPES[p.dtype]
    fan_in = p.ic // p.groups * math.prod(p.kernel)
    arrays: list[Any] = []
    for i, shape in enumerate(p.input_shapes):
        scale = 1 / math.sqrt(fan_in) if (i == 1 and p.op != BACKWARD_WEIGHTS) else 1.0
        arrays.append((rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype))
    if p.op == FORWARD and not p.bias:
        arrays.append(None)
    if p.op == BACKWARD_WEIGHTS:
        arrays.append(None)  # weights_shape: the problem has it
    return arrays

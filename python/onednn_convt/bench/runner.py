"""Measure one configuration: our call, the native loop, PyTorch, the reference, memory, cache.

Order per configuration: the compile cache is cleared and the peak-RSS mark reset; the
first call is timed (it compiles); then our call (allocating its result, as PyTorch
does), our call with ``out=``, and the native loop are timed; the cache counters and peak
RSS are read; for ops with weights, the out= call with the weights bound as constant is
timed against the plain out= call; tracemalloc measures the bytes allocated per call; then
PyTorch and, on small shapes, the reference run. A short pause separates the runners, so one OpenMP pool's
spinning threads do not slow the next.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..info import cache_info, clear_cache
from . import inference_peers, peers, timing
from .peak import peak_for
from .suites import Config


@dataclass
class Options:
    """How much effort each measurement gets.

    Attributes:
        repeat: samples per measurement.
        budget: seconds per measurement, about.
        torch: compare with PyTorch when it is installed.
        reference: time the NumPy reference on small shapes.
        memory: measure tracemalloc bytes per call.
        wait_idle: before each configuration, wait up to this many seconds for other
            processes to leave the CPUs alone.
        torch_limit: in bf16/f16, when a PyTorch call is estimated (from batch 1) to take
            longer than this many seconds, report the estimate instead of running it.
        peers: inference runtimes to compare with, where they fit
            (:data:`.inference_peers.PEERS`: ``onnxruntime``, ``openvino``).
        threads: the thread count the peers' pools get (oneDNN's and PyTorch's are set by
            the caller: ``bench.cli.set_threads``).
    """

    repeat: int = 11
    budget: float = 0.5
    torch: bool = True
    reference: bool = True
    memory: bool = True
    wait_idle: float = 0.0
    torch_limit: float = 5.0
    peers: tuple[str, ...] = ()
    threads: int = 1


#: seconds of sleep before each batch when ours and PyTorch's calls alternate
_PAIR_GAP = 0.02


def _ms(t: Optional[timing.Timing]) -> Optional[float]:
    return None if t is None else t.median * 1e3


def run_config(cfg: Config, opts: Options, peak: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration; returns a flat record (times in ms unless named otherwise).

    Failures are recorded in ``error`` rather than raised, so one bad configuration does
    not end a run.
    """
    lay = cfg.layer
    rec: dict[str, Any] = {
        "key": cfg.key, "suite": cfg.suite, "layer": lay.name, "op": cfg.op, "dtype": cfg.dtype,
        "format": cfg.data_format, "weights_format": cfg.weights_format,
        "shape": lay.describe() + (" +bias" if cfg.bias else ""), "bias": cfg.bias,
        "flops": cfg.flops, "compute_bound": lay.compute_bound,
        "sweep_axis": lay.sweep[0] if lay.sweep else None, "sweep_value": lay.sweep[1] if lay.sweep else None,
    }
    if opts.wait_idle > 0:
        timing.wait_for_quiet(opts.wait_idle)
    try:
        _measure_ours(cfg, opts, peak, rec)
    except Exception as e:  # noqa: BLE001 - reported per configuration
        rec["error"] = f"{type(e).__name__}: {e}"
    return rec


#: pairs of first calls (a tuned second process's, the untuned one) per autotuned configuration
FIRST_CALL_PAIRS = 4


def measure_first_calls(cfg: Config, rec: dict[str, Any], pairs: int = FIRST_CALL_PAIRS) -> None:
    """A tuned second process's first call against the untuned first call, side by side.

    For an autotuned configuration (its choice in the cache file): ``pairs`` rounds, each of
    a tuned first call and an untuned one (autotuning off: the rules' choice compiled),
    which of the two goes first alternating from round to round, every compile cache (ours
    and oneDNN's) cleared before each. Before the tuned call, the cache file is read afresh
    by turning autotuning on, as a new process does (timed apart: ``cache_read_ms``; the
    package's import of platformdirs is not in it, this process having imported it), and
    before each call the garbage is collected, so that a collection of what the parse left
    does not fall into the tuned call alone.
    Records the medians (``first_tuned_ms``, ``first_untuned_ms``), their ratio
    (``first_tuned_vs_untuned``) and the tuned call's lowering string."""
    from ..lowering import autotune, tuning_cache

    times: dict[bool, list[float]] = {True: [], False: []}
    reads: list[float] = []
    was = autotune.enabled()
    try:
        for i in range(pairs):
            for tuned in ((True, False) if i % 2 == 0 else (False, True)):  # each first in turn
                case = cfg.build()
                tuning_cache.forget()
                start = time.perf_counter()
                autotune.set_autotune(tuned)
                if tuned:
                    reads.append(time.perf_counter() - start)
                gc.collect()  # both calls start with no garbage (the file's parse leaves some)
                clear_cache()
                start = time.perf_counter()
                case.op(*case.args)
                times[tuned].append(time.perf_counter() - start)
                if tuned:
                    rec["first_tuned_lowering"] = case.op.lowering
    finally:
        autotune.set_autotune(was)
    rec["cache_read_ms"] = statistics.median(reads) * 1e3
    rec["first_tuned_ms"] = statistics.median(times[True]) * 1e3
    rec["first_untuned_ms"] = statistics.median(times[False]) * 1e3
    rec["first_tuned_vs_untuned"] = rec["first_tuned_ms"] / rec["first_untuned_ms"]


def _measure_ours(cfg: Config, opts: Options, peak: dict[str, Any], rec: dict[str, Any]) -> None:
    case = cfg.build()
    op, args = case.op, case.args
    monitor = timing.LoadMonitor()

    clear_cache()
    c0 = cache_info()
    timing.reset_peak_rss()
    rss_before, _ = timing.rss_bytes()
    start = time.perf_counter()
    result = op(*args)
    first = time.perf_counter() - start
    c1 = cache_info()
    out = np.empty_like(result)
    op(*args, out=out)
    c2 = cache_info()
    plan = op.last_plan
    rec["lowering"] = op.lowering
    tuned = op.tuning
    if tuned is not None and tuned.recheck_us and not tuned.cached:  # this call timed a tuned change again
        rec["recheck_us"] = tuned.recheck_us
    rec["emulated"] = bool(plan.emulated)
    rec["first_call_ms"] = first * 1e3
    rec["compile_misses"] = c1["misses"] - c0["misses"]

    # every runner below has run already (the first call and the out= call), so no warm-up
    ours = timing.measure(timing.python_runner(lambda: op(*args)), opts.repeat, opts.budget, warm=True)
    # out= call and native loop in alternating batches: their difference is the binding's
    # overhead, which a shared machine's drift between two separate measurements would swamp
    run_native, note = peers.native_runner(case)
    ours_out, native, pairs = timing.measure_difference(
        timing.python_runner(lambda: op(*args, out=out)), run_native, opts.repeat, opts.budget
    )
    c3 = cache_info()
    _, rss_peak = timing.rss_bytes()
    # the errors below are judged on the first call and on a steady one (the path timed)
    steady = op(*args)
    bound = _measure_constant_weights(op, args, out, opts, rec) if hasattr(op, "with_constant_weights") else None

    rec["compile_ms"] = max(0.0, first - ours.median) * 1e3
    _record_ours(rec, ours)
    rec["out_median_ms"] = ours_out.median * 1e3
    rec["native_ms"] = native.median * 1e3
    rec["native_best_ms"] = native.best * 1e3
    rec["native_note"] = note
    rec["overhead_pairs_us"] = [d * 1e6 for d in pairs]
    rec["overhead_us"] = statistics.median(pairs) * 1e6
    rec["repeat_misses"] = c3["misses"] - c1["misses"]
    rec["repeat_hits"] = c3["hits"] - c1["hits"]
    rec["plan_compiles"] = c2["misses"] - c1["misses"]
    rec["rss_peak_mb"] = None if rss_peak is None else rss_peak / 2**20
    rec["rss_growth_mb"] = None if rss_peak is None or rss_before is None else (rss_peak - rss_before) / 2**20
    if opts.memory:
        calls = 3 if ours.median < 0.01 else 1
        rec["alloc_bytes"] = timing.allocated_per_call(lambda: op(*args), calls, warm=True)
        rec["alloc_out_bytes"] = timing.allocated_per_call(lambda: op(*args, out=out), calls, warm=True)

    if opts.torch:
        _measure_torch(case, opts, steady, rec, lambda: op(*args))
    if opts.peers:
        _measure_inference_peers(case, opts, steady, rec, bound)
    gflops = cfg.flops / (rec["median_ms"] / 1e3) / 1e9
    rec["gflops"] = gflops
    rec["pct_peak"] = 100.0 * gflops / peak_for(peak, cfg.dtype) if peak else None
    if opts.reference:
        _measure_reference(case, opts, (result, steady, out), rec)
    rec["others_cpu"] = monitor.others()


def _measure_constant_weights(
    op: Any, args: Sequence[Any], out: np.ndarray, opts: Options, rec: dict[str, Any]
) -> Callable[[], Any]:
    """The same call with the weights bound as constant (``op.with_constant_weights``: the
    library reorders them once), timed with out= in alternating batches against the plain
    out= call. ``const_equal``: both wrote the same bytes; ``const_err``: how far apart the
    two results are (:func:`peers.relative_error`, the plain one as the scale), which
    :func:`wrong` checks; ``const_lowering``: the bound op's lowering (autotuning may time
    it to another one than the plain op's). Returns that call (allocating its result),
    compiled, for the inference peers (:func:`_measure_inference_peers`)."""
    bound = op.with_constant_weights(args[1])
    rest = (args[0], *args[2:])
    const_out = np.empty_like(out)
    bound(*rest, out=const_out)  # compiles; reorders the weights into the constant cache
    op(*args, out=out)
    rec["const_equal"] = bool(np.array_equal(const_out.view(np.uint8), out.view(np.uint8)))
    rec["const_lowering"] = bound.lowering
    rec["const_err"] = peers.relative_error(const_out, out)
    plain, const, _ = timing.measure_difference(
        timing.python_runner(lambda: op(*args, out=out)),
        timing.python_runner(lambda: bound(*rest, out=const_out)), opts.repeat, opts.budget,
    )
    rec["const_out_ms"] = const.median * 1e3
    rec["const_gain"] = plain.median / const.median
    return lambda: bound(*rest)


def _record_ours(rec: dict[str, Any], t: timing.Timing) -> None:
    rec["median_ms"] = t.median * 1e3
    rec["iqr_ms"] = t.iqr * 1e3
    rec["best_ms"] = t.best * 1e3
    rec["samples"] = t.samples


def _torch_estimate(case: Any, opts: Options) -> Optional[float]:
    """Seconds per PyTorch call estimated from batch 1 (times N), when that exceeds
    ``opts.torch_limit``; None otherwise. Only for bf16/f16, where PyTorch on CPUs without
    native kernels can take a minute per call."""
    cfg = case.config
    if cfg.dtype == "f32" or cfg.layer.n == 1 or opts.torch_limit <= 0:
        return None
    small = replace(cfg, layer=replace(cfg.layer, n=1)).build()
    call = peers.torch_call(small)
    if call is None:
        return None
    start = time.perf_counter()
    call()
    estimate = (time.perf_counter() - start) * cfg.layer.n
    return estimate if estimate > opts.torch_limit else None


def _measure_torch(
    case: Any, opts: Options, ours: np.ndarray, rec: dict[str, Any], our_call: Callable[[], Any]
) -> None:
    """Time PyTorch's call. Where it is quick enough to sample, it is timed in alternating
    batches with ``our_call`` (a sleep before each batch lets the other OpenMP runtime's
    threads stop spinning), and our figures in ``rec`` are replaced by that paired
    measurement: the ratio then compares two timings of the same moments of a shared
    machine, whose drift between separate measurements was up to 2x here."""
    call = peers.torch_call(case)
    if call is None:
        return
    timing.settle()
    try:
        estimate = _torch_estimate(case, opts)
    except RuntimeError:
        estimate = None  # the full call below reports the error
    if estimate is not None:
        rec["torch_ms"] = estimate * 1e3
        rec["torch_estimated"] = True
        rec["vs_torch"] = estimate / (rec["median_ms"] / 1e3)
        timing.settle()
        return
    try:
        start = time.perf_counter()
        first_result = call()  # PyTorch creates its primitives here
        first = time.perf_counter() - start
        rec["torch_err"] = peers.relative_error(peers.torch_to_numpy(case, first_result), ours)
        once = None
        if first > 10 * opts.budget:  # very slow: the first call is the figure
            once = first
        elif first > 2 * opts.budget:  # too slow to sample: one more call is the figure
            start = time.perf_counter()
            call()
            once = time.perf_counter() - start
        if once is None:
            mine, t, _ = timing.measure_difference(
                timing.python_runner(our_call), timing.python_runner(call), opts.repeat, 2 * opts.budget,
                gap=_PAIR_GAP,
            )
            _record_ours(rec, mine)
            rec["paired_with_torch"] = True
        else:
            t = timing.measure(timing.python_runner(call), opts.repeat, opts.budget, once=once, warm=True)
    except RuntimeError as e:  # e.g. a dtype PyTorch has no CPU kernel for
        rec["torch_error"] = str(e).splitlines()[0][:200]
        return
    finally:
        timing.settle()
    rec["torch_ms"] = t.median * 1e3
    rec["torch_iqr_ms"] = t.iqr * 1e3
    rec["torch_best_ms"] = t.best * 1e3
    rec["vs_torch"] = t.median / (rec["median_ms"] / 1e3)


def _measure_inference_peers(
    case: Any, opts: Options, ours: np.ndarray, rec: dict[str, Any], bound: Optional[Callable[[], Any]]
) -> None:
    """Time the inference runtimes of ``opts.peers`` where they fit the configuration
    (:mod:`.inference_peers`): each graph holds the weights as constants, so our call runs
    with the weights bound as constant too (``bound``, from ``op.with_constant_weights``;
    None for an op without weights, which no peer fits). The peers and our
    call are timed in rounds, one batch of each in turn after a short sleep (another
    runtime's threads stop spinning), so that all see the same moments of the machine.

    Records, per peer (prefix ``ort`` for ONNX Runtime, ``ov`` for OpenVINO): ``<p>_ms``,
    ``vs_<p>`` (its time over ours: > 1, we are faster), ``<p>_err`` (its first result
    against our steady one, as ``torch_err``), ``<p>_precision`` (the dtype its kernel
    computed in), or ``<p>_note`` (why it does not fit) or ``<p>_error`` (it failed); and
    ``peers_ours_ms``, our bound call's time in those rounds."""
    cfg = case.config
    runs, names = [], []
    for peer in opts.peers:
        prefix = inference_peers.PREFIX[peer]
        why = inference_peers.unfit(peer, cfg)
        if why is not None:
            rec[f"{prefix}_note"] = why
            continue
        try:
            compiled = inference_peers.call(peer, case, opts.threads)
            rec[f"{prefix}_err"] = peers.relative_error(compiled.run(), ours)
        except Exception as e:  # noqa: BLE001 - a peer's failure is its own field, not the row's
            first_line = (str(e).strip().splitlines() or [""])[0]
            rec[f"{prefix}_error"] = f"{type(e).__name__}: {first_line[:200]}"
            continue
        rec[f"{prefix}_precision"] = compiled.precision
        runs.append(compiled.run)
        names.append(prefix)
    if not runs or bound is None:
        return
    runners = [timing.python_runner(bound), *(timing.python_runner(r) for r in runs)]
    timing.settle()
    try:
        times, _ = timing.measure_rounds(runners, opts.repeat, len(runners) * opts.budget,
                                         gaps=[_PAIR_GAP] * len(runners))
    finally:
        timing.settle()
    rec["peers_ours_ms"] = times[0].median * 1e3
    for prefix, t in zip(names, times[1:]):
        rec[f"{prefix}_ms"] = t.median * 1e3
        rec[f"vs_{prefix}"] = t.median / times[0].median


def _measure_reference(case: Any, opts: Options, ours: Sequence[np.ndarray], rec: dict[str, Any]) -> None:
    """Time the reference; ``ref_err`` is the worst error of ``ours`` (the first call, a
    steady call and an out= call) against it."""
    call = peers.reference_call(case)
    if call is None:
        return
    start = time.perf_counter()
    expected = call()
    first = time.perf_counter() - start
    t = timing.measure(timing.python_runner(call), max(1, opts.repeat // 3), opts.budget / 2, once=first)
    rec["ref_ms"] = t.median * 1e3
    errors = [peers.relative_error(r, expected) for r in ours]
    rec["ref_err"] = math.nan if any(math.isnan(e) for e in errors) else max(errors)


#: relative error above which a result is flagged (per dtype: about 2**-mantissa_bits * 16)
TOLERANCE = {"f32": 1e-4, "bf16": 3e-2, "f16": 4e-3}


def _beyond(err: Optional[float], tolerance: float) -> bool:
    return err is not None and (math.isnan(err) or err > tolerance)


def flagged(rec: dict[str, Any]) -> bool:
    """Whether the reference error of a record is above the dtype's tolerance (or NaN: the
    bench's inputs are finite, so a NaN in our result is wrong)."""
    return _beyond(rec.get("ref_err"), TOLERANCE[rec["dtype"]])


def torch_disagrees(rec: dict[str, Any]) -> bool:
    """Whether PyTorch's result and ours are further apart than two results within the
    dtype's tolerance of the exact one can be (``torch_err`` above twice it)."""
    return _beyond(rec.get("torch_err"), 2 * TOLERANCE[rec["dtype"]])


def constant_disagrees(rec: dict[str, Any]) -> bool:
    """Whether the call with the weights bound as constant and the plain call gave results
    further apart than twice the dtype's tolerance."""
    return _beyond(rec.get("const_err"), 2 * TOLERANCE[rec["dtype"]])


def wrong(rec: dict[str, Any]) -> list[str]:
    """The result checks a record fails, one sentence each (empty: none failed).

    A run without the reference (``--no-reference``, as the speed runs are made) still
    checks our result against PyTorch's and the constant-weights call's against the plain
    one. Where the reference was run, it decides: PyTorch alone differing from a result
    that matches the reference is not ours to fail, and is not counted here.
    """
    tol = TOLERANCE[rec["dtype"]]
    out = []
    if flagged(rec):
        out.append(f"our result is {rec['ref_err']:.1e} from the float64 reference (tolerance {tol:g})")
    if torch_disagrees(rec) and rec.get("ref_err") is None:
        out.append(f"our result and PyTorch's are {rec['torch_err']:.1e} apart (at most {2 * tol:g} expected); "
                   "run again without --no-reference to tell which is wrong")
    if constant_disagrees(rec):
        out.append(f"the call with the weights bound as constant ({rec.get('const_lowering')}) and the plain call "
                   f"({rec.get('lowering')}) are {rec['const_err']:.1e} apart (at most {2 * tol:g} expected)")
    return out

"""Run a case through the public API and judge it against ``onednn_convt.reference``.

How a case runs: the op class of its kind is looked up on the ``onednn_convt`` module and
built with the case's attributes (``onednn_convt.ConvTranspose(**attrs)``), the inputs are
filled as benchdnn fills them (:mod:`onednn_convt.conformance.fill`) in the memory order the
JSON's strides (or an ``--in-shapes`` tag) give, and the op is called with ``out=`` an array
in the output's memory order, pre-filled with NaN so an element the op does not write is
caught. No other code path is used.

Outcomes:

- ``PASSED``: the result matches the criteria below.
- ``FAILED``: it does not (the message gives the number of differing elements, the largest
  error, its index and the expected and actual values), or the op raised a library error
  on a case the spec allows, or accepted a case the reference rejects.
- ``UNSUPPORTED``: the library has no kernel for the dtype on this CPU and emulation is off
  (``strict_dtypes``: the op is built with ``strict=True`` and raises UnsupportedError).
- ``INVALID``: the case is malformed or violates the spec (the reason names the file and
  what is wrong: the runner's, or the op's ValueError/TypeError message), or its sizes are
  absurd (a dim of 2**31 or more, or more memory than any process can address).
- ``SKIPPED``: a valid graph that is neither a single ConvTranspose op nor a pattern the
  package fuses (:mod:`onednn_convt.conformance.patterns`), or a case over the memory
  limit (the message gives the estimated sizes and the limit), or a file too large to read.
- ``ERROR``: anything else the runner did not expect: a bug of this package (the traceback's
  last frames). A case the library refuses is never an ERROR.

The contract: a malformed input is INVALID with the file and the reason; a case the library
refuses is SKIPPED or INVALID; no input makes the runner hang, crash or exceed the memory
limit, and one bad case or file never stops the others (:func:`run_case` never raises;
:func:`~.collect.collect` turns each bad file into cases).

Memory: before anything of a case is allocated, :func:`memory_estimate` adds up what
running it takes (the inputs and the output, which stay; the float64 draws of the fill,
the NaN-filled output, the op's copies, the float64 reference and the check, which come and
go: the peak holds the largest, :func:`peak_bytes`) and compares it with
:func:`memory_limit`: ``onednn_convt``'s memory limit (``ONEDNN_CONVT_MEMORY_LIMIT``,
:func:`onednn_convt.set_memory_limit`, else the memory available now), lowered to what is
left under ``ulimit -v``/``-d`` less the library's reserve
(:func:`onednn_convt.limits.address_space_reserve`). Over it, the case is SKIPPED with the
sizes; over :data:`ABSURD_BYTES`, INVALID. The op applies the limit to its own allocations
too (a MemoryError it raises is SKIPPED), and a MemoryError while the runner allocates is
SKIPPED, never an ERROR. The estimate is a guard against the impossible, not an exact
budget (measured: about 1.5 times the peak of a forward case).

Criteria (the same for every op): the reference is computed in float64 from the very values
the op received (the inputs after conversion to the case's dtype) and rounded once, to
nearest even, to the output dtype. The result must have the expected shape (the one
recomputed from the case with ``onednn_convt.shapes``) and dtype and equal the rounded
reference **exactly**, element by element, for f32, bf16 and f16 alike: benchdnn's
threshold for these ops is 0 in every dtype. This is exact rather than lucky because the
inputs are small integers with sparsity chosen so that every sum is an integer computed
exactly in f32 (the library's accumulator, also for emulated bf16/f16) and rounding it to
the output dtype gives the same value on both sides. Where this CPU has no bf16/f16 kernel
the package computes in f32 and rounds (its documented behaviour, ``info()["dtypes"]``), so
such cases are judged like native ones and reported PASSED when they match; with
``strict_dtypes`` they are UNSUPPORTED instead. The spec's meaning decides where oneDNN's own
op is wrong (auto_pad on the backward ops, D8; dilated BackwardData, D9): the reference
implements the spec, and so does the binding.

Pattern cases (several ops: a ConvTranspose with post-ops, or int8 with Dequantize and
Quantize) run as one ``onednn_convt.ConvTranspose(post_ops=..., src_dequantize=...,
weights_dequantize=..., dst_quantize=...)`` call on the inputs :func:`.fill.pattern_plan`
makes, against ``reference.fused_conv_transpose`` on the same arrays:

- int8 output (a Quantize ends the graph): exactly, element by element. The inputs are
  integers and the scales of the oneDNN cases are powers of two or 2.25, so every value
  before the Quantize is exact in f32 as in float64, and both round half to even: a
  difference is a bug, not a rounding tie. The details give ``max_abs_diff``, how many
  pre-quantize values were exact ties (``ties``) and how many outputs saturated.
- float output: exactly after rounding to the output dtype, as single ops, when every
  post-op is exact on integers (:data:`.fill.EXACT_POST_OPS`; the fill keeps every
  intermediate value exact in f32); otherwise within ``|got - ref| <= tol * max(1, |ref|)``
  with ``tol = 2 * eps(dtype) + 16 * eps(f32)`` (the library's exp/erf/tanh approximations
  and its f32 attributes against the float64 reference: ours, in the spirit of benchdnn's
  eltwise thresholds).

The details also say whether the library ran the graph as one fused partition
(``fused``, ``partitions``, ``lowering``); the package falls back to the plain op and NumPy
where it does not, which is judged the same way (the result is what the package documents).
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from .judge import FAILED, PASSED, Result, call_failed, compare, last_line, reference_result, wrong_dtype_or_shape
from .memory import over_limit
from .model import ERROR, INVALID, SKIPPED, Case
from .pattern_run import run_pattern


def run_case(case: Case, *, strict_dtypes: bool = False) -> Result:
    """Run one case and judge it (see the module docstring for outcomes and criteria).

    Never raises (but KeyboardInterrupt): running out of memory is SKIPPED, anything else
    unexpected is ERROR with the traceback's last frames.

    Args:
        case: a case from :func:`onednn_convt.conformance.collect.collect`.
        strict_dtypes: build the op with ``strict=True``, so a dtype the CPU has no kernel
            for is UNSUPPORTED instead of emulated.
    """
    start = time.perf_counter()
    stage = ["checking the case"]
    try:
        result = _run(case, strict_dtypes, stage)
    except MemoryError as e:
        result = Result(
            case,
            SKIPPED,
            f"out of memory {stage[0]} (the estimate was under the limit): {last_line(e)}",
        )
    except Exception as e:  # noqa: BLE001 - reported, never raised
        result = Result(
            case, ERROR, f"{stage[0]}: {last_line(e)}\n{traceback.format_exc(limit=-3)}"
        )
    result.seconds = time.perf_counter() - start
    return result


def _run(case: Case, strict_dtypes: bool, stage: list[str]) -> Result:
    if case.status is not None:
        return Result(case, case.status, case.reason)
    if case.pattern is not None:
        return run_pattern(case, strict_dtypes, stage)
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES

    from . import fill

    assert case.kind is not None and case.output is not None
    stage[0] = "building the op"
    try:
        op = getattr(onednn_convt, case.kind)(**case.attrs, strict=strict_dtypes)
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    over = over_limit(case)
    if over is not None:
        return over
    stage[0] = "filling the inputs"
    arrays = fill.make_inputs(case)
    dtype = FLOAT_DTYPES[case.output.dtype]
    out = None
    if case.output.shape is not None:
        stage[0] = "allocating the output"
        out = fill.place(np.full(case.output.shape, np.nan), dtype, case.output.order)
    details: dict[str, Any] = {}
    stage[0] = "calling the op"
    try:
        try:
            got = op(*arrays, out=out)
        except ValueError as e:
            if out is None:
                raise
            try:  # the op refuses our output array: is it the shape, or the case?
                got = op(*arrays)
            except ValueError:
                raise e from None
            return Result(
                case,
                FAILED,
                f"the op's output shape {got.shape} differs from the spec's {case.output.shape} ({e})",
            )
    except Exception as e:  # noqa: BLE001
        return call_failed(case, e)
    plan = getattr(op, "last_plan", None)
    if plan is not None:
        details["emulated"] = bool(getattr(plan, "emulated", False))
        lowering = getattr(plan, "lowering", None)
        details["lowering"] = getattr(lowering, "kind", None)
    if out is None:
        over = over_limit(case, int(got.size))
        if over is not None:
            return over
    stage[0] = "computing the reference"
    try:
        ref = reference_result(case, arrays)
    except ValueError as e:
        return Result(
            case, FAILED, f"the op accepted a case the reference rejects: {e}", details=details
        )
    stage[0] = "judging the result"
    wrong = wrong_dtype_or_shape(case, got, ref, dtype, details)
    if wrong is not None:
        return wrong
    message = compare(got, ref, dtype)
    details["elements"] = int(got.size)
    details["nonzero_reference"] = int(np.count_nonzero(ref))
    if message is not None:
        return Result(case, FAILED, message, details=details)
    if out is not None and got is not out:
        message = compare(out, ref, dtype)
        return Result(
            case,
            FAILED,
            f"the op returned a new array instead of out=; out: {message or 'equal'}",
            details=details,
        )
    return Result(case, PASSED, details=details)


# -- many cases ------------------------------------------------------------------------------


def _run_indexed(args: tuple[int, Case, bool]) -> tuple[int, Result]:
    index, case, strict = args
    return index, run_case(case, strict_dtypes=strict)


def _worker_init() -> None:
    import onednn_convt  # noqa: F401 - load the library once per worker


def run_cases(
    cases: Sequence[Case],
    *,
    jobs: int = 1,
    strict_dtypes: bool = False,
    on_result: Optional[Callable[[int, Result], None]] = None,
) -> list[Result]:
    """Run cases, in order with ``jobs=1`` or in ``jobs`` worker processes.

    Args:
        cases: the cases.
        jobs: worker processes (spawned, each with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS
            = cores // jobs).
        strict_dtypes: see :func:`run_case`.
        on_result: called with (index, result) as each case finishes.

    Returns:
        The results in the order of ``cases``.
    """
    results: list[Optional[Result]] = [None] * len(cases)
    for index, result in _iterate(cases, jobs, strict_dtypes):
        results[index] = result
        if on_result is not None:
            on_result(index, result)
    return [r for r in results if r is not None]


def _iterate(cases: Sequence[Case], jobs: int, strict: bool) -> Iterator[tuple[int, Result]]:
    work: Iterable[tuple[int, Case, bool]] = ((i, c, strict) for i, c in enumerate(cases))
    if jobs <= 1 or len(cases) <= 1:
        for item in work:
            yield _run_indexed(item)
        return
    import concurrent.futures
    import multiprocessing
    import os

    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    # read by libgomp (oneDNN) and OpenBLAS (the NumPy reference) when a worker starts
    keys = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, threads))
    try:
        context = multiprocessing.get_context("spawn")  # libgomp does not survive fork
        with concurrent.futures.ProcessPoolExecutor(
            jobs, mp_context=context, initializer=_worker_init
        ) as pool:
            futures = {pool.submit(_run_indexed, item): item for item in work}
            for future in concurrent.futures.as_completed(futures):
                try:
                    yield future.result()
                except Exception as e:  # noqa: BLE001 - a worker died (a crash in the library)
                    index, case, _ = futures[future]
                    yield (
                        index,
                        Result(
                            case,
                            ERROR,
                            f"the worker process running this case (or another at the same time) died: "
                            f"{last_line(e)}; run the case alone (-j 1, the repro command) to see",
                        ),
                    )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

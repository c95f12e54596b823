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
- ``INVALID``: the case is malformed or violates the spec; the reason is the runner's or the
  op's ValueError/TypeError message.
- ``SKIPPED``: a valid graph that is not a single ConvTranspose op.
- ``ERROR``: anything else the runner did not expect (a bug: the traceback's last line).

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
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from .cases import INVALID, SKIPPED, Case

PASSED = "PASSED"
FAILED = "FAILED"
UNSUPPORTED = "UNSUPPORTED"
ERROR = "ERROR"
OUTCOMES = (PASSED, FAILED, UNSUPPORTED, INVALID, SKIPPED, ERROR)


@dataclass
class Result:
    """The verdict on one case.

    Attributes:
        case: the case.
        outcome: one of OUTCOMES.
        message: why (empty when PASSED).
        seconds: wall time of the run (building inputs, the call, the reference, the check).
        details: extra facts (``emulated``, ``lowering``, ``mismatches``, ``max_error``, ...).
    """

    case: Case
    outcome: str
    message: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


# -- the check --------------------------------------------------------------------------------


def compare(got: np.ndarray, ref: np.ndarray, dtype: Any) -> Optional[str]:
    """None if ``got`` equals ``ref`` (float64) rounded to ``dtype`` exactly, else a message.

    The message gives how many elements differ, the largest difference, its index, and the
    expected and actual values there. NaN in ``got`` is a difference; an infinity equal to
    the rounded reference is not.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        expected = ref.astype(dtype).astype(np.float64)
        actual = np.asarray(got).astype(np.float64)
        equal = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        if equal.all():
            return None
        diff = np.where(equal, 0.0, np.abs(actual - expected))
        diff = np.where(np.isnan(diff), np.inf, diff)
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    index = tuple(int(i) for i in worst)
    bad = int(equal.size - np.count_nonzero(equal))
    return (
        f"{bad} of {equal.size} elements differ; max |got - expected| = {diff[worst]:g} at index {index}: "
        f"expected {expected[worst]:g}, got {actual[worst]:g}"
    )


def _reference(case: Case, arrays: Sequence[np.ndarray]) -> np.ndarray:
    from .. import reference

    attrs = {k: v for k, v in case.attrs.items() if v is not None}
    if case.kind == "ConvTranspose":
        bias = arrays[2] if len(arrays) > 2 else None
        return reference.conv_transpose(arrays[0], arrays[1], bias, **attrs)
    attrs.pop("output_padding", None)
    if case.kind == "ConvTransposeBackwardData":
        return reference.conv_transpose_backward_data(arrays[0], arrays[1], **attrs)
    ws = attrs.pop("weights_shape")
    if len(arrays) > 2:
        ws = tuple(int(v) for v in arrays[2])
    return reference.conv_transpose_backward_weights(arrays[0], arrays[1], ws, **attrs)


def _last_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def run_case(case: Case, *, strict_dtypes: bool = False) -> Result:
    """Run one case and judge it (see the module docstring for outcomes and criteria).

    Args:
        case: a case from :func:`onednn_convt.conformance.cases.collect`.
        strict_dtypes: build the op with ``strict=True``, so a dtype the CPU has no kernel
            for is UNSUPPORTED instead of emulated.
    """
    start = time.perf_counter()
    result = _run(case, strict_dtypes)
    result.seconds = time.perf_counter() - start
    return result


def _run(case: Case, strict_dtypes: bool) -> Result:
    if case.status is not None:
        return Result(case, case.status, case.reason)
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES
    from onednn_convt.errors import OneDNNError, UnsupportedError

    from . import fill

    assert case.kind is not None and case.output is not None
    try:
        op = getattr(onednn_convt, case.kind)(**case.attrs, strict=strict_dtypes)
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    try:
        arrays = fill.make_inputs(case)
    except Exception as e:  # noqa: BLE001 - reported, never raised
        return Result(case, ERROR, f"filling the inputs: {_last_line(e)}")
    dtype = FLOAT_DTYPES[case.output.dtype]
    out = None
    if case.output.shape is not None:
        out = fill.place(np.full(case.output.shape, np.nan), dtype, case.output.order)
    details: dict[str, Any] = {}
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
    except UnsupportedError as e:
        return Result(case, UNSUPPORTED, str(e))
    except OneDNNError as e:
        return Result(case, FAILED, f"the library refused a case the spec allows: {e}")
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    except Exception as e:  # noqa: BLE001
        return Result(
            case, ERROR, f"calling the op: {_last_line(e)}\n{traceback.format_exc(limit=-3)}"
        )
    plan = getattr(op, "last_plan", None)
    if plan is not None:
        details["emulated"] = bool(getattr(plan, "emulated", False))
        lowering = getattr(plan, "lowering", None)
        details["lowering"] = getattr(lowering, "kind", None)
    try:
        ref = _reference(case, arrays)
    except ValueError as e:
        return Result(
            case, FAILED, f"the op accepted a case the reference rejects: {e}", details=details
        )
    if got.dtype != dtype:
        return Result(case, FAILED, f"result dtype {got.dtype}, expected {dtype}", details=details)
    if got.shape != ref.shape or (case.output.shape is not None and got.shape != case.output.shape):
        return Result(
            case,
            FAILED,
            f"result shape {got.shape}, expected {ref.shape} (reference) / {case.output.shape} (spec shapes)",
            details=details,
        )
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
            futures = [pool.submit(_run_indexed, item) for item in work]
            for future in concurrent.futures.as_completed(futures):
                yield future.result()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

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
- ``SKIPPED``: a valid graph that is neither a single ConvTranspose op nor a pattern the
  package fuses (:mod:`onednn_convt.conformance.patterns`).
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


def compare_close(got: np.ndarray, ref: np.ndarray, dtype: Any, tol: float) -> Optional[str]:
    """None if ``|got - ref| <= tol * max(1, |ref|)`` everywhere (NaN equal to NaN, an
    infinity to the same infinity), else a message as :func:`compare`'s."""
    with np.errstate(over="ignore", invalid="ignore"):
        expected = ref.astype(dtype).astype(np.float64)
        actual = np.asarray(got).astype(np.float64)
        same = (actual == expected) | (np.isnan(actual) & np.isnan(expected))
        diff = np.where(same, 0.0, np.abs(actual - expected))
        diff = np.where(np.isnan(diff), np.inf, diff)
        bound = tol * np.maximum(1.0, np.abs(expected))
        ok = same | (diff <= bound)
    if ok.all():
        return None
    excess = np.where(ok, 0.0, diff / np.where(np.isfinite(bound), bound, np.inf))
    worst = np.unravel_index(int(np.argmax(np.where(ok, -1.0, excess))), diff.shape)
    index = tuple(int(i) for i in worst)
    bad = int(ok.size - np.count_nonzero(ok))
    return (
        f"{bad} of {ok.size} elements differ by more than {tol:g} * max(1, |expected|); "
        f"at index {index}: expected {expected[worst]:g}, got {actual[worst]:g} (|diff| = {diff[worst]:g})"
    )


#: Machine epsilon of each float dtype.
EPS = {"f32": 2.0**-23, "bf16": 2.0**-7, "f16": 2.0**-10}


def float_tolerance(code: str) -> float:
    """The tolerance of a float pattern whose post-ops are not all exact (module docstring)."""
    return 2 * EPS[code] + 16 * EPS["f32"]


def _last_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _wrong_dtype_or_shape(
    case: Case, got: np.ndarray, ref: np.ndarray, dtype: Any, details: dict[str, Any]
) -> Optional[Result]:
    """A FAILED result if ``got`` has another dtype than ``dtype`` or another shape than the
    reference's (or the case's output spec shape); else None."""
    spec = case.output.shape if case.output is not None else None
    if got.dtype != dtype:
        return Result(case, FAILED, f"result dtype {got.dtype}, expected {dtype}", details=details)
    if got.shape != ref.shape or (spec is not None and got.shape != spec):
        return Result(
            case,
            FAILED,
            f"result shape {got.shape}, expected {ref.shape} (reference) / {spec} (spec shapes)",
            details=details,
        )
    return None


def _call_failed(case: Case, e: Exception) -> Result:
    """The result of a case whose op call raised ``e`` (call it in the except block: an
    ERROR carries the traceback)."""
    from onednn_convt.errors import OneDNNError, UnsupportedError

    if isinstance(e, UnsupportedError):
        return Result(case, UNSUPPORTED, str(e))
    if isinstance(e, OneDNNError):
        return Result(case, FAILED, f"the library refused a case the spec allows: {e}")
    if isinstance(e, (ValueError, TypeError)):
        return Result(case, INVALID, str(e))
    return Result(case, ERROR, f"calling the op: {_last_line(e)}\n{traceback.format_exc(limit=-3)}")


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
    if case.pattern is not None:
        return _run_pattern(case, strict_dtypes)
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES

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
    except Exception as e:  # noqa: BLE001
        return _call_failed(case, e)
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
    wrong = _wrong_dtype_or_shape(case, got, ref, dtype, details)
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


# -- pattern cases -----------------------------------------------------------------------------


def _run_pattern(case: Case, strict_dtypes: bool) -> Result:
    """Run a pattern case as one fused ConvTranspose call and judge it (module docstring)."""
    import onednn_convt
    from onednn_convt import reference
    from onednn_convt.dtypes import FLOAT_DTYPES
    from onednn_convt.post_ops import INT8_DTYPES

    from . import fill

    p = case.pattern
    assert p is not None and case.output is not None
    try:
        op = onednn_convt.ConvTranspose(**case.attrs, **p.op_kwargs(), strict=strict_dtypes)
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    try:
        arrays = fill.make_inputs(case)
    except Exception as e:  # noqa: BLE001 - reported, never raised
        return Result(case, ERROR, f"filling the inputs: {_last_line(e)}")
    by_role = {t.role: a for t, a in zip(case.inputs, arrays)}
    operands = [a for t, a in zip(case.inputs, arrays) if t.role.startswith("post_ops[")]
    src, weights, bias = by_role["src"], by_role["weights"], by_role.get("bias")
    code = case.output.dtype
    int8_out = code in INT8_DTYPES
    dtype = INT8_DTYPES[code] if int8_out else FLOAT_DTYPES.get(code)
    if dtype is None:
        return Result(case, INVALID, f"output dtype {code}: expected f32, bf16, f16, u8 or s8")
    out = None
    if case.output.shape is not None:
        # NaN marks elements the op does not write; an integer output cannot hold it
        out = fill.place(
            np.full(case.output.shape, 0.0 if int8_out else np.nan), dtype, case.output.order
        )
    details: dict[str, Any] = {}
    try:
        got = op(src, weights, bias, *operands, out=out)
    except Exception as e:  # noqa: BLE001
        return _call_failed(case, e)
    details.update(fused=op.fused, partitions=op.partitions, lowering=op.lowering)
    plan = getattr(op, "last_plan", None)
    details["emulated"] = bool(getattr(plan, "emulated", False))
    attrs = {k: v for k, v in case.attrs.items() if v is not None}
    try:
        pre = reference.fused_conv_transpose(
            src,
            weights,
            bias,
            operands,
            post_ops=p.post_ops,
            src_dequantize=p.src_dequantize,
            weights_dequantize=p.weights_dequantize,
            **attrs,
        )
    except ValueError as e:
        return Result(
            case, FAILED, f"the op accepted a case the reference rejects: {e}", details=details
        )
    q = p.dst_quantize
    ref = pre if q is None else reference.quantize(pre, q.scales, q.zps, q.dtype, q.qtype, q.axis)  # type: ignore[arg-type]
    wrong = _wrong_dtype_or_shape(case, got, ref, dtype, details)
    if wrong is not None:
        return wrong
    details["elements"] = int(got.size)
    details["nonzero_reference"] = int(np.count_nonzero(ref))
    if int8_out:
        assert q is not None
        message = _judge_int8(got, ref, pre, q, details)
    elif fill.exact_chain(p.post_ops):
        details["criterion"] = "exact"
        message = compare(got, ref, dtype)
    else:
        tol = float_tolerance(code)
        details["criterion"] = f"tol={tol:.3g}"
        message = compare_close(got, ref, dtype, tol)
    if message is not None:
        return Result(case, FAILED, message, details=details)
    if out is not None and got is not out:
        return Result(case, FAILED, "the op returned a new array instead of out=", details=details)
    return Result(case, PASSED, details=details)


def _judge_int8(
    got: np.ndarray, ref: np.ndarray, pre: np.ndarray, q: Any, details: dict[str, Any]
) -> Optional[str]:
    """Exact comparison of an int8 result; details: max_abs_diff, ties (values x.5 before
    the rounding), saturated (values the Quantize clips to its range)."""
    from onednn_convt.post_ops import INT8_DTYPES

    info = np.iinfo(INT8_DTYPES[q.dtype])
    actual = got.astype(np.float64)
    diff = np.abs(actual - ref)
    scaled = pre / float(q.scales[0]) + float(q.zps[0])  # per-tensor: what is rounded
    with np.errstate(invalid="ignore"):
        ties = np.abs(scaled - np.floor(scaled)) == 0.5
    details["max_abs_diff"] = float(diff.max()) if diff.size else 0.0
    details["ties"] = int(np.count_nonzero(ties))
    with np.errstate(invalid="ignore"):
        rounded = np.rint(scaled)
        details["saturated"] = int(np.count_nonzero((rounded < info.min) | (rounded > info.max)))
    bad = diff != 0
    if not bad.any():
        return None
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    index = tuple(int(i) for i in worst)
    off_by_one = int(np.count_nonzero(diff == 1))
    tie_bad = int(np.count_nonzero(bad & ties))
    return (
        f"{int(bad.sum())} of {diff.size} elements differ ({off_by_one} by 1, {tie_bad} of them at "
        f"a rounding tie x.5 before the Quantize); max |got - expected| = {diff[worst]:g} at index "
        f"{index}: expected {ref[worst]:g}, got {actual[worst]:g} (value before rounding: {scaled[worst]:.6g})"
    )


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

"""A conformance case's verdict: the outcomes, the :class:`Result` of a case, and how a
result is judged against the reference (:func:`compare` exactly after rounding,
:func:`compare_close` within a tolerance)."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .model import ERROR, INVALID, SKIPPED, Case


PASSED = "PASSED"
FAILED = "FAILED"
UNSUPPORTED = "UNSUPPORTED"
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


def reference_result(case: Case, arrays: Sequence[np.ndarray]) -> np.ndarray:
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


def last_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def wrong_dtype_or_shape(
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


def call_failed(case: Case, e: Exception) -> Result:
    """The result of a case whose op call raised ``e`` (call it in the except block: an
    ERROR carries the traceback)."""
    from onednn_convt.errors import OneDNNError, UnsupportedError

    if isinstance(e, UnsupportedError):
        return Result(case, UNSUPPORTED, str(e))
    if isinstance(e, OneDNNError):
        return Result(case, FAILED, f"the library refused a case the spec allows: {e}")
    if isinstance(e, MemoryError):  # the op's estimate is over the memory limit
        return Result(case, SKIPPED, f"the op's allocation is over the memory limit: {e}")
    if isinstance(e, (ValueError, TypeError)):
        return Result(case, INVALID, str(e))
    return Result(case, ERROR, f"calling the op: {last_line(e)}\n{traceback.format_exc(limit=-3)}")



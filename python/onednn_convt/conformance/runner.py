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
left under an address-space limit (``ulimit -v``). Over it, the case is SKIPPED with the
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

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

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
    if isinstance(e, MemoryError):  # the op's estimate is over the memory limit
        return Result(case, SKIPPED, f"the op's allocation is over the memory limit: {e}")
    if isinstance(e, (ValueError, TypeError)):
        return Result(case, INVALID, str(e))
    return Result(case, ERROR, f"calling the op: {_last_line(e)}\n{traceback.format_exc(limit=-3)}")


# -- memory ------------------------------------------------------------------------------------

#: Estimated bytes past which a case is INVALID, not SKIPPED: more than a 64-bit process can
#: address (the 128 TiB of x86-64's user space).
ABSURD_BYTES = 1 << 47
#: Bytes of the float64 draws and masks that filling one input element takes at its peak
#: (:func:`.fill.integers` and the sign draws of :func:`.fill.make_pattern_input`).
FILL_BYTES = 40
#: float64 arrays of the output's size the check holds at once besides the reference's
#: result (the rounded copy, the result widened, differences, masks).
CHECK_OUTPUTS = 6


def _itemsize(code: str) -> int:
    from onednn_convt.dtypes import FLOAT_DTYPES
    from onednn_convt.post_ops import INT8_DTYPES

    dtype = FLOAT_DTYPES.get(code) or INT8_DTYPES.get(code)
    return int(np.dtype(dtype).itemsize) if dtype is not None else 8


def _forward_buffers(case: Case) -> tuple[int, int]:
    """(elements of the reference's padded sum buffer, of one tap's products) of a
    forward case (:func:`onednn_convt.reference.conv_transpose`); (0, 0) if the shapes do
    not say (the op then refuses the case)."""
    from .. import shapes

    try:
        by_role = {t.role: t.shape for t in case.inputs}
        src, weights = by_role["src"], by_role["weights"]
        assert src is not None and weights is not None
        df = case.attrs.get("data_format") or "NXC"
        wf = case.attrs.get("weights_format") or "XOI"
        n, _, xs = shapes.split_activation(src, df)
        _, o, kernel = shapes.split_weights(weights, wf)
        oc = o * int(case.attrs.get("groups") or 1)

        def dims(name: str, default: int) -> list[int]:
            value = case.attrs.get(name)
            value = default if value is None else value
            values = [int(value)] * len(xs) if isinstance(value, int) else [int(v) for v in value]
            return values if len(values) == len(xs) else [default] * len(xs)

        s, d, op = dims("strides", 1), dims("dilations", 1), dims("output_padding", 0)
        full = [
            abs(si) * (x - 1) + abs(di) * (k - 1) + 1 + abs(pi)
            for si, di, pi, x, k in zip(s, d, op, xs, kernel)
        ]
        return n * oc * math.prod(full), n * oc * math.prod(xs)
    except (AssertionError, KeyError, IndexError, TypeError, ValueError, OverflowError):
        return 0, 0


def memory_estimate(case: Case, out_elements: Optional[int] = None) -> dict[str, int]:
    """Bytes running ``case`` allocates, by purpose (the module docstring).

    ``inputs`` and ``output`` stay allocated; the other entries are phases that come and go
    (filling the inputs, the NaN-filled output, the op's own copies, the float64 reference,
    the check), of which the peak holds the largest (:func:`peak_bytes`). The float64
    reference holds the inputs widened and copied, its sum buffer (for a forward op, the
    output before the pads crop it: ``N * OC * prod(s * (x - 1) + d * (k - 1) + 1 + op)``)
    and one kernel tap's products twice, and two output-sized arrays per post-op; the check
    holds the reference's result and :data:`CHECK_OUTPUTS` output-sized arrays.
    ``out_elements`` gives the output's size when the case's spec does not (after the call).
    """
    ins = [
        (math.prod(t.shape or ()), _itemsize(t.dtype))
        for t in case.inputs
        if t.role != "weights_shape"
    ]
    s_elems = sum(n for n, _ in ins)
    assert case.output is not None
    known = case.output.shape is not None
    o_elems = math.prod(case.output.shape or ()) if known else (out_elements or 0)
    o_size = _itemsize(case.output.dtype)
    full, taps = _forward_buffers(case) if case.kind == "ConvTranspose" else (0, 0)
    full = max(full, o_elems)
    if case.kind != "ConvTranspose":
        taps = s_elems + o_elems
    steps = 2 + (len(case.pattern.post_ops) + 1 if case.pattern is not None else 0)
    return {
        "inputs": sum(n * size for n, size in ins),
        "output": o_elems * o_size,
        "filling the inputs": FILL_BYTES * max((n for n, _ in ins), default=0),
        "NaN-filled output": o_elems * (8 + o_size),
        "the op's copies": 2 * 4 * (s_elems + o_elems),
        "float64 reference": 8 * (3 * s_elems + full + 2 * taps + steps * o_elems),
        "check": 8 * (full + CHECK_OUTPUTS * o_elems),
    }


def peak_bytes(parts: dict[str, int]) -> int:
    """The peak of :func:`memory_estimate`: what stays, plus the largest phase."""
    stays = parts.get("inputs", 0) + parts.get("output", 0)
    return stays + max((v for k, v in parts.items() if k not in ("inputs", "output")), default=0)


def memory_limit() -> tuple[Optional[int], str]:
    """(the bytes a case may allocate, where that limit comes from): ``onednn_convt``'s
    memory limit (:func:`onednn_convt.set_memory_limit`, ``ONEDNN_CONVT_MEMORY_LIMIT``, else
    the memory available now), lowered to what is left of the address-space limit
    (``ulimit -v``) when there is one. (None, ...) when nothing says."""
    from .. import limits

    if getattr(limits, "_limit", None) is not None:
        source = "ONEDNN_CONVT_MEMORY_LIMIT or onednn_convt.set_memory_limit()"
    else:
        source = "the memory available now"
    limit = limits.memory_limit()
    headroom = _address_space_left()
    if headroom is not None and (limit is None or headroom < limit):
        return headroom, "what is left under the address-space limit (ulimit -v)"
    return limit, source


def _address_space_left() -> Optional[int]:
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return None
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[0])
        return max(0, soft - pages * resource.getpagesize())
    except (ImportError, OSError, ValueError, IndexError):
        return None


def _over_limit(case: Case, out_elements: Optional[int] = None) -> Optional[Result]:
    """SKIPPED (INVALID when absurd) if running ``case`` would allocate more than the
    memory limit, or more than any process can; else None."""
    from ..limits import INT32_MAX, format_bytes

    tensors = [t for t in case.inputs if t.role != "weights_shape"] + [case.output]
    for t in tensors:
        if t is not None and t.shape and max(t.shape) > INT32_MAX:
            return Result(
                case,
                INVALID,
                f"{t.role} has shape {list(t.shape)}: a dim of 2**31 or more; oneDNN computes "
                "shapes in 32-bit integers",
            )
    parts = memory_estimate(case, out_elements)
    total = peak_bytes(parts)
    detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items() if v)
    if total > ABSURD_BYTES:
        return Result(
            case,
            INVALID,
            f"running the case would allocate about {format_bytes(total)} ({detail}), more "
            f"than a 64-bit process can address ({format_bytes(ABSURD_BYTES)})",
            details={"estimated_bytes": total},
        )
    limit, source = memory_limit()
    if limit is not None and total > limit:
        return Result(
            case,
            SKIPPED,
            f"running the case would allocate about {format_bytes(total)} ({total} bytes: "
            f"{detail}), over the memory limit of {format_bytes(limit)} ({source})",
            details={"estimated_bytes": total, "limit": limit},
        )
    return None


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
            f"out of memory {stage[0]} (the estimate was under the limit): {_last_line(e)}",
        )
    except Exception as e:  # noqa: BLE001 - reported, never raised
        result = Result(
            case, ERROR, f"{stage[0]}: {_last_line(e)}\n{traceback.format_exc(limit=-3)}"
        )
    result.seconds = time.perf_counter() - start
    return result


def _run(case: Case, strict_dtypes: bool, stage: list[str]) -> Result:
    if case.status is not None:
        return Result(case, case.status, case.reason)
    if case.pattern is not None:
        return _run_pattern(case, strict_dtypes, stage)
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES

    from . import fill

    assert case.kind is not None and case.output is not None
    stage[0] = "building the op"
    try:
        op = getattr(onednn_convt, case.kind)(**case.attrs, strict=strict_dtypes)
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    over = _over_limit(case)
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
        return _call_failed(case, e)
    plan = getattr(op, "last_plan", None)
    if plan is not None:
        details["emulated"] = bool(getattr(plan, "emulated", False))
        lowering = getattr(plan, "lowering", None)
        details["lowering"] = getattr(lowering, "kind", None)
    if out is None:
        over = _over_limit(case, int(got.size))
        if over is not None:
            return over
    stage[0] = "computing the reference"
    try:
        ref = _reference(case, arrays)
    except ValueError as e:
        return Result(
            case, FAILED, f"the op accepted a case the reference rejects: {e}", details=details
        )
    stage[0] = "judging the result"
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


def _run_pattern(case: Case, strict_dtypes: bool, stage: list[str]) -> Result:
    """Run a pattern case as one fused ConvTranspose call and judge it (module docstring)."""
    import onednn_convt
    from onednn_convt import reference
    from onednn_convt.dtypes import FLOAT_DTYPES
    from onednn_convt.post_ops import INT8_DTYPES

    from . import fill

    p = case.pattern
    assert p is not None and case.output is not None
    stage[0] = "building the op"
    try:
        op = onednn_convt.ConvTranspose(**case.attrs, **p.op_kwargs(), strict=strict_dtypes)
    except (ValueError, TypeError) as e:
        return Result(case, INVALID, str(e))
    over = _over_limit(case)
    if over is not None:
        return over
    stage[0] = "filling the inputs"
    arrays = fill.make_inputs(case)
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
        stage[0] = "allocating the output"
        # NaN marks elements the op does not write; an integer output cannot hold it
        out = fill.place(
            np.full(case.output.shape, 0.0 if int8_out else np.nan), dtype, case.output.order
        )
    details: dict[str, Any] = {}
    stage[0] = "calling the op"
    try:
        got = op(src, weights, bias, *operands, out=out)
    except Exception as e:  # noqa: BLE001
        return _call_failed(case, e)
    details.update(fused=op.fused, partitions=op.partitions, lowering=op.lowering)
    plan = getattr(op, "last_plan", None)
    details["emulated"] = bool(getattr(plan, "emulated", False))
    if out is None:
        over = _over_limit(case, int(got.size))
        if over is not None:
            return over
    stage[0] = "computing the reference"
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
    stage[0] = "judging the result"
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
                            f"{_last_line(e)}; run the case alone (-j 1, the repro command) to see",
                        ),
                    )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

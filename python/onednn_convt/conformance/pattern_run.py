"""Running a pattern case (a fused graph of several ops: :mod:`.patterns`) as one fused
``ConvTranspose`` call, and judging it (int8 outputs exactly, float ones as single ops)."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .judge import FAILED, PASSED, Result, call_failed, compare, compare_close, float_tolerance, wrong_dtype_or_shape
from .memory import over_limit
from .model import INVALID, Case


def run_pattern(case: Case, strict_dtypes: bool, stage: list[str]) -> Result:
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
    over = over_limit(case)
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
        return call_failed(case, e)
    details.update(fused=op.fused, partitions=op.partitions, lowering=op.lowering)
    plan = getattr(op, "last_plan", None)
    details["emulated"] = bool(getattr(plan, "emulated", False))
    if out is None:
        over = over_limit(case, int(got.size))
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
    wrong = wrong_dtype_or_shape(case, got, ref, dtype, details)
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



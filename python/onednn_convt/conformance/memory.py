"""What a conformance case would take in memory, before anything is allocated: the
estimate of its buffers (:func:`memory_estimate`, :func:`peak_bytes`) and the limit it must
stay under (:func:`memory_limit`: the package's memory limit, else the memory available now,
lowered to the address space left). :mod:`.runner` refuses a case past the limit.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .judge import Result
from .model import INVALID, SKIPPED, Case


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
    (:func:`onednn_convt.limits.limit_in_force`: :func:`onednn_convt.set_memory_limit`,
    ``ONEDNN_CONVT_MEMORY_LIMIT``, else the memory available now; under ``ulimit -v``/``-d``
    at most what that leaves, less the library's reserve). (None, ...) when nothing says."""
    from .. import limits

    return limits.limit_in_force()


def over_limit(case: Case, out_elements: Optional[int] = None) -> Optional[Result]:
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

"""How close a result must be to the float64 reference: one rule for tests, demo and bench.

The error of a result is measured relative to the largest reference magnitude,
``max|got - ref| / max|ref|``. It may be at most the output dtype's rounding (one epsilon,
doubled for the input rounding's effect) plus f32 accumulation error, which grows with the
reduction length (how many products are summed into one output element).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from .dtypes import FLOAT_DTYPES

_F32_EPS = float(np.finfo(np.float32).eps)


def epsilon(code: str) -> float:
    """Machine epsilon of a dtype code: f32 2**-23, f16 2**-10, bf16 2**-7."""
    return {"f32": _F32_EPS, "f16": 2.0**-10, "bf16": 2.0**-7}[code]


def tolerance(code: str, reduction: int) -> float:
    """Largest acceptable :func:`relative_error` for a result of dtype ``code``.

    Args:
        code: output dtype code (``"f32"``, ``"bf16"``, ``"f16"``).
        reduction: number of products summed into one output element.
    """
    return 2 * epsilon(code) + 4 * max(1, reduction) * _F32_EPS


def relative_error(got: ArrayLike, ref: ArrayLike) -> float:
    """``max|got - ref| / max|ref|`` in float64 (0 when both are all zero)."""
    g = np.asarray(got, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    err = float(np.max(np.abs(g - r))) if r.size else 0.0
    return err / scale if scale else err


def rounded(x: ArrayLike, code: str) -> np.ndarray:
    """``x`` rounded to dtype ``code`` (what the op actually sees), as that dtype."""
    return np.asarray(x).astype(FLOAT_DTYPES[code])

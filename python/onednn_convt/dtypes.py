"""The dtype table: NumPy dtypes <-> oneDNN data type codes (spec D10).

Every float tensor of one call has the same dtype; ``weights_shape`` is s32.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

#: oneDNN code -> NumPy dtype, for the float tensors of every op.
FLOAT_DTYPES: dict[str, np.dtype[Any]] = {
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
}
#: dtype of the ``weights_shape`` input of ConvTransposeBackwardWeights.
SHAPE_DTYPE = np.dtype(np.int32)

_CODES = {dtype: code for code, dtype in FLOAT_DTYPES.items()}


def code_of(dtype: np.dtype[Any]) -> str | None:
    """The oneDNN code (``"f32"``, ``"bf16"``, ``"f16"``) of a NumPy dtype, or None."""
    return _CODES.get(dtype)


def expected_names() -> str:
    """Users' names of the accepted float dtypes, for messages."""
    return "numpy.float32 (f32), ml_dtypes.bfloat16 (bf16) or numpy.float16 (f16)"


def resolve(dtype: Any) -> str:
    """The oneDNN code of ``dtype`` given as a code, a NumPy dtype or a type.

    Raises:
        TypeError: ``dtype`` is not one of the three float types.
    """
    if isinstance(dtype, str) and dtype in FLOAT_DTYPES:
        return dtype
    try:
        code = code_of(np.dtype(dtype))
    except TypeError:
        code = None
    if code is None:
        msg = f"dtype: expected {expected_names()}, got {dtype!r}"
        raise TypeError(msg)
    return code

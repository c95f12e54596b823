"""The dtype table: NumPy dtypes <-> oneDNN data type codes (spec D10).

Every float tensor of one call has the same dtype; ``weights_shape`` is s32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from . import memory, native, schema

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


def common_code(op_name: str, named: Sequence[tuple[str, Any]], mixed: str) -> str:
    """The one float dtype code ("f32", "bf16", "f16") of the named arrays of a call (None
    entries skipped).

    Raises:
        TypeError: an array of another dtype (naming it; a u8/s8 one of a ConvTranspose says
            what an int8 call needs), or arrays of several dtypes (``mixed`` says what must
            have one, the message lists each array's).
    """
    codes: dict[str, str] = {}
    for name, a in named:
        if a is None:
            continue
        code = code_of(a.dtype)
        if code is None:
            hint = ""
            if a.dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and op_name == "ConvTranspose":
                hint = " (an int8 ConvTranspose needs src_dequantize and weights_dequantize)"
            msg = f"{op_name}: argument '{name}' expected dtype {expected_names()}, got {a.dtype}{hint}"
            raise TypeError(msg)
        codes[name] = code
    if len(set(codes.values())) > 1:
        got = ", ".join(f"{n}={c}" for n, c in codes.items())
        msg = f"{op_name}: {mixed}, got {got}"
        raise TypeError(msg)
    return next(iter(codes.values()))


def resolve(dtype: Any) -> str:
    """The oneDNN code of ``dtype`` given as a code, a NumPy dtype or a type.

    Raises:
        TypeError: ``dtype`` is not one of the three float types.
    """
    if isinstance(dtype, str):  # a code or a NumPy name, in any case ("F32", "float32", "BFloat16")
        code = schema.spelled(dtype, tuple(FLOAT_DTYPES))
        if code is not None:
            return code
        dtype = dtype.lower()
    try:
        code = code_of(np.dtype(dtype))
    except TypeError:
        code = None
    if code is None:
        msg = f"dtype: expected {expected_names()}, got {dtype!r}"
        raise TypeError(msg)
    return code


def to_f32(a: np.ndarray) -> np.ndarray:
    """A C-contiguous float32 copy of a float array (fast path for bf16 and f16)."""
    code = code_of(a.dtype)
    if code in ("bf16", "f16"):
        out = memory.empty(a.shape, np.float32)
        # aligned too: the converter reads uint16 elements (misaligned reads are UB in C++)
        flags = a.flags
        if not (flags.c_contiguous and flags.aligned):
            a = a.copy(order="C")  # a fresh array is aligned
        if native.convert(a, code, out, "f32"):
            return out
    return np.ascontiguousarray(a, dtype=np.float32)


def round_f32(result: np.ndarray, dtype: np.dtype[Any], out: np.ndarray | None = None) -> np.ndarray:
    """``result`` (float32) rounded to nearest even in ``dtype``, written into ``out`` if given."""
    code = code_of(dtype)
    if code in ("bf16", "f16") and result.flags.c_contiguous:
        target = memory.empty(result.shape, dtype) if out is None or not out.flags.c_contiguous else out
        if native.convert(result, "f32", target, code):
            if out is not None and target is not out:
                np.copyto(out, target)
            return out if out is not None else target
    if out is None:
        return result.astype(dtype, copy=False)
    np.copyto(out, result, casting="unsafe")
    return out


def all_finite(a: np.ndarray) -> bool:
    """Whether a float array holds no Inf and no NaN (fast for C-contiguous bf16 and f16)."""
    code = code_of(a.dtype)
    if code in ("bf16", "f16"):
        if a.flags.c_contiguous and a.flags.aligned:
            return bool(native.all_finite(a, code))
        # any other strides: the exponent bits, read as uint16 (NumPy's isfinite on bf16
        # converts each element: 3.8 ms for a strided view of a million, 1.6 ms this way)
        exponent = _EXPONENT_BITS[code]
        return not bool(np.any(np.bitwise_and(a.view(np.uint16), exponent) == exponent))
    return bool(np.isfinite(a).all())


#: the exponent field of a 16-bit float: all ones in an Inf or a NaN, and only there
_EXPONENT_BITS = {"bf16": np.uint16(0x7F80), "f16": np.uint16(0x7C00)}


#: DLPack type (code, bits) -> NumPy dtype, for arrays taken through DLPack (interop.py).
#: Codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool. Only the float types above reach the
#: ops; the rest are read so that a wrong dtype gets the ops' usual TypeError.
DLPACK_DTYPES: dict[tuple[int, int], np.dtype[Any]] = {
    (2, 32): FLOAT_DTYPES["f32"],
    (2, 16): FLOAT_DTYPES["f16"],
    (4, 16): FLOAT_DTYPES["bf16"],
    (2, 64): np.dtype(np.float64),
    **{(0, b): np.dtype(f"int{b}") for b in (8, 16, 32, 64)},
    **{(1, b): np.dtype(f"uint{b}") for b in (8, 16, 32, 64)},
    (6, 8): np.dtype(np.bool_),
}
_DLPACK_CODES = {dtype: key for key, dtype in DLPACK_DTYPES.items()}


def dlpack_type(dtype: np.dtype[Any]) -> tuple[int, int] | None:
    """The DLPack (code, bits) of a NumPy dtype, or None."""
    return _DLPACK_CODES.get(dtype)

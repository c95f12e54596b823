"""The native f32 <-> bf16/f16 conversion rounds exactly as NumPy and ml_dtypes do."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onednn_convt import _core, dtypes


def _awkward_values(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    with np.errstate(over="ignore"):
        a = (rng.standard_normal(n) * np.exp(rng.uniform(-100, 100, n))).astype(np.float32)
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, 65520.0, 3.3895e38], np.float32)
    a[: min(n, 8)] = special[: min(n, 8)]
    return a


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1001, 2**16 + 5, 300_001])  # the last two: in parallel chunks
def test_rounding_matches_numpy_bit_for_bit(code, n):
    dtype = dtypes.FLOAT_DTYPES[code]
    a = _awkward_values(n)
    with np.errstate(over="ignore"):
        expected = a.astype(dtype)
    got = np.empty(n, dtype)
    assert _core.convert(a, "f32", got, code)
    assert np.array_equal(got.view(np.uint16), expected.view(np.uint16))
    back = np.empty(n, np.float32)
    assert _core.convert(got, code, back, "f32")
    assert np.array_equal(back, expected.astype(np.float32), equal_nan=True)


def test_helpers_handle_views_and_out():
    a = _awkward_values(64).reshape(8, 8)
    view = a.astype(ml_dtypes.bfloat16).T  # not C-contiguous
    assert np.array_equal(dtypes.to_f32(view), view.astype(np.float32), equal_nan=True)
    out = np.empty((8, 8), np.float16)[:, :]
    with np.errstate(over="ignore"):
        expected = a.astype(np.float16)
    assert dtypes.round_f32(a, np.dtype(np.float16), out) is out
    assert np.array_equal(out.view(np.uint16), expected.view(np.uint16))


def test_bad_arguments_raise():
    a = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="one size"):
        _core.convert(a, "f32", np.zeros(5, np.float16), "f16")
    with pytest.raises(ValueError, match="f32"):
        _core.convert(np.zeros(4, np.float16), "f16", np.zeros(4, np.float16), "bf16")
    with pytest.raises(ValueError, match="item sizes"):
        _core.convert(a, "f32", np.zeros(4, np.float32), "f16")
    # a misaligned array (a view one byte into a buffer) would be read through a misaligned
    # pointer: refused (the Python helpers hand the converter aligned copies)
    raw = np.zeros(4 * 2 + 1, np.uint8)[1:].view(np.float16)
    assert not raw.flags.aligned
    with pytest.raises(ValueError, match="aligned"):
        _core.convert(raw, "f16", np.zeros(4, np.float32), "f32")
    with pytest.raises(ValueError, match="aligned"):
        _core.convert(np.zeros(4, np.float32), "f32", raw, "f16")

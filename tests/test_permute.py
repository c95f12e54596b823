"""The MatMul lowerings' permuting copies (onednn_convt.lowering.permute): oneDNN's Reorder
for large arrays, NumPy for small ones, each equal to NumPy's own transpose, element for
element."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from onednn_convt.lowering import permute

CASES = [
    # (shape, axes): the tiles layouts (2-D and 3-D, NXC and NCX), a plain transpose
    ((4, 16, 2, 16, 2, 64), (0, 1, 3, 2, 4, 5)),
    ((2, 4, 2, 8, 2, 8, 2, 16), (0, 1, 3, 5, 2, 4, 6, 7)),
    ((2, 64, 8, 2, 8, 2), (0, 2, 4, 3, 5, 1)),
    ((1, 16, 4, 2, 4, 2, 4, 2), (1, 3, 5, 7, 0, 2, 4, 6)),
    ((300, 257), (1, 0)),
]
DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape,axes", CASES, ids=str)
def test_permuted_equals_numpys_transpose(shape, axes, dtype, monkeypatch):
    a = np.random.default_rng(0).standard_normal(int(np.prod(shape))).astype(dtype)
    want = np.ascontiguousarray(a.reshape(shape).transpose(axes))
    for min_elems in (1, a.size + 1):  # through the library, then through NumPy
        monkeypatch.setattr(permute, "MIN_ELEMS", min_elems)
        got = permute.permuted(a, shape, axes)
        assert got.flags.c_contiguous and got.dtype == a.dtype and got.shape == want.shape
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_large_copies_go_through_the_library():
    """At the default threshold a U-Net-sized copy is the library's, its compiled Reorder
    cached; so is a 3-D layout of eight axes that no two merge."""
    permute._reorder.cache_clear()
    a = np.zeros(4 * 64 * 2 * 64 * 2 * 64, ml_dtypes.bfloat16)
    permute.permuted(a, (4, 64, 2, 64, 2 * 64), (0, 1, 3, 2, 4))
    assert permute._reorder.cache_info().currsize == 1
    b = np.random.default_rng(1).standard_normal(2 * 3 * 4 * 5 * 6 * 7 * 8 * 4).astype(np.float32)
    shape, axes = (2, 3, 4, 5, 6, 7, 8, 4), (1, 0, 3, 2, 5, 4, 7, 6)
    got = permute.permuted(b, shape, axes)
    assert np.array_equal(got, b.reshape(shape).transpose(axes))
    assert permute._reorder.cache_info().currsize == 2


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_a_phase_view_whose_axes_interleave_is_copied_right(dtype):
    """Every other element of an NCX array (a polyphase phase of a stride-2 layer), moved
    to NXC: its axes interleave without overlapping, a layout oneDNN cannot describe; the
    copy still equals NumPy's (it was a OneDNNError)."""
    full = np.random.default_rng(2).standard_normal((1, 1024, 33, 33)).astype(dtype)
    phase = full[:, :, ::2, ::2]
    got = permute.permuted(phase, phase.shape, (0, 2, 3, 1))
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(phase.transpose(0, 2, 3, 1)).view(np.uint8))
    permute._reorder.cache_clear()
    permute.permuted(full, full.shape, (0, 2, 3, 1))  # the whole array's axes nest: the library's
    assert permute._reorder.cache_info().currsize == 1

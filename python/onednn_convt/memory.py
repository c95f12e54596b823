"""New arrays the package allocates (results, reordered copies, a call's intermediates):
from 1 MiB, from the native core's kept blocks rather than from NumPy.

A large array from ``malloc`` is fresh pages on every call: one page fault and one zeroed
4 KiB page at a time, a tax of up to half the call on memory-bound work (a reorder). The
core keeps the large blocks that oneDNN's temporary buffers and these arrays free, up to
256 MiB, and hands them out again (:func:`onednn_convt.host_memory_info`;
:func:`onednn_convt.clear_cache` frees them). An array keeps its block until NumPy frees
it, like any array; smaller arrays come from NumPy as before.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from . import native

#: the smallest array taken from the kept blocks, in bytes (1 MiB; host_memory.hpp)
KEPT_FROM = native.host_kept_from
#: the most bytes kept for reuse at once (256 MiB)
KEPT_BYTES = native.host_kept_bytes


def empty(shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
    """A new C-ordered array, contents undefined (as :func:`numpy.empty`)."""
    dims = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(n) for n in shape)
    dt = np.dtype(dtype)
    if math.prod(dims) * dt.itemsize < KEPT_FROM:
        return np.empty(dims, dt)
    array: np.ndarray = native.host_empty(dt, list(dims))
    return array


def zeros(shape: Sequence[int] | int, dtype: Any) -> np.ndarray:
    """A new C-ordered array of zeros (as :func:`numpy.zeros`)."""
    array = empty(shape, dtype)
    fill_zeros(array)
    return array


def fill_zeros(a: np.ndarray) -> None:
    """Set ``a`` (any view) to zeros: through same-size unsigned integers, whose zero bits
    are every float dtype's zero (NumPy fills bf16 element by element: 530 us for 2 MiB
    where its 16-bit integers take 40)."""
    size = a.dtype.itemsize
    (a.view(f"u{size}") if size in (1, 2, 4, 8) and a.dtype.kind in "fV" else a).fill(0)


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` where it is C-contiguous, else a C-contiguous copy of it (as
    :func:`numpy.ascontiguousarray`), in kept memory from 1 MiB: a lowering's per-call copies
    (a MatMul's frames of 134 MB a call on HiFi-GAN's layer) take no fresh pages."""
    if a.flags.c_contiguous:
        return a
    out = empty(a.shape, a.dtype)
    np.copyto(out, a)
    return out

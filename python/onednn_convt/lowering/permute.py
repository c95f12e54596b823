"""Permuting copies of activations (the MatMul lowerings' layout steps), done by oneDNN.

A permuting copy of a large array runs as a oneDNN ``Reorder`` partition: JIT code over the
thread pool. NumPy copies on one thread, element by element where the innermost run is
short. On a Sapphire Rapids CPU (2 threads) the U-Net BackwardData's diff_dst (4x128x128x64
bf16, 8 MiB) took 0.31 ms this way against 0.59 ms in NumPy. Small arrays, and layouts
that need more than the library's twelve dimensions, are copied by NumPy.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np

from .. import dtypes, memory, native, omp, shapes
from ..strides import nested

#: arrays of fewer elements are copied by NumPy (the library call's fixed cost dominates)
MIN_ELEMS = 1 << 16
#: the most dimensions of a library Reorder (oneDNN's DNNL_MAX_NDIMS; compiled_op.cpp)
MAX_DIMS = 12


def permuted(a: np.ndarray, shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """``a`` reshaped to ``shape`` and its axes permuted, as a new C-contiguous array."""
    code = dtypes.code_of(a.dtype)
    view = a.reshape(shape).transpose(axes)
    dims = _coalesced(view) if code is not None and a.size >= MIN_ELEMS else None
    if dims is None or len(dims[0]) > MAX_DIMS:  # (a 3-D layout has at most 8)
        return _numpy_permuted(a, shape, axes)
    sizes, strides = dims
    src = np.lib.stride_tricks.as_strided(view, sizes, tuple(s * a.itemsize for s in strides))
    if not nested(src):
        # axes that interleave without overlapping, which oneDNN 3.2 cannot describe ("could
        # not construct a memory descriptor using strides"): a polyphase phase of an NCX
        # array moved to NXC, (17, 17, 1024) with strides (66, 2, 1089)
        return _numpy_permuted(a, shape, axes)
    out = memory.empty(view.shape, a.dtype)
    _reorder(sizes, strides, code, omp.max_threads()).execute([src], out.reshape(sizes))
    return out


def _coalesced(view: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(sizes, element strides) of ``view`` with size-1 axes dropped and each axis merged
    into the one before it where the two are contiguous in ``view`` too; None if ``view``
    has a stride that is not a whole number of elements or is not positive."""
    sizes: list[int] = []
    strides: list[int] = []
    for n, st in zip(view.shape, view.strides):
        if n == 1:
            continue
        if st <= 0 or st % view.itemsize:
            return None
        st //= view.itemsize
        if strides and strides[-1] == st * n:
            sizes[-1] *= n
            strides[-1] = st
        else:
            sizes.append(n)
            strides.append(st)
    return (tuple(sizes), tuple(strides)) if sizes else None


@functools.lru_cache(maxsize=64)
def _reorder(sizes: tuple[int, ...], strides: tuple[int, ...], code: str, threads: int) -> Any:
    """The compiled Reorder from ``strides`` to dense, for this many threads (the library
    fixes its thread split when it compiles)."""
    return native.compile("Reorder", {}, [(sizes, strides, code)], (sizes, shapes.dense_strides(sizes), code))


def _numpy_permuted(a: np.ndarray, shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """The copy in NumPy, of same-size unsigned integers (NumPy copies bf16 element by
    element). Where the last axis stays last, its elements travel together as one wider
    integer: NumPy's copy loops run per innermost row, and a kernel-sized innermost row (2
    taps) made the copy 6x slower (6.3 ms against 1.0 ms for 2M elements)."""
    size = a.dtype.itemsize
    src = a.view(f"u{size}").reshape(shape)
    target = [shape[i] for i in axes]
    width = size * shape[-1]
    if axes[-1] == len(shape) - 1 and width in (2, 4, 8) and src.strides[-1] == size and src.flags.aligned:
        src, axes = src.view(f"u{width}")[..., 0], axes[:-1]
    else:
        width = size
    out = memory.empty(target[: len(axes)], f"u{width}")
    np.copyto(out.transpose(np.argsort(axes)), src)
    return out.view(f"u{size}").reshape(target).view(a.dtype)

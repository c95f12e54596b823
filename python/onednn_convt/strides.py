"""Which NumPy memory layouts oneDNN can describe, and how the package describes them.

A library tensor is a shape and strides in elements, positive, nesting (each dimension's
step at least the extent of the ones with smaller steps) and aligned to the item size.
Arrays outside that are copied first (:func:`needs_copy`). A size-1 dimension's stride
addresses nothing, and NumPy leaves any value there; the library is told the C-order one
(:func:`library_strides`).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np


def element_strides(a: np.ndarray) -> Optional[tuple[int, ...]]:
    """Strides of ``a`` in elements, or None where oneDNN cannot describe them (misaligned,
    not a whole number of items, or zero/negative on a dim longer than 1)."""
    size = a.itemsize
    if not a.flags.aligned or any(s % size for s in a.strides):
        return None
    strides = tuple(s // size for s in a.strides)
    if any(s <= 0 and n > 1 for s, n in zip(strides, a.shape)):
        return None
    return strides


def non_overlapping(a: np.ndarray) -> bool:
    """Whether the dims longer than 1, in order of their steps, each step past the extent of
    the ones before: no two elements share memory, and the strides nest."""
    dims = sorted((s, n) for s, n in zip(a.strides, a.shape) if n > 1)
    extent = a.itemsize
    for s, n in dims:
        if s < extent:
            return False
        extent = s * n
    return True


def needs_copy(a: np.ndarray) -> bool:
    """Whether ``a`` must be copied before the library can read it: its strides cannot be
    described (negative or zero steps on longer dims, steps that do not nest: ``x[:, :, ::3,
    ::3]`` of an NCX array, which oneDNN refused with invalid_arguments) or it is misaligned."""
    return element_strides(a) is None or not non_overlapping(a)


def nested(a: np.ndarray) -> bool:
    """Whether oneDNN can write ``a`` as it is: aligned, positive strides that nest."""
    strides = element_strides(a)
    return strides is not None and all(st > 0 for st in strides) and non_overlapping(a)


def library_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """``strides`` (elements) with each size-1 dim's replaced by the C-order one: the extent
    of the dims after it. A size-1 dim's stride addresses nothing, and NumPy leaves any value
    there (``x[::2]`` of two rows: twice the dense one; ``x[None]``: 0), but oneDNN 3.2 reads
    it: a binary Add whose operand had a size-1 dim's stride above the dense one added the
    wrong elements (docs/deviations.md). The core compares the other dims' strides alone."""
    out = list(strides)
    inner = 1
    for i in reversed(range(len(shape))):
        if shape[i] == 1:
            out[i] = inner
        inner = max(inner, out[i] * shape[i])
    return tuple(out)

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


#: the step (elements) whose multiples oneDNN 3.2's Reorder writes wrongly into an evenly
#: spaced array (:func:`writable`)
REORDER_BAD_STEP = 4


def even_step(a: np.ndarray) -> int:
    """The step (elements) between ``a``'s elements where they lie evenly spaced, as a 1-D
    array of that step reshaped would (the dims longer than 1, ordered by stride, each
    starting where the one before ends), else 0. A dense array's is 1; ``x[..., ::4]`` of
    a C-contiguous ``x`` has 4."""
    strides = element_strides(a)
    if strides is None:
        return 0
    dims = sorted((s, n) for s, n in zip(strides, a.shape) if n > 1)
    if not dims:
        return 1
    step = dims[0][0]
    extent = step
    for s, n in dims:
        if s != extent:
            return 0
        extent = s * n
    return step


def writable(a: np.ndarray) -> bool:
    """Whether oneDNN 3.2 writes ``a`` as it is, and rightly: :func:`nested`, and not evenly
    spaced at a step that is a multiple of :data:`REORDER_BAD_STEP` elements. Into such an
    array (``x[..., ::4]`` of a C-contiguous ``x``) the Reorder from a dense result wrote the
    first element right and garbage after it: in f32 and bf16, 2-D to 4-D, from a few
    thousand elements on, on one thread or two (a scan of 1,800 shapes: over a third wrong at
    steps 4, 8, 12 and 16; none at steps 2, 3, 5, 6, 7, 9 or 10, none where some other dim
    leaves a gap, none reading such an array; AMD Zen4, avx512_core_bf16;
    docs/deviations.md). Such an array gets a dense result, copied into it."""
    if not nested(a):
        return False
    step = even_step(a)
    return step <= 1 or step % REORDER_BAD_STEP != 0


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

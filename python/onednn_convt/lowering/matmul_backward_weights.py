"""ConvTransposeBackwardWeights as one MatMul over frames of diff_dst, in bf16 and f16.

oneDNN 3.2's bf16 backward-weights kernels return wrong weights when a spatial dim of src is
no longer than the dilated kernel (:func:`onednn_convt.lowering.weights.backward_weights_needs_f32`),
so such calls cannot use them. Computing them in f32 is right but slow on large problems
(the DCGAN 4x4 -> 8x8 layer: 0.84x PyTorch's bf16 time). The same gradient is a matrix
product in the call's own dtype, which the library's bf16 MatMul computes correctly:

    frames[n, x, oc, t] = diff_dst[n, oc, x*s - pads_begin + t*d]   (0 outside diff_dst),
                          per spatial dim, for src position x and kernel tap t
    IOX: dW (IC, OC*K) = src (IC, N*X) @ frames (N*X, OC*K)
    XOI: dW (K*OC, IC) = frames (K*OC, N*X) @ src (N*X, IC)

Both results are the weights' memory as laid out (no finishing copy). A tap that falls in
the padding is a zero in the frames; with an Inf or NaN in src, 0 * Inf would turn it into a
NaN where the op has no term at all, so such calls are redone by the library's f32 kernel.

The rule (documented in docs/performance.md): bf16 or f16, groups 1, the library's bf16 kernel ruled
out by the condition above, at least :data:`MIN_MACS` multiply-adds (below that the f32 path
costs a few microseconds and this one's NumPy framing more), frames at most
:data:`MAX_FRAMES_RATIO` times diff_dst.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from .. import dtypes, memory, shapes
from .permute import permuted

#: the smallest problem (multiply-adds) that takes this lowering
MIN_MACS = 1 << 22

#: the largest frames / diff_dst element ratio (about kernel / stride per spatial dim)
MAX_FRAMES_RATIO = 16

# IOX wants the frames with each channel's taps innermost, (N*X, OC, K). Copied straight
# from the padded diff_dst, whose channels are innermost, that copy reads one element per tap
# across the padded rows. Instead they are copied as they lie (N*X, K, OC: runs of OC
# channels) and then transposed to (N*X, OC, K) by oneDNN's Reorder over the thread pool
# (:mod:`.permute`). Measured on an AMD Zen4, 2 threads (best of 7, two runs): 1.4-6.2x
# faster in bf16 and f32 over 1-D, 2-D, 3-D and 1x1 src (DCGAN's 16x512x4x4 -> 8x8 layer in
# bf16: 1.73 -> 0.29 ms). XOI's frames, (K*OC, N*X), are then a 2-D transpose of the frames
# as they lie: in bf16 from :data:`XOI_TWO_STEP_FROM` elements 1.3-4.3x faster (six shapes,
# two runs); smaller, and in f32, it varied from run to run (0.2-5.5x), and the one copy
# stays.

#: the fewest frames elements (2-byte dtypes, XOI) copied in two steps (see above)
XOI_TWO_STEP_FROM = 1 << 19


def applies(
    src_shape: Sequence[int], dd_shape: Sequence[int], kernel: Sequence[int], groups: int, data_format: str,
) -> bool:
    """Whether a bf16/f16 BackwardWeights call that the library's low-precision kernels get
    wrong runs as this MatMul (the caller checks that condition and the dtype)."""
    n, ic, xs = shapes.split_activation(src_shape, data_format)
    _, oc, _ = shapes.split_activation(dd_shape, data_format)
    frames = n * math.prod(xs) * oc * math.prod(kernel)
    return groups == 1 and frames * ic >= MIN_MACS and frames <= MAX_FRAMES_RATIO * math.prod(dd_shape)


def backward_weights(
    src_shape: Sequence[int], dd_shape: Sequence[int], weights_shape: Sequence[int], kernel: Sequence[int],
    geometry: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int]],
    data_format: str, weights_format: str, exact: Callable[[Sequence[Any]], np.ndarray],
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for one BackwardWeights call.

    Args:
        geometry: (strides, dilations, pads_begin, pads_end) per spatial dim, resolved.
        exact: computes the call's result in f32 by the library's kernel (for non-finite src).

    Returns:
        keyword arguments ``attrs``, ``prepare``, ``finish``, ``library_shape``,
        ``prepared_elems``.
    """
    strides, dilations, pads_begin, _ = geometry
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, ic, xs = shapes.split_activation(src_shape, data_format)
    _, oc, ys = shapes.split_activation(dd_shape, data_format)
    p, k = math.prod(xs), math.prod(kernel)
    # diff_dst with pads_begin zeros before it and enough after it for the last frame
    padded = tuple(
        max(pb + y, (x - 1) * s + (t - 1) * d + 1)
        for x, y, t, s, d, pb in zip(xs, ys, kernel, strides, dilations, pads_begin)
    )
    inner = tuple(slice(pb, pb + y) for pb, y in zip(pads_begin, ys))
    rank = len(xs)

    def frames_of(dd: np.ndarray) -> np.ndarray:
        """(N, X..., K..., OC), a read-only view of a zero-padded (N, Y'..., OC) copy."""
        full = memory.zeros((n, *padded, oc), dd.dtype)
        full[(slice(None), *inner, slice(None))] = np.moveaxis(dd, 1, -1) if ncx else dd
        st = full.strides
        view_strides = (
            st[0], *(s * st[1 + i] for i, s in enumerate(strides)),
            *(d * st[1 + i] for i, d in enumerate(dilations)), st[-1],
        )
        return np.lib.stride_tricks.as_strided(full, (n, *xs, *kernel, oc), view_strides, writeable=False)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dtype = args[0].dtype
        # 2-byte floats move as uint16 (NumPy copies ml_dtypes' bfloat16 about 25% slower)
        dd = args[1].view(np.uint16) if dtype.itemsize == 2 else args[1]
        frames = frames_of(dd)
        spatial = tuple(range(1, 1 + rank))  # the X axes of frames; taps follow them
        taps = tuple(range(1 + rank, 1 + 2 * rank))
        src = args[0]  # (N, IC, X) or (N, X, IC); where it must move, oneDNN's Reorder moves it
        if iox:  # src (IC, N*X) @ frames (N*X, OC*K)
            rows = permuted(src, (n, ic, p) if ncx else (n * p, ic), (1, 0, 2) if ncx else (1, 0))
            cols = permuted(memory.contiguous(frames).view(dtype), (n * p, k, oc), (0, 2, 1))
            return [rows.reshape(ic, n * p), cols.reshape(n * p, oc * k)]
        # frames (K*OC, N*X) @ src (N*X, IC)
        if dtype.itemsize == 2 and n * p * k * oc >= XOI_TWO_STEP_FROM:
            rows = permuted(memory.contiguous(frames).view(dtype), (n * p, k * oc), (1, 0))
        else:
            rows = memory.contiguous(frames.transpose(*taps, 1 + 2 * rank, 0, *spatial))
        cols = permuted(src, (n, ic, p), (0, 2, 1)) if ncx else memory.contiguous(src)
        return [rows.view(dtype).reshape(k * oc, n * p), cols.reshape(n * p, ic)]

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        if not dtypes.all_finite(np.ascontiguousarray(arrays[0])):
            return exact(arrays)  # padding taps would meet the Inf/NaN as 0 * Inf = NaN
        return out.reshape(weights_shape)  # already the weights' layout, in the call's dtype

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (ic, oc * k) if iox else (k * oc, ic),
        # padded, frames, src (frames copied in two steps: the first copy is freed before the
        # library's result is allocated, the peak that the estimate stands for)
        "prepared_elems": n * math.prod(padded) * oc + n * p * oc * k + n * p * ic,
        "finish_elems": 0,  # a reshape (the redo of a non-finite src is the library's f32 op's)
    }

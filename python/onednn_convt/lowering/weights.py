"""Weights transforms shared by the lowerings: the flipped weights of the forward
Convolution that equals a stride-1 ConvTranspose, and weights grown with zero taps (the
guarded BackwardData). Which lowering runs a problem: :mod:`onednn_convt.lowering.rules`."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from .. import shapes



def convolution_pads(
    kernel: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int], pads_end: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Pads of the stride-1 forward Convolution equal to a stride-1 ConvTranspose:
    ``d*(k-1) - pb`` and ``d*(k-1) - pe`` (negative when the ConvTranspose crops more)."""
    ek = [d * (k - 1) for k, d in zip(kernel, dilations)]
    return [e - p for e, p in zip(ek, pads_begin)], [e - p for e, p in zip(ek, pads_end)]


def convolution_weights(
    w: np.ndarray, weights_format: str, groups: int, out: Optional[np.ndarray] = None
) -> np.ndarray:
    """ConvTranspose weights as the weights of the equivalent stride-1 forward Convolution:
    per group the I and O dims swapped and the spatial dims reversed, IOX ``(IC, OC/G, X...)``
    to OIX ``(OC, IC/G, X...)`` and XOI ``(X..., OC/G, IC)`` to XIO ``(X..., IC/G, OC)``.
    A C-contiguous array (oneDNN takes no negative strides): ``out`` when it has that shape
    and dtype (and is C-contiguous), else a new one."""
    ic, ocg, kernel = shapes.split_weights(w.shape, weights_format)
    if ocg == 1 and ic == groups:  # depthwise: the same shape, only the spatial dims reversed
        flipped = w[_REVERSED[weights_format, len(kernel)]]
    else:
        flipped = _transposed_per_group(w, weights_format, groups, ic, ocg, kernel)
    if out is not None and out.shape == flipped.shape and out.dtype == flipped.dtype and out.flags.c_contiguous:
        np.copyto(out, flipped)
        return out
    return np.ascontiguousarray(flipped)


#: (weights_format, spatial rank) -> the index that reverses the spatial dims
_REVERSED = {
    (fmt, r): (slice(None),) * (2 if fmt == "IOX" else 0) + (slice(None, None, -1),) * r
    for fmt in ("IOX", "XOI") for r in (1, 2, 3)
}


def _transposed_per_group(
    w: np.ndarray, weights_format: str, groups: int, ic: int, ocg: int, kernel: Sequence[int]
) -> np.ndarray:
    """The general case of :func:`convolution_weights`: a flipped view (of a copy when the
    per-group transpose cannot be a view)."""
    r = len(kernel)
    if weights_format == "IOX":
        swapped = w.reshape(groups, ic // groups, ocg, *kernel).swapaxes(1, 2)
        conv = swapped.reshape(ocg * groups, ic // groups, *kernel)
        axes = tuple(range(2, 2 + r))
    else:
        split = w.reshape(*kernel, ocg, groups, ic // groups)
        conv = np.moveaxis(split, (r, r + 2), (r + 2, r)).reshape(*kernel, ic // groups, ocg * groups)
        axes = tuple(range(r))
    return np.flip(conv, axes)


def backward_weights_needs_f32(src: Sequence[int], kernel: Sequence[int], dilations: Sequence[int]) -> bool:
    """Whether a bf16/f16 BackwardWeights call must be computed in f32 even where the CPU has
    native kernels: when some spatial dim of src is no longer than the dilated kernel.

    oneDNN 3.2's bf16 backward-weights kernels (``jit_bf16:avx512_core_bf16``, in both the
    Convolution and the ConvTranspose lowering, and the AMX ones: 9 of 3,300 unguarded bf16
    problems there, all with this condition; guards.BF16_BACKWARD_WEIGHTS_SHORT_SRC says
    where it applies) return weights taps that are uninitialized
    memory (up to 1e35), zero or wrong on such problems, differently from run to run. A
    random scan of 18,368 small problems found 43 wrong results (2-D/3-D: 34 of 7,786 in
    NXC, 1 of 1,977 in NCX, 5 of 984 with 32-128 channels; 1-D: 3 of 2,128 in NXC, 0 of
    2,091 in NCX), every one of them with this condition, 4 with equality only; none among
    1,500 problems of spatial sizes 6-16 without it. f32 was right on all 1,902 tried.
    """
    return any(x <= d * (k - 1) + 1 for x, k, d in zip(src, kernel, dilations))


#: the most extra multiply-adds (as a factor) that a native bf16 call with zero-padded
#: kernel taps may cost before f32 is chosen instead (guards.AMX_STRIDE_NOT_BELOW_KERNEL);
#: AMX bf16 ran 2.9-3.8x the f32 speed on the models suite (docs/performance.md)
MAX_PADDED_KERNEL_COST = 2.5


def padded_kernel(
    kernel: Sequence[int], strides: Sequence[int], dims: Sequence[int]
) -> Optional[tuple[int, ...]]:
    """The kernel grown with zero taps to ``s + 1`` along ``dims``, so that no stride there
    reaches the kernel; None when that costs more than :data:`MAX_PADDED_KERNEL_COST` times
    the multiply-adds."""
    grown = tuple(s + 1 if i in dims else k for i, (k, s) in enumerate(zip(kernel, strides)))
    cost = 1.0
    for k, g in zip(kernel, grown):
        cost *= g / k
    return grown if cost <= MAX_PADDED_KERNEL_COST else None


def zero_padded_weights(weights_format: str, kernel: Sequence[int], grown: Sequence[int]) -> Callable[[np.ndarray], np.ndarray]:
    """A function giving the weights (IOX or XOI, or the OIX/XIO reading of them) with zero
    taps appended to each spatial dim, from ``kernel`` to ``grown``; C-contiguous, same dtype.
    A forward Convolution over them computes the same outputs when each pads_end grows by
    ``d * (grown - kernel)``: the new taps read pads or rows whose products are zero."""
    r = len(kernel)
    first = 2 if weights_format in ("IOX", "OIX") else 0
    widths = [(0, 0)] * (r + 2)
    for i, (k, g) in enumerate(zip(kernel, grown)):
        widths[first + i] = (0, g - k)

    def pad(w: np.ndarray) -> np.ndarray:
        # the same-size unsigned integer view: zero bits are +0.0 in every float format
        bits = np.pad(w.view(f"u{w.dtype.itemsize}"), widths)
        return bits.view(w.dtype)

    return pad

"""Which library op runs each op: the rules chosen from measurement (README, "Lowerings").

Every choice below computes the same op; they differ in the kernels and reorders oneDNN 3.2
picks for them. ``python benchmarks/compare_lowerings.py fwd`` (or ``bwd_d``, ``bwd_w``) times
both lowerings of each models-suite configuration side by side; the figures below are its:

- ConvTranspose with groups 1 and no bias runs as the library's ``ConvolutionBackwardData``
  (:func:`forward_kind`): the backward data of the convolution it transposes, on the same
  weights memory (IOX read as OIX, XOI as XIO) with ``dst_shape`` giving the output size
  (output_padding included). oneDNN 3.2 runs the same kernels either way (bit-identical
  results); its ConvTranspose wraps them in a deconvolution and costs about 2 us more per
  call (native loop on ``tiny``: 4.5 against 6.8 us). Our out= call took 0.76-0.82x the
  ConvTranspose time on ``tiny`` (f32, bf16; NCX, NXC) and 0.73-1.13x on the models and
  sweep suites (geometric mean 0.99 over 76 configurations, within noise). That
  op has no bias input, and with groups oneDNN 3.2 rejects it (``invalid_shape``), so those
  keep ``ConvTranspose``.
- Otherwise ConvTranspose runs as the library's ``ConvTranspose`` (or as ``MatMul`` +
  overlap-add for large 1-D kernels, :mod:`onednn_convt.matmul_lowering`), except a depthwise
  one (one input and one output channel per group) with every stride 1: that is a forward
  ``Convolution`` over the spatially flipped weights with pads ``d*(k-1) - pb`` and
  ``d*(k-1) - pe``, which oneDNN 3.2 runs on its depthwise convolution kernels where its
  ConvTranspose takes a generic deconvolution path. On the models suite's depthwise layer
  (8x128x32x32, k3 s1 p1), library execute time, Sapphire Rapids, 2 threads, under every
  ``ONEDNN_MAX_CPU_ISA`` from AVX2 to AMX: NXC 0.08-0.13x (f32) and 0.015-0.04x (bf16) of
  the ConvTranspose time, NCX 0.31-0.35x (f32) and 0.035-0.06x (bf16); with a fused
  post-op the ConvTranspose kernel slows a further 2-10x (19-29 ms) while the Convolution's
  does not (:mod:`onednn_convt.fusion` builds its graph on the same Convolution). An
  earlier measurement on a Zen4 CPU (avx512_core_bf16) had found NCX 1.2-2x slower this
  way, NXC 0.37x (f32) and 0.50x (bf16); it predates the per-ISA measurement and is not
  re-checked there. The flipped weights are copied each call into
  an array kept per thread and plan (small: one input and one output channel per group), so
  calls with out= allocate nothing. Dense and grouped stride-1 layers measured
  0.6-1.4x either way (Zen4), so they keep the rules above.
- ConvTransposeBackwardData runs as ``MatMul`` over frames of diff_dst for large 1-D kernels
  (:mod:`onednn_convt.matmul_lowering`); otherwise as the library's forward ``Convolution`` over the same
  weights memory (IOX read as OIX, XOI as XIO; spec D9), which handles dilations, except
  where :func:`backward_data_kind` picks the library's own ``ConvTransposeBackwardData``:
  every dilation 1 (oneDNN 3.2 drops dilations there) and either one spatial dim or NCX.
  Measured side by side on the models suite (AVX-512 machine, 2 threads, f32 and bf16), the
  library's op took 0.24-0.38x the Convolution lowering's time in 1-D (gemm-based kernels)
  and 0.42-1.07x in 2-D/3-D NCX (geometric mean 0.83x: no activation reorders); in 2-D/3-D
  NXC it took 0.88-2.8x, so there the Convolution lowering stays (its kernels read NXC).
- ConvTransposeBackwardWeights runs as the library's ``ConvTransposeBackwardWeights``, except
  in 2-D and 3-D NXC (:func:`backward_weights_kind`), where it runs as the backward-weights of
  the convolution that BackwardData is (spec D9): ``ConvolutionBackwardWeights`` with src =
  diff_dst, diff_dst = src and the weights read as OIX (IOX) or XIO (XOI). oneDNN 3.2 runs
  that on NXC activations directly (ConvTransposeBackwardWeights reorders both to blocked
  layouts): on the models suite 0.16-0.26x the time on the depthwise layer, 0.38-0.74x on the
  3-D layer, 0.53-1.0x on the DCGAN layers, 0.86x on U-Net bf16, but 1.6x on U-Net f32
  (geometric mean over the ten 2-D/3-D NXC configurations 0.62x). In NCX it measured
  1.0-2.3x slower, in 1-D 0.84-1.7x, so those keep the library's op.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from . import shapes

#: the dispatch ISA on which the rules below were measured (an AMD Zen4, 2 threads): on
#: another ISA they still compute the same results (tests/test_isa_matrix.py checks every
#: level), but which lowering is fastest there has not been measured; info() reports it.
#: The depthwise stride-1 forward rule alone was re-measured on a Sapphire Rapids CPU under
#: every ONEDNN_MAX_CPU_ISA level (module docstring), where it disagrees with Zen4 in NCX
RULES_MEASURED_ON = "avx512_core_bf16"

CONVOLUTION = "Convolution"
CONV_TRANSPOSE = "ConvTranspose"
CONV_TRANSPOSE_BACKWARD_DATA = "ConvTransposeBackwardData"
CONV_TRANSPOSE_BACKWARD_WEIGHTS = "ConvTransposeBackwardWeights"
CONVOLUTION_BACKWARD_WEIGHTS = "ConvolutionBackwardWeights"
CONVOLUTION_BACKWARD_DATA = "ConvolutionBackwardData"


def convolution_pads(
    kernel: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int], pads_end: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Pads of the stride-1 forward Convolution equal to a stride-1 ConvTranspose:
    ``d*(k-1) - pb`` and ``d*(k-1) - pe`` (negative when the ConvTranspose crops more)."""
    ek = [d * (k - 1) for k, d in zip(kernel, dilations)]
    return [e - p for e, p in zip(ek, pads_begin)], [e - p for e, p in zip(ek, pads_end)]


def forward_kind(
    kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
    pads_end: Sequence[int], groups: int, ic: int, oc: int, *, bias: bool,
) -> str:
    """The library op kind that runs a ConvTranspose call (outside the MatMul lowering)."""
    depthwise = ic == groups and oc == groups
    if depthwise and all(s == 1 for s in strides):
        begin, end = convolution_pads(kernel, dilations, pads_begin, pads_end)
        if min(begin + end) >= 0:
            return CONVOLUTION
    if groups == 1 and not bias:
        return CONVOLUTION_BACKWARD_DATA
    return CONV_TRANSPOSE


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


def backward_weights_kind(rank: int, data_format: str) -> str:
    """The library op kind that runs a ConvTransposeBackwardWeights call."""
    if rank >= 2 and data_format == "NXC":
        return CONVOLUTION_BACKWARD_WEIGHTS
    return CONV_TRANSPOSE_BACKWARD_WEIGHTS


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


def backward_data_kind(dilations: Sequence[int], data_format: str) -> str:
    """The library op kind that runs a ConvTransposeBackwardData call."""
    if all(d == 1 for d in dilations) and (len(dilations) == 1 or data_format == "NCX"):
        return CONV_TRANSPOSE_BACKWARD_DATA
    return CONVOLUTION


#: the most extra multiply-adds (as a factor) that a native bf16 call with zero-padded
#: kernel taps may cost before f32 is chosen instead (guards.AMX_STRIDE_NOT_BELOW_KERNEL);
#: AMX bf16 ran 2.9-3.8x the f32 speed on the models suite (README, Performance)
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

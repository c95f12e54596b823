"""The lowerings of a ConvTranspose problem: which can run it, and how each is built.

- ``ConvTranspose``: the library's own op (any problem; bias, groups, output_padding).
- ``ConvolutionBackwardData``: the backward data of the convolution this op transposes, on
  the same weights memory (IOX read as OIX, XOI as XIO) with ``dst_shape`` giving the output
  size; groups 1 (oneDNN 3.2 rejects groups there); no bias, as neither library op takes it
  (:func:`bias_apart`).

A bias never reaches the library ops (:func:`bias_apart`): with a stride > 1 the
deconvolution's strided kernel adds it once per partial sum on some problems (the guard
:data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`), and with stride 1 its biased
kernels are 1.3-20x slower than the op without it. Both library ops run without it; the core
adds it to a small f32 result, a second partition (BiasAdd) to any other.
- ``Convolution (flipped weights)``: every stride 1 and pads within the dilated kernel: a
  forward Convolution over the spatially flipped, per-group transposed weights with pads
  ``d*(k-1) - pb`` and ``d*(k-1) - pe``; the weights are copied each call into an array
  kept per thread and plan, so calls with out= allocate nothing.
- ``MatMul (overlap-add)``: 1-D, groups 1, dilation 1 (:mod:`.matmul_lowering`).
- ``MatMul (tiles)``: the taps tile the output (stride = kernel, or a single src position,
  no pads, groups 1, dilation 1; :mod:`.matmul_tiles`).

A kernel of at least :data:`.matmul_lowering.MIN_KERNEL` in 1-D has the overlap-add alone:
oneDNN 3.2's deconvolution JIT takes about 100 s to compile there. Where the guard
:data:`onednn_convt.guards.AMX_STRIDE_NOT_BELOW_KERNEL` is active, the two library ops
compute in f32 (their native kernels are wrong there).
"""

from __future__ import annotations

import threading
from typing import Optional

import numpy as np

from .. import guards
from ..problem import Problem
from . import base, matmul_columns, matmul_lowering, matmul_tiles, weights
from .base import Lowering


def candidates(p: Problem) -> list[str]:
    """The names of the lowerings that can run ``p``."""
    g = p.geometry
    if matmul_lowering.applies(p.kernel, p.groups, g.dilations):
        return [base.OVERLAP_ADD]
    names = [base.CONV_TRANSPOSE]
    if p.groups == 1:  # a bias never reaches the library op (bias_apart)
        names.append(base.CONVOLUTION_BACKWARD_DATA)
    if _flippable(p):
        names.append(base.FLIPPED_CONVOLUTION)
    if p.rank == 1 and p.groups == 1 and g.dilations[0] == 1:
        names.append(base.OVERLAP_ADD)
    if matmul_tiles.applies(p.kernel, *g.astuple(), p.groups, p.output_padding, p.src):
        names.append(base.TILES)
    if matmul_columns.applies(p.kernel, g.strides, g.dilations, p.groups, p.oc):
        names.append(base.COLUMNS)
    return names


def bias_guarded(p: Problem) -> bool:
    """Whether the guard :data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE` keeps
    ``p``'s bias out of the library ops (ConvTranspose, ConvolutionBackwardData)."""
    return p.bias and guards.strided_deconvolution_epilogue(p.dtype, p.geometry.strides)


#: the most output elements of an f32 result whose bias the core adds (:func:`bias_apart`)
HOST_BIAS_ELEMENTS = 2**16
#: :func:`bias_apart`'s answers: the core adds the bias; a second partition (BiasAdd) does
HOST, STAGE = "host", "stage"


def bias_apart(p: Problem, in_f32: bool = False) -> Optional[str]:
    """How the library ops (ConvTranspose, ConvolutionBackwardData) running ``p`` get its
    bias: ``None``, they take it; :data:`HOST`, they run without it and the core adds it to
    their f32 result (``Lowering.host_bias``); :data:`STAGE`, a second partition (BiasAdd)
    adds it in dst (``Lowering.bias_stage``). ``in_f32``: a bf16/f16 ``p`` whose library op
    computes in f32 (an ``"... in f32"`` lowering), which counts as f32.

    Always apart. Strided, the guard :data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`
    requires it. With stride 1, oneDNN 3.2's deconvolution with a bias is slow: it runs
    its blocked JIT kernel (``jit:avx512_core``, ``jit_bf16:avx512_core_bf16``) with
    reorders of src, weights and dst around it, where without a bias
    ConvolutionBackwardData runs ``brgconv`` on the plain layouts, and its bf16 bias pass
    costs about 9 ns an output element. Measured on an AMD Zen5 (avx512_core_bf16), 2
    threads, out= calls, k3 s1 p1 layers of 75 to 262,144 output elements, NCX and NXC:
    f32 took 0.50-0.74x the library's biased time with the bias apart (the tiny forward,
    1x4x5x5 -> 3 channels: 8.6 us against 2.9 with the core's loop, 6.5 with a BiasAdd
    partition; an 8x32x32x32 NXC one 670 against 350 us); bf16, 0.07-0.21x (2,430 against
    250 us). The core's loop (one thread) beats a partition up to :data:`HOST_BIAS_ELEMENTS`
    (a partition costs about 3.5 us more a call; at 131,072 elements, k4 s2, the partition
    took 0.93x the loop's time, which runs on one thread). f32 only: a bf16/f16 result
    would be rounded twice by the core.

    A polyphase lowering asks this of the whole problem: where the answer is
    :data:`STAGE` its phases run without the bias and one BiasAdd follows them over dst (a
    BiasAdd partition per phase, on its strided view of dst, took 11-13x the phases' time:
    8x64x64x64 depthwise k4 s2 NCX f32, 196 against 15 ms)."""
    if not p.bias:
        return None
    if (p.dtype == "f32" or in_f32) and int(np.prod(p.out_shape)) <= HOST_BIAS_ELEMENTS:
        return HOST
    return STAGE


def _flippable(p: Problem) -> bool:
    g = p.geometry
    begin, end = weights.convolution_pads(p.kernel, g.dilations, g.pads_begin, g.pads_end)
    return all(s == 1 for s in g.strides) and min(begin + end) >= 0


def build(p: Problem, name: str, in_f32: bool = False) -> Lowering:
    """The lowering ``name`` (one of :func:`candidates`) of ``p``; ``in_f32``: its library
    op computed in f32 (the ``"<name> in f32"`` candidate of a bf16/f16 ``p``)."""
    g = p.geometry
    inputs = (0, 1) if not p.bias else (0, 1, 2)
    guarded = bool(guards.stride_not_below_kernel(p.dtype, p.kernel, g.strides))
    guard = guards.AMX_STRIDE_NOT_BELOW_KERNEL.name if guarded else None
    if name == base.OVERLAP_ADD:
        parts = matmul_lowering.conv_transpose(
            p.input_shapes[0], p.kernel[0], g.strides[0], g.pads_begin[0], p.dst[0], p.oc // p.groups,
            p.data_format, p.weights_format,
        )
        return Lowering(base.MATMUL, inputs=(0, 1), out_shape=p.out_shape, name=name, **parts)
    if name == base.COLUMNS:
        parts = matmul_columns.conv_transpose(p.input_shapes[0], p.kernel, g.strides, g.pads_begin, p.dst, p.oc,
                                              p.data_format, p.weights_format)
        return Lowering(base.MATMUL, inputs=inputs, out_shape=p.out_shape, name=name, **parts)
    if name == base.TILES:
        parts = matmul_tiles.conv_transpose(p.input_shapes[0], p.kernel, p.oc // p.groups, p.data_format,
                                            p.weights_format, bias_in_matmul=p.dtype != "f16", bias=p.bias)
        return Lowering(base.MATMUL, inputs=inputs, out_shape=p.out_shape, guard=guard, name=name, **parts)
    if name == base.FLIPPED_CONVOLUTION:
        return _flipped_convolution(p, inputs)
    if name == base.CONVOLUTION_BACKWARD_DATA:
        attrs = p.library_attrs(p.convolution_weights_format)
        attrs["dst_shape"] = list(p.out_shape)
    elif name == base.CONV_TRANSPOSE:
        attrs = p.library_attrs()
        attrs["output_padding"] = list(p.output_padding)
    else:
        raise ValueError(f"ConvTranspose: no lowering named {name!r}")
    if bias_guarded(p) and guard is None:
        guard = guards.STRIDED_DECONVOLUTION_EPILOGUE.name
    apart = bias_apart(p, in_f32=in_f32)
    axis = (1 if p.data_format == "NCX" else p.rank + 1) if apart == HOST else None
    return Lowering(name, attrs, inputs, p.out_shape, weights_arg=1, f32_only=guarded, guard=guard, name=name,
                    bias_stage=apart == STAGE, host_bias=axis)


def _flipped_convolution(p: Problem, inputs: tuple[int, ...]) -> Lowering:
    """A Convolution over the flipped weights (stride 1: no output_padding)."""
    g = p.geometry
    attrs = p.library_attrs(p.convolution_weights_format)
    attrs["pads_begin"], attrs["pads_end"] = weights.convolution_pads(p.kernel, g.dilations, g.pads_begin, g.pads_end)
    wf, groups = p.weights_format, p.groups
    buffers = threading.local()  # the flipped weights, one array per thread: reused

    def flip_weights(args: list[np.ndarray]) -> list[np.ndarray]:
        buffers.w = weights.convolution_weights(args[1], wf, groups, getattr(buffers, "w", None))
        return [args[0], buffers.w, *args[2:]]

    size = int(np.prod(p.weights_shape))
    return Lowering(
        base.CONVOLUTION, attrs, inputs, p.out_shape, prepare=flip_weights, prepared_elems=size, weights_arg=1,
        name=base.FLIPPED_CONVOLUTION,
    )

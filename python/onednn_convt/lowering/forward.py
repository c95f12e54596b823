"""The lowerings of a ConvTranspose problem: which can run it, and how each is built.

- ``ConvTranspose``: the library's own op (any problem; bias, groups, output_padding).
- ``ConvolutionBackwardData``: the backward data of the convolution this op transposes, on
  the same weights memory (IOX read as OIX, XOI as XIO) with ``dst_shape`` giving the output
  size; groups 1 (oneDNN 3.2 rejects groups there) and no bias, except where the bias is
  added by a second partition anyway (:func:`bias_stage`: the op has no bias input).

A bias with a stride > 1 never reaches the library's deconvolution: its strided kernel adds
it once per partial sum on some problems (:data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`),
so both library ops run without it and a second partition (BiasAdd) adds it in dst.
- ``Convolution (flipped weights)``: every stride 1 and pads within the dilated kernel: a
  forward Convolution over the spatially flipped, per-group transposed weights with pads
  ``d*(k-1) - pb`` and ``d*(k-1) - pe``; the weights are copied each call into an array
  kept per thread and plan, so calls with out= allocate nothing.
- ``MatMul (overlap-add)``: 1-D, groups 1, dilation 1 (:mod:`.matmul_lowering`).
- ``MatMul (tiles)``: the taps tile the output (stride = kernel, no pads, groups 1,
  dilation 1; :mod:`.matmul_tiles`).

A kernel of at least :data:`.matmul_lowering.MIN_KERNEL` in 1-D has the overlap-add alone:
oneDNN 3.2's deconvolution JIT takes about 100 s to compile there. Where the guard
:data:`onednn_convt.guards.AMX_STRIDE_NOT_BELOW_KERNEL` is active, the two library ops
compute in f32 (their native kernels are wrong there).
"""

from __future__ import annotations

import threading

import numpy as np

from .. import guards
from ..problem import Problem
from . import base, matmul_lowering, matmul_tiles, weights
from .base import Lowering


def candidates(p: Problem) -> list[str]:
    """The names of the lowerings that can run ``p``."""
    g = p.geometry
    if matmul_lowering.applies(p.kernel, p.groups, g.dilations):
        return [base.OVERLAP_ADD]
    names = [base.CONV_TRANSPOSE]
    if p.groups == 1 and (not p.bias or bias_stage(p)):
        names.append(base.CONVOLUTION_BACKWARD_DATA)
    if _flippable(p):
        names.append(base.FLIPPED_CONVOLUTION)
    if p.rank == 1 and p.groups == 1 and g.dilations[0] == 1:
        names.append(base.OVERLAP_ADD)
    if matmul_tiles.applies(p.kernel, *g.astuple(), p.groups, p.output_padding):
        names.append(base.TILES)
    return names


def bias_stage(p: Problem) -> bool:
    """Whether the library ops (ConvTranspose, ConvolutionBackwardData) run ``p`` without its
    bias, which a second partition then adds (:data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`)."""
    return p.bias and guards.strided_deconvolution_epilogue(p.dtype, p.geometry.strides)


def _flippable(p: Problem) -> bool:
    g = p.geometry
    begin, end = weights.convolution_pads(p.kernel, g.dilations, g.pads_begin, g.pads_end)
    return all(s == 1 for s in g.strides) and min(begin + end) >= 0


def build(p: Problem, name: str) -> Lowering:
    """The lowering ``name`` (one of :func:`candidates`) of ``p``."""
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
    if name == base.TILES:
        parts = matmul_tiles.conv_transpose(p.input_shapes[0], p.kernel, p.oc // p.groups, p.data_format,
                                            p.weights_format, bias_in_matmul=p.dtype != "f16")
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
    staged = bias_stage(p)
    if staged and guard is None:
        guard = guards.STRIDED_DECONVOLUTION_EPILOGUE.name
    return Lowering(name, attrs, inputs, p.out_shape, weights_arg=1, f32_only=guarded, guard=guard, name=name,
                    bias_stage=staged)


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

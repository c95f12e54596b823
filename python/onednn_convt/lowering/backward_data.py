"""The lowerings of a ConvTransposeBackwardData problem: which can run it, and how each is built.

- ``Convolution``: the library's forward Convolution over the same weights memory (IOX read
  as OIX, XOI as XIO; spec D9); any problem, dilations included.
- ``ConvTransposeBackwardData``: the library's own op; every dilation 1 (oneDNN 3.2 drops
  dilations there).
- ``MatMul (frames)``: 1-D, groups 1, dilation 1, kernel at most
  :data:`.matmul_lowering.MAX_OVERLAP` times the stride (:mod:`.matmul_lowering`).

Where a guard of :mod:`onednn_convt.guards` is active the problem has one lowering, the
guard's: the rules' library op in f32 (``amx_padding_only_outputs``), or for
``amx_stride_not_below_kernel`` every s-th row of diff_dst with stride 1 (``Convolution
(subsampled)``), a MatMul over tiles (``MatMul (tiles)``) or the Convolution over weights
with zero taps (``Convolution (zero-padded taps)``). A 1-D kernel of at least
:data:`.matmul_lowering.MIN_KERNEL` has the frames alone (the library's JIT compiles slowly).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Optional

import numpy as np

from .. import guards
from ..problem import Geometry, Problem
from . import base, matmul_lowering, matmul_tiles, rules, weights
from .base import Lowering

#: the names of the lowerings a guard chooses alone
_GUARDED = (base.SUBSAMPLED, base.TILES, base.ZERO_PADDED_TAPS)


def candidates(p: Problem) -> list[str]:
    """The names of the lowerings that can run ``p``."""
    g = p.geometry
    chosen = rules.fallback(p)  # a guard's route, if any
    if chosen in _GUARDED or guards.padding_only_outputs(p.dtype, p.src, p.dst, p.kernel, *g.astuple()[:3]):
        return [chosen]
    if chosen == base.FRAMES and p.kernel[0] >= matmul_lowering.MIN_KERNEL:
        return [chosen]
    names = [base.CONVOLUTION]
    if all(d == 1 for d in g.dilations):
        names.append(base.CONV_TRANSPOSE_BACKWARD_DATA)
    if p.rank == 1 and p.groups == 1 and g.dilations[0] == 1 and p.kernel[0] <= matmul_lowering.MAX_OVERLAP * g.strides[0]:
        names.append(base.FRAMES)
    if matmul_tiles.applies(p.kernel, *g.astuple(), p.groups, p.output_padding, p.src) and all(
        y == x * k for x, y, k in zip(p.src, p.dst, p.kernel)
    ):
        names.append(base.TILES)
    return names


def build(p: Problem, name: str) -> Lowering:
    """The lowering ``name`` (one of :func:`candidates`) of ``p``."""
    g = p.geometry
    if name == base.FRAMES:
        parts = matmul_lowering.conv_transpose_backward_data(
            p.input_shapes[0], p.kernel[0], g.strides[0], g.pads_begin[0], p.src[0], p.ic, p.data_format,
            p.weights_format,
        )
        return Lowering(base.MATMUL, inputs=(0, 1), out_shape=p.out_shape, name=name, **parts)
    if guards.padding_only_outputs(p.dtype, p.src, p.dst, p.kernel, *g.astuple()[:3]):
        guard = guards.AMX_PADDING_ONLY_OUTPUTS.name  # the AMX kernel crashes: f32
        return replace(_library(p, g, name), f32_only=True, guard=guard)
    if name == base.SUBSAMPLED:
        return _subsampled(p)
    if name == base.TILES:
        parts = matmul_tiles.conv_transpose_backward_data(p.input_shapes[0], p.kernel, p.ic, p.data_format, p.weights_format)
        guard = guards.AMX_STRIDE_NOT_BELOW_KERNEL.name
        return Lowering(base.MATMUL, inputs=(0, 1), out_shape=p.out_shape, guard=guard, name=name, **parts)
    if name == base.ZERO_PADDED_TAPS:
        return _zero_padded_taps(p)
    if name not in (base.CONVOLUTION, base.CONV_TRANSPOSE_BACKWARD_DATA):
        raise ValueError(f"ConvTransposeBackwardData: no lowering named {name!r}")
    return _library(p, g, name)


def _library(p: Problem, g: Geometry, kind: str) -> Lowering:
    """The library op ``kind`` on geometry ``g``."""
    if kind == base.CONV_TRANSPOSE_BACKWARD_DATA:  # no dilation
        attrs = replace(p, geometry=g).library_attrs()
    else:
        attrs = replace(p, geometry=g).library_attrs(p.convolution_weights_format)
    return Lowering(kind, attrs, (0, 1), p.out_shape, weights_arg=1, name=kind)


def _subsampled(p: Problem) -> Lowering:
    """BackwardData whose guarded dims all have kernel 1 and no pads_begin: output ``i``
    reads diff_dst row ``s*i`` alone, so the op over every ``s``-th row (the first ``x``
    of them, copied compactly) with stride 1 there is the same: native kernels, as stride
    1 is outside :data:`guards.AMX_STRIDE_NOT_BELOW_KERNEL`."""
    g = p.geometry
    dims = guards.stride_not_below_kernel(p.dtype, p.kernel, g.strides)
    s, pe = list(g.strides), list(g.pads_end)
    offset = 2 if p.data_format == "NCX" else 1
    index: list[Any] = [slice(None)] * len(p.out_shape)
    copied = list(p.input_shapes[0])
    for i in dims:
        index[offset + i] = slice(0, s[i] * (p.src[i] - 1) + 1, s[i])
        copied[offset + i] = p.src[i]
        s[i], pe[i] = 1, 0
    rows = tuple(index)

    def subsample(args: list[np.ndarray]) -> list[np.ndarray]:
        # a compact copy (oneDNN cannot describe the view's strides; NumPy copies bf16
        # element by element, its same-size integers in bulk)
        dd = args[0]
        return [np.ascontiguousarray(dd.view(f"u{dd.itemsize}")[rows]).view(dd.dtype), args[1]]

    geometry = replace(g, strides=tuple(s), pads_end=tuple(pe))
    low = _library(p, geometry, rules.backward_data_kind(g.dilations, p.data_format))
    return replace(
        low, prepare=subsample, prepared_elems=math.prod(copied), guard=guards.AMX_STRIDE_NOT_BELOW_KERNEL.name,
        name=base.SUBSAMPLED,
    )


def _zero_padded_taps(p: Problem) -> Lowering:
    """BackwardData kept away from the AMX kernel: the Convolution over weights grown with
    zero taps so that each stride is below its kernel (native), or, where that costs more
    than :data:`.weights.MAX_PADDED_KERNEL_COST`, the rules' op in f32."""
    g = p.geometry
    guard = guards.AMX_STRIDE_NOT_BELOW_KERNEL.name
    dims = guards.stride_not_below_kernel(p.dtype, p.kernel, g.strides)
    plain = replace(_library(p, g, rules.backward_data_kind(g.dilations, p.data_format)), f32_only=True, guard=guard)
    grown: Optional[tuple[int, ...]] = weights.padded_kernel(p.kernel, g.strides, dims)
    if grown is None:
        return plain
    pe = tuple(e + d * (k2 - k) for e, d, k2, k in zip(g.pads_end, g.dilations, grown, p.kernel))
    pad = weights.zero_padded_weights(p.convolution_weights_format, p.kernel, grown)
    low = _library(p, replace(g, pads_end=pe), base.CONVOLUTION)
    return replace(
        low, prepare=lambda args: [args[0], pad(args[1])], prepared_elems=math.prod(grown) * p.ic * (p.oc // p.groups),
        guard=guard, exact=plain, name=base.ZERO_PADDED_TAPS,
    )

"""The lowerings of a ConvTransposeBackwardWeights problem: which can run it, and how each is built.

- ``ConvTransposeBackwardWeights``: the library's own op (any problem).
- ``ConvolutionBackwardWeights``: the backward weights of the convolution that BackwardData
  is (spec D9): src = diff_dst, diff_dst = src and the weights read as OIX (IOX) or XIO
  (XOI); any problem.
- ``MatMul (frames)``: one MatMul over frames of diff_dst (:mod:`.matmul_backward_weights`);
  groups 1 and frames at most :data:`.matmul_backward_weights.MAX_FRAMES_RATIO` times
  diff_dst.
- ``MatMul (tiles)``: where the taps tile diff_dst (stride = kernel, no pads, groups 1:
  :mod:`.matmul_tiles`), one MatMul over diff_dst permuted, with no padding to build.

A 3-D problem with pads_begin >= 3 in depth gets its cropped rows of diff_dst back as zeros
on AVX-512 CPUs (the guard ``avx512_backward_weights_depth_pad``: the library's kernels
there corrupt the heap or return garbage with such a pad).

Where the library's bf16/f16 kernels are wrong on the problem
(:func:`onednn_convt.lowering.rules.backward_weights_f32_only`, guard
``bf16_backward_weights_short_src``), or in f16 far slower than its f32 ones
(:func:`onednn_convt.lowering.rules.f16_backward_weights_in_f32`), the two library ops
compute in f32.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Sequence

import numpy as np

from .. import dtypes, guards
from ..plan import compile_lowering
from ..problem import Problem
from . import base, matmul_backward_weights, matmul_tiles, rules
from .base import Lowering


def candidates(p: Problem) -> list[str]:
    """The names of the lowerings that can run ``p``."""
    names = [base.CONV_TRANSPOSE_BACKWARD_WEIGHTS, base.CONVOLUTION_BACKWARD_WEIGHTS]
    dd = p.input_shapes[1]
    frames = p.n * math.prod(p.src) * p.oc * math.prod(p.kernel)
    if p.groups == 1 and frames <= matmul_backward_weights.MAX_FRAMES_RATIO * math.prod(dd):
        names.append(base.FRAMES)
    g = p.geometry
    if matmul_tiles.applies(p.kernel, *g.astuple(), p.groups, p.output_padding, p.src) and all(
        y == x * k for x, y, k in zip(p.src, p.dst, p.kernel)
    ):
        names.append(base.TILES)
    return names


def build(p: Problem, name: str) -> Lowering:
    """The lowering ``name`` (one of :func:`candidates`) of ``p``."""
    wrong = rules.backward_weights_f32_only(p)  # the guard: native kernels wrong here
    f32_only = wrong or rules.f16_backward_weights_in_f32(p)  # ... or far slower
    guard = guards.BF16_BACKWARD_WEIGHTS_SHORT_SRC.name if wrong else None
    wshape = p.weights_shape
    if name == base.FRAMES:
        library = build(p, rules.backward_weights_kind(p.rank, p.data_format))

        def exact(arrays: Sequence[Any]) -> np.ndarray:
            """The call computed by the library's f32 kernel, in f32."""
            f32 = [dtypes.to_f32(x) for x in arrays[:2]]
            plan = compile_lowering(library, f32, None, np.dtype(np.float32), "f32", emulated=False)
            return plan.run(f32, None)

        parts = matmul_backward_weights.backward_weights(
            p.input_shapes[0], p.input_shapes[1], wshape, p.kernel, p.geometry.astuple(), p.data_format,
            p.weights_format, exact,
        )
        return Lowering(base.MATMUL, inputs=(0, 1), out_shape=wshape, guard=guard, name=name, **parts)
    if name == base.TILES:
        parts = matmul_tiles.conv_transpose_backward_weights(
            p.input_shapes[0], p.input_shapes[1], p.kernel, p.data_format, p.weights_format)
        return Lowering(base.MATMUL, inputs=(0, 1), out_shape=wshape, guard=guard, name=name, **parts)
    if name == base.CONVOLUTION_BACKWARD_WEIGHTS:
        # the convolution from diff_dst to src (D9) has the same weights memory: OIX/XIO
        attrs = p.library_attrs(p.convolution_weights_format)
        inputs = (1, 0)
    elif name == base.CONV_TRANSPOSE_BACKWARD_WEIGHTS:
        attrs = p.library_attrs()
        inputs = (0, 1)
    else:
        raise ValueError(f"ConvTransposeBackwardWeights: no lowering named {name!r}")
    attrs["weights_shape"] = list(wshape)
    if guards.strided_1x1_backward_weights(p.dtype, p.kernel, p.geometry.strides):
        return _unit_stride(p, name, attrs, inputs, f32_only, guard)
    front = guards.backward_weights_depth_pad(p.dtype, p.geometry.pads_begin)
    if not front:
        return Lowering(name, attrs, inputs, wshape, f32_only=f32_only, guard=guard, name=name)
    # the guard avx512_backward_weights_depth_pad: the cropped rows back in diff_dst, as zeros
    attrs["pads_begin"][0] = 0
    axis = 2 if p.data_format == "NCX" else 1  # depth
    padded = list(p.input_shapes[1])
    padded[axis] += front
    into = [slice(None)] * len(padded)
    into[axis] = slice(front, None)
    return Lowering(name, attrs, inputs, wshape, prepare=_diff_dst_in_zeros(inputs.index(1), padded, into),
                    prepared_elems=math.prod(padded), f32_only=f32_only,
                    guard=guard or guards.AVX512_BACKWARD_WEIGHTS_DEPTH_PAD.name, name=name)


def _diff_dst_in_zeros(at: int, shape: Sequence[int], into: Sequence[slice],
                       take: Sequence[slice] | None = None) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """A ``prepare`` that hands the library, in place of its input ``at`` (diff_dst), an
    array of ``shape`` holding ``diff_dst[take]`` (all of it by default) at ``into`` and
    zeros elsewhere: one array per thread, kept (its zeros are written once)."""
    buffers = threading.local()
    into_index, take_index = tuple(into), None if take is None else tuple(take)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dd = args[at]
        buffer = getattr(buffers, "dd", None)
        if buffer is None or buffer.dtype != dd.dtype:
            buffer = buffers.dd = np.zeros(shape, dd.dtype)
        buffer[into_index] = dd if take_index is None else dd[take_index]
        return [buffer if i == at else a for i, a in enumerate(args)]

    return prepare


def _unit_stride(p: Problem, name: str, attrs: dict[str, Any], inputs: tuple[int, ...], f32_only: bool,
                 guard: str | None) -> Lowering:
    """The guard strided_1x1_backward_weights: a 1x1 kernel's taps read diff_dst row
    ``s*i - pads_begin`` for src row ``i`` (per dim), so the op is the stride-1, unpadded
    BackwardWeights of src and those rows, copied into an array of src's spatial size
    (rows that fall in the pads stay zeros: they add nothing)."""
    g = p.geometry
    rank = p.rank
    attrs.update(strides=[1] * rank, pads_begin=[0] * rank, pads_end=[0] * rank, dilations=[1] * rank)
    first = 2 if p.data_format == "NCX" else 1  # the first spatial axis
    shape = list(p.input_shapes[1])
    shape[first:first + rank] = p.src
    # per dim: the src rows i whose diff_dst row s*i - pb exists, and those diff_dst rows
    into = [slice(None)] * len(shape)
    take = [slice(None)] * len(shape)
    for d, (x, y, s, pb) in enumerate(zip(p.src, p.dst, g.strides, g.pads_begin)):
        lo = -(-pb // s)  # the first src row with s*i - pb >= 0
        hi = max(lo, min(x, (y - 1 + pb) // s + 1))  # past the last with s*i - pb < y
        into[first + d], take[first + d] = slice(lo, hi), slice(s * lo - pb, s * hi - pb, s)
    return Lowering(name, attrs, inputs, p.weights_shape, prepare=_diff_dst_in_zeros(inputs.index(1), shape, into, take),
                    prepared_elems=math.prod(shape), f32_only=f32_only,
                    guard=guard or guards.STRIDED_1X1_BACKWARD_WEIGHTS.name, name=name)

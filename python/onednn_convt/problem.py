"""A validated problem: what one call of an op computes, named and typed.

The ops check a call's arrays and attributes and describe the result as a :class:`Problem`
(op, dtype, formats, channels, spatial sizes, kernel, :class:`Geometry`). The lowering
package (:mod:`onednn_convt.lowering`) reads only this: it lists the lowerings that can run
the problem and builds the chosen one, without looking at the arrays again.

Sizes are in elements. Channels and spatial sizes are always those of the forward
ConvTranspose (src -> dst), whichever op the problem is: ``ic`` is the src (= diff_src)
channel count, ``oc`` the dst (= diff_dst) one, ``src``/``dst`` their spatial sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

FORWARD = "ConvTranspose"
BACKWARD_DATA = "ConvTransposeBackwardData"
BACKWARD_WEIGHTS = "ConvTransposeBackwardWeights"

#: the shape classes of :func:`shape_class`, the keys of the measured rules tables
#: (:mod:`onednn_convt.lowering.rules_table`)
SHAPE_CLASSES = ("tiny", "depthwise", "depthwise-strided", "grouped", "1d", "1d-thin", "3d", "3d-tiled", "tiled",
                 "stride1", "thin", "small", "dense")

#: FLOPs (2 x multiply-adds) under which a problem is of class ``"tiny"``
TINY_FLOPS = 1_000_000
#: src positions (the product of its spatial sizes) up to which a dense 2-D problem is
#: of class ``"small"`` (8x8)
SMALL_SRC = 64
#: channels (input or output, the fewer) under which a problem is ``"thin"``
THIN_CHANNELS = 32


def depthwise(groups: int, ic: int, oc: int) -> bool:
    """One input and one output channel per group."""
    return ic == groups and oc == groups


#: a grouped 3-D shape has oneDNN 3.2's JIT kernels where its channels per group (in and
#: out) are a multiple of this (:func:`gemm_grouped`)
GROUP_CHANNELS_BLOCK = 8


def gemm_grouped(rank: int, groups: int, ic: int, oc: int) -> bool:
    """A grouped 3-D shape whose channels per group (in or out) are not a multiple of
    :data:`GROUP_CHANNELS_BLOCK`, depthwise among them: oneDNN 3.2 has no JIT kernel for its
    3-D convolutions (its depthwise kernels are 1-D and 2-D), and every lowering of such a
    shape runs its gemm convolution (``x64:gemm:jit``). The lowerings rank differently there
    than on the 2-D layers they would be extrapolated from: the rules keep these shapes
    apart (:mod:`onednn_convt.lowering.rules`), and the polyphase lowering leaves them
    (:func:`onednn_convt.lowering.polyphase.fits`). Measured on an AVX2 CPU (an AMD Zen3,
    whose JIT kernels block channels by 8); where AVX-512 kernels (16 a block, and brgemm
    ones) draw the line was not measured (on an AMD Zen4 a 3-D depthwise Convolution ran
    ``jit:avx512_core``, the library's ConvTransposeBackwardData ``x64:gemm:jit``)."""
    return rank == 3 and groups > 1 and any((c // groups) % GROUP_CHANNELS_BLOCK for c in (ic, oc))


def tiled(strides: Sequence[int], kernel: Sequence[int]) -> bool:
    """Every stride at least its kernel size: the taps of neighbouring src positions do not
    overlap (U-Net's k2 s2)."""
    return all(s >= k for s, k in zip(strides, kernel))


def shape_class(
    kernel: tuple[int, ...], strides: tuple[int, ...], groups: int, ic: int, oc: int, src: tuple[int, ...], n: int
) -> str:
    """The class of a ConvTranspose shape that the measured rules are keyed by: the features
    that decide which lowering is fastest, fitted on the broad suite's fit half and checked
    on its holdout half (docs/performance.md).

    ``"tiny"``: under :data:`TINY_FLOPS`, a call bound by its per-call overhead; else, with
    groups, ``"depthwise"`` (one input and one output channel per group, every stride 1),
    ``"depthwise-strided"`` or ``"grouped"``; in 1-D, ``"1d-thin"`` (under
    :data:`THIN_CHANNELS` input or output channels: a speech decoder's last layer) or
    ``"1d"``; in 3-D, ``"3d-tiled"`` (every stride at least its kernel: the taps do not
    overlap) or ``"3d"``; in 2-D, ``"tiled"`` (the taps do not overlap: U-Net's k2 s2),
    ``"stride1"`` (every stride 1: no polyphase form), ``"thin"`` (under
    :data:`THIN_CHANNELS` channels: a super-resolution or segmentation output),
    ``"small"`` (src of at most :data:`SMALL_SRC` positions: a generator's first layers)
    or ``"dense"``.
    """
    if flops(n, ic, oc, groups, kernel, src) < TINY_FLOPS:
        return "tiny"
    if groups > 1:
        if depthwise(groups, ic, oc):
            return "depthwise" if all(s == 1 for s in strides) else "depthwise-strided"
        return "grouped"
    taps_apart = tiled(strides, kernel)
    thin = min(ic, oc) < THIN_CHANNELS
    if len(kernel) == 1:
        return "1d-thin" if thin else "1d"
    if len(kernel) == 3:
        return "3d-tiled" if taps_apart else "3d"
    if taps_apart:
        return "tiled"
    if all(s == 1 for s in strides):
        return "stride1"
    if thin:
        return "thin"
    if math.prod(src) <= SMALL_SRC:
        return "small"
    return "dense"


def flops(n: int, ic: int, oc: int, groups: int, kernel: tuple[int, ...], src: tuple[int, ...]) -> int:
    """2 x the multiply-adds of a ConvTranspose of these sizes (the same for its three ops)."""
    return 2 * n * ic * (oc // groups) * math.prod(kernel) * math.prod(src)


def features(
    kernel: tuple[int, ...], strides: tuple[int, ...], groups: int, ic: int, oc: int, src: tuple[int, ...], n: int
) -> tuple[float, ...]:
    """Where a shape sits among the measured layers, for the nearest-layers rules
    (:meth:`onednn_convt.lowering.rules_table.Table.choose`): log2 of the input and output
    channels per group, the src positions, the batch, the kernel taps, the stride product
    and the groups; the rank; and 1 or 0 for depthwise, other grouped, and tiled (every
    stride at least its kernel). Each counts alike: one doubling of a size is as far as one
    more spatial dim, or a change of kind. The weights were chosen by leave-one-layer-out
    cross-validation on the broad suite's fit half (docs/performance.md)."""
    log2 = math.log2
    dw = groups > 1 and depthwise(groups, ic, oc)
    return (log2(ic / groups), log2(oc / groups), log2(math.prod(src)), log2(n), log2(math.prod(kernel)),
            log2(math.prod(strides)), float(len(kernel)), float(dw), float(groups > 1 and not dw),
            float(tiled(strides, kernel)), log2(groups))


@dataclass(frozen=True)
class Geometry:
    """Per spatial dim: strides, dilations and pads (auto_pad resolved to explicit pads)."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]

    def astuple(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(strides, dilations, pads_begin, pads_end), the order of the shape formulas."""
        return self.strides, self.dilations, self.pads_begin, self.pads_end


@dataclass(frozen=True)
class Problem:
    """One checked call of an op.

    Attributes:
        op: ``"ConvTranspose"``, ``"ConvTransposeBackwardData"`` or
            ``"ConvTransposeBackwardWeights"``.
        dtype: the call's float dtype code (``"f32"``, ``"bf16"``, ``"f16"``).
        data_format: ``"NCX"`` or ``"NXC"`` (activations).
        weights_format: ``"IOX"`` or ``"XOI"``.
        groups: groups.
        n: batch.
        ic: forward src channels (IC).
        oc: forward dst channels (OC = O * groups).
        src: forward src spatial sizes.
        dst: forward dst spatial sizes.
        kernel: kernel sizes.
        geometry: strides, dilations, pads.
        output_padding: the forward's output_padding per spatial dim (ConvTranspose only;
            zeros for the backward ops, whose shapes already say it).
        bias: whether a ConvTranspose call has a bias input.
        input_shapes: shapes of the call's array inputs, in the op's order (ConvTranspose:
            src, weights[, bias]; BackwardData: diff_dst, weights; BackwardWeights: src,
            diff_dst).
        out_shape: shape of the result.
    """

    op: str
    dtype: str
    data_format: str
    weights_format: str
    groups: int
    n: int
    ic: int
    oc: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    kernel: tuple[int, ...]
    geometry: Geometry
    output_padding: tuple[int, ...]
    bias: bool
    input_shapes: tuple[tuple[int, ...], ...]
    out_shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        """Spatial dims (1 to 3)."""
        return len(self.kernel)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        """The weights' shape in ``weights_format``: (IC, O, X...) or (X..., O, IC)."""
        o = self.oc // self.groups
        return (self.ic, o, *self.kernel) if self.weights_format == "IOX" else (*self.kernel, o, self.ic)

    def activation_shape(self, channels: int, spatial: Sequence[int]) -> tuple[int, ...]:
        """An activation of ``channels`` over ``spatial`` in ``data_format``: (N, C, X...) or
        (N, X..., C)."""
        return (self.n, channels, *spatial) if self.data_format == "NCX" else (self.n, *spatial, channels)

    def with_call_shapes(self) -> Problem:
        """This problem with ``input_shapes`` and ``out_shape`` those its other fields say
        (a part of a lowering made of several: a group, a phase, a depth tap's 2-D op)."""
        src, dst = self.activation_shape(self.ic, self.src), self.activation_shape(self.oc, self.dst)
        inputs: tuple[tuple[int, ...], ...]
        if self.op == FORWARD:
            inputs, out = (src, self.weights_shape) + (((self.oc,),) if self.bias else ()), dst
        elif self.op == BACKWARD_DATA:
            inputs, out = (dst, self.weights_shape), src
        else:
            inputs, out = (src, dst), self.weights_shape
        return replace(self, input_shapes=inputs, out_shape=out)

    @property
    def convolution_weights_format(self) -> str:
        """How the library's Convolution ops read the same weights memory (spec D9): IOX as
        OIX, XOI as XIO."""
        return "OIX" if self.weights_format == "IOX" else "XIO"

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group (:func:`depthwise`)."""
        return depthwise(self.groups, self.ic, self.oc)

    @property
    def gemm_grouped(self) -> bool:
        """A grouped 3-D problem that oneDNN 3.2 runs on its gemm convolution
        (:func:`gemm_grouped`)."""
        return gemm_grouped(self.rank, self.groups, self.ic, self.oc)

    @property
    def flops(self) -> int:
        """2 x the multiply-adds of the op (the same for all three ops of one shape)."""
        return flops(self.n, self.ic, self.oc, self.groups, self.kernel, self.src)

    @property
    def shape_class(self) -> str:
        """:func:`shape_class` of this problem."""
        return shape_class(self.kernel, self.geometry.strides, self.groups, self.ic, self.oc, self.src, self.n)

    @property
    def features(self) -> tuple[float, ...]:
        """:func:`features` of this problem."""
        return features(self.kernel, self.geometry.strides, self.groups, self.ic, self.oc, self.src, self.n)

    def library_attrs(self, weights_format: str | None = None) -> dict[str, Any]:
        """The library attributes shared by every lowering onto a convolution-like op."""
        g = self.geometry
        return {
            "strides": list(g.strides), "dilations": list(g.dilations), "pads_begin": list(g.pads_begin),
            "pads_end": list(g.pads_end), "auto_pad": "None", "groups": self.groups,
            "data_format": self.data_format, "weights_format": weights_format or self.weights_format,
        }

    def key(self) -> str:
        """A stable text naming the problem (the autotuning cache's signature)."""
        g = self.geometry
        parts = [
            self.op, self.dtype, self.data_format, self.weights_format, f"g{self.groups}", f"n{self.n}",
            f"ic{self.ic}", f"oc{self.oc}", "src" + "x".join(map(str, self.src)),
            "k" + "x".join(map(str, self.kernel)), "s" + "x".join(map(str, g.strides)),
            "d" + "x".join(map(str, g.dilations)), "pb" + "x".join(map(str, g.pads_begin)),
            "pe" + "x".join(map(str, g.pads_end)), "dst" + "x".join(map(str, self.dst)),
        ]
        if self.bias:
            parts.append("bias")
        return " ".join(parts)

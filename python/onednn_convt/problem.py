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
from dataclasses import dataclass
from typing import Any

FORWARD = "ConvTranspose"
BACKWARD_DATA = "ConvTransposeBackwardData"
BACKWARD_WEIGHTS = "ConvTransposeBackwardWeights"

#: the shape classes of :func:`shape_class`, the keys of the measured rules tables
#: (:mod:`onednn_convt.lowering.rules_table`)
SHAPE_CLASSES = ("tiny", "1d", "depthwise", "grouped", "3d", "tiled", "small", "dense")

#: FLOPs (2 x multiply-adds) under which a problem is of class ``"tiny"``
TINY_FLOPS = 1_000_000
#: src positions (the product of its spatial sizes) up to which a dense 2-D problem is
#: of class ``"small"`` (8x8)
SMALL_SRC = 64


def shape_class(
    kernel: tuple[int, ...], strides: tuple[int, ...], groups: int, ic: int, oc: int, src: tuple[int, ...], n: int
) -> str:
    """The class of a ConvTranspose shape that the measured rules are keyed by.

    ``"tiny"``: under :data:`TINY_FLOPS`, a call bound by its per-call overhead (the tiny
    suite's 1x4x5x5 layer, 5 kFLOP; the models suite's layers have 19 MFLOP and more);
    else ``"1d"``: one spatial dim; ``"depthwise"``: one input and one output channel per
    group; ``"grouped"``: other groups > 1; ``"3d"``: three spatial dims (oneDNN has its
    own 3-D kernels: on a Sapphire Rapids CPU the 3-D U-Net BackwardData in f32 NCX ran
    fastest as a Convolution, 0.70x the library op's time, and the 2-D one as the library
    op, 0.80x the Convolution's); ``"tiled"``: every stride at least its kernel size (the
    taps do not overlap: U-Net's k2 s2); ``"small"``: the rest, where src has at most
    :data:`SMALL_SRC` positions (the first layers of an image generator: DCGAN's 4x4 src;
    tuned on a Sapphire Rapids CPU under five ``ONEDNN_MAX_CPU_ISA`` levels, its fastest
    lowering differed from the 16x16 layer's in 5 to 13 of 18 op/dtype/format rows per
    level, and its BackwardWeights ran fastest as a MatMul over frames in 19 of 30 rows,
    the 16x16 layer's in none); ``"dense"``: the rest (DCGAN's 16x16 k4 s2).
    """
    if flops(n, ic, oc, groups, kernel, src) < TINY_FLOPS:
        return "tiny"
    if len(kernel) == 1:
        return "1d"
    if groups > 1:
        return "depthwise" if ic == groups and oc == groups else "grouped"
    if len(kernel) == 3:
        return "3d"
    if all(s >= k for s, k in zip(strides, kernel)):
        return "tiled"
    if math.prod(src) <= SMALL_SRC:
        return "small"
    return "dense"


def flops(n: int, ic: int, oc: int, groups: int, kernel: tuple[int, ...], src: tuple[int, ...]) -> int:
    """2 x the multiply-adds of a ConvTranspose of these sizes (the same for its three ops)."""
    return 2 * n * ic * (oc // groups) * math.prod(kernel) * math.prod(src)


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

    @property
    def convolution_weights_format(self) -> str:
        """How the library's Convolution ops read the same weights memory (spec D9): IOX as
        OIX, XOI as XIO."""
        return "OIX" if self.weights_format == "IOX" else "XIO"

    @property
    def depthwise(self) -> bool:
        """One input and one output channel per group."""
        return self.ic == self.groups and self.oc == self.groups

    @property
    def flops(self) -> int:
        """2 x the multiply-adds of the op (the same for all three ops of one shape)."""
        return flops(self.n, self.ic, self.oc, self.groups, self.kernel, self.src)

    @property
    def shape_class(self) -> str:
        """:func:`shape_class` of this problem."""
        return shape_class(self.kernel, self.geometry.strides, self.groups, self.ic, self.oc, self.src, self.n)

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

"""Benchmark suites: layer shapes crossed with ops, dtypes and data formats.

A :class:`Layer` is one ConvTranspose geometry, given as its forward problem (src ->
dst). Each layer is run as all three ops (``fwd`` = ConvTranspose, ``bwd_d`` =
ConvTransposeBackwardData, ``bwd_w`` = ConvTransposeBackwardWeights), in f32, bf16 and f16,
and in NCX and NXC. Weights go with the data format the way frameworks pair them: IOX with
NCX (PyTorch's ConvTranspose weight), XOI with NXC.

Suites (issue 4):

* ``models``: DCGAN 512->256 on 4x4 and 256->128 on 16x16 (k4 s2 p1, N=16), U-Net 128->64
  on 64x64 (k2 s2, N=4), 3-D 64->32 on 16^3 (k2 s2, N=1), HiFi-GAN-style 1-D 512->256 on
  L=1024 (k16 s8 p4, N=8), depthwise 128 channels on 32x32 (k3 s1 p1, groups 128, N=8) and
  an inverse-STFT-like 1-D layer (1026->1 channels, L=224, k1024 s256, N=1). Spatial sizes
  are the src sizes.
* ``tiny``: 1x4x5x5 -> 3 channels, k3 s1: the cost of a call when there is nothing to compute.
* ``sweep``: a k4 s2 p1 2-D layer (N=4, 64->64 channels, 16x16) with one of N, channels or
  spatial size varied at a time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .. import dtypes
from ..problem import flops, shape_class

OPS = ("fwd", "bwd_d", "bwd_w")
DTYPES = ("f32", "bf16", "f16")
FORMATS = ("NCX", "NXC")
#: long op names accepted on the command line
OP_ALIASES = {
    "ConvTranspose": "fwd",
    "ConvTransposeBackwardData": "bwd_d",
    "ConvTransposeBackwardWeights": "bwd_w",
}


@dataclass(frozen=True)
class Layer:
    """One ConvTranspose geometry, as its forward problem.

    Attributes:
        name: short name used in tables and keys.
        n: batch.
        ic: src channels (ConvTranspose input).
        oc: dst channels.
        spatial: src spatial sizes (1 to 3 dims).
        kernel: kernel sizes, one per spatial dim.
        stride: stride, every spatial dim.
        pad: pads_begin = pads_end, every spatial dim.
        groups: groups.
        compute_bound: a large, compute-bound shape (target 3 looks at these).
        slow: compiles slowly on some oneDNN versions; ``--skip-slow`` leaves it out.
        sweep: for the sweep suite, (axis, value) that this layer varies.
        note: one line for the README.
    """

    name: str
    n: int
    ic: int
    oc: int
    spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: int = 1
    pad: int = 0
    groups: int = 1
    compute_bound: bool = False
    slow: bool = False
    sweep: Optional[tuple[str, int]] = None
    note: str = ""

    @property
    def dst_spatial(self) -> tuple[int, ...]:
        """Forward dst sizes: stride*(src-1) + kernel - 2*pad (no dilation, no output_padding)."""
        return tuple(self.stride * (x - 1) + k - 2 * self.pad for x, k in zip(self.spatial, self.kernel))

    @property
    def flops(self) -> int:
        """2*N*IC*OC/G*prod(src spatial)*prod(kernel): the same count for all three ops."""
        return flops(self.n, self.ic, self.oc, self.groups, self.kernel, self.spatial)

    @property
    def shape_class(self) -> str:
        """:func:`onednn_convt.problem.shape_class` of this layer (the measured rules' key)."""
        return shape_class(self.kernel, (self.stride,) * len(self.kernel), self.groups, self.ic, self.oc, self.spatial, self.n)

    def describe(self) -> str:
        """``N=16 512->256 4x4 k4s2p1`` style summary."""
        dims = "x".join(map(str, self.spatial))
        k = "x".join(map(str, sorted(set(self.kernel))))
        g = f" g{self.groups}" if self.groups > 1 else ""
        return f"N={self.n} {self.ic}->{self.oc} {dims} k{k}s{self.stride}p{self.pad}{g}"


@dataclass(frozen=True)
class Config:
    """One benchmark configuration: a layer run as one op, in one dtype and data format."""

    suite: str
    layer: Layer
    op: str
    dtype: str
    data_format: str

    @property
    def weights_format(self) -> str:
        """IOX with NCX, XOI with NXC."""
        return "IOX" if self.data_format == "NCX" else "XOI"

    @property
    def key(self) -> str:
        """Unique name: ``suite/layer/op/dtype/format``."""
        return f"{self.suite}/{self.layer.name}/{self.op}/{self.dtype}/{self.data_format}"

    @property
    def flops(self) -> int:
        return self.layer.flops

    def attrs(self) -> dict[str, Any]:
        """Attributes of the onednn_convt op (library names)."""
        lay = self.layer
        return dict(
            strides=lay.stride, pads_begin=lay.pad, pads_end=lay.pad, groups=lay.groups,
            data_format=self.data_format, weights_format=self.weights_format,
        )

    def activation_shape(self, channels: int, spatial: Sequence[int]) -> tuple[int, ...]:
        if self.data_format == "NCX":
            return (self.layer.n, channels, *spatial)
        return (self.layer.n, *spatial, channels)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        lay = self.layer
        o = lay.oc // lay.groups
        if self.weights_format == "IOX":
            return (lay.ic, o, *lay.kernel)
        return (*lay.kernel, o, lay.ic)

    def build(self, seed: int = 0) -> Case:
        """The op object and its inputs (values from a seeded normal, rounded to the dtype)."""
        from .. import ops

        lay = self.layer
        rng = np.random.default_rng(seed)
        dtype = dtypes.FLOAT_DTYPES[self.dtype]
        scale = 1.0 / math.sqrt(lay.ic // lay.groups * math.prod(lay.kernel))

        def make(shape: Sequence[int], s: float = 1.0) -> np.ndarray:
            a = (rng.standard_normal(shape, dtype=np.float32) * s).astype(dtype)
            return a

        src = make(self.activation_shape(lay.ic, lay.spatial))
        w = make(self.weights_shape, scale)
        dd = make(self.activation_shape(lay.oc, lay.dst_spatial))
        attrs = self.attrs()
        op: Any
        if self.op == "fwd":
            op, args = ops.ConvTranspose(**attrs), (src, w)
        elif self.op == "bwd_d":
            op, args = ops.ConvTransposeBackwardData(**attrs), (dd, w)
        else:
            op = ops.ConvTransposeBackwardWeights(weights_shape=self.weights_shape, **attrs)
            args = (src, dd)
        return Case(self, op, args)


@dataclass
class Case:
    """A built configuration: the op object and the input arrays (in the config's dtype)."""

    config: Config
    op: Any
    args: tuple[np.ndarray, ...]

    @property
    def input_names(self) -> tuple[str, ...]:
        return {"fwd": ("src", "weights"), "bwd_d": ("diff_dst", "weights"), "bwd_w": ("src", "diff_dst")}[
            self.config.op
        ]

    def f32_args(self) -> tuple[np.ndarray, ...]:
        """The inputs as float32 (exact: every dtype here widens to f32 without rounding)."""
        return tuple(np.asarray(a, dtype=np.float32) for a in self.args)


def _models() -> list[Layer]:
    return [
        Layer("dcgan1", 16, 512, 256, (4, 4), (4, 4), 2, 1, compute_bound=True,
              note="DCGAN generator layer, 512->256 channels on a 4x4 src"),
        Layer("dcgan2", 16, 256, 128, (16, 16), (4, 4), 2, 1, compute_bound=True,
              note="DCGAN-style layer, 256->128 channels on a 16x16 src"),
        Layer("unet", 4, 128, 64, (64, 64), (2, 2), 2, 0, note="U-Net up-sampling, k2 s2"),
        Layer("conv3d", 1, 64, 32, (16, 16, 16), (2, 2, 2), 2, 0, note="3-D up-sampling, k2 s2"),
        Layer("hifigan", 8, 512, 256, (1024,), (16,), 8, 4, compute_bound=True,
              note="HiFi-GAN-style 1-D up-sampling, k16 s8 p4"),
        Layer("depthwise", 8, 128, 128, (32, 32), (3, 3), 1, 1, groups=128,
              note="depthwise (groups = channels), k3 s1 p1"),
        Layer("istft", 1, 1026, 1, (224,), (1024,), 256, 0, slow=True,
              note="inverse-STFT-like 1-D layer, k1024 s256 (~97 s to compile as a deconvolution on oneDNN 3.2)"),
    ]


def _tiny() -> list[Layer]:
    return [Layer("tiny", 1, 4, 3, (5, 5), (3, 3), 1, 0, note="1x4x5x5 -> 3 channels, k3")]


def _sweep() -> list[Layer]:
    base = dict(n=4, c=64, x=16)
    values = {"n": (1, 2, 4, 8, 16, 32), "c": (16, 32, 64, 128, 256), "x": (4, 8, 16, 32, 64)}
    layers, seen = [], set()
    for axis, vals in values.items():
        for v in vals:
            p = dict(base, **{axis: v})
            shape = (p["n"], p["c"], p["x"])
            if shape in seen:
                continue
            seen.add(shape)
            layers.append(
                Layer(f"sweep-n{p['n']}-c{p['c']}-x{p['x']}", p["n"], p["c"], p["c"], (p["x"], p["x"]),
                      (4, 4), 2, 1, sweep=(axis, v), note=f"k4s2p1, {axis} = {v}")
            )
    return layers


#: suite name -> its layers
SUITES = {"models": _models, "tiny": _tiny, "sweep": _sweep}


def layers(suite: str) -> list[Layer]:
    """The layers of one suite.

    Raises:
        ValueError: unknown suite.
    """
    if suite not in SUITES:
        msg = f"bench: unknown suite {suite!r}, expected one of {', '.join(SUITES)}"
        raise ValueError(msg)
    return SUITES[suite]()


def configs(
    suite: str, ops: Iterable[str] = OPS, dtypes_: Iterable[str] = DTYPES,
    formats: Iterable[str] = FORMATS, skip_slow: bool = False, layer_names: Optional[Iterable[str]] = None,
) -> list[Config]:
    """Every configuration of ``suite`` for the chosen ops, dtypes and formats.

    Ordered layer by layer, then op, data format and dtype (f32 before bf16 and f16, so the
    f16/f32 ratio of target 5 compares neighbours).
    """
    ops, dtypes_, formats = list(ops), list(dtypes_), list(formats)
    wanted = None if layer_names is None else set(layer_names)
    out = []
    for lay in layers(suite):
        if (skip_slow and lay.slow) or (wanted is not None and lay.name not in wanted):
            continue
        for op in ops:
            for fmt in formats:
                for dt in dtypes_:
                    out.append(Config(suite, lay, op, dt, fmt))
    return out

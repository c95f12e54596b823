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
* ``broad``: 52 layers of published architectures (GANs, detection and pose heads,
  segmentation decoders, super-resolution, 1-D audio decoders, 3-D medical and video), each
  with its source; ``broad-fit`` is the half the measured rules are made from,
  ``broad-holdout`` the half they are reported on.
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
        pad: pads_begin, every spatial dim (and pads_end unless ``pad_end`` is given).
        groups: groups.
        pad_end: pads_end where it differs from ``pad`` (asymmetric pads: TensorFlow's SAME).
        dilation: dilation, every spatial dim.
        output_padding: output_padding, every spatial dim.
        family: the broad suite's family (``gan``, ``detection``, ``segmentation``, ``sr``,
            ``audio``, ``3d``).
        part: the broad suite's part: ``fit`` (the rules are made from these layers) or
            ``holdout`` (reported on, never fitted).
        source: where the layer comes from (paper, and the layer in it).
        compute_bound: a large, compute-bound shape (target 3 looks at these).
        slow: compiles slowly on some oneDNN versions; ``--skip-slow`` leaves it out.
        sweep: for the sweep suite, (axis, value) that this layer varies.
        note: one line for the docs.
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
    pad_end: Optional[int] = None
    dilation: int = 1
    output_padding: int = 0
    family: str = ""
    part: str = ""
    source: str = ""

    @property
    def pads(self) -> tuple[int, int]:
        """(pads_begin, pads_end), every spatial dim."""
        return self.pad, self.pad if self.pad_end is None else self.pad_end

    @property
    def dst_spatial(self) -> tuple[int, ...]:
        """Forward dst sizes: stride*(src-1) + dilation*(kernel-1) + 1 - pads + output_padding."""
        pb, pe = self.pads
        return tuple(self.stride * (x - 1) + self.dilation * (k - 1) + 1 - pb - pe + self.output_padding
                     for x, k in zip(self.spatial, self.kernel))

    @property
    def flops(self) -> int:
        """2*N*IC*OC/G*prod(src spatial)*prod(kernel): the same count for all three ops."""
        return flops(self.n, self.ic, self.oc, self.groups, self.kernel, self.spatial)

    @property
    def shape_class(self) -> str:
        """:func:`onednn_convt.problem.shape_class` of this layer (the measured rules' key)."""
        return shape_class(self.kernel, (self.stride,) * len(self.kernel), self.groups, self.ic, self.oc, self.spatial, self.n)

    def describe(self) -> str:
        """``N=16 512->256 4x4 k4s2p1`` style summary (``p1/2`` asymmetric pads, ``d2``
        dilation, ``op1`` output_padding, ``g4`` groups)."""
        dims = "x".join(map(str, self.spatial))
        k = "x".join(map(str, sorted(set(self.kernel))))
        pb, pe = self.pads
        p = f"p{pb}" if pb == pe else f"p{pb}/{pe}"
        extra = (f"d{self.dilation}" if self.dilation > 1 else "") + (f"op{self.output_padding}" if self.output_padding else "")
        g = f" g{self.groups}" if self.groups > 1 else ""
        return f"N={self.n} {self.ic}->{self.oc} {dims} k{k}s{self.stride}{p}{extra}{g}"


@dataclass(frozen=True)
class Config:
    """One benchmark configuration: a layer run as one op, in one dtype and data format."""

    suite: str
    layer: Layer
    op: str
    dtype: str
    data_format: str
    #: a forward with a bias (one value per output channel)
    bias: bool = False

    @property
    def weights_format(self) -> str:
        """IOX with NCX, XOI with NXC."""
        return "IOX" if self.data_format == "NCX" else "XOI"

    @property
    def key(self) -> str:
        """Unique name: ``suite/layer/op/dtype/format``, and ``/bias`` for a biased forward."""
        key = f"{self.suite}/{self.layer.name}/{self.op}/{self.dtype}/{self.data_format}"
        return key + "/bias" if self.bias else key

    @property
    def flops(self) -> int:
        return self.layer.flops

    def attrs(self) -> dict[str, Any]:
        """Attributes of the onednn_convt op (library names)."""
        lay = self.layer
        pb, pe = lay.pads
        extra: dict[str, Any] = {}
        if lay.dilation > 1:
            extra["dilations"] = lay.dilation
        if lay.output_padding:
            extra["output_padding"] = lay.output_padding
        return dict(
            strides=lay.stride, pads_begin=pb, pads_end=pe, groups=lay.groups,
            data_format=self.data_format, weights_format=self.weights_format, **extra,
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
        args: tuple[np.ndarray, ...]
        if self.op == "fwd":
            op, args = ops.ConvTranspose(**attrs), (src, w)
            if self.bias:
                args = (src, w, make((lay.oc,)))
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
        names = {"fwd": ("src", "weights"), "bwd_d": ("diff_dst", "weights"), "bwd_w": ("src", "diff_dst")}
        return names[self.config.op] + (("bias",) if self.config.bias else ())

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


def _layer(family: str, part: str, source: str, name: str, n: int, ic: int, oc: int, spatial: tuple[int, ...],
           k: int, s: int, p: int, **kw: Any) -> Layer:
    return Layer(name, n, ic, oc, spatial, (k,) * len(spatial), s, p, family=family, part=part, source=source,
                 note=source, **kw)


def _broad() -> list[Layer]:
    """ConvTranspose layers of published architectures, half to fit the rules on (``fit``),
    half to report them on (``holdout``). Batches are the papers' where that keeps a call
    near a GFLOP on two cores, else smaller; ``variant`` layers are marked as such."""
    gan, det, seg, sr, audio, vol = "gan", "detection", "segmentation", "sr", "audio", "3d"
    dcgan = "Radford et al., DCGAN (ICLR 2016), generator"
    return [
        # -- GANs -------------------------------------------------------------------------
        _layer(gan, "fit", f"{dcgan}: z (100) -> 4x4x512", "dcgan-z", 64, 100, 512, (1, 1), 4, 1, 0),
        _layer(gan, "holdout", f"{dcgan}: 4x4x512 -> 8x8x256", "dcgan-g2", 32, 512, 256, (4, 4), 4, 2, 1),
        _layer(gan, "fit", f"{dcgan}: 16x16x128 -> 32x32x64", "dcgan-g4", 16, 128, 64, (16, 16), 4, 2, 1),
        _layer(gan, "holdout", f"{dcgan}: 32x32x64 -> 64x64x3", "dcgan-g5", 64, 64, 3, (32, 32), 4, 2, 1),
        # the generator at batch 16, as `bench --suite step` trains it: the layers no other
        # suite has at that batch
        _layer(gan, "fit", f"{dcgan}, batch 16: z (100) -> 4x4x512", "dcgan-z-b16", 16, 100, 512, (1, 1), 4, 1, 0),
        _layer(gan, "fit", f"{dcgan}, batch 16: 8x8x256 -> 16x16x128", "dcgan-g3-b16", 16, 256, 128, (8, 8), 4, 2, 1),
        _layer(gan, "fit", f"{dcgan}, batch 16: 32x32x64 -> 64x64x3", "dcgan-g5-b16", 16, 64, 3, (32, 32), 4, 2, 1),
        _layer(gan, "fit", "DCGAN in TensorFlow (carpedm20/DCGAN-tensorflow): k5 s2 'SAME', 4x4x512 -> 8x8x256",
               "dcgan-tf", 8, 512, 256, (4, 4), 5, 2, 1, pad_end=2),
        _layer(gan, "holdout", "Isola et al., pix2pix (CVPR 2017), U-Net decoder: 8x8x1024 -> 16x16x512", "pix2pix-up3",
               1, 1024, 512, (8, 8), 4, 2, 1),
        _layer(gan, "fit", "Isola et al., pix2pix (CVPR 2017), U-Net decoder output: 128x128x128 -> 256x256x3",
               "pix2pix-out", 1, 128, 3, (128, 128), 4, 2, 1),
        _layer(gan, "holdout", "Zhu et al., CycleGAN (ICCV 2017), ResNet generator: 64x64x256 -> 128x128x128",
               "cyclegan-up1", 1, 256, 128, (64, 64), 3, 2, 1, output_padding=1),
        _layer(gan, "fit", "Zhu et al., CycleGAN (ICCV 2017), ResNet generator: 128x128x128 -> 256x256x64",
               "cyclegan-up2", 1, 128, 64, (128, 128), 3, 2, 1, output_padding=1),
        _layer(gan, "holdout", "Choi et al., StarGAN (CVPR 2018), generator up-sampling: 32x32x256 -> 64x64x128",
               "stargan-up1", 1, 256, 128, (32, 32), 4, 2, 1),
        _layer(gan, "fit", "Karras et al., StyleGAN2 (CVPR 2020), fused modulated up-sampling conv "
               "(conv_transpose2d with groups = batch, batch 4): 8x8x512 -> 16x16", "stylegan2-up8",
               1, 2048, 2048, (8, 8), 3, 2, 0, groups=4),
        _layer(gan, "holdout", "Karras et al., StyleGAN2 (CVPR 2020), fused modulated up-sampling conv "
               "(groups = batch, batch 2): 16x16x512 -> 32x32", "stylegan2-up16", 1, 1024, 1024, (16, 16), 3, 2, 0,
               groups=2),
        # -- detection and pose heads -----------------------------------------------------
        _layer(det, "fit", "Xiao et al., Simple Baselines (ECCV 2018), ResNet-50 head: 8x6x2048 -> 16x12x256",
               "simplebaseline-d1", 2, 2048, 256, (8, 6), 4, 2, 1),
        _layer(det, "holdout", "Xiao et al., Simple Baselines (ECCV 2018), head deconv 2: 16x12x256 -> 32x24x256",
               "simplebaseline-d2", 2, 256, 256, (16, 12), 4, 2, 1),
        _layer(det, "holdout", "Zhou et al., CenterNet (arXiv 2019), ResNet-18 head: 16x16x512 -> 32x32x256",
               "centernet-r18-d1", 1, 512, 256, (16, 16), 4, 2, 1),
        _layer(det, "fit", "Zhou et al., CenterNet (arXiv 2019), ResNet-18 head: 64x64x128 -> 128x128x64",
               "centernet-r18-d3", 1, 128, 64, (64, 64), 4, 2, 1),
        _layer(det, "fit", "Zhou et al., CenterNet (arXiv 2019), DLA-34 IDAUp: depthwise bilinear up x2",
               "centernet-ida2", 8, 64, 64, (64, 64), 4, 2, 1, groups=64),
        _layer(det, "holdout", "Zhou et al., CenterNet (arXiv 2019), DLA-34 IDAUp: depthwise bilinear up x4",
               "centernet-ida4", 8, 128, 128, (32, 32), 8, 4, 2, groups=128),
        _layer(det, "fit", "Zhou et al., CenterNet (arXiv 2019), DLA-34 IDAUp: depthwise bilinear up x8",
               "centernet-ida8", 8, 256, 256, (16, 16), 16, 8, 4, groups=256),
        _layer(det, "holdout", "He et al., Mask R-CNN (ICCV 2017), mask head: 14x14x256 -> 28x28x256 per RoI",
               "maskrcnn-mask", 16, 256, 256, (14, 14), 2, 2, 0),
        _layer(det, "fit", "Cheng et al., HigherHRNet (CVPR 2020), deconv module: 128x128x(32+17) -> 256x256x32",
               "higherhrnet-deconv", 2, 49, 32, (128, 128), 4, 2, 1),
        _layer(det, "holdout", "Fu et al., DSSD (arXiv 2017), deconvolution module: 10x10x512 -> 20x20x512",
               "dssd-deconv", 8, 512, 512, (10, 10), 2, 2, 0),
        # -- segmentation decoders --------------------------------------------------------
        _layer(seg, "fit", "Long et al., FCN-8s (CVPR 2015), upscore2: 21 classes, x2", "fcn-up2", 1, 21, 21, (16, 16),
               4, 2, 0),
        _layer(seg, "holdout", "Long et al., FCN-8s (CVPR 2015), upscore8: 21 classes, x8", "fcn-up8", 1, 21, 21,
               (64, 64), 16, 8, 0),
        _layer(seg, "fit", "Ronneberger et al., U-Net (MICCAI 2015), up-conv 2x2: 28x28x1024 -> 56x56x512", "unet-up1",
               1, 1024, 512, (28, 28), 2, 2, 0),
        _layer(seg, "holdout", "Ronneberger et al., U-Net (MICCAI 2015), up-conv 2x2: 196x196x128 -> 392x392x64",
               "unet-up4", 1, 128, 64, (196, 196), 2, 2, 0),
        _layer(seg, "holdout", "Chaurasia & Culurciello, LinkNet (VCIP 2017), decoder block 4 full-conv 3x3 s2",
               "linknet-dec4", 8, 128, 128, (12, 15), 3, 2, 1, output_padding=1),
        _layer(seg, "fit", "Chaurasia & Culurciello, LinkNet (VCIP 2017), decoder block 1 full-conv 3x3 s2",
               "linknet-dec1", 8, 16, 16, (90, 120), 3, 2, 1, output_padding=1),
        _layer(seg, "fit", "Romera et al., ERFNet (T-ITS 2018), UpsamplerBlock 128 -> 64 at 64x128",
               "erfnet-up1", 1, 128, 64, (64, 128), 3, 2, 1, output_padding=1),
        _layer(seg, "holdout", "Romera et al., ERFNet (T-ITS 2018), output deconv 16 -> 20 classes at 256x512",
               "erfnet-out", 1, 16, 20, (256, 512), 2, 2, 0),
        _layer(seg, "holdout", "Paszke et al., ENet (arXiv 2016), upsampling bottleneck's transposed conv (32 ch)",
               "enet-up", 1, 32, 32, (64, 128), 3, 2, 1, output_padding=1),
        _layer(seg, "fit", "variant (no published layer): ERFNet's upsampler with dilation 2, to cover dilation",
               "erfnet-up1-d2", 1, 128, 64, (64, 128), 3, 2, 2, dilation=2, output_padding=1),
        _layer(seg, "holdout", "variant (no published layer): a 32-group k4 s2 p1 decoder layer, to cover groups",
               "grouped32-up", 8, 256, 256, (16, 16), 4, 2, 1, groups=32),
        # added to the fit half after its first holdout check on a Zen4 (benchmarks/NOTES.md): the
        # holdout's grouped and one-layer k2 s2 output layers had no layer of their kind to fit on
        _layer(seg, "fit", "Mehta et al., ESPNet (ECCV 2018), decoder: the 20 class maps k2 s2 up at 128x256",
               "espnet-up2", 1, 20, 20, (128, 256), 2, 2, 0),
        _layer(seg, "fit", "variant (no published layer): an 8-group k4 s2 p1 decoder layer, to cover groups",
               "grouped8-up", 4, 128, 128, (32, 32), 4, 2, 1, groups=8),
        # -- super-resolution -------------------------------------------------------------
        _layer(sr, "fit", "Dong et al., FSRCNN (ECCV 2016), deconvolution x2: 56 -> 1 channel", "fsrcnn-x2", 1, 56, 1,
               (256, 256), 9, 2, 4, output_padding=1),
        _layer(sr, "holdout", "Dong et al., FSRCNN (ECCV 2016), deconvolution x3: 56 -> 1 channel", "fsrcnn-x3", 1, 56,
               1, (170, 170), 9, 3, 4, output_padding=2),
        _layer(sr, "holdout", "Lai et al., LapSRN (CVPR 2017), feature up-sampling 64 -> 64 x2", "lapsrn-feat", 1, 64,
               64, (128, 128), 4, 2, 1),
        _layer(sr, "fit", "Lai et al., LapSRN (CVPR 2017), image up-sampling 1 -> 1 x2", "lapsrn-img", 4, 1, 1,
               (128, 128), 4, 2, 1),
        _layer(sr, "fit", "Haris et al., DBPN (CVPR 2018), up-projection x4: 64 channels, k8 s4 p2", "dbpn-up4", 2,
               64, 64, (32, 32), 8, 4, 2),
        _layer(sr, "holdout", "Tong et al., SRDenseNet (ICCV 2017), deconvolution 256 -> 256 x2", "srdensenet-deconv",
               1, 256, 256, (32, 32), 3, 2, 1, output_padding=1),
        # -- speech and audio (1-D) -------------------------------------------------------
        _layer(audio, "holdout", "Kong et al., HiFi-GAN V1 (NeurIPS 2020), up-sampling 1: 512 -> 256, k16 s8",
               "hifigan-up1", 16, 512, 256, (32,), 16, 8, 4),
        _layer(audio, "fit", "Kong et al., HiFi-GAN V1 (NeurIPS 2020), up-sampling 3: 128 -> 64, k4 s2",
               "hifigan-up3", 16, 128, 64, (2048,), 4, 2, 1),
        _layer(audio, "holdout", "Kong et al., HiFi-GAN V1 (NeurIPS 2020), up-sampling 4: 64 -> 32, k4 s2",
               "hifigan-up4", 16, 64, 32, (4096,), 4, 2, 1),
        _layer(audio, "holdout", "Kumar et al., MelGAN (NeurIPS 2019), up-sampling 1: 512 -> 256, k16 s8", "melgan-up1", 4,
               512, 256, (128,), 16, 8, 4),
        _layer(audio, "fit", "Donahue et al., WaveGAN (ICLR 2019), up-sampling 1: 1024 -> 512, k25 s4",
               "wavegan-up1", 4, 1024, 512, (16,), 25, 4, 11, output_padding=1),
        _layer(audio, "holdout", "Donahue et al., WaveGAN (ICLR 2019), up-sampling 5: 64 -> 1, k25 s4", "wavegan-up5",
               64, 64, 1, (4096,), 25, 4, 11, output_padding=1),
        _layer(audio, "fit", "Luo & Mesgarani, Conv-TasNet (TASLP 2019), decoder: 512 -> 1, k16 s8",
               "convtasnet-dec", 4, 512, 1, (3999,), 16, 8, 0),
        _layer(audio, "fit", "Defossez et al., Demucs (arXiv 2019), decoder layer: 256 -> 128, k8 s4", "demucs-dec", 4,
               256, 128, (1024,), 8, 4, 0),
        # -- 3-D: medical and video -------------------------------------------------------
        _layer(vol, "fit", "Cicek et al., 3-D U-Net (MICCAI 2016), up-conv 2x2x2: 128 channels", "unet3d-up", 1, 128,
               128, (16, 16, 12), 2, 2, 0),
        _layer(vol, "holdout", "Milletari et al., V-Net (3DV 2016), de-convolution 2x2x2: 128 -> 64", "vnet-up2", 2, 128,
               64, (16, 16, 8), 2, 2, 0),
        _layer(vol, "holdout", "Isensee et al., nnU-Net (Nature Methods 2021), 3-D transposed conv 320 -> 320",
               "nnunet-up1", 2, 320, 320, (4, 5, 4), 2, 2, 0),
        _layer(vol, "fit", "Isensee et al., nnU-Net (Nature Methods 2021), 3-D transposed conv 64 -> 32", "nnunet-up4",
               1, 64, 32, (32, 40, 32), 2, 2, 0),
        _layer(vol, "fit", "Vondrick et al., VideoGAN (NeurIPS 2016), foreground stream: 2x4x4x512 -> 4x8x8x256",
               "videogan-up1", 2, 512, 256, (2, 4, 4), 4, 2, 1),
        _layer(vol, "holdout", "Vondrick et al., VideoGAN (NeurIPS 2016), foreground stream: 8x16x16x128 -> 16x32x32x64",
               "videogan-up3", 1, 128, 64, (8, 16, 16), 4, 2, 1),
    ]


def _broad_fit() -> list[Layer]:
    return [lay for lay in _broad() if lay.part == "fit"]


def _broad_holdout() -> list[Layer]:
    return [lay for lay in _broad() if lay.part == "holdout"]


#: suite name -> its layers
#: the suite name of a user's layers (``--layers-json``): in no suite's list
CUSTOM = "custom"

SUITES = {"models": _models, "tiny": _tiny, "sweep": _sweep, "broad": _broad, "broad-fit": _broad_fit,
          "broad-holdout": _broad_holdout}


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
    bias: bool = False, custom: Optional[Sequence[Layer]] = None,
) -> list[Config]:
    """Every configuration of ``suite`` for the chosen ops, dtypes and formats (``bias``: the
    forwards with a bias); of the layers ``custom`` instead, where given (a user's layers:
    ``--layers-json``), as suite ``custom``.

    Ordered layer by layer, then op, data format and dtype (f32 before bf16 and f16, so the
    f16/f32 ratio of target 5 compares neighbours).
    """
    ops, dtypes_, formats = list(ops), list(dtypes_), list(formats)
    wanted = None if layer_names is None else set(layer_names)
    if custom is not None:
        suite = CUSTOM
    out = []
    for lay in layers(suite) if custom is None else custom:
        if (skip_slow and lay.slow) or (wanted is not None and lay.name not in wanted):
            continue
        for op in ops:
            for fmt in formats:
                for dt in dtypes_:
                    out.append(Config(suite, lay, op, dt, fmt, bias=bias and op == "fwd"))
    return out

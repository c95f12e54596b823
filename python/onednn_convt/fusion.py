"""A fused ConvTranspose call: ConvTranspose [+ bias] [+ post-ops], float or int8, as one
library partition, and how it runs where the library does not fuse it.

:class:`Fusion` is what a ``ConvTranspose(post_ops=..., src_dequantize=...,
weights_dequantize=..., dst_quantize=...)`` adds to the plain op (here, with the graph it
makes: :func:`graph_nodes`); :func:`onednn_convt.fused_plan.make_plan` checks a call's
tensors against it and compiles the graph (``Dequantize ->`` ConvTranspose ``->``
post-ops ``-> Quantize``). Where the library's graph cannot run here it falls back, and
says so in ``op.lowering``:

- bf16/f16 without native kernels, on a problem a guard keeps away from the library's
  low-precision kernel (:mod:`onednn_convt.guards`), or where the measured rules run the
  plain op in f32 (faster there): the same graph in f32, rounded once;
- a graph the library does not fuse into one partition: the plain ConvTranspose in f32,
  then the post-ops and the quantization in NumPy (float64, the reference's math).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from . import guards, memory, shapes
from .lowering import base as lowerings
from .lowering import matmul_tiles
from .post_ops import Dequantize, PostOp, Quantize, as_post_ops

if TYPE_CHECKING:
    from .ops import ConvTranspose
    from .problem import Problem

F32 = np.dtype(np.float32)


@dataclass(frozen=True)
class Fusion:
    """What follows (and, for int8, precedes) the ConvTranspose of a fused op.

    Attributes:
        post_ops: the chain, in order (at most :data:`onednn_convt.post_ops.MAX_CHAIN`).
        src_dequantize, weights_dequantize: an int8 op's input quantization (both or none).
        dst_quantize: an int8 op's output quantization; None: dst is f32.
    """

    post_ops: tuple[PostOp, ...]
    src_dequantize: Optional[Dequantize] = None
    weights_dequantize: Optional[Dequantize] = None
    dst_quantize: Optional[Quantize] = None

    @property
    def int8(self) -> bool:
        return self.src_dequantize is not None

    @property
    def binary(self) -> tuple[PostOp, ...]:
        """The post-ops that take a second tensor, in call order."""
        return tuple(p for p in self.post_ops if p.is_binary)

    def input_names(self) -> tuple[str, ...]:
        extra = tuple(f"post_ops[{i}] ({p.kind})" for i, p in enumerate(self.post_ops) if p.is_binary)
        return ("src", "weights", "bias") + extra

    def after(self, bias: bool) -> list[str]:
        """The op kinds after the ConvTranspose."""
        kinds = (["BiasAdd"] if bias else []) + [p.kind for p in self.post_ops]
        return kinds + (["Quantize"] if self.dst_quantize is not None else [])

    def chain(self, bias: bool, core: str = lowerings.CONV_TRANSPOSE) -> str:
        """The graph's op kinds, joined by '+' (``core``: the library op computing the
        ConvTranspose, see :class:`Core`)."""
        return "+".join((["Dequantize"] if self.int8 else []) + [core] + self.after(bias))


@dataclass(frozen=True)
class Core:
    """The library op that computes a fused call's ConvTranspose, at the head of its graph.

    The library's ``ConvTranspose``; or, with stride 1, a forward ``Convolution`` over
    flipped weights (:mod:`onednn_convt.lowering.forward`; the plain op's own lowering for
    depthwise layers), whose kernels keep their speed with post-ops fused where the
    library's deconvolution kernel loses it (10-20x: see :func:`staged_core`).

    Or, in NXC where the taps tile the output (stride = kernel, no pads: the U-Net
    up-sampling), the ``MatMul`` over the taps that writes dst itself
    (:func:`onednn_convt.lowering.matmul_tiles.conv_transpose`), where the plain op runs so
    (the measured rules' choice, or the guard's route on AMX, which keeps bf16 native): its
    result is dst's memory in another shape, the post-ops' tensors are seen in that shape.

    Attributes:
        kind: the library op kind.
        attrs: its attributes.
        weights_format: the format of the weights it takes (IOX/XOI, or OIX/XIO).
        prepare: turns (src, weights[, bias], binary operands...) into its graph's inputs
            (the weights flip; the MatMul's views), or None.
        out_shape: the shape of its result and the post-ops' (None: dst's).
        how: what ``op.lowering`` adds to say how the ConvTranspose was computed.
        staged: the op runs as a partition of its own, without the bias, and the bias and
            post-ops follow as a second partition in dst (the guard
            :data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`; see
            :func:`staged_core`).
        plain: (staged) the plain op computes the ConvTranspose, by its rules, before the
            graph (in ``prepare``): the graph holds the bias and post-ops alone, its first
            input that result (``kind`` names the plain op's lowering).
    """

    kind: str
    attrs: dict[str, Any]
    weights_format: str
    prepare: Optional[Callable[[list[np.ndarray]], list[np.ndarray]]] = None
    out_shape: Optional[tuple[int, ...]] = None
    how: str = ""
    staged: bool = False
    plain: bool = False


def make_core(op: ConvTranspose, lowering: Optional[lowerings.Lowering], src_shape: Sequence[int],
              w_shape: Sequence[int]) -> Core:
    """The :class:`Core` of a fused call whose plain op lowers to ``lowering`` (None: the
    library's ConvTranspose)."""
    if lowering is not None and lowering.kind == lowerings.CONVOLUTION:
        return Core(lowering.kind, lowering.attrs, lowering.attrs["weights_format"], lowering.prepare,
                    how=" (the ConvTranspose as a Convolution over flipped weights)")
    return Core(lowerings.CONV_TRANSPOSE, op._convtranspose_attrs(src_shape, w_shape), op.attrs["weights_format"])


#: why a stride-1 float call's deconvolution runs apart from its bias and post-ops
SLOW_STRIDE_1_EPILOGUE = "oneDNN 3.2's stride-1 deconvolution is slow with them fused"


def staged_core(op: ConvTranspose, problem: Problem, plain_rule: str,
                why: str = guards.STRIDED_DECONVOLUTION_EPILOGUE.name) -> Core:
    """The core of a float call that the library's deconvolution would compute with its
    bias and post-ops fused, where that is wrong (the guard
    :data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`: a stride > 1) or slow
    (:data:`SLOW_STRIDE_1_EPILOGUE`: with stride 1, oneDNN 3.2's deconvolution with a fused
    bias or post-op runs its blocked JIT kernel, 10-20x the time of the op alone and the rest
    after it; measured on an AMD Zen5, f32 and bf16, k3 s1 p1 layers of 75 to 262,144 output
    elements: 8x32x32x32 -> 32 with bias + ReLU, 4.8 ms fused against 0.41 ms staged in NCX f32,
    6.3 against 0.19 ms in NXC bf16): the op alone, then BiasAdd and the post-ops as further
    partitions, in dst. The op alone runs as the plain call does: ``plain_rule``, the rules'
    lowering of ``problem`` (its native form where the rule is "... in f32"). Where that is
    the library's ConvTranspose or ConvolutionBackwardData, it heads the graph (on an AMD
    Zen5 the HiFi-GAN k16 s8 layer with bias + ReLU, f32 NCX, took 178 ms on
    ConvolutionBackwardData where the rules' ConvTranspose takes 117); any other lowering
    (polyphase, a MatMul form, ...) is the plain op itself, run before the graph
    (:attr:`Core.plain`: the DCGAN k4 s2 layer's polyphase forward, f32 NXC with bias + Add,
    ran in 4.1 ms on ConvolutionBackwardData where the plain op and NumPy take 2.8).
    ``why`` ends ``op.lowering``."""
    from .lowering import IN_F32, forward

    rule = plain_rule.removesuffix(IN_F32)
    if rule in (lowerings.CONV_TRANSPOSE, lowerings.CONVOLUTION_BACKWARD_DATA):
        low = forward.build(problem, rule)
        return Core(low.kind, low.attrs, low.attrs["weights_format"], staged=True,
                    how=f" (the ConvTranspose as {rule}, then the rest: {why})")
    plain = op._plain()

    def run_plain(args: list[np.ndarray]) -> list[np.ndarray]:
        """(src, weights[, bias], operands...) -> (the op's result without its bias, dense as
        the graph takes it[, bias], operands...)"""
        result = memory.empty(problem.out_shape, args[0].dtype)
        plain(args[0], args[1], out=result)
        return [result] + args[2:]

    return Core(rule, {}, op.attrs["weights_format"], run_plain, staged=True, plain=True,
                how=f" (the ConvTranspose as the plain op runs it, then the rest: {why})")


#: dtype -> the dispatch ISAs on which oneDNN 3.2 runs a MatMul with every post-op chain on
#: its brgemm kernels, measured (Sapphire Rapids under ONEDNN_MAX_CPU_ISA caps: every unary
#: post-op, every binary one dst-shaped and one-valued, alone and in chains, 1-D to 3-D).
#: Elsewhere some chains run on its reference kernel (``ref:any``, 100-1000x slower):
#: gemm:jit (f32 under AVX2, bf16 under AVX512_CORE) for a unary post-op then a dst-shaped
#: Add, every f16 MatMul with a bias or a post-op, and per-channel tensors on some levels.
MATMUL_POST_OPS_ISAS = {
    "f32": frozenset({"avx512_core", "avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx"}),
    "bf16": frozenset({"avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx"}),
}


def tiles_core(op: ConvTranspose, problem: Problem, plain_rule: str, code: str,
               operand_shapes: Sequence[tuple[int, ...]]) -> Optional[Core]:
    """The MatMul :class:`Core` of an f32 or bf16 NXC call whose plain op runs as
    :data:`onednn_convt.lowering.base.TILES` (``plain_rule``, the rules' lowering of
    ``problem``: see :class:`Core`), on a CPU of
    :data:`MATMUL_POST_OPS_ISAS`, each binary post-op's tensor being dst-shaped or one
    value; else None."""
    if (op.attrs["data_format"] != "NXC" or plain_rule != lowerings.TILES
            or guards.dispatch_isa() not in MATMUL_POST_OPS_ISAS.get(code, ())):
        return None
    dst = problem.out_shape
    parts = matmul_tiles.conv_transpose(problem.input_shapes[0], problem.kernel, problem.oc, "NXC",
                                        op.attrs["weights_format"])
    shape: tuple[int, ...] = parts["library_shape"]
    # no per-channel tensors: oneDNN 3.2 runs such a MatMul on its reference kernel (ref:any)
    # under AVX2 and, for 3-D problems (a 6-D MatMul), under AVX-512 and AMX too: 800 ms for
    # the models suite's conv3d layer against 0.6 ms
    if any(s not in (tuple(dst), (1,) * len(dst)) for s in operand_shapes):
        return None
    head = 2 + int(problem.bias)

    def seen(x: np.ndarray) -> np.ndarray:
        """A binary operand (at dst's rank) in the MatMul result's shape: dst's memory order
        (a view where x is contiguous), or its one value."""
        return x.reshape(shape if x.shape == tuple(dst) else (1,) * len(shape))

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        return list(parts["prepare"](args[:head])) + [seen(x) for x in args[head:]]

    return Core(lowerings.MATMUL, {}, op.attrs["weights_format"], prepare, shape,
                " (the ConvTranspose as a MatMul over the taps)")


def make_fusion(
    where: str, post_ops: Any, src_dequantize: Any, weights_dequantize: Any, dst_quantize: Any
) -> Optional[Fusion]:
    """The checked Fusion of a ConvTranspose's arguments, or None for a plain op."""
    chain = as_post_ops(where, post_ops)
    for name, q, cls in (("src_dequantize", src_dequantize, Dequantize),
                         ("weights_dequantize", weights_dequantize, Dequantize),
                         ("dst_quantize", dst_quantize, Quantize)):
        if q is not None and (not isinstance(q, cls) or (cls is Dequantize and isinstance(q, Quantize))):
            msg = f"{where}: argument '{name}' expected a {cls.__name__}, got {type(q).__name__}"
            raise TypeError(msg)
    if (src_dequantize is None) != (weights_dequantize is None):
        msg = f"{where}: an int8 ConvTranspose needs both 'src_dequantize' and 'weights_dequantize'"
        raise ValueError(msg)
    int8 = src_dequantize is not None
    if dst_quantize is not None and not int8:
        msg = f"{where}: 'dst_quantize' needs an int8 op (src_dequantize and weights_dequantize)"
        raise ValueError(msg)
    for i, p in enumerate(chain):
        if p.dequantize is not None and not int8:
            msg = f"{where}: post_ops[{i}] ({p.kind}) dequantizes its tensor, which needs an int8 op"
            raise ValueError(msg)
    if int8:
        if any(z != 0 for z in weights_dequantize.zps):
            msg = f"{where}: weights_dequantize expected zero points 0 (oneDNN 3.2 has no weights zero points), got {list(weights_dequantize.zps)}"
            raise ValueError(msg)
        for name, q in (("src_dequantize", src_dequantize), ("dst_quantize", dst_quantize)):
            if q is not None and q.qtype != "per_tensor":
                msg = f"{where}: {name} expected qtype 'per_tensor' (the library quantizes activations per tensor), got {q.qtype!r}"
                raise ValueError(msg)
        for i, p in enumerate(chain):
            if p.dequantize is not None and p.dequantize.qtype != "per_tensor":
                msg = f"{where}: post_ops[{i}] ({p.kind}) expected a per_tensor dequantize, got {p.dequantize.qtype!r}"
                raise ValueError(msg)
    if not chain and not int8:
        return None
    return Fusion(chain, src_dequantize, weights_dequantize, dst_quantize)


def weights_axis(weights_format: str, rank: int) -> int:
    """The O dim of the weights (IOX: 1, XOI: rank - 2; a Convolution's OIX: 0, XIO:
    rank - 1): the per-channel axis of int8 weights."""
    return {"IOX": 1, "XOI": rank - 2, "OIX": 0, "XIO": rank - 1}[weights_format]


def graph_nodes(op: ConvTranspose, f: Fusion, has_bias: bool,
                out_shape: Sequence[int], inter: str, out_code: str,
                operand_shapes: Sequence[Sequence[int]], src_shape: Sequence[int],
                w_shape: Sequence[int], core: Optional[Core] = None,
                ) -> list[tuple[str, dict[str, Any], list[int], Any]]:
    """The library graph of a fused call: (kind, attrs, inputs, output) per node, inputs
    indexing the graph's inputs (src, weights, bias?, operands...; after a
    :attr:`Core.plain` core: its result, bias?, operands...) or, as -1 - k, node k.
    ``core``: the op at its head (default: the library's ConvTranspose on ``w_shape``,
    as the user's call reads; else ``w_shape`` is the weights as the core takes them)."""
    if core is None:
        core = make_core(op, None, src_shape, w_shape)
    nodes: list[tuple[str, dict[str, Any], list[int], Any]] = []

    def add(kind: str, attrs: dict[str, Any], inputs: list[int], shape: Sequence[int], code: str) -> int:
        nodes.append((kind, attrs, inputs, (list(shape), list(shapes.dense_strides(shape)), code)))
        return -len(nodes)

    src_ref, w_ref = 0, 1
    if f.int8:
        assert f.src_dequantize is not None and f.weights_dequantize is not None
        src_ref = add("Dequantize", f.src_dequantize.library_attrs(len(src_shape)), [0], src_shape, "f32")
        wq = f.weights_dequantize.library_attrs(len(w_shape))
        if f.weights_dequantize.qtype == "per_channel":
            wq["axis"] = weights_axis(core.weights_format, len(w_shape))
        w_ref = add("Dequantize", wq, [1], w_shape, "f32")
    head = 1 if core.plain else 2  # the graph's inputs before the bias: src, weights; or the op's result
    conv = [src_ref, w_ref] + ([2] if has_bias and not core.staged else [])
    out_shape = core.out_shape or out_shape  # the post-ops work in the core's result's shape
    ref = 0 if core.plain else add(core.kind, core.attrs, conv, out_shape, inter)
    if core.staged and has_bias:  # in NXC an Add of the 1-D bias (it broadcasts over the last dim,
        # and the library fuses the post-ops into it); BiasAdd, its own partition, in NCX
        nxc = op.attrs["data_format"] == "NXC"
        kind, attrs = ("Add", {}) if nxc else ("BiasAdd", {"data_format": "NCX"})
        ref = add(kind, attrs, [ref, head], out_shape, inter)
    first = operand = head + int(has_bias)
    for p in f.post_ops:
        if p.is_binary:
            other = operand
            shape = operand_shapes[operand - first]
            if p.dequantize is not None:
                other = add("Dequantize", p.dequantize.library_attrs(len(shape)), [operand], shape, "f32")
            ref = add(p.kind, p.library_attrs(), [ref, other], out_shape, inter)
            operand += 1
        else:
            ref = add(p.kind, p.library_attrs(), [ref], out_shape, inter)
    if f.dst_quantize is not None:
        add("Quantize", f.dst_quantize.library_attrs(len(out_shape)), [ref], out_shape, out_code)
    return nodes

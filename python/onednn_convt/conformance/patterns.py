"""Pattern graphs: a ConvTranspose with the ops oneDNN fuses around it, run as one fused call.

A graph of several ops runs as one ``onednn_convt.ConvTranspose(post_ops=...,
src_dequantize=..., weights_dequantize=..., dst_quantize=...)`` call when its ops form the
chain the package fuses (oneDNN 3.2's ``convtranspose_post_ops_fusion`` and int8 patterns)::

    [Dequantize(src)] + [Dequantize(weights)] -> ConvTranspose [with bias input 2]
        [-> BiasAdd] [-> up to three post-ops] [-> Quantize]

The chain is found by tensor ids: each op's output feeds exactly one op. A post-op is
one of :data:`onednn_convt.post_ops.POST_OPS`. A binary post-op takes the chain on input 0,
or on input 1 of a commutative kind (Add, Multiply, Maximum, Minimum). Its other input is a
graph input, or in an int8 graph a graph input through a per-tensor Dequantize.
Both Dequantize ops (int8) or neither (float) precede the ConvTranspose. Quantize comes
last and only in int8 graphs.

Anything else is a valid graph this runner does not cover (``SKIPPED``, the reason says which
op breaks the chain): another op kind, a branch, an op outside the chain, a Subtract or Divide
with the chain on input 1 (the package's post-ops compute ``chain - other``, not
``other - chain``), more than three post-ops (more than :data:`MAX_OPS` ops), an int8 graph
whose intermediates are bf16 or f16. Malformed attributes, dtypes or shapes are ``INVALID``,
as for single ops, and so are malformed intermediate tensors: every tensor of the chain
(the ConvTranspose's output, each post-op's, the Quantize's) must be declared with the
shape the ConvTranspose gives (unknown dims are inferred) and a dtype the op gives (float;
the Quantize's u8/s8), and a Dequantize's output f32 with its input's shape. (Cycles, and
one tensor id declared as two tensors, are refused when the file is read:
:func:`.graph_json.check_tensors`.)

``--in-shapes`` sets the shape of any graph input by tensor id; ``--op-attrs`` sets the
attributes of any op by op id (ConvTranspose geometry, Dequantize/Quantize ``scales``,
``zps``, ``qtype``, ``axis``, a post-op's ``alpha``...); ``--dt`` rewrites every f32 tensor;
``--mb`` the batch of src and of binary operands that carry it. The output shape is the
ConvTranspose's, recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..post_ops import MAX_CHAIN, POST_OPS, Dequantize, PostOp, Quantize
from .graph import CONVT_KINDS, GRAPH_OP_KINDS, Graph, GraphOp, LogicalTensor
from .graph_json import short
from .model import SKIPPED, Case, CaseError, Overrides, TensorSpec
from .op_case import (apply_in_shapes, check_attrs, check_ranks, expected_output_shape, op_keywords, shape_differs,
                      stride_order)
from .pattern_ops import COMMUTATIVE, Input, apply_op_attrs, check_dtypes, invalid, quantization, skip
from .pattern_ops import post_op as read_post_op

@dataclass(frozen=True)
class Pattern:
    """What a pattern graph adds to its ConvTranspose (the fused op's extra keywords).

    Attributes:
        chain: the graph's op kinds, inputs' Dequantize ops first, then in chain order.
        post_ops: the post-ops, in chain order.
        src_dequantize, weights_dequantize, dst_quantize: the int8 quantization (or None).
        bias_add: whether the bias came as a BiasAdd op (else as ConvTranspose input 2).
    """

    chain: tuple[str, ...]
    post_ops: tuple[PostOp, ...] = ()
    src_dequantize: Optional[Dequantize] = None
    weights_dequantize: Optional[Dequantize] = None
    dst_quantize: Optional[Quantize] = None
    bias_add: bool = False

    @property
    def int8(self) -> bool:
        """Whether the ConvTranspose's inputs are dequantized."""
        return self.src_dequantize is not None

    @property
    def label(self) -> str:
        """The op kinds joined by '+' (``Dequantize+Dequantize+ConvTranspose+Add+Quantize``)."""
        return "+".join(self.chain)

    def op_kwargs(self) -> dict[str, Any]:
        """The ConvTranspose keywords beyond the geometry."""
        return {
            "post_ops": list(self.post_ops) or None,
            "src_dequantize": self.src_dequantize,
            "weights_dequantize": self.weights_dequantize,
            "dst_quantize": self.dst_quantize,
        }


def build(case: Case, graph: Graph, ov: Overrides) -> None:
    """Fill ``case`` from a graph of several ops, or raise CaseError (see the module docstring).

    A SKIPPED reason starts with the graph's op kinds: ``the graph has 2 ops (ConvTranspose,
    Concat): op 3 (Concat) follows the ConvTranspose; ...``.
    """
    try:
        _build(case, graph, ov)
    except CaseError as e:
        if e.status == SKIPPED:
            kinds = ", ".join(op.kind for op in graph.ops[:MAX_OPS])
            more = ", ..." if len(graph.ops) > MAX_OPS else ""
            raise skip(f"the graph has {len(graph.ops)} ops ({kinds}{more}): {e.reason}") from None
        raise


#: Most ops of a pattern: two Dequantize, the ConvTranspose, a BiasAdd, MAX_CHAIN post-ops
#: each with the Dequantize of its tensor, a Quantize.
MAX_OPS = 4 + 2 * MAX_CHAIN + 1


def _build(case: Case, graph: Graph, ov: Overrides) -> None:
    for op in graph.ops:
        if op.kind not in GRAPH_OP_KINDS:
            raise invalid(
                f"unknown op kind {short(op.kind)} in op {op.id} (not a oneDNN Graph op)"
            )
    if len(graph.ops) > MAX_OPS:
        raise skip(f"a pattern has at most {MAX_OPS} ops")
    copy = Graph([op.copy() for op in graph.ops])  # a copy the overrides can change
    ops = {op.id: op for op in copy.ops}
    convs = [op for op in copy.ops if op.kind in CONVT_KINDS]
    if [op.kind for op in convs] != ["ConvTranspose"]:
        raise skip(
            "the runner takes a single ConvTranspose op, or one ConvTranspose with the "
            "Dequantize, BiasAdd, post-op and Quantize ops the package fuses"
        )
    conv = convs[0]
    case.kind = conv.kind
    apply_op_attrs(ops, ov)
    check_attrs(conv)

    # (graph_json checked that a tensor has one producer and that there is no cycle)
    producer: dict[int, GraphOp] = {}
    consumers: dict[int, list[tuple[GraphOp, int]]] = {}
    for op in copy.ops:
        if len(op.outputs) != 1:
            raise invalid(f"op {op.id} ({op.kind}) expected 1 output, got {len(op.outputs)}")
        tid = op.outputs[0].id
        producer[tid] = op
        for i, t in enumerate(op.inputs):
            consumers.setdefault(t.id, []).append((op, i))
    used = {conv.id}

    def graph_input(t: LogicalTensor, role: str, dequantize_ok: bool) -> Input:
        p = producer.get(t.id)
        if p is None:
            return Input(t, role)
        if p.kind == "Dequantize" and dequantize_ok:
            if len(p.inputs) != 1:
                raise invalid(f"op {p.id} (Dequantize) expected 1 input, got {len(p.inputs)}")
            inner = producer.get(p.inputs[0].id)
            if inner is not None:
                raise skip(
                    f"the Dequantize (op {p.id}) of {role} takes the output of op {inner.id} ({inner.kind}); "
                    "a pattern dequantizes graph inputs only"
                )
            used.add(p.id)
            return Input(p.inputs[0], role, p)
        raise skip(
            f"{role} comes from op {p.id} ({p.kind}); in a pattern it is a graph input"
            + (" or a Dequantize of one" if dequantize_ok else "")
        )

    if not 2 <= len(conv.inputs) <= 3:
        raise invalid(
            f"ConvTranspose expected 2 or 3 inputs (src, weights, bias), got {len(conv.inputs)}"
        )
    src = graph_input(conv.inputs[0], "src", True)
    weights = graph_input(conv.inputs[1], "weights", True)
    bias = graph_input(conv.inputs[2], "bias", False) if len(conv.inputs) == 3 else None
    if (src.dequantize is None) != (weights.dequantize is None):
        which = "src" if src.dequantize is not None else "weights"
        raise skip(
            f"only {which} of the ConvTranspose is dequantized; an int8 pattern dequantizes both src and weights"
        )
    int8 = src.dequantize is not None

    # the chain after the ConvTranspose
    chain_kinds = ["ConvTranspose"]
    post_ops: list[PostOp] = []
    operands: list[Input] = []
    strict_shapes: list[bool] = []
    quantize: Optional[GraphOp] = None
    bias_add = False
    chain_tensors = [conv.outputs[0]]
    chain_ops = [conv]
    cur = conv.outputs[0]
    while True:
        users = consumers.get(cur.id, [])
        if not users:
            break
        if len(users) > 1:
            names = ", ".join(f"{op.id} ({op.kind})" for op, _ in users)
            raise skip(
                f"tensor {cur.id} feeds {len(users)} ops ({names}); a pattern is a single chain"
            )
        nxt, index = users[0]
        if nxt.id in used:  # a cycle (graph_json rejects them; never loop on one)
            raise invalid(
                f"op {nxt.id} ({nxt.kind}) comes twice in the chain: the graph has a cycle"
            )
        used.add(nxt.id)
        if quantize is not None:
            raise skip(f"op {nxt.id} ({nxt.kind}) follows the Quantize; Quantize ends a pattern")
        where = f"op {nxt.id} ({nxt.kind})"
        if nxt.kind == "BiasAdd":
            if post_ops or bias is not None:
                raise skip(
                    f"{where} comes after {'a post-op' if post_ops else 'the bias input'}; a BiasAdd directly follows a ConvTranspose without bias"
                )
            if len(nxt.inputs) != 2 or index != 0:
                raise skip(
                    f"{where} expected the ConvTranspose's output on input 0 and the bias on input 1"
                )
            df = nxt.attrs.get("data_format")
            conv_df = conv.attrs["data_format"].value if "data_format" in conv.attrs else "NXC"
            bias_df = df.value if df is not None else "NXC"
            if bias_df != conv_df:
                raise skip(
                    f"{where} has data_format {bias_df} and the ConvTranspose {conv_df}: the bias would run along another dim"
                )
            bias = graph_input(nxt.inputs[1], "bias", False)
            bias_add = True
        elif nxt.kind == "Quantize":
            if not int8:
                raise skip(
                    f"{where} follows a float ConvTranspose; Quantize ends int8 patterns only"
                )
            if len(nxt.inputs) != 1:
                raise invalid(f"{where} expected 1 input, got {len(nxt.inputs)}")
            quantize = nxt
        elif nxt.kind in POST_OPS:
            post_op, strict = read_post_op(nxt)
            if post_op.is_binary:
                if len(nxt.inputs) != 2:
                    raise invalid(f"{where} expected 2 inputs, got {len(nxt.inputs)}")
                if index == 1 and nxt.kind not in COMMUTATIVE:
                    raise skip(
                        f"{where} takes the chain on input 1: other {'-' if nxt.kind == 'Subtract' else '/'} chain, "
                        f"which the package's post-op (chain {'-' if nxt.kind == 'Subtract' else '/'} other) does not compute"
                    )
                role = f"post_ops[{len(post_ops)}]"
                operand = graph_input(nxt.inputs[1 - index], role, int8)
                if operand.dequantize is not None:
                    deq = quantization(operand.dequantize, Dequantize)
                    if deq.qtype != "per_tensor":
                        raise skip(
                            f"the Dequantize (op {operand.dequantize.id}) of {role} is {deq.qtype}; the package fuses per-tensor ones"
                        )
                    post_op = PostOp(
                        post_op.kind, dequantize=deq
                    )  # binary kinds have no attributes
                operands.append(operand)
                strict_shapes.append(strict)
            elif len(nxt.inputs) != 1:
                raise invalid(f"{where} expected 1 input, got {len(nxt.inputs)}")
            post_ops.append(post_op)
        else:
            raise skip(
                f"{where} follows the ConvTranspose; a pattern continues with BiasAdd, a post-op "
                f"({', '.join(POST_OPS)}) or Quantize"
            )
        chain_kinds.append(nxt.kind)
        cur = nxt.outputs[0]
        chain_tensors.append(cur)
        chain_ops.append(nxt)
    unused = [op for op in copy.ops if op.id not in used]
    if unused:
        names = ", ".join(f"{op.id} ({op.kind})" for op in unused)
        raise skip(f"op(s) {names} are not part of the ConvTranspose's chain")
    if len(post_ops) > MAX_CHAIN:
        raise skip(
            f"{len(post_ops)} post-ops; oneDNN 3.2 fuses at most {MAX_CHAIN} after a ConvTranspose"
        )

    # quantization
    src_dq = weights_dq = None
    dst_q = None
    if int8:
        assert src.dequantize is not None and weights.dequantize is not None
        src_dq = quantization(src.dequantize, Dequantize)
        weights_dq = quantization(weights.dequantize, Dequantize)
        if src_dq.qtype != "per_tensor":
            raise skip(
                f"the Dequantize of src (op {src.dequantize.id}) is per_channel; the library fuses per-tensor ones"
            )
        if any(weights_dq.zps):
            raise skip(
                f"the Dequantize of weights (op {weights.dequantize.id}) has zero points {list(weights_dq.zps)}; "
                "oneDNN 3.2 fuses weights without zero points only"
            )
    inputs = [src, weights] + ([bias] if bias is not None else []) + operands
    final = chain_tensors[-1]

    # shapes, memory orders and dtypes after the overrides
    by_id = {i.tensor.id: i for i in inputs}
    if len(by_id) != len(inputs):
        raise skip("one graph input feeds several ops of the pattern")
    shape = {i.tensor.id: list(i.tensor.shape) for i in inputs}
    order = {i.tensor.id: stride_order(i.tensor.stride, len(i.tensor.shape)) for i in inputs}
    apply_in_shapes(ov, list(by_id), shape, order)
    if ov.mb:
        batch = shape[src.tensor.id][0] if shape[src.tensor.id] else None
        for given in [src, *operands]:
            dims = shape[given.tensor.id]
            if dims and (
                given is src or (dims[0] == batch and len(dims) == len(shape[src.tensor.id]))
            ):
                dims[0] = ov.mb
    dtype = {
        t.id: (ov.dt if ov.dt and t.dtype == "f32" else t.dtype)
        for op in copy.ops
        for t in op.inputs + op.outputs
    }
    for tid, dt in ov.dt_ids:
        if tid not in dtype:
            raise invalid(f"--dt: no tensor with id {tid}")
        dtype[tid] = dt
    for given in inputs:
        if any(d < 0 for d in shape[given.tensor.id]):
            raise invalid(
                f"input {given.tensor.id} ({given.role}) has an unknown shape {shape[given.tensor.id]}; every input shape must be known"
            )
    check_dtypes(int8, inputs, chain_tensors, dtype, quantize)
    if quantize is not None:
        dst_q = quantization(quantize, Quantize, dtype=dtype[final.id])
    by_role = {"src": shape[src.tensor.id], "weights": shape[weights.tensor.id]}
    if bias is not None:
        by_role["bias"] = shape[bias.tensor.id]
    check_ranks(conv.kind, by_role)

    # the ConvTranspose's keywords and the output shape
    attrs = op_keywords(conv, len(shape[src.tensor.id]) - 2)
    try:
        out_shape: Optional[tuple[int, ...]] = expected_output_shape(
            conv.kind, attrs, [tuple(shape[src.tensor.id]), tuple(shape[weights.tensor.id])]
        )
    except (ValueError, IndexError, TypeError, ArithmeticError):  # e.g. a stride of 0
        out_shape = None  # the call reports why
    if out_shape is not None and min(out_shape, default=0) < 1:
        out_shape = None
    if out_shape is not None:
        for operand, strict in zip(operands, strict_shapes):
            got = tuple(shape[operand.tensor.id])
            if strict and got != out_shape:
                raise invalid(
                    f"{operand.role} has shape {list(got)} and auto_broadcast 'none', but the chain's shape is {list(out_shape)}"
                )
            full = (1,) * (len(out_shape) - len(got)) + got
            if len(got) > len(out_shape) or any(a not in (1, b) for a, b in zip(full, out_shape)):
                raise invalid(
                    f"{operand.role} has shape {list(got)}, which does not broadcast to the chain's shape {list(out_shape)} "
                    "(a post-op's tensor must not change dst's shape)"
                )
        for t, maker in zip(chain_tensors if not ov.reshapes else [], chain_ops):
            if shape_differs(t.shape, out_shape):
                what = (
                    f"output {t.id}"
                    if t is final
                    else f"tensor {t.id} (the output of op {maker.id}, {maker.kind})"
                )
                raise invalid(
                    f"{what} has shape {list(t.shape)} in the JSON; the inputs and attributes give {list(out_shape)}"
                )
    if not ov.reshapes:
        for given in inputs:
            deq = given.dequantize
            if deq is not None and shape_differs(deq.outputs[0].shape, deq.inputs[0].shape):
                raise invalid(
                    f"the Dequantize (op {deq.id}) of {given.role} has input shape {deq.inputs[0].shape} "
                    f"and output shape {deq.outputs[0].shape} in the JSON; Dequantize keeps the shape"
                )
    out_order: tuple[int, ...] = ()
    if out_shape is not None:
        out_order = (
            stride_order(final.stride, len(final.shape))
            if len(final.shape) == len(out_shape)
            else ()
        )
        out_order = out_order or tuple(range(len(out_shape)))

    lead = [d.dequantize.kind for d in (src, weights) if d.dequantize is not None]
    case.attrs = attrs
    case.inputs = [
        TensorSpec(
            i.tensor.id, i.role, tuple(shape[i.tensor.id]), dtype[i.tensor.id], order[i.tensor.id]
        )
        for i in inputs
    ]
    case.output = TensorSpec(final.id, "dst", out_shape, dtype[final.id], out_order)
    case.pattern = Pattern(
        chain=tuple(lead + chain_kinds),
        post_ops=tuple(post_ops),
        src_dequantize=src_dq,
        weights_dequantize=weights_dq,
        dst_quantize=dst_q,
        bias_add=bias_add,
    )

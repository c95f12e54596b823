"""The ops of a pattern graph read one by one: the overrides applied to them, a Dequantize or
Quantize and a post-op from their attributes, the dtypes of the fused call checked. For
:mod:`.patterns`, which assembles them into one fused ConvTranspose call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..post_ops import INT8_DTYPES, POST_OPS, Dequantize, PostOp
from .graph import Attr, GraphOp, LogicalTensor
from .graph_json import short
from .model import FLOAT_CODES, INVALID, SKIPPED, CaseError, Overrides
from .op_case import checked_value

#: Binary kinds whose inputs can be swapped (the chain may come on input 1).
COMMUTATIVE = ("Add", "Multiply", "Maximum", "Minimum")
#: Attributes of the Dequantize/Quantize ops, as the JSON types them.
QUANT_ATTRS = {"scales": "f32[]", "zps": "s64[]", "qtype": "string", "axis": "s64"}
#: The library's defaults for the optional quantization attributes.
QUANT_DEFAULTS: dict[str, Any] = {"qtype": "per_tensor", "axis": 1}
INT8_CODES = tuple(INT8_DTYPES)



@dataclass
class Input:
    """A graph input of the pattern: the tensor, its role, and its producer's Dequantize."""

    tensor: LogicalTensor
    role: str
    dequantize: Optional[GraphOp] = None



def skip(reason: str) -> CaseError:
    return CaseError(SKIPPED, reason)


def invalid(reason: str) -> CaseError:
    return CaseError(INVALID, reason)


def apply_op_attrs(ops: dict[int, GraphOp], ov: Overrides) -> None:
    for op_id, pairs in ov.op_attrs:
        op = ops.get(op_id)
        if op is None:
            raise invalid(
                f"--op-attrs: no op with id {op_id} in the graph (op ids: {', '.join(map(str, ops))})"
            )
        for name, text in pairs:
            if name not in op.attrs:
                raise invalid(
                    f"--op-attrs: no attribute {short(name)} in op {op.id} ({op.kind}); an override must name an attribute the JSON op has"
                )
            op.attrs[name] = Attr(op.attrs[name].type, checked_value(op.attrs[name], text, name))


def quantization(op: GraphOp, cls: type[Dequantize], **extra: Any) -> Any:
    """The Dequantize/Quantize object of a graph op (INVALID if its attributes are not)."""
    values: dict[str, Any] = dict(QUANT_DEFAULTS)
    for name, attr in op.attrs.items():
        want = QUANT_ATTRS.get(name)
        if want is None:
            raise invalid(f"op {op.id} ({op.kind}): unknown attribute {short(name)}")
        if attr.type != want:
            raise invalid(
                f"op {op.id} ({op.kind}): attribute {short(name)} expected type {want}, got {attr.type}"
            )
        values[name] = attr.value
    if "scales" not in values:
        raise invalid(f"op {op.id} ({op.kind}): missing required attribute 'scales'")
    try:
        return cls(**values, **extra)
    except (ValueError, TypeError) as e:
        raise invalid(f"op {op.id}: {e}") from None


def post_op(op: GraphOp) -> tuple[PostOp, bool]:
    """(the PostOp of a graph op, whether its auto_broadcast is 'none')."""
    spec = POST_OPS[op.kind]
    attrs: dict[str, Any] = {}
    strict_shapes = False
    for name, attr in op.attrs.items():
        if spec.is_binary and name == "auto_broadcast":
            if attr.type != "string" or attr.value not in ("numpy", "none"):
                raise invalid(
                    f"op {op.id} ({op.kind}): auto_broadcast expected 'numpy' or 'none', got {short(attr.value)}"
                )
            strict_shapes = attr.value == "none"
            continue
        if attr.type != "f32":
            raise invalid(
                f"op {op.id} ({op.kind}): attribute {short(name)} expected type f32, got {attr.type}"
            )
        attrs[name] = float(attr.value)
    try:
        return PostOp(op.kind, **attrs), strict_shapes
    except (ValueError, TypeError) as e:
        raise invalid(f"op {op.id}: {e}") from None



def check_dtypes(
    int8: bool,
    inputs: list[Input],
    chain: list[LogicalTensor],
    dtype: dict[int, str],
    quantize: Optional[GraphOp],
) -> None:
    """INVALID (or SKIPPED) unless the tensors' dtypes fit the pattern (spec 6)."""
    final = chain[-1]
    if not int8:
        tensors = [(i.role, i.tensor.id) for i in inputs] + [
            (f"tensor {t.id}", t.id) for t in chain
        ]
        codes = {dtype[tid] for _, tid in tensors}
        for role, tid in tensors:
            if dtype[tid] not in FLOAT_CODES:
                raise invalid(
                    f"{role} has dtype {dtype[tid]}; a float pattern takes f32, bf16 or f16"
                )
        if len(codes) > 1:
            got = ", ".join(f"{r}={dtype[t]}" for r, t in tensors)
            raise invalid(f"every tensor of a float pattern must have one dtype, got {got}")
        return
    for i in inputs:
        dt = dtype[i.tensor.id]
        if i.dequantize is not None:
            deq_out = i.dequantize.outputs[0].id
            if dt not in INT8_CODES:
                raise invalid(
                    f"{i.role} is dequantized and has dtype {dt}; Dequantize takes u8 or s8"
                )
            if dtype[deq_out] not in FLOAT_CODES:
                raise invalid(
                    f"the Dequantize (op {i.dequantize.id}) of {i.role} gives {dtype[deq_out]}; Dequantize gives f32"
                )
            if dtype[deq_out] != "f32":
                raise skip(
                    f"the Dequantize of {i.role} gives {dtype[deq_out]}; the package's int8 ops compute in f32"
                )
        elif dt != "f32":
            raise invalid(
                f"{i.role} has dtype {dt}; in an int8 pattern it is f32 (or u8/s8 through a Dequantize)"
            )
    inner = chain[:-1] if quantize is not None else chain
    for t in inner:
        if dtype[t.id] not in FLOAT_CODES:
            raise invalid(
                f"tensor {t.id} of the chain is {dtype[t.id]}; the ConvTranspose and its post-ops give f32, bf16 or f16"
            )
        if dtype[t.id] != "f32":
            raise skip(
                f"tensor {t.id} of the chain is {dtype[t.id]}; the package's int8 ops compute in f32"
            )
    if quantize is not None and dtype[final.id] not in INT8_CODES:
        raise invalid(
            f"the Quantize output {final.id} has dtype {dtype[final.id]}; Quantize gives u8 or s8"
        )

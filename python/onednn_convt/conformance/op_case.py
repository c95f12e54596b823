"""One op's case: its attributes, shapes and tensors checked, and its output shape
recomputed after the overrides with :mod:`onednn_convt.shapes` (spec 4, D8).

Ranks are checked before anything reads dims by rank (:func:`check_ranks`). The helpers here
serve :mod:`.patterns` too, which checks the ConvTranspose at the head of a fused graph the
same way.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from .. import schema, shapes
from .graph import CONVT_KINDS, GRAPH_OP_KINDS, LIBRARY_ATTRS, REQUIRED_ATTRS, Attr, Graph, GraphOp
from .graph_json import F32_MAX, MAX_NDIMS, S64_MAX, S64_MIN, short
from .model import (ACTIVATIONS, FLOAT_CODES, INPUT_ROLES, INVALID, OUTPUT_ROLE, SKIPPED, Case, CaseError, Overrides,
                    TensorSpec)

_STRING_VALUES = {
    "auto_pad": ("None", "SAME_UPPER", "SAME_LOWER", "VALID"),
    "data_format": schema.DATA_FORMATS,
    "weights_format": schema.WEIGHTS_FORMATS,
}


# -- shapes ----------------------------------------------------------------------------------


def expected_output_shape(
    kind: str, attrs: dict[str, Any], input_shapes: Sequence[Sequence[int]]
) -> tuple[int, ...]:
    """The output shape of a call, from :mod:`onednn_convt.shapes` (spec 4, D8).

    Args:
        kind: op kind.
        attrs: the op's keyword attributes (ints or per-dim lists, any auto_pad spelling);
            BackwardWeights needs ``weights_shape``.
        input_shapes: shapes of the inputs in index order.

    Raises:
        ValueError: attributes whose lengths do not match the spatial rank, or an unknown
            auto_pad value.
    """
    if kind == "ConvTransposeBackwardWeights":
        return tuple(int(v) for v in attrs["weights_shape"])

    def given(name: str) -> Any:
        """The attribute's value, or the schema's default where the case leaves it out (or
        empty)."""
        return attrs.get(name) or schema.default(kind, name)

    df, wf = given("data_format"), given("weights_format")
    n, _, xs = shapes.split_activation(input_shapes[0], df)
    i, o, kernel = shapes.split_weights(input_shapes[1], wf)
    if len(kernel) != len(xs):
        msg = f"{kind}: weights rank {len(input_shapes[1])} expected equal to the activations' {len(input_shapes[0])}"
        raise ValueError(msg)
    spatial = len(xs)

    def dims(name: str) -> tuple[int, ...]:
        value = attrs.get(name)
        return schema.per_dim(kind, name, schema.default(kind, name) if value is None else value, spatial)

    s, d = dims("strides"), dims("dilations")
    auto_pad = schema.AUTO_PAD.get(str(given("auto_pad")).lower())
    if auto_pad is None:
        msg = f"{kind}: unknown auto_pad {short(attrs.get('auto_pad'))}"
        raise ValueError(msg)
    pb, pe = shapes.resolve_pads(kernel, s, d, auto_pad, dims("pads_begin"), dims("pads_end"))
    if kind == "ConvTranspose":
        ys = shapes.conv_transpose_output(xs, kernel, s, d, pb, pe, dims("output_padding"))
        return shapes.join_activation(n, o * int(given("groups")), ys, df)
    ys = shapes.backward_data_output(xs, kernel, s, d, pb, pe)
    return shapes.join_activation(n, i, ys, df)


def tag_order(tag: str, rank: int) -> tuple[int, ...]:
    """Memory order of a benchdnn tag (``abcd`` plain, ``acdb`` channels-last).

    Raises:
        ValueError: not a permutation of the first ``rank`` letters.
    """
    order = tuple(ord(c) - ord("a") for c in tag)
    if sorted(order) != list(range(rank)):
        msg = f"memory tag {short(tag)} expected a permutation of {''.join(chr(97 + i) for i in range(rank))}"
        raise ValueError(msg)
    return order


def apply_in_shapes(
    ov: Overrides,
    inputs: Sequence[int],
    shape: dict[int, list[int]],
    order: dict[int, tuple[int, ...]],
) -> None:
    """Apply ``--in-shapes`` to the graph inputs (tensor ids ``inputs``): their ``shape`` and
    memory ``order`` (a tag sets it; a new rank without one makes it dense), in place.

    Raises:
        CaseError: INVALID for a tensor that is not a graph input or a tag that does not fit.
    """
    for tid, new_shape, tag in ov.in_shapes:
        if tid not in inputs:
            raise CaseError(
                INVALID,
                f"--in-shapes: tensor {tid} is not a graph input (inputs: {', '.join(map(str, inputs))})",
            )
        old_rank = len(shape[tid])
        if new_shape is not None and len(new_shape) > MAX_NDIMS:
            raise CaseError(
                INVALID,
                f"--in-shapes: tensor {tid} gets {len(new_shape)} dims; a tensor has at most {MAX_NDIMS} (DNNL_MAX_NDIMS)",
            )
        if new_shape is not None:
            shape[tid] = list(new_shape)
        rank = len(shape[tid])
        try:
            order[tid] = (
                tag_order(tag, rank)
                if tag
                else (order[tid] if rank == old_rank else tuple(range(rank)))
            )
        except ValueError as e:
            raise CaseError(INVALID, f"--in-shapes: tensor {tid}: {e}") from None


def shape_differs(declared: Sequence[int], expected: Sequence[int]) -> bool:
    """Whether a tensor's shape in the JSON contradicts the shape an op gives it: another
    rank, or a known dim (>= 0) of another size. Unknown dims, and ``[]`` (rank unknown) on
    a tensor an op computes, are left to the library to infer."""
    if not declared:
        return False
    return len(declared) != len(expected) or any(
        d >= 0 and d != e for d, e in zip(declared, expected)
    )


def check_ranks(kind: str, by_role: Mapping[str, Sequence[int]]) -> None:
    """Raise CaseError INVALID unless the inputs have the ranks the op takes: the activation
    input (src, or diff_dst of BackwardData) rank 3, 4 or 5 (1 to 3 spatial dims), weights
    and the other activation its rank, a bias and weights_shape rank 1. (The op's own rule;
    checked here because the fill and the memory estimate read the dims by these ranks.)"""
    lead = "diff_dst" if kind == "ConvTransposeBackwardData" else "src"
    rank = len(by_role[lead])
    if not 3 <= rank <= 5:
        raise CaseError(
            INVALID,
            f"{lead} has shape {list(by_role[lead])} (rank {rank}); {kind} takes rank 3, 4 or 5 "
            "(1 to 3 spatial dims)",
        )
    for role, dims in by_role.items():
        want = 1 if role in ("bias", "weights_shape") else rank
        if role in ("src", "diff_dst", "weights", "bias", "weights_shape") and len(dims) != want:
            raise CaseError(
                INVALID,
                f"{role} has shape {list(dims)} (rank {len(dims)}); {kind} takes {role} of rank {want}"
                + (f" like {lead}" if want == rank else ""),
            )


def stride_order(stride: Sequence[int], rank: int) -> tuple[int, ...]:
    """Memory order implied by element strides (outermost first); plain if unknown."""
    if len(stride) != rank or any(s <= 0 for s in stride):
        return tuple(range(rank))
    return tuple(sorted(range(rank), key=lambda i: (-stride[i], i)))


# -- building a case -----------------------------------------------------------------------


def _parse_value(attr: Attr, text: str, name: str) -> Any:
    t = attr.type
    try:
        if t == "s64[]":
            return [int(v) for v in text.split("x")]
        if t == "f32[]":
            return [float(v) for v in text.split("x")]
        if t == "s64":
            return int(text)
        if t == "f32":
            return float(text)
        if t == "bool":
            low = text.lower()
            if low not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return low in ("true", "1")
    except ValueError:
        raise CaseError(
            INVALID, f"--op-attrs: value {short(text)} of '{name}' does not parse as {t}"
        ) from None
    return text


def checked_value(attr: Attr, text: str, name: str) -> Any:
    """:func:`_parse_value`, INVALID unless the value is in the format's range (s64
    integers, finite f32 numbers), as a JSON value would have to be."""
    value = _parse_value(attr, text, name)
    items = value if isinstance(value, list) else [value]
    if attr.type.startswith("s64") and not all(S64_MIN <= v <= S64_MAX for v in items):
        raise CaseError(
            INVALID, f"--op-attrs: value {short(text)} of '{name}' is out of the s64 range"
        )
    if attr.type.startswith("f32") and not all(abs(v) <= F32_MAX for v in items):  # NaN too
        raise CaseError(INVALID, f"--op-attrs: value {short(text)} of '{name}' is not a finite f32")
    return value


def op_keywords(op: GraphOp, spatial: int) -> dict[str, Any]:
    """A graph op's attributes as the package op's keywords: ``groups`` as an int, per-dim
    lists checked against ``spatial`` dims (:func:`_per_dim_value`)."""
    attrs: dict[str, Any] = {}
    for name, attr in op.attrs.items():
        value = attr.value
        if name == "groups" and isinstance(value, list):
            value = value[0]
        elif attr.type == "s64[]":
            value = _per_dim_value(op.kind, name, value, spatial)
        attrs[name] = value
    return attrs


def _per_dim_value(kind: str, name: str, value: list[int], spatial: int) -> Any:
    """A JSON list attribute as the op's keyword value.

    The library writes unset lists as 12 zeros (DNNL_MAX_NDIMS) and reads only the first
    ``spatial`` entries; longer lists are accepted when the rest are zeros.
    """
    if name == "weights_shape":
        return None if not any(value) else tuple(value)
    if len(value) > spatial >= 1 and not any(value[spatial:]):
        value = value[:spatial]
    return tuple(value)


def check_attrs(op: GraphOp) -> None:
    schema_types = LIBRARY_ATTRS[op.kind]
    for name, attr in op.attrs.items():
        if name not in schema_types:
            where = (
                "ConvTranspose only"
                if name == "output_padding"
                else (
                    "ConvTransposeBackwardWeights only"
                    if name == "weights_shape"
                    else "no ConvTranspose op"
                )
            )
            raise CaseError(
                INVALID,
                f"attribute {short(name)} is not defined for {op.kind} ({where}); the library rejects it at add_op",
            )
        want = schema_types[name]
        if isinstance(attr.value, list) and len(attr.value) > MAX_NDIMS:
            raise CaseError(
                INVALID,
                f"attribute {short(name)} has {len(attr.value)} values; the library holds at most {MAX_NDIMS} (DNNL_MAX_NDIMS)",
            )
        # The library stores a value by attribute name: a one-element s64[] groups works (spec 2).
        if attr.type != want and not (
            name == "groups" and attr.type == "s64[]" and len(attr.value) == 1
        ):
            raise CaseError(
                INVALID, f"attribute {short(name)} expected type {want}, got {attr.type}"
            )
        allowed = _STRING_VALUES.get(name)
        if allowed and attr.value not in allowed:
            hint = ""
            if name == "weights_format" and attr.value in schema.CONVOLUTION_WEIGHTS_FORMATS:
                hint = " (a Convolution format some oneDNN pages list by mistake)"
            raise CaseError(
                INVALID,
                f"attribute {short(name)} is {short(attr.value)}{hint}; the library accepts exactly {', '.join(allowed)}",
            )
    missing = [n for n in REQUIRED_ATTRS if n not in op.attrs]
    if missing:
        raise CaseError(
            INVALID,
            f"missing required attribute(s) {', '.join(missing)} (the library schema requires strides, pads_begin, pads_end, dilations)",
        )


def _apply_op_attrs(op: GraphOp, ov: Overrides) -> None:
    for op_id, pairs in ov.op_attrs:
        if op_id != op.id:
            raise CaseError(
                INVALID, f"--op-attrs: no op with id {op_id} in the graph (its op has id {op.id})"
            )
        for name, text in pairs:
            if name not in op.attrs:
                raise CaseError(
                    INVALID,
                    f"--op-attrs: no attribute {short(name)} in op {op.id} ({op.kind}); an override must name an attribute the JSON op has",
                )
            op.attrs[name] = Attr(op.attrs[name].type, checked_value(op.attrs[name], text, name))


def fill_single(case: Case, graph: Graph, ov: Overrides) -> None:
    """Check the one op of ``graph`` after the overrides and describe its call in ``case``.

    Raises:
        CaseError: INVALID or SKIPPED, with the reason.
    """
    op = graph.ops[0].copy()  # a copy the overrides can change
    if op.kind not in CONVT_KINDS:
        if op.kind in GRAPH_OP_KINDS:
            raise CaseError(SKIPPED, f"op kind {op.kind} is not one of {', '.join(CONVT_KINDS)}")
        raise CaseError(INVALID, f"unknown op kind {short(op.kind)} (not a oneDNN Graph op)")
    case.kind = op.kind
    _apply_op_attrs(op, ov)
    check_attrs(op)
    roles = INPUT_ROLES[op.kind]
    if not 2 <= len(op.inputs) <= len(roles):
        want = "2" if len(roles) == 2 else f"2 or {len(roles)}"
        raise CaseError(
            INVALID, f"{op.kind} expected {want} inputs ({', '.join(roles)}), got {len(op.inputs)}"
        )
    if len(op.outputs) != 1:
        raise CaseError(INVALID, f"{op.kind} expected 1 output, got {len(op.outputs)}")

    ids = [t.id for t in op.inputs]
    if len(set(ids)) < len(ids):
        twice = next(t for t in ids if ids.count(t) > 1)
        which = ", ".join(f"{roles[i]}" for i, t in enumerate(ids) if t == twice)
        raise CaseError(
            SKIPPED,
            f"tensor {twice} is {which} of the {op.kind}; the runner fills each input as its own tensor",
        )

    # tensors: shape, memory order, dtype after the overrides
    tensors = {t.id: t for t in op.inputs}
    shape = {t.id: list(t.shape) for t in op.inputs + op.outputs}
    order = {t.id: stride_order(t.stride, len(t.shape)) for t in op.inputs + op.outputs}
    dtype = {t.id: t.dtype for t in op.inputs + op.outputs}
    apply_in_shapes(ov, list(tensors), shape, order)
    role_of = {t.id: roles[i] for i, t in enumerate(op.inputs)}
    if ov.mb:
        for tid, role in role_of.items():
            if role in ACTIVATIONS and shape[tid]:
                shape[tid][0] = ov.mb
    for tid in dtype:
        if ov.dt and dtype[tid] == "f32":
            dtype[tid] = ov.dt
    for tid, dt in ov.dt_ids:
        if tid not in dtype:
            raise CaseError(INVALID, f"--dt: no tensor with id {tid}")
        dtype[tid] = dt

    # dtypes (spec 6)
    floats = {}
    for tid, role in role_of.items():
        if role == "weights_shape":
            if dtype[tid] != "s32":
                raise CaseError(
                    INVALID, f"input 2 (weights_shape) expected dtype s32, got {dtype[tid]}"
                )
            continue
        floats[role] = dtype[tid]
    out_t = op.outputs[0]
    floats[OUTPUT_ROLE[op.kind]] = dtype[out_t.id]
    for role, dt in floats.items():
        if dt not in FLOAT_CODES:
            raise CaseError(INVALID, f"{role} has dtype {dt}; {op.kind} takes f32, bf16 or f16")
    if len(set(floats.values())) > 1:
        got = ", ".join(f"{r}={d}" for r, d in floats.items())
        raise CaseError(INVALID, f"every float tensor of {op.kind} must have one dtype, got {got}")
    for tid, role in role_of.items():
        if any(d < 0 for d in shape[tid]):
            raise CaseError(
                INVALID,
                f"input {tid} ({role}) has an unknown shape {shape[tid]}; every input shape must be known",
            )

    check_ranks(op.kind, {role: shape[tid] for tid, role in role_of.items()})

    # attributes as the op's keywords
    attrs = op_keywords(op, len(shape[op.inputs[0].id]) - 2)
    ws_values: Optional[tuple[int, ...]] = None
    input_shapes = [tuple(shape[t.id]) for t in op.inputs]
    if op.kind == "ConvTransposeBackwardWeights":
        ws = attrs.get("weights_shape")
        if ws is None and out_t.known_shape and not ov.reshapes:
            ws = tuple(out_t.shape)  # the library takes a known output shape instead (spec 4.3)
        if ws is None:
            raise CaseError(
                INVALID,
                "weights_shape is neither set (the attribute is all zeros) nor given by a known output shape",
            )
        attrs["weights_shape"] = ws
        if len(op.inputs) == 3:
            ws_values = tuple(ws)
            if tuple(input_shapes[2]) != (len(ws),):
                raise CaseError(
                    INVALID,
                    f"input 2 (weights_shape) expected shape [{len(ws)}], got {list(input_shapes[2])}",
                )
    try:
        out_shape: Optional[tuple[int, ...]] = expected_output_shape(op.kind, attrs, input_shapes)
    except (ValueError, IndexError, TypeError, ArithmeticError):  # e.g. a stride of 0
        out_shape = None  # the call reports why
    if out_shape is not None and min(out_shape, default=0) < 1:
        out_shape = None  # likewise
    if out_shape is not None and not ov.reshapes and shape_differs(out_t.shape, out_shape):
        raise CaseError(
            INVALID,
            f"output {out_t.id} has shape {list(out_t.shape)} in the JSON; the inputs and attributes give {list(out_shape)}",
        )
    out_order = (
        order[out_t.id] if out_shape is not None and len(out_shape) == len(out_t.shape) else ()
    )
    if out_shape is not None and not out_order:
        out_order = tuple(range(len(out_shape)))
    case.attrs = attrs
    case.inputs = [
        TensorSpec(
            t.id,
            roles[i],
            tuple(shape[t.id]),
            dtype[t.id],
            order[t.id],
            ws_values if roles[i] == "weights_shape" else None,
        )
        for i, t in enumerate(op.inputs)
    ]
    case.output = TensorSpec(out_t.id, OUTPUT_ROLE[op.kind], out_shape, dtype[out_t.id], out_order)



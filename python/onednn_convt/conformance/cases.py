"""Cases: a graph JSON plus benchdnn-style overrides, checked and ready to run.

A :class:`Case` says which op runs (kind and keyword attributes of the public op class), the
inputs (id, role, shape, dtype, memory order) and the expected output shape, recomputed
after the overrides with :mod:`onednn_convt.shapes`. A case that cannot run carries a status
instead: ``INVALID`` (the file or the overrides are malformed or violate the library's
schema: the reason says which) or ``SKIPPED`` (a valid graph this runner does not cover:
an op that is not one of the three ConvTranspose ops, or several ops that are not a pattern).

A graph of several ops is a *pattern* case when it is a ConvTranspose with the ops the
package fuses around it (Dequantize, BiasAdd, post-ops, Quantize:
:mod:`onednn_convt.conformance.patterns`); the case then carries a :class:`~.patterns.Pattern`
and runs as one fused ``ConvTranspose`` call.

:func:`collect` turns paths (JSON files, harness files, directories) into cases. It never
stops at a bad file: a file that cannot be read or is malformed is an INVALID case naming
it (:mod:`.graph_json` and :mod:`.harness` say what is refused), the rest are collected; a
file whose check raises what it should not is an ``ERROR`` case (a bug of this package).
The work is bounded (:class:`Budget`): at most :data:`MAX_CASES` cases and
:data:`MAX_HARNESS_FILES` harness files per collect, and :data:`MAX_WORK` characters of case
lines plus graph entries checked; past a bound, reading stops with an INVALID case that
says where. Each case is checked with work proportional to its graph's size (a graph of
more ops than a pattern has is SKIPPED before anything else), and ranks are checked before
anything reads dims by rank (:func:`check_ranks`).
"""

from __future__ import annotations

import os
import shlex
import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

from .. import schema, shapes
from . import graph_json
from .graph_json import (
    CONVT_KINDS,
    F32_MAX,
    GRAPH_OP_KINDS,
    LIBRARY_ATTRS,
    MAX_NDIMS,
    REQUIRED_ATTRS,
    S64_MAX,
    S64_MIN,
    Attr,
    FileTooLarge,
    Graph,
    GraphJSONError,
    short,
)

if TYPE_CHECKING:
    from .patterns import Pattern

INVALID = "INVALID"
SKIPPED = "SKIPPED"
#: A case whose check raised what it should not (a bug of this package; the runner's outcome)
ERROR = "ERROR"

#: Input roles of each op, in index order, and the output's.
INPUT_ROLES = {
    "ConvTranspose": ("src", "weights", "bias"),
    "ConvTransposeBackwardData": ("diff_dst", "weights"),
    "ConvTransposeBackwardWeights": ("src", "diff_dst", "weights_shape"),
}
OUTPUT_ROLE = {
    "ConvTranspose": "dst",
    "ConvTransposeBackwardData": "diff_src",
    "ConvTransposeBackwardWeights": "diff_weights",
}
#: Roles of activation tensors (their dim 0 is the batch that --mb rewrites).
ACTIVATIONS = ("src", "diff_dst")
FLOAT_CODES = ("f32", "bf16", "f16")
_STRING_VALUES = {
    "auto_pad": ("None", "SAME_UPPER", "SAME_LOWER", "VALID"),
    "data_format": schema.DATA_FORMATS,
    "weights_format": schema.WEIGHTS_FORMATS,
}


class CaseError(Exception):
    """A case that cannot run: ``status`` is INVALID or SKIPPED, ``reason`` says why."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Overrides:
    """The benchdnn settings of one case (one element of each sweep).

    Attributes:
        in_shapes: (tensor id, shape or None, memory tag or None) per ``--in-shapes`` entry.
        op_attrs: (op id, ((name, value text), ...)) per ``--op-attrs`` op.
        dt: ``--dt`` for every f32 tensor, or None.
        dt_ids: (tensor id, dtype) per ``--dt=ID:DT`` entry.
        mb: ``--mb`` (0 = keep).
        texts: the option texts as written, for the case's line (``--dt=...``, ...).
    """

    in_shapes: tuple[tuple[int, Optional[tuple[int, ...]], Optional[str]], ...] = ()
    op_attrs: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    dt: Optional[str] = None
    dt_ids: tuple[tuple[int, str], ...] = ()
    mb: int = 0
    texts: tuple[str, ...] = ()

    @property
    def reshapes(self) -> bool:
        """Whether the output shape is to be recomputed (shapes or attributes overridden)."""
        return bool(self.in_shapes or self.op_attrs or self.mb)


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of a case.

    Attributes:
        id: logical tensor id in the JSON.
        role: ``src``, ``weights``, ``bias``, ``diff_dst``, ``weights_shape``, the output's,
            or in a pattern case ``post_ops[i]`` (the second tensor of binary post-op i).
        shape: logical shape (the op's layout, e.g. NCX); None for an output that cannot be
            computed (the call then reports why).
        dtype: ``f32``, ``bf16``, ``f16`` (``s32`` for weights_shape; ``u8``/``s8`` for the
            quantized tensors of an int8 pattern).
        order: memory order of the dims, outermost first (``(0, 2, 3, 1)`` = tag ``acdb``).
        values: the values of a ``weights_shape`` input (the format holds no data).
    """

    id: int
    role: str
    shape: Optional[tuple[int, ...]]
    dtype: str
    order: tuple[int, ...] = ()
    values: Optional[tuple[int, ...]] = None


@dataclass
class Case:
    """One problem: an op call, or the reason it cannot run.

    Attributes:
        id: the benchdnn-style line that defines it (``--reset ... --case=PATH``).
        location: where it came from (``harness_f32:12``, a JSON path).
        root: directory the ``--case`` path is relative to (for the repro command).
        path: the resolved JSON file ('' when not found).
        kind: op kind (None when the file could not be read).
        attrs: keyword attributes of the public op class.
        inputs: input tensors in index order; ``output``: the output tensor. A pattern
            case: src, weights, bias (when there is one), then the binary post-ops' tensors
            in chain order; the output is the chain's last tensor.
        status: None if runnable, else INVALID or SKIPPED; ``reason`` says why.
        pattern: for a graph of several ops, what it adds to the ConvTranspose.
    """

    id: str
    location: str
    root: str = "."
    path: str = ""
    kind: Optional[str] = None
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[TensorSpec] = field(default_factory=list)
    output: Optional[TensorSpec] = None
    status: Optional[str] = None
    reason: str = ""
    pattern: Optional[Pattern] = None

    @property
    def label(self) -> Optional[str]:
        """The op kind, or a pattern's op kinds joined by '+'."""
        return self.pattern.label if self.pattern is not None else self.kind

    @property
    def dtype(self) -> Optional[str]:
        """The dtype of the call's output (None when unknown): f32, bf16, f16, or the u8/s8
        of an int8 pattern's Quantize."""
        if self.output is not None:
            return self.output.dtype
        floats = [t.dtype for t in self.inputs if t.role != "weights_shape"]
        return floats[0] if floats else None

    def repro(self) -> str:
        """A shell command that runs this case alone."""
        return (
            f"onednn-convt conformance --cases-root {shlex.quote(os.path.abspath(self.root))} "
            f"--line={shlex.quote(self.id)}"
        )


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
    df = attrs.get("data_format") or "NXC"
    wf = attrs.get("weights_format") or "XOI"
    n, _, xs = shapes.split_activation(input_shapes[0], df)
    i, o, kernel = shapes.split_weights(input_shapes[1], wf)
    if len(kernel) != len(xs):
        msg = f"{kind}: weights rank {len(input_shapes[1])} expected equal to the activations' {len(input_shapes[0])}"
        raise ValueError(msg)
    spatial = len(xs)

    def dims(name: str, default: int) -> tuple[int, ...]:
        value = attrs.get(name)
        return schema.per_dim(kind, name, default if value is None else value, spatial)

    s, d = dims("strides", 1), dims("dilations", 1)
    auto_pad = schema.AUTO_PAD.get(str(attrs.get("auto_pad") or "None").lower())
    if auto_pad is None:
        msg = f"{kind}: unknown auto_pad {short(attrs.get('auto_pad'))}"
        raise ValueError(msg)
    pb, pe = shapes.resolve_pads(kernel, s, d, auto_pad, dims("pads_begin", 0), dims("pads_end", 0))
    if kind == "ConvTranspose":
        ys = shapes.conv_transpose_output(xs, kernel, s, d, pb, pe, dims("output_padding", 0))
        return shapes.join_activation(n, o * int(attrs.get("groups") or 1), ys, df)
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


def _checked_value(attr: Attr, text: str, name: str) -> Any:
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


def op_keywords(op: graph_json.GraphOp, spatial: int) -> dict[str, Any]:
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


def _check_attrs(op: graph_json.GraphOp) -> None:
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


def _apply_op_attrs(op: graph_json.GraphOp, ov: Overrides) -> None:
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
            op.attrs[name] = Attr(op.attrs[name].type, _checked_value(op.attrs[name], text, name))


def build_case(
    graph: Union[Graph, GraphJSONError],
    ov: Overrides,
    *,
    id: str,
    location: str,
    root: str,
    path: str,
) -> Case:
    """Apply the overrides to a graph and check the result.

    Args:
        graph: the parsed JSON, or the error that reading it raised.
        ov: the case's settings.
        id, location, root, path: see :class:`Case`.

    Returns:
        A runnable case, or one whose status is INVALID or SKIPPED with the reason.
    """
    case = Case(id=id, location=location, root=root, path=path)
    try:
        if isinstance(graph, FileTooLarge):
            raise CaseError(SKIPPED, str(graph))
        if isinstance(graph, GraphJSONError):
            raise CaseError(INVALID, str(graph))
        _fill(case, graph, ov)
    except CaseError as e:
        case.status, case.reason = e.status, e.reason
    except Exception as e:  # noqa: BLE001 - a bug here: this case is an ERROR, the others run
        case.status = ERROR
        case.reason = f"checking the case: {type(e).__name__}: {short(str(e))}\n{traceback.format_exc(limit=-3)}"
    return case


def _fill(case: Case, graph: Graph, ov: Overrides) -> None:
    if not graph.ops:
        raise CaseError(
            INVALID, "the graph has 0 ops (none); the runner takes a single ConvTranspose op"
        )
    if len(graph.ops) > 1:
        from . import patterns

        patterns.build(case, graph, ov)
        return
    op = graph.ops[0].copy()  # a copy the overrides can change
    if op.kind not in CONVT_KINDS:
        if op.kind in GRAPH_OP_KINDS:
            raise CaseError(SKIPPED, f"op kind {op.kind} is not one of {', '.join(CONVT_KINDS)}")
        raise CaseError(INVALID, f"unknown op kind {short(op.kind)} (not a oneDNN Graph op)")
    case.kind = op.kind
    _apply_op_attrs(op, ov)
    _check_attrs(op)
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


# -- collecting ----------------------------------------------------------------------------


def bundled_suite() -> str:
    """Directory of the suite shipped in the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")


def bundled_paths() -> list[str]:
    """The harness files of the bundled suite (what runs when no path is given)."""
    d = bundled_suite()
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("harness"))


#: Most cases one :func:`collect` expands to (a bundled harness file has a few hundred; a
#: harness file that sweeps or includes itself into more is INVALID past this).
MAX_CASES = 20_000
#: Most harness files one :func:`collect` reads (``--batch`` inclusions included).
MAX_HARNESS_FILES = 1_000
#: Most work one :func:`collect` does: the characters of the cases' lines plus the entries
#: (ops, attributes, tensors) of the graph each case checks, summed over the cases.
MAX_WORK = 1 << 26
#: Parsed graph files kept for the next case that names them: at most this many entries
#: (ops, attributes, tensors; a bundled case has about 15) in all.
LOADER_CACHE = 200_000


@dataclass
class Budget:
    """What one :func:`collect` may still expand to: cases, harness files to read, and
    work (:data:`MAX_WORK`)."""

    cases: int = field(default_factory=lambda: MAX_CASES)
    files: int = field(default_factory=lambda: MAX_HARNESS_FILES)
    work: int = field(default_factory=lambda: MAX_WORK)


class _Loader:
    """Reads each JSON file once (the files read last are kept, up to :data:`LOADER_CACHE`
    graph entries, so that memory stays bounded)."""

    def __init__(self) -> None:
        self._graphs: OrderedDict[str, Union[Graph, GraphJSONError]] = OrderedDict()
        self._entries = 0

    def __call__(self, path: str) -> Union[Graph, GraphJSONError]:
        graph = self._graphs.pop(path, None)
        if graph is None:
            try:
                graph = graph_json.load(path)
            except GraphJSONError as e:
                graph = e
            self._entries += _weight(graph)
        self._graphs[path] = graph  # the most recent last
        while self._entries > LOADER_CACHE and len(self._graphs) > 1:
            _, old = self._graphs.popitem(last=False)
            self._entries -= _weight(old)
        return graph


def _weight(graph: Union[Graph, GraphJSONError]) -> int:
    return graph.entries() if isinstance(graph, Graph) else 1


def _json_case(path: str, root: str, loader: _Loader, location: str) -> Case:
    rel = os.path.relpath(path, root)
    line = f"--reset --case={rel}"
    return build_case(loader(path), Overrides(), id=line, location=location, root=root, path=path)


def _walk(directory: str) -> Iterable[tuple[str, str]]:
    """(kind, path) of the case files under a directory: ``*.json`` and ``harness*`` files."""
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.endswith(".json"):
                yield "json", full
            elif name.startswith("harness"):
                yield "harness", full


def collect(
    paths: Sequence[str] = (), *, cases_root: Optional[str] = None, lines: Sequence[str] = ()
) -> list[Case]:
    """Every case of the given paths, in order.

    Args:
        paths: JSON files, harness files (any other file) and directories (searched
            recursively for ``*.json`` and ``harness*`` files). No paths and no lines: the
            bundled suite's harness files.
        cases_root: where ``--case=`` paths are looked up when not found next to the harness
            file (and for ``lines``; default: the current directory).
        lines: harness lines given directly (``--reset --case=op/f32/deconv.json``).

    A bad file (unreadable, malformed, a harness that includes itself or expands past the
    :class:`Budget`) is one or more INVALID cases naming it, among the others; see the
    module docstring.

    Raises:
        FileNotFoundError: a path given that does not exist (a usage error).
    """
    from .harness import parse_harness, parse_text

    loader = _Loader()
    budget = Budget()
    cases: list[Case] = []
    if not paths and not lines:
        paths = bundled_paths()
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"conformance: no such file or directory: {p}")
    for p in paths:
        if os.path.isdir(p):
            items: Iterable[tuple[str, str]] = _walk(p)
            base = p
        else:
            items = [("json" if p.endswith(".json") else "harness", p)]
            base = os.path.dirname(p) or "."
        for kind, full in items:
            shown = full if os.path.isdir(p) else p
            if budget.cases <= 0:
                cases.append(_not_read(shown, base, f"{shown} is not read"))
                break
            try:
                if kind == "json":
                    budget.cases -= 1
                    cases.append(_json_case(full, base, loader, shown))
                else:
                    cases.extend(
                        parse_harness(
                            full, cases_root=cases_root, loader=loader, shown=shown, budget=budget
                        )
                    )
            except Exception as e:  # noqa: BLE001 - a bug here: this file is an ERROR, the others run
                cases.append(
                    Case(
                        id=f"# {shown}",
                        location=shown,
                        root=base,
                        status=ERROR,
                        reason=f"reading {shown}: {type(e).__name__}: {short(str(e))}\n"
                        f"{traceback.format_exc(limit=-3)}",
                    )
                )
    for i, text in enumerate(lines):
        if budget.cases <= 0:
            cases.append(
                _not_read(f"--line[{i + 1}]", cases_root or ".", f"--line[{i + 1}] is not read")
            )
            break
        cases.extend(
            parse_text(
                text,
                f"--line[{i + 1}]",
                base_dir=cases_root or ".",
                cases_root=cases_root,
                loader=loader,
                budget=budget,
            )
        )
    return cases


def _not_read(shown: str, root: str, what: str) -> Case:
    """The INVALID case of a path left unread because the run already has MAX_CASES cases."""
    return Case(
        id=f"# {shown}",
        location=shown,
        root=root,
        status=INVALID,
        reason=f"{what} (nor what follows): the paths given already expand to {MAX_CASES} cases, "
        "the most one run takes",
    )

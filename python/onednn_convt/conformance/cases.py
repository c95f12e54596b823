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

:func:`collect` turns paths (JSON files, harness files, directories) into cases.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Optional, Sequence, Union

from .. import schema, shapes
from . import graph_json
from .graph_json import (
    CONVT_KINDS,
    GRAPH_OP_KINDS,
    LIBRARY_ATTRS,
    REQUIRED_ATTRS,
    Attr,
    Graph,
    GraphJSONError,
)

if TYPE_CHECKING:
    from .patterns import Pattern

INVALID = "INVALID"
SKIPPED = "SKIPPED"

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
        msg = f"{kind}: unknown auto_pad {attrs.get('auto_pad')!r}"
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
        msg = f"memory tag {tag!r} expected a permutation of {''.join(chr(97 + i) for i in range(rank))}"
        raise ValueError(msg)
    return order


def apply_in_shapes(
    ov: Overrides, inputs: Sequence[int], shape: dict[int, list[int]], order: dict[int, tuple[int, ...]]
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
            INVALID, f"--op-attrs: value {text!r} of '{name}' does not parse as {t}"
        ) from None
    return text


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
                f"attribute '{name}' is not defined for {op.kind} ({where}); the library rejects it at add_op",
            )
        want = schema_types[name]
        # The library stores a value by attribute name: a one-element s64[] groups works (spec 2).
        if attr.type != want and not (
            name == "groups" and attr.type == "s64[]" and len(attr.value) == 1
        ):
            raise CaseError(INVALID, f"attribute '{name}' expected type {want}, got {attr.type}")
        allowed = _STRING_VALUES.get(name)
        if allowed and attr.value not in allowed:
            hint = ""
            if name == "weights_format" and attr.value in schema.CONVOLUTION_WEIGHTS_FORMATS:
                hint = " (a Convolution format some oneDNN pages list by mistake)"
            raise CaseError(
                INVALID,
                f"attribute '{name}' is {attr.value!r}{hint}; the library accepts exactly {', '.join(allowed)}",
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
                    f"--op-attrs: no attribute '{name}' in op {op.id} ({op.kind}); an override must name an attribute the JSON op has",
                )
            op.attrs[name] = Attr(op.attrs[name].type, _parse_value(op.attrs[name], text, name))


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
        if isinstance(graph, GraphJSONError):
            raise CaseError(INVALID, str(graph))
        _fill(case, graph, ov)
    except CaseError as e:
        case.status, case.reason = e.status, e.reason
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
    op = graph_json.parse_graph(graph.to_json()).ops[0]  # a copy the overrides can change
    case.kind = op.kind
    if op.kind not in CONVT_KINDS:
        if op.kind in GRAPH_OP_KINDS:
            raise CaseError(SKIPPED, f"op kind {op.kind} is not one of {', '.join(CONVT_KINDS)}")
        raise CaseError(INVALID, f"unknown op kind {op.kind!r} (not a oneDNN Graph op)")
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
    except (ValueError, IndexError, TypeError):
        out_shape = None  # the call reports why
    if out_shape is not None and min(out_shape, default=0) < 1:
        out_shape = None  # likewise
    if (
        out_shape is not None
        and not ov.reshapes
        and out_t.known_shape
        and tuple(out_t.shape) != out_shape
    ):
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


class _Loader:
    """Reads each JSON file once."""

    def __init__(self) -> None:
        self._graphs: dict[str, Union[Graph, GraphJSONError]] = {}

    def __call__(self, path: str) -> Union[Graph, GraphJSONError]:
        if path not in self._graphs:
            try:
                self._graphs[path] = graph_json.load(path)
            except GraphJSONError as e:
                self._graphs[path] = e
        return self._graphs[path]


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

    Raises:
        FileNotFoundError: a path that does not exist.
    """
    from .harness import parse_harness, parse_text

    loader = _Loader()
    cases: list[Case] = []
    if not paths and not lines:
        paths = bundled_paths()
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"conformance: no such file or directory: {p}")
        if os.path.isdir(p):
            items = list(_walk(p))
            base = p
        else:
            items = [("json" if p.endswith(".json") else "harness", p)]
            base = os.path.dirname(p) or "."
        for kind, full in items:
            shown = full if os.path.isdir(p) else p
            if kind == "json":
                cases.extend([_json_case(full, base, loader, shown)])
            else:
                cases.extend(parse_harness(full, cases_root=cases_root, loader=loader, shown=shown))
    for i, text in enumerate(lines):
        cases.extend(
            parse_text(
                text,
                f"--line[{i + 1}]",
                base_dir=cases_root or ".",
                cases_root=cases_root,
                loader=loader,
            )
        )
    return cases

"""oneDNN graph JSON: load, validate and write the serialized graphs benchdnn reads (spec 8).

A graph file is an object with ``version``, ``engine_kind``, ``fpmath_mode`` and ``graph``,
a list of op entries::

    {"id": 0, "name": "...", "kind": "ConvTranspose",
     "attrs": {"strides": {"type": "s64[]", "value": [2, 2]}, ...},
     "inputs": [logical tensor, ...], "outputs": [logical tensor]}

and a logical tensor is ``{"id", "dtype", "shape", "stride", "layout_type",
"property_type"}`` with an unknown dim written as INT64_MIN.

:func:`loads` / :func:`load` check the structure and raise :class:`GraphJSONError` with the
file and the JSON path of the first problem; what is valid *for a ConvTranspose op*
(attribute names, dtypes, shapes) is checked when a case is built
(:mod:`onednn_convt.conformance.cases`).

Hostile files are refused here, before anything is built from them:

- a file that is not a regular file (a directory, a device, a FIFO), not UTF-8, or larger
  than :data:`MAX_JSON_BYTES` (:class:`FileTooLarge`, which the runner reports SKIPPED) is
  not read (:func:`read_text`);
- JSON nested deeper than :data:`MAX_DEPTH` levels, or with an integer of more digits than
  Python converts, is not valid JSON here; an integer outside the format's s64 range, an
  f32 value no f32 holds (NaN, infinite, beyond :data:`F32_MAX`), a tensor of more than
  :data:`MAX_NDIMS` dims, is malformed;
- the ops' tensors must form a graph (:func:`check_tensors`): one tensor id is one tensor
  (the same dtype and shape in every entry), a tensor has at most one producer, and the
  ops form no cycle (the message names the ops of the cycle).

Messages quote values cut short (:func:`short`), whatever their size.

:func:`to_graph_json` writes the graph of a Python call in the library's spelling: every
attribute of the op kind, defaults included, ``type`` first in every attribute entry, both
``data_format`` and ``weights_format`` (benchdnn needs them, spec 8), ``auto_pad`` as
``"None"``/``"SAME_UPPER"``/..., one entry per spatial dim in every list.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from ..shapes import dense_strides

#: The op kinds this package runs.
CONVT_KINDS = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")

#: Every op kind of oneDNN 3.2's Graph API (``dnnl::graph::op::kind``): a kind outside this
#: set is a typo or not a oneDNN op (INVALID); one inside it but not in CONVT_KINDS is a
#: valid graph this runner does not cover (SKIPPED).
GRAPH_OP_KINDS = frozenset(
    """Abs AbsBackward Add AvgPool AvgPoolBackward BatchNormForwardTraining BatchNormInference
    BatchNormTrainingBackward BiasAdd BiasAddBackward Clamp ClampBackward Concat Convolution
    ConvolutionBackwardData ConvolutionBackwardWeights ConvTranspose ConvTransposeBackwardData
    ConvTransposeBackwardWeights Dequantize Divide DynamicDequantize DynamicQuantize Elu
    EluBackward End Exp GELU GELUBackward HardSigmoid HardSigmoidBackward HardSwish
    HardSwishBackward Interpolate InterpolateBackward LayerNorm LayerNormBackward LeakyReLU Log
    LogSoftmax LogSoftmaxBackward MatMul Maximum MaxPool MaxPoolBackward Minimum Mish
    MishBackward Multiply Pow PReLU PReLUBackward Quantize Reciprocal ReduceL1 ReduceL2
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReLU ReLUBackward Reorder Round Select
    Sigmoid SigmoidBackward SoftMax SoftMaxBackward SoftPlus SoftPlusBackward Sqrt
    SqrtBackward Square SquaredDifference StaticReshape StaticTranspose Subtract Tanh
    TanhBackward TypeCast Wildcard""".split()
)

#: Attribute value types of the format (the entry's ``"type"``).
ATTR_TYPES = ("string", "bool", "s64", "s64[]", "f32", "f32[]")

#: How the library writes an unknown dim or stride.
UNKNOWN_DIM = -(2**63)

#: Library attribute schema of each op kind: name -> JSON type, in the order we write them
#: (spec 2). Required: strides, pads_begin, pads_end, dilations.
LIBRARY_ATTRS: dict[str, dict[str, str]] = {
    kind: {
        "strides": "s64[]",
        "pads_begin": "s64[]",
        "pads_end": "s64[]",
        "dilations": "s64[]",
        "auto_pad": "string",
        "groups": "s64",
        "data_format": "string",
        "weights_format": "string",
        **({"output_padding": "s64[]"} if kind == "ConvTranspose" else {}),
        **({"weights_shape": "s64[]"} if kind == "ConvTransposeBackwardWeights" else {}),
    }
    for kind in CONVT_KINDS
}
REQUIRED_ATTRS = ("strides", "pads_begin", "pads_end", "dilations")


class GraphJSONError(ValueError):
    """The text is not a well-formed oneDNN graph JSON; the message names where."""


@dataclass
class Attr:
    """One attribute entry: its JSON ``type`` and ``value``."""

    type: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """``{"type": ..., "value": ...}`` with ``type`` first (benchdnn requires it)."""
        return {"type": self.type, "value": self.value}


@dataclass
class LogicalTensor:
    """A logical tensor entry. ``shape``/``stride`` hold UNKNOWN_DIM where unknown."""

    id: int
    dtype: str
    shape: list[int]
    stride: list[int] = field(default_factory=lambda: [UNKNOWN_DIM])
    layout_type: str = "strided"
    property_type: str = "undef"

    def to_json(self) -> dict[str, Any]:
        """The entry in the library's key order."""
        return {
            "id": self.id,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "layout_type": self.layout_type,
            "property_type": self.property_type,
        }

    @property
    def known_shape(self) -> bool:
        """Whether every dim is known (>= 0)."""
        return all(d >= 0 for d in self.shape)


@dataclass
class GraphOp:
    """One op entry of a graph."""

    id: int
    name: str
    kind: str
    attrs: dict[str, Attr]
    inputs: list[LogicalTensor]
    outputs: list[LogicalTensor]

    def copy(self) -> GraphOp:
        """A copy whose attributes and tensor lists can be changed without changing this op
        (attribute values and tensors are shared: they are replaced, never changed)."""
        return GraphOp(
            self.id, self.name, self.kind, dict(self.attrs), list(self.inputs), list(self.outputs)
        )

    def to_json(self) -> dict[str, Any]:
        """The entry in the library's key order."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "attrs": {k: a.to_json() for k, a in self.attrs.items()},
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }


@dataclass
class Graph:
    """A whole graph file; ``extra`` keeps optional top-level keys (``input_ports``, ...)."""

    ops: list[GraphOp]
    version: str = "3.2.0"
    engine_kind: str = "cpu"
    fpmath_mode: str = "strict"
    extra: dict[str, Any] = field(default_factory=dict)

    def entries(self) -> int:
        """How many ops, attributes and tensor entries the graph has (what checking a case
        of it reads; computed once)."""
        n = self.__dict__.get("_entries")
        if n is None:
            n = sum(1 + len(op.attrs) + len(op.inputs) + len(op.outputs) for op in self.ops)
            self.__dict__["_entries"] = n
        return int(n)

    def to_json(self) -> dict[str, Any]:
        """The top-level object (``graph`` last, as the library writes it)."""
        return {
            "version": self.version,
            "engine_kind": self.engine_kind,
            "fpmath_mode": self.fpmath_mode,
            **self.extra,
            "graph": [op.to_json() for op in self.ops],
        }


# -- reading ------------------------------------------------------------------------------

#: Most bytes of a graph JSON file the runner reads (oneDNN's are a few KiB): a larger file
#: is SKIPPED unread (:class:`FileTooLarge`).
MAX_JSON_BYTES = 4 << 20
#: Deepest nesting of JSON arrays and objects (a graph file nests 6 deep).
MAX_DEPTH = 32
#: Most dims of a logical tensor (``DNNL_MAX_NDIMS``: the library's shape and stride arrays).
MAX_NDIMS = 12
#: The largest finite f32 (an ``f32`` attribute beyond it, or NaN, is no f32).
F32_MAX = float.fromhex("0x1.fffffep+127")
#: The range of the format's integers (ids, dims, strides, ``s64`` attributes).
S64_MIN, S64_MAX = -(2**63), 2**63 - 1
#: What a data type name looks like (``f32``, ``bf16``, ``boolean``): checked names are short.
_DTYPE_NAME = re.compile(r"[A-Za-z0-9_]{1,16}")
#: Characters of a value quoted in a message.
QUOTE_CHARS = 120

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = QUOTE_CHARS
_repr.maxlist = _repr.maxdict = 12
_repr.maxlevel = 3


def short(value: Any) -> str:
    """``repr(value)`` cut to about :data:`QUOTE_CHARS` characters and 3 levels (a message
    quoting a hostile value stays short, and never recurses deeply)."""
    if isinstance(value, str):
        text = repr(value[: QUOTE_CHARS + 1])
        return text if len(value) <= QUOTE_CHARS else text[:-1] + "..." + text[-1]
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 400:
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    return _repr.repr(value)


def plain(text: Any) -> str:
    """``text`` as is when it is a short printable string (a name, a dtype, a path), else
    :func:`short` of it (quoted and cut)."""
    if (
        isinstance(text, str)
        and len(text) <= QUOTE_CHARS
        and text.isprintable()
        and text.strip() == text
        and text
    ):
        return text
    return short(text)


class FileTooLarge(GraphJSONError):
    """A file larger than the runner reads; ``size`` and ``limit`` in bytes."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        has = f"{size} bytes" if size > limit + 1 else f"more than {limit} bytes"
        super().__init__(
            f"{path}: the file has {has}; the runner reads files of at most {limit} bytes"
        )
        self.size = size
        self.limit = limit


def read_text(path: Union[str, os.PathLike[str]], max_bytes: int) -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes`` bytes.

    Raises:
        FileTooLarge: the file is larger.
        ValueError: not a regular file (a directory, a device, a FIFO), unreadable, or not
            UTF-8; the message names the file.
    """
    name = os.fspath(path)
    shown = plain(name)
    try:
        info = os.stat(name)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{shown}: not a regular file")
        if info.st_size > max_bytes:
            raise FileTooLarge(shown, info.st_size, max_bytes)
        with open(name, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise ValueError(f"{shown}: cannot read: {e.strerror or e}") from None
    except ValueError as e:  # also os.stat's "embedded null byte"
        if isinstance(e, FileTooLarge) or str(e).startswith(shown):
            raise
        raise ValueError(f"{shown}: cannot read: {e}") from None
    if len(data) > max_bytes:  # it grew since the stat
        raise FileTooLarge(shown, len(data), max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{shown}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})"
        ) from None


def _fail(where: str, msg: str) -> GraphJSONError:
    return GraphJSONError(f"{where}: {msg}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_s64(x: Any) -> bool:
    return _is_int(x) and S64_MIN <= x <= S64_MAX


def _get(obj: dict[str, Any], key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise _fail(where, f"missing key '{key}'")
    value = obj[key]
    if kind is int and not _is_int(value) or not isinstance(value, kind):
        raise _fail(f"{where}.{key}", f"expected {_type_name(kind)}, got {short(value)}")
    if kind is int and not _is_s64(value):
        raise _fail(f"{where}.{key}", f"{short(value)} is out of the format's s64 range")
    return value


def _type_name(kind: type | tuple[type, ...]) -> str:
    names = {int: "an integer", str: "a string", list: "a list", dict: "an object"}
    if isinstance(kind, tuple):
        return " or ".join(names.get(k, k.__name__) for k in kind)
    return names.get(kind, kind.__name__)


def _int_list(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise _fail(where, f"expected a list of integers, got {short(value)}")
    if not all(S64_MIN <= v <= S64_MAX for v in value):
        raise _fail(where, f"{short(value)} has a value out of the format's s64 range")
    return list(value)


def _dims(value: Any, where: str) -> list[int]:
    dims = _int_list(value, where)
    if len(dims) > MAX_NDIMS:
        raise _fail(
            where, f"{len(dims)} dims; a logical tensor has at most {MAX_NDIMS} (DNNL_MAX_NDIMS)"
        )
    return dims


def _parse_attr(name: str, entry: Any, where: str) -> Attr:
    if not isinstance(entry, dict):
        raise _fail(
            where,
            f'attribute \'{short(name)}\' expected an object {{"type", "value"}}, got {short(entry)}',
        )
    keys = list(entry)
    if "type" not in entry or "value" not in entry:
        raise _fail(
            where, f"attribute {short(name)} expected keys 'type' and 'value', got {short(keys)}"
        )
    if keys[0] != "type":
        raise _fail(
            where,
            f"attribute {short(name)}: 'type' must be the first key (benchdnn's loader reads it first), got {short(keys)}",
        )
    t, v = entry["type"], entry["value"]
    if t not in ATTR_TYPES:
        raise _fail(
            where,
            f"attribute {short(name)} has unknown type {short(t)}; expected one of {', '.join(ATTR_TYPES)}",
        )

    def real(x: Any) -> bool:  # a finite number an f32 holds
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        try:
            return abs(float(x)) <= F32_MAX
        except OverflowError:  # an int beyond any float
            return False

    checks: dict[str, Callable[[], bool]] = {
        "string": lambda: isinstance(v, str),
        "bool": lambda: (
            isinstance(v, bool) or (_is_int(v) and v in (0, 1)) or v in ("true", "false")
        ),
        "s64": lambda: _is_s64(v),
        "s64[]": lambda: isinstance(v, list) and all(_is_s64(x) for x in v),
        "f32": lambda: real(v),
        "f32[]": lambda: isinstance(v, list) and all(real(x) for x in v),
    }
    if not checks[t]():
        raise _fail(where, f"attribute {short(name)} of type {t} has value {short(v)}")
    return Attr(t, v)


def _parse_tensor(obj: Any, where: str) -> LogicalTensor:
    if not isinstance(obj, dict):
        raise _fail(where, f"expected a logical tensor object, got {short(obj)}")
    dtype = _get(obj, "dtype", where, str)
    if not _DTYPE_NAME.fullmatch(dtype):
        raise _fail(f"{where}.dtype", f"{short(dtype)} is not a data type name (f32, u8, ...)")
    return LogicalTensor(
        id=_get(obj, "id", where, int),
        dtype=dtype,
        shape=_dims(_get(obj, "shape", where, list), f"{where}.shape"),
        stride=_dims(obj.get("stride", [UNKNOWN_DIM]), f"{where}.stride"),
        layout_type=_get(obj, "layout_type", where, str) if "layout_type" in obj else "strided",
        property_type=_get(obj, "property_type", where, str) if "property_type" in obj else "undef",
    )


def _parse_op(obj: Any, where: str) -> GraphOp:
    if not isinstance(obj, dict):
        raise _fail(where, f"expected an op object, got {short(obj)}")
    attrs_obj = _get(obj, "attrs", where, dict) if "attrs" in obj else {}
    attrs = {name: _parse_attr(name, e, f"{where}.attrs") for name, e in attrs_obj.items()}
    return GraphOp(
        id=_get(obj, "id", where, int),
        name=_get(obj, "name", where, str) if "name" in obj else "",
        kind=_get(obj, "kind", where, str),
        attrs=attrs,
        inputs=[
            _parse_tensor(t, f"{where}.inputs[{i}]")
            for i, t in enumerate(_get(obj, "inputs", where, list))
        ],
        outputs=[
            _parse_tensor(t, f"{where}.outputs[{i}]")
            for i, t in enumerate(_get(obj, "outputs", where, list))
        ],
    )


def _describe(t: LogicalTensor) -> str:
    return f"{plain(t.dtype)} {t.shape}"


def check_tensors(ops: Sequence[GraphOp], source: str) -> None:
    """Raise GraphJSONError unless the ops' tensors form a graph (spec 8).

    A tensor id names one tensor: every entry with that id has the same dtype and shape, and
    at most one op outputs it. The ops form no cycle (an op whose output is its own input,
    or ops feeding each other): the message names the ops of the cycle.
    """
    first: dict[int, tuple[LogicalTensor, str]] = {}
    producers: dict[int, list[int]] = {}  # tensor id -> indices of the ops that output it
    for i, op in enumerate(ops):
        for side, tensors in (("inputs", op.inputs), ("outputs", op.outputs)):
            for j, t in enumerate(tensors):
                where = f"graph[{i}].{side}[{j}]"
                seen = first.setdefault(t.id, (t, where))
                if seen[0].dtype != t.dtype or seen[0].shape != t.shape:
                    raise _fail(
                        source,
                        f"tensor {t.id} is {_describe(seen[0])} at {seen[1]} and "
                        f"{_describe(t)} at {where}; one id is one tensor",
                    )
        for t in op.outputs:
            users = producers.setdefault(t.id, [])
            if not users or users[-1] != i:
                users.append(i)
    # cycles: depth-first over "op -> the ops whose outputs it reads", without recursion
    reads = [[k for t in op.inputs for k in producers.get(t.id, ())] for op in ops]
    state = [0] * len(ops)  # 1: on the path, 2: done
    for start in range(len(ops)):
        if state[start]:
            continue
        path, pending = [start], [iter(reads[start])]
        state[start] = 1
        while pending:
            nxt = next(pending[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                pending.pop()
            elif state[nxt] == 1:
                cycle = (path[path.index(nxt) :] + [nxt])[::-1]  # in the direction data flows
                names = " -> ".join(f"op {ops[k].id} ({plain(ops[k].kind)})" for k in cycle)
                if len(cycle) == 2:
                    what = f"op {ops[nxt].id} ({plain(ops[nxt].kind)}) takes its own output as an input"
                else:
                    what = f"{names}, each op's output an input of the next"
                raise _fail(source, f"the graph has a cycle: {what}; a graph is acyclic")
            elif not state[nxt]:
                state[nxt] = 1
                path.append(nxt)
                pending.append(iter(reads[nxt]))
    for tid, makers in producers.items():
        if len(makers) > 1:
            a, b = ops[makers[0]], ops[makers[1]]
            raise _fail(
                source,
                f"tensor {tid} is the output of ops {a.id} ({plain(a.kind)}) and {b.id} "
                f"({plain(b.kind)}); a tensor has one producer",
            )


def check_depth(data: Any, source: str, limit: int = MAX_DEPTH) -> None:
    """Raise GraphJSONError if arrays and objects nest deeper than ``limit`` (no recursion)."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            raise _fail(source, f"arrays and objects nest deeper than {limit} levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list)))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list)))


def parse_graph(data: Any, source: str = "<graph>") -> Graph:
    """A :class:`Graph` from decoded JSON, checking the structure of the format.

    Args:
        data: the decoded JSON value.
        source: name for messages (usually the file path).

    Raises:
        GraphJSONError: a missing key, a value of the wrong type, an integer out of the s64
            range, a tensor of more than 12 dims, an attribute entry whose first key is not
            ``type``, duplicate op ids, or tensors that do not form a graph
            (:func:`check_tensors`: one id declared as two tensors, two producers, a cycle).
    """
    if not isinstance(data, dict):
        raise _fail(source, f"expected a JSON object at the top level, got {type(data).__name__}")
    ops_data = _get(data, "graph", source, list)
    ops = [_parse_op(op, f"{source}: graph[{i}]") for i, op in enumerate(ops_data)]
    ids = [op.id for op in ops]
    if len(set(ids)) != len(ids):
        raise _fail(source, f"duplicate op ids {short(ids)}")
    known = ("version", "engine_kind", "fpmath_mode", "graph")
    for key in known[:3]:
        if key in data and not isinstance(data[key], str):
            raise _fail(source, f"'{key}' expected a string, got {short(data[key])}")
    check_tensors(ops, source)
    return Graph(
        ops=ops,
        version=data.get("version", ""),
        engine_kind=data.get("engine_kind", "cpu"),
        fpmath_mode=data.get("fpmath_mode", "strict"),
        extra={k: v for k, v in data.items() if k not in known},
    )


def loads(text: str, source: str = "<graph>") -> Graph:
    """Parse graph JSON text.

    Raises:
        GraphJSONError: the text is not JSON (also: nested deeper than :data:`MAX_DEPTH`,
            or an integer of more digits than Python converts), or not a well-formed graph
            (see :func:`parse_graph`).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(source, f"not valid JSON: {e}") from None
    except RecursionError:
        raise _fail(
            source, f"not valid JSON here: arrays and objects nest deeper than {MAX_DEPTH} levels"
        ) from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits
        digits = getattr(sys, "get_int_max_str_digits", lambda: 0)()
        what = f"an integer of more than {digits} digits" if digits else str(e)
        raise _fail(source, f"not valid JSON here: {what}") from None
    check_depth(data, source)
    return parse_graph(data, source)


def load(path: Union[str, os.PathLike[str]], max_bytes: int = MAX_JSON_BYTES) -> Graph:
    """Read and parse a graph JSON file.

    Raises:
        FileTooLarge: a file of more than ``max_bytes`` bytes (not read).
        GraphJSONError: unreadable file (not a regular file, not UTF-8) or malformed content.
    """
    try:
        text = read_text(path, max_bytes)
    except FileTooLarge:
        raise
    except ValueError as e:
        raise GraphJSONError(str(e)) from None
    return loads(text, str(path))


def dumps(graph: Graph, indent: Optional[int] = 2) -> str:
    """Graph JSON text (``indent=None`` for one line)."""
    return json.dumps(graph.to_json(), indent=indent) + ("\n" if indent is not None else "")


# -- writing the graph of a Python call -----------------------------------------------------


def _tensor_of(array: np.ndarray, tid: int, code: str) -> LogicalTensor:
    size = array.itemsize
    if all(s > 0 and s % size == 0 for s in array.strides):
        stride = [s // size for s in array.strides]
    else:  # the op copies such arrays to dense memory before the library sees them
        stride = list(dense_strides(array.shape))
    return LogicalTensor(tid, code, [int(d) for d in array.shape], stride)


def library_attrs(kind: str, attrs: dict[str, Any], spatial: int) -> dict[str, Attr]:
    """Every library attribute of ``kind`` from an op's normalized attributes.

    Args:
        kind: op kind.
        attrs: the op's ``attrs`` (ints, tuples, library spellings, None where not given);
            ``weights_shape`` must already be resolved for BackwardWeights.
        spatial: number of spatial dims (lists are written with one entry per dim).

    Raises:
        ValueError: a list attribute whose length is not ``spatial``.
    """
    from .. import schema

    out: dict[str, Attr] = {}
    for name, t in LIBRARY_ATTRS[kind].items():
        value = attrs.get(name)
        if name == "weights_shape":
            out[name] = Attr(t, [int(v) for v in value] if value is not None else [0] * 12)
        elif t == "s64[]":
            out[name] = Attr(t, list(schema.per_dim(kind, name, value, spatial)))
        elif t == "s64":
            out[name] = Attr(t, int(value if value is not None else 1))
        else:
            out[name] = Attr(t, str(value))
    return out


def graph_of_call(op: Any, *inputs: Any) -> Graph:
    """The :class:`Graph` of the call ``op(*inputs)``; see :func:`to_graph_json`."""
    from .. import dtypes, legacy
    from .cases import expected_output_shape

    if isinstance(op, legacy.ConvTransposeBackpropFilters):
        inner = op._op  # the ConvTransposeBackwardWeights that computes it
        inputs = tuple(inputs)
        if len(inputs) > 2 and inputs[2] is not None:
            shape = list(np.asarray(inputs[2]).tolist())
            ax0, ax1 = op._axes
            shape[ax0], shape[ax1] = shape[ax1], shape[ax0]
            inputs = (*inputs[:2], np.asarray(shape, np.int32))
        op = inner
    kind = getattr(op, "op_name", None)
    if kind not in CONVT_KINDS:
        msg = f"to_graph_json: argument 'op' expected a ConvTranspose, ConvTransposeBackwardData or ConvTransposeBackwardWeights object, got {type(op).__name__}"
        raise TypeError(msg)
    if getattr(op, "fusion", None) is not None:
        return _graph_of_fused_call(op, inputs)
    names = type(op).input_names
    arrays = [None if x is None else np.asarray(x) for x in inputs]
    while arrays and arrays[-1] is None:
        arrays.pop()
    if len(arrays) < 2 or len(arrays) > len(names) or any(a is None for a in arrays):
        msg = f"to_graph_json: {kind} expected inputs {', '.join(names)} (the last optional), got {len(inputs)}"
        raise ValueError(msg)
    attrs = dict(op.attrs)
    tensors: list[LogicalTensor] = []
    code: Optional[str] = None
    ws_input: Optional[list[int]] = None
    for i, (name, a) in enumerate(zip(names, arrays)):
        assert a is not None
        if name == "weights_shape":
            ws_input = [int(v) for v in np.ravel(a)]
            tensors.append(LogicalTensor(i, "s32", [len(ws_input)], [1]))
            continue
        c = dtypes.code_of(a.dtype)
        if c is None or (code is not None and c != code):
            msg = f"to_graph_json: {kind} argument '{name}' expected dtype {dtypes.expected_names()} like the other inputs, got {a.dtype}"
            raise TypeError(msg)
        code = c
        tensors.append(_tensor_of(a, i, c))
    assert code is not None
    if kind == "ConvTransposeBackwardWeights":
        ws = ws_input if ws_input is not None else attrs.get("weights_shape")
        if ws is None:
            msg = f"to_graph_json: {kind} weights_shape expected as input 2 or as the attribute, got neither"
            raise ValueError(msg)
        attrs["weights_shape"] = tuple(int(v) for v in ws)
    spatial = arrays[0].ndim - 2  # type: ignore[union-attr]
    out_shape = expected_output_shape(kind, attrs, [tuple(a.shape) for a in arrays])  # type: ignore[union-attr]
    _check_output_shape(kind, out_shape)
    output = LogicalTensor(len(tensors), code, list(out_shape), list(dense_strides(out_shape)))
    from .. import native

    graph_op = GraphOp(0, f"{kind}_0", kind, library_attrs(kind, attrs, spatial), tensors, [output])
    return Graph([graph_op], version=native.onednn_version())


def _check_output_shape(kind: str, shape: Sequence[int]) -> None:
    """Raise ValueError unless every dim of the output (weights_shape included) is >= 1: a
    graph with a negative or empty shape is not written."""
    if not shape or min(shape) < 1:
        msg = (
            f"to_graph_json: {kind} would have an output of shape {list(shape)}; every dim must "
            "be at least 1 (the attributes do not fit the inputs' shapes)"
        )
        raise ValueError(msg)


#: JSON types of the attributes of the ops a fused call adds (post-ops' own are f32).
FUSED_ATTR_TYPES = {
    "scales": "f32[]",
    "zps": "s64[]",
    "qtype": "string",
    "axis": "s64",
    "auto_broadcast": "string",
    "data_format": "string",
}


def _node_attrs(kind: str, attrs: dict[str, Any], spatial: int) -> dict[str, Attr]:
    if kind == "ConvTranspose":
        return library_attrs(kind, attrs, spatial)
    out = {}
    for name, value in attrs.items():
        t = FUSED_ATTR_TYPES.get(name, "f32")
        if t == "f32[]":
            value = [float(v) for v in value]
        elif t == "s64[]":
            value = [int(v) for v in value]
        elif t == "f32":
            value = float(value)
        elif t == "s64":
            value = int(value)
        out[name] = Attr(t, value)
    return out


def _array_code(a: np.ndarray) -> Optional[str]:
    from .. import dtypes
    from ..post_ops import INT8_DTYPES

    for code, dt in INT8_DTYPES.items():
        if a.dtype == dt:
            return code
    return dtypes.code_of(a.dtype)


def _graph_of_fused_call(op: Any, inputs: Sequence[Any]) -> Graph:
    """The whole graph of a fused ConvTranspose call: the nodes the package compiles
    (:func:`onednn_convt.fusion.graph_nodes`), inputs first (src, weights, the bias if given,
    each binary post-op's tensor at dst's rank), then each node's output, in node order."""
    from .. import fusion, native
    from .cases import expected_output_shape

    f = op.fusion
    name = op.op_name
    given = list(inputs)
    if len(given) < 2 or given[0] is None or given[1] is None:
        msg = f"to_graph_json: {name} expected inputs {', '.join(op.input_names)}, got {len(given)}"
        raise ValueError(msg)
    src, w = np.asarray(given[0]), np.asarray(given[1])
    bias = None if len(given) < 3 or given[2] is None else np.asarray(given[2])
    operands = [np.asarray(x) for x in given[3:]]
    if len(operands) != len(f.binary) or any(x is None for x in given[3:]):
        msg = (
            f"to_graph_json: {name} expected {len(f.binary)} post-op tensor(s) after the bias "
            f"({', '.join(op.input_names[3:]) or 'none'}), got {len(operands)}"
        )
        raise ValueError(msg)
    arrays = [src, w] + ([bias] if bias is not None else []) + operands
    codes = []
    for a, arg in zip(
        arrays,
        ["src", "weights"] + (["bias"] if bias is not None else []) + list(op.input_names[3:]),
    ):
        c = _array_code(a)
        if c is None:
            msg = f"to_graph_json: {name} argument '{arg}' has dtype {a.dtype}, which is not a oneDNN data type here"
            raise TypeError(msg)
        codes.append(c)
    if f.int8:
        inter = "f32"
        out_code = f.dst_quantize.dtype if f.dst_quantize is not None else "f32"
    else:
        if len(set(codes)) > 1:
            got = ", ".join(codes)
            msg = (
                f"to_graph_json: every tensor of a fused float call must have one dtype, got {got}"
            )
            raise TypeError(msg)
        inter = out_code = codes[0]
    out_shape = expected_output_shape(name, dict(op.attrs), [src.shape, w.shape])
    _check_output_shape(name, out_shape)
    rank = len(out_shape)
    operand_shapes = []
    for x in operands:
        if x.ndim > rank:
            msg = f"to_graph_json: {name} post-op tensor of shape {x.shape} has more dims than dst {out_shape}"
            raise ValueError(msg)
        operand_shapes.append((1,) * (rank - x.ndim) + tuple(x.shape))
    nodes = fusion.graph_nodes(
        op, f, bias is not None, out_shape, inter, out_code, operand_shapes, src.shape, w.shape
    )
    n_args = len(arrays)
    placed = arrays[: n_args - len(operands)] + [
        x.reshape(s) for x, s in zip(operands, operand_shapes)
    ]
    tensors = [_tensor_of(a, i, c) for i, (a, c) in enumerate(zip(placed, codes))]
    outputs = [
        LogicalTensor(n_args + k, code, [int(d) for d in shape], [int(v) for v in strides])
        for k, (_, _, _, (shape, strides, code)) in enumerate(nodes)
    ]

    def ref(i: int) -> LogicalTensor:
        return tensors[i] if i >= 0 else outputs[-1 - i]

    spatial = src.ndim - 2
    ops = [
        GraphOp(
            k,
            f"{kind}_{k}",
            kind,
            _node_attrs(kind, attrs, spatial),
            [ref(i) for i in refs],
            [outputs[k]],
        )
        for k, (kind, attrs, refs, _) in enumerate(nodes)
    ]
    return Graph(ops, version=native.onednn_version())


def to_graph_json(op: Any, *inputs: Any, indent: Optional[int] = 2) -> str:
    """The oneDNN graph JSON of the call ``op(*inputs)``, for benchdnn or this runner.

    Written in the library's spelling with every attribute: lists with one entry per
    spatial dim, ``auto_pad`` as ``"None"``/``"SAME_UPPER"``/..., both formats,
    ``output_padding`` for ConvTranspose and the resolved ``weights_shape`` for
    ConvTransposeBackwardWeights (a ``weights_shape`` input is written as a third, s32
    input as well, its values in the attribute since the format holds no data). An
    ``output_padding`` given to a backward op is only checked by this package and is not a
    library attribute, so it is not written. The legacy ConvTransposeBackpropFilters is
    written as the ConvTransposeBackwardWeights that computes it.

    A fused ConvTranspose (``post_ops=``, or int8 with ``src_dequantize=`` ...) is written
    as the whole graph the package compiles for the call (:func:`onednn_convt.fusion.graph_nodes`):
    the Dequantize ops of src and weights, the ConvTranspose (its bias as input 2, pads
    resolved as compiled), each post-op (a binary one's tensor at dst's rank, through its
    Dequantize when it has one) and the Quantize, with tensor ids, dtypes, shapes and
    strides; pass the bias as None to write a call without bias that has post-op tensors.

    Args:
        op: an op object (``onednn_convt.ConvTranspose(...)``, ...).
        *inputs: the arrays of the call, in the op's input order (NumPy arrays in the
            op's layouts: activations NXC/NCX, weights XOI/IOX).
        indent: JSON indentation (None: one line).

    Returns:
        The JSON text (input tensor ids 0.., then the outputs; a single-op graph, or a
        fused call's chain with op ids 0.. in chain order).

    Raises:
        TypeError: not an op object, or unsupported/mixed dtypes.
        ValueError: wrong number of inputs, list attributes of the wrong length, or shapes
            for which the output shape cannot be computed.
    """
    return dumps(graph_of_call(op, *inputs), indent=indent)


def case_graph_json(case: Any, indent: Optional[int] = 2) -> str:
    """The graph JSON of a runnable :class:`~onednn_convt.conformance.cases.Case`, with its
    overrides applied (to hand a failing case to oneDNN's tools)."""
    import onednn_convt

    from ..dtypes import FLOAT_DTYPES, SHAPE_DTYPE
    from .fill import place

    if case.status is not None or case.kind is None:
        msg = f"case_graph_json: the case is {case.status}: {case.reason}"
        raise ValueError(msg)
    if case.pattern is not None:
        from ..post_ops import INT8_DTYPES

        by_role = {
            t.role: place(
                np.zeros(t.shape), INT8_DTYPES.get(t.dtype) or FLOAT_DTYPES[t.dtype], t.order
            )
            for t in case.inputs
        }
        operands = [by_role[t.role] for t in case.inputs if t.role.startswith("post_ops[")]
        fused = onednn_convt.ConvTranspose(**case.attrs, **case.pattern.op_kwargs())
        return to_graph_json(
            fused, by_role["src"], by_role["weights"], by_role.get("bias"), *operands, indent=indent
        )
    op = getattr(onednn_convt, case.kind)(**case.attrs)
    arrays = [
        np.asarray(t.values, SHAPE_DTYPE)
        if t.role == "weights_shape"
        else place(np.zeros(t.shape), FLOAT_DTYPES[t.dtype], t.order)
        for t in case.inputs
    ]
    return to_graph_json(op, *arrays, indent=indent)

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

Writing the graph of a Python call is :mod:`onednn_convt.conformance.export`'s.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
import sys
from typing import Any, Callable, Optional, Sequence, Union

from .graph import ATTR_TYPES, UNKNOWN_DIM, Attr, Graph, GraphJSONError, GraphOp, LogicalTensor


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

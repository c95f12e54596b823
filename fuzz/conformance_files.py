"""Mutation fuzzer of the conformance runner's inputs: graph JSON and harness files.

Each trial takes one conformance case of the package (the bundled suite's, ``suite/cases``)
or of the repository (``tests/data/onednn``, ``tests/data/conformance_hostile``), mutates
it, writes it (and any files it includes) to a temporary directory, and runs it in this
process through the runner's Python API (:func:`~onednn_convt.conformance.collect`,
:func:`~onednn_convt.conformance.run_cases`) with a 256 MiB memory limit set. It then
writes the JSON and JUnit reports of the results and reads them back.

A trial fails when a case is ERROR (a bug of this package, by the runner's contract), when
an exception escapes the API, when a report cannot be written or read back, or when a
mutation that makes the input malformed (``MALFORMING``) gives a PASSED case. The harness
catches crashes and hangs.

Mutations, JSON level: random ConvTranspose geometry and input sizes (the computed shapes
made unknown, so the case reaches the op and the reference); delete, duplicate or retype a
key or list item; numbers made
absurd, negative, zero, huge, floats or integers of 5,000 digits; wrong dtypes and ranks
(one entry, or every entry of a tensor alike); swapped tensor ids; an id declared as two
tensors; duplicate op ids; cycles (an op reading its own output, two ops feeding each
other); deep nesting; truncation; random bytes; bytes that are not UTF-8; a file over the
size limit. Harness level: random option lines (sweeps, overrides with absurd values,
unknown options, quotes), files that include each other or themselves, sweeps whose
product is huge, missing and unreadable ``--batch`` files.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onednn_convt
from harness import Failure
from onednn_convt.conformance import graph_json, report
from onednn_convt.conformance.collect import bundled_suite, collect
from onednn_convt.conformance.model import ERROR, INVALID
from onednn_convt.conformance.judge import PASSED
from onednn_convt.conformance.runner import run_cases
from onednn_convt import shapes

NAME = "conformance"
PER_PROCESS = 50
TIMEOUT = 60.0
#: the memory limit of the trials (the runner SKIPs a case over it before allocating)
MEMORY_LIMIT = 256 << 20

REPO = Path(__file__).resolve().parent.parent
SEED_DIRS = [
    Path(bundled_suite()) / "cases",
    REPO / "tests" / "data" / "onednn",
    REPO / "tests" / "data" / "conformance_hostile",
]
#: numbers a mutation puts in place of one
ABSURD_NUMBERS: list[Any] = [
    0,
    -1,
    -7,
    1,
    2,
    3,
    13,
    2**31,
    2**31 - 1,
    2**32 + 1,
    2**62,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    10**30,
    1.5,
    -0.0,
    1e308,
    1e-300,
    True,
    False,
    None,
]
DTYPES = ["f32", "bf16", "f16", "s8", "u8", "s32", "boolean", "f64", "undef", "int8", "F32", ""]
KINDS = [
    "ConvTranspose",
    "ConvTransposeBackwardData",
    "ConvTransposeBackwardWeights",
    "ReLU",
    "Add",
    "Dequantize",
    "Quantize",
    "BiasAdd",
    "Square",
    "Convolution",
    "Concat",
    "Wildcard",
    "Bogus",
]


def _seeds() -> list[Path]:
    found = []
    for d in SEED_DIRS:
        if d.is_dir():
            found.extend(sorted(p for p in d.rglob("*.json")))
    return found


SEEDS = _seeds()


# -- JSON helpers ---------------------------------------------------------------------------------
def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and indices) into ``value``, the root excluded."""
    out = []
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, child in items:
            out.append(p + (k,))
            stack.append((child, p + (k,)))
    return out


def _get(value: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        value = value[k]
    return value


def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _random_value(rng: np.random.Generator, depth: int = 0) -> Any:
    kind = int(rng.integers(7 if depth < 2 else 4))
    if kind == 0:
        return _pick(rng, ABSURD_NUMBERS)
    if kind == 1:
        return _pick(rng, DTYPES + KINDS + ["None", "NCX", "XOI", "per_channel", "x" * 300])
    if kind == 2:
        return float(rng.standard_normal() * 10.0 ** int(rng.integers(-5, 40)))
    if kind == 3:
        return int(rng.integers(-(2**40), 2**40))
    if kind == 4:
        return [_random_value(rng, depth + 1) for _ in range(int(rng.integers(0, 5)))]
    if kind == 5:
        return {
            str(_random_value(rng, 2)): _random_value(rng, depth + 1)
            for _ in range(int(rng.integers(0, 3)))
        }
    return [int(rng.integers(-3, 20)) for _ in range(int(rng.integers(0, 14)))]


def _tensors(graph: Any) -> list[dict[str, Any]]:
    """The tensor entries of a graph (of what is left of one after earlier mutations)."""
    ops = graph.get("graph", []) if isinstance(graph, dict) else []
    found: list[dict[str, Any]] = []
    for op in ops if isinstance(ops, list) else []:
        for side in ("inputs", "outputs"):
            entries = op.get(side, []) if isinstance(op, dict) else []
            found.extend(
                t
                for t in (entries if isinstance(entries, list) else [])
                if isinstance(t, dict) and "id" in t
            )
    return found


def _graph_inputs(graph: dict[str, Any]) -> list[int]:
    made = {t["id"] for op in graph["graph"] for t in op["outputs"]}
    return sorted({t["id"] for op in graph["graph"] for t in op["inputs"] if t["id"] not in made})


# -- mutations: each returns (files {name: bytes}, the file to run, malformed?, what) -----------
Files = dict[str, bytes]
Mutation = Callable[[np.random.Generator, dict[str, Any], str], tuple[Files, str, bool, str]]


def _as_files(graph: Any, name: str = "case.json") -> Files:
    return {name: json.dumps(graph).encode()}


def m_delete(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    path = _pick(rng, _slots(g))
    parent = _get(g, path[:-1])
    del parent[path[-1]]
    required = path[-1] in (
        "graph",
        "id",
        "kind",
        "inputs",
        "outputs",
        "dtype",
        "shape",
        "type",
        "value",
    ) or (
        len(path) >= 2
        and path[-2] == "attrs"
        and path[-1] in ("strides", "pads_begin", "pads_end", "dilations")
        and _is_conv(g, path)
    )
    return (
        _as_files(g),
        "case.json",
        bool(required and not isinstance(path[-1], int)),
        f"delete {path}",
    )


def _is_conv(g: dict[str, Any], path: tuple[Any, ...]) -> bool:
    try:
        return str(g["graph"][path[1]]["kind"]).startswith("ConvTranspose")
    except (KeyError, IndexError, TypeError):
        return False


def m_duplicate(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    lists = [p for p in _slots(g) if isinstance(_get(g, p), list) and _get(g, p)]
    if not lists:
        return m_delete(rng, g, text)
    path = _pick(rng, lists)
    items = _get(g, path)
    i = int(rng.integers(len(items)))
    items.insert(i, copy.deepcopy(items[i]))
    malformed = path == ("graph",)  # duplicate op ids
    return _as_files(g), "case.json", malformed, f"duplicate {path}[{i}]"


def m_retype(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    path = _pick(rng, _slots(g))
    old = _get(g, path[:-1])[path[-1]]
    new = _random_value(rng)
    _get(g, path[:-1])[path[-1]] = new
    key = path[-1]
    malformed = (
        key in ("id", "shape", "inputs", "outputs", "graph", "attrs")
        and type(new) is not type(old)
        and not (isinstance(old, int) and isinstance(new, int) and not isinstance(new, bool))
    )
    return _as_files(g), "case.json", malformed, f"retype {path}: {old!r:.60} -> {new!r:.60}"


def m_number(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    numbers = [
        p
        for p in _slots(g)
        if isinstance(_get(g, p), (int, float)) and not isinstance(_get(g, p), bool)
    ]
    if not numbers:
        return m_retype(rng, g, text)
    path = _pick(rng, numbers)
    new = _pick(rng, ABSURD_NUMBERS[:-3]) if rng.random() < 0.7 else int(rng.integers(-100, 100))
    _get(g, path[:-1])[path[-1]] = new
    return _as_files(g), "case.json", False, f"number {path} = {new!r}"


def m_bigint(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    numbers = [
        p for p in _slots(g) if isinstance(_get(g, p), int) and not isinstance(_get(g, p), bool)
    ]
    if not numbers:
        return m_retype(rng, g, text)
    path = _pick(rng, numbers)
    marker = 1234567890123
    _get(g, path[:-1])[path[-1]] = marker
    digits = int(_pick(rng, [30, 400, 4299, 5000, 20000]))
    out = json.dumps(g).replace(str(marker), "9" * digits, 1)
    return (
        {"case.json": out.encode()},
        "case.json",
        digits > 4300,
        f"bigint of {digits} digits at {path}",
    )


def m_dtype(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    tensors = _tensors(g)
    t = _pick(rng, tensors)
    tid, old = t["id"], t["dtype"]
    new = _pick(rng, [d for d in DTYPES if d != old])
    alike = rng.random() < 0.5
    for u in tensors if alike else [t]:
        if u["id"] == tid:
            u["dtype"] = new
    single = len(g["graph"]) == 1
    # one entry of a tensor used twice: two declarations; a single op's float tensor: not a float
    malformed = (not alike and sum(u["id"] == tid for u in tensors) > 1) or (
        single and new not in ("f32", "bf16", "f16") and old != "s32"
    )
    return (
        _as_files(g),
        "case.json",
        malformed,
        f"dtype of tensor {tid} {old} -> {new} ({'every entry' if alike else 'one entry'})",
    )


def m_rank(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    tensors = [t for t in _tensors(g) if t.get("shape")]
    t = _pick(rng, tensors)
    tid = t["id"]
    shape = list(t["shape"])
    if rng.random() < 0.5 or len(shape) < 2:
        shape.insert(int(rng.integers(len(shape) + 1)), int(_pick(rng, [1, 2, 5])))
    else:
        del shape[int(rng.integers(len(shape)))]
    if rng.random() < 0.3:
        shape = [] if rng.random() < 0.5 else [1] * int(rng.integers(13, 40))
    alike = rng.random() < 0.6
    for u in _tensors(g) if alike else [t]:
        if u["id"] == tid:
            u["shape"] = list(shape)
            u["stride"] = (
                list(shapes.dense_strides(shape)) if rng.random() < 0.5 else u.get("stride", [])
            )
    twice = sum(u["id"] == tid for u in _tensors(g)) > 1
    graph_input = tid in _graph_inputs(g)
    # a graph input's rank changed (the op's rank rule or the output shape breaks), or one
    # entry of a shared tensor changed (two declarations); [] on a computed tensor is "unknown"
    malformed = (
        (graph_input and shape != [] and tid in _conv_inputs(g))
        or (not alike and twice)
        or len(shape) > 12
    )
    return (
        _as_files(g),
        "case.json",
        malformed,
        f"rank of tensor {tid} -> {shape} ({'every entry' if alike else 'one entry'})",
    )


def _conv_inputs(g: dict[str, Any]) -> set[int]:
    """Ids of the ConvTranspose-family op's first two inputs (src/diff_dst, weights) and of
    the tensors their Dequantize ops read."""
    ids: set[int] = set()
    made = {t["id"]: op for op in g["graph"] for t in op["outputs"]}
    for op in g["graph"]:
        if str(op["kind"]).startswith("ConvTranspose"):
            for t in op["inputs"][:2]:
                ids.add(t["id"])
                p = made.get(t["id"])
                if p is not None and p["kind"] == "Dequantize":
                    ids.update(u["id"] for u in p["inputs"])
    return ids


def m_swap_ids(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    ids = sorted({t["id"] for t in _tensors(g)})
    if len(ids) < 2:
        return m_number(rng, g, text)
    a, b = (int(x) for x in rng.choice(ids, 2, replace=False))
    scope = _tensors(g) if rng.random() < 0.5 else [_pick(rng, _tensors(g))]
    for t in scope:
        if t["id"] in (a, b):
            t["id"] = b if t["id"] == a else a
    return _as_files(g), "case.json", False, f"swap tensor ids {a} and {b} ({len(scope)} entries)"


def m_two_tensors(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    """Give one entry the id of another tensor whose dtype or shape differ."""
    tensors = _tensors(g)
    pairs = [
        (s, t)
        for s in tensors
        for t in tensors
        if s["id"] != t["id"] and (s["dtype"], s["shape"]) != (t["dtype"], t["shape"])
    ]
    if not pairs:
        return m_dtype(rng, g, text)
    s, t = _pick(rng, pairs)
    old = s["id"]
    s["id"] = t["id"]
    return (
        _as_files(g),
        "case.json",
        True,
        f"entry of tensor {old} renamed {t['id']} (another dtype/shape)",
    )


def m_op_ids(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    ops = g["graph"]
    if len(ops) < 2:
        return m_duplicate(rng, g, text)
    a, b = rng.choice(len(ops), 2, replace=False)
    ops[int(a)]["id"] = ops[int(b)]["id"]
    return _as_files(g), "case.json", True, f"op {int(a)} gets the id of op {int(b)}"


def m_cycle(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    ops = g["graph"]
    op = _pick(rng, ops)
    if len(ops) == 1 or rng.random() < 0.4:  # an op reading its own output
        out = copy.deepcopy(op["outputs"][0])
        if op["inputs"]:
            op["inputs"][int(rng.integers(len(op["inputs"])))] = out
        else:
            op["inputs"].append(out)
        return _as_files(g), "case.json", True, f"op {op['id']} reads its own output {out['id']}"
    # a later op's output becomes an input of an earlier op on its path: find a consumer chain
    made = {t["id"]: k for k, o in enumerate(ops) for t in o["outputs"]}
    edges = [
        (made[t["id"]], k, j)
        for k, o in enumerate(ops)
        for j, t in enumerate(o["inputs"])
        if t["id"] in made
    ]
    if not edges:
        return m_cycle(rng, {"graph": [op], **{k: v for k, v in g.items() if k != "graph"}}, text)
    producer, consumer, _ = _pick(rng, edges)
    # the producer reads the consumer's output (declared as the consumer declares it)
    out = copy.deepcopy(ops[consumer]["outputs"][0])
    inputs = ops[producer]["inputs"]
    if inputs:
        inputs[int(rng.integers(len(inputs)))] = out
    else:
        inputs.append(out)
    return (
        _as_files(g),
        "case.json",
        True,
        f"ops {ops[producer]['id']} and {ops[consumer]['id']} feed each other",
    )


def m_float_attr(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    """An f32 attribute (scales, alpha, min, ...) or s64 zero point set to an extreme."""
    slots = [
        (op, name)
        for op in g["graph"]
        for name, a in op.get("attrs", {}).items()
        if a.get("type") in ("f32", "f32[]", "s64[]")
        and name in ("scales", "zps", "alpha", "beta", "min", "max")
    ]
    if not slots:
        return m_geometry(rng, g, text)
    op, name = _pick(rng, slots)
    attr = op["attrs"][name]
    value = _pick(
        rng,
        [
            0.0,
            -0.0,
            1e-45,
            1e-300,
            3e38,
            3.5e38,
            1e308,
            -2.0,
            0.3,
            2**24 + 1,
            2**31,
            -(2**31) - 1,
            255,
            -129,
        ],
    )
    if attr["type"] == "s64[]":
        value = int(value)
    count = len(attr["value"]) if isinstance(attr["value"], list) else 1
    attr["value"] = [value] * count if isinstance(attr["value"], list) else value
    out = json.dumps(g)
    if rng.random() < 0.1:  # JSON's NaN and Infinity literals (Python reads them)
        out = out.replace(json.dumps(value), _pick(rng, ["NaN", "Infinity", "-Infinity"]), 1)
    return {"case.json": out.encode()}, "case.json", False, f"op {op['id']} {name} = {value!r}"


UNKNOWN = -(2**63)


def _unknown_outputs(g: dict[str, Any], rng: np.random.Generator) -> None:
    """Make the shapes of the tensors ops compute unknown (the runner computes them)."""
    for op in g["graph"]:
        for t in op["outputs"]:
            tid = t["id"]
            unknown = [UNKNOWN] * len(t["shape"]) if rng.random() < 0.8 else []
            for u in _tensors(g):
                if u["id"] == tid:
                    u["shape"] = list(unknown)
                    u["stride"] = [UNKNOWN] * len(unknown)


def m_geometry(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    """Random small ConvTranspose attributes, the computed shapes unknown: valid or not,
    the case reaches the op (and the reference) with odd geometry."""
    changed = []
    for op in g["graph"]:
        if not str(op["kind"]).startswith("ConvTranspose"):
            continue
        attrs = op.setdefault("attrs", {})
        for name in ("strides", "dilations", "pads_begin", "pads_end", "output_padding"):
            if name in attrs and rng.random() < 0.5:
                n = len(attrs[name]["value"])
                low = 0 if name.startswith("pads") or name == "output_padding" else 1
                attrs[name]["value"] = [
                    int(rng.integers(low - (rng.random() < 0.1), low + 5)) for _ in range(n)
                ]
                changed.append(f"{name}={attrs[name]['value'][:3]}")
        if "auto_pad" in attrs and rng.random() < 0.3:
            attrs["auto_pad"]["value"] = _pick(rng, ["None", "SAME_UPPER", "SAME_LOWER", "VALID"])
            changed.append(f"auto_pad={attrs['auto_pad']['value']}")
        if "groups" in attrs and rng.random() < 0.2:
            attrs["groups"]["value"] = int(_pick(rng, [1, 2, 3, 4, 0, -1]))
            changed.append(f"groups={attrs['groups']['value']}")
    _unknown_outputs(g, rng)
    return _as_files(g), "case.json", False, "geometry " + " ".join(changed)


def m_sizes(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    """Graph inputs resized alike (small to far over the memory limit), the computed shapes
    unknown: the memory estimate, the fill and the reference on odd sizes."""
    inputs = _graph_inputs(g)
    tid = _pick(rng, inputs)
    factor = int(_pick(rng, [1, 2, 3, 7, 64, 1000, 10**5, 10**7]))
    dim = None
    for t in _tensors(g):
        if t["id"] == tid and t["shape"]:
            if dim is None:
                dim = int(rng.integers(len(t["shape"])))
            t["shape"] = list(t["shape"])
            t["shape"][dim] = max(1, t["shape"][dim]) * factor
            t["stride"] = list(shapes.dense_strides(t["shape"]))
    _unknown_outputs(g, rng)
    return _as_files(g), "case.json", False, f"tensor {tid} dim {dim} x{factor}"


def m_deep(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    depth = int(_pick(rng, [33, 100, 990, 5000, 100_000]))
    opener, closer = ("[", "]") if rng.random() < 0.5 else ('{"a":', "}")
    nested = opener * depth + "1" + closer * depth
    where = _pick(rng, ['"graph"', '"attrs"', '"extra"', '"value"'])
    out = (
        text.replace(f"{where}:", f'"deep": {nested}, {where}:', 1)
        if where in text and where != '"extra"'
        else ('{"extra": ' + nested + ", " + text.lstrip()[1:])
    )
    return {"case.json": out.encode()}, "case.json", True, f"nesting {depth} deep before {where}"


def m_truncate(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    body = text.rstrip()
    cut = int(rng.integers(0, len(body) - 1))
    return (
        {"case.json": body[:cut].encode()},
        "case.json",
        True,
        f"truncated to {cut} of {len(body)} characters",
    )


def m_random_bytes(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    data = text.encode()
    n = int(rng.integers(1, 40))
    kind = int(rng.integers(3))
    if kind == 0:  # overwrite some bytes
        b = bytearray(data)
        for _ in range(n):
            b[int(rng.integers(len(b)))] = int(rng.integers(256))
        out = bytes(b)
    elif kind == 1:  # a random file
        out = rng.integers(0, 256, size=int(rng.integers(0, 2000)), dtype=np.uint8).tobytes()
    else:  # random bytes inserted
        at = int(rng.integers(len(data)))
        out = data[:at] + rng.integers(0, 256, size=n, dtype=np.uint8).tobytes() + data[at:]
    # only a change that breaks UTF-8 or the JSON syntax is sure to be malformed: judged below
    return (
        {"case.json": out},
        "case.json",
        _not_json(out),
        f"random bytes ({['overwrite', 'file', 'insert'][kind]}, {n})",
    )


def _not_json(data: bytes) -> bool:
    try:
        json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return True
    return False


def m_non_utf8(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    data = text.encode()
    at = int(rng.integers(len(data)))
    bad = _pick(rng, [b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"])
    return (
        {"case.json": data[:at] + bad + data[at:]},
        "case.json",
        True,
        f"non-UTF-8 {bad!r} at {at}",
    )


def m_huge_file(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    pad = graph_json.MAX_JSON_BYTES + int(rng.integers(1, 100))
    return (
        {"case.json": text.encode() + b" " * pad},
        "case.json",
        True,
        f"file padded to {pad} bytes",
    )


def m_many(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    """Several JSON-level mutations in a row."""
    what, malformed = [], False
    for _ in range(int(rng.integers(2, 5))):
        files, _, bad, w = _pick(rng, [m_delete, m_retype, m_number, m_swap_ids, m_duplicate])(
            rng, g, text
        )
        g = json.loads(files["case.json"])
        what.append(w)
        malformed = malformed or bad
    return _as_files(g), "case.json", malformed, "; ".join(what)


# -- harness files --------------------------------------------------------------------------------
def _option(rng: np.random.Generator, g: dict[str, Any]) -> str:
    ids = _graph_inputs(g) or [0]
    op_ids = [op["id"] for op in g["graph"]]
    names = sorted({n for op in g["graph"] for n in op.get("attrs", {})}) or ["strides"]

    def dims() -> str:
        sizes = [0, 1, 2, 3, 4, 5, 8, 16, 2**31, 10**20, -1]
        return "x".join(str(int(_pick(rng, sizes))) for _ in range(int(rng.integers(0, 6))))

    def value() -> str:
        texts = [
            str(_pick(rng, ABSURD_NUMBERS)),
            "1.5",
            "nan",
            "inf",
            "-",
            "x",
            "1e999",
            "9" * 5000,
            "true",
        ]
        return str(_pick(rng, [dims(), *texts]))

    k = int(rng.integers(10))
    if k == 0:
        return "--dt=" + ",".join(
            _pick(rng, DTYPES[:8] + [f"{_pick(rng, ids)}:{_pick(rng, DTYPES[:6])}"])
            for _ in range(int(rng.integers(1, 4)))
        )
    if k == 1:
        return "--mb=" + ",".join(
            str(_pick(rng, [0, 1, 2, 3, 10**9, 2**40, -1])) for _ in range(int(rng.integers(1, 4)))
        )
    if k == 2:
        return "--in-shapes=" + "+".join(
            f"{_pick(rng, ids)}:{dims() or '-'}{_pick(rng, ['', '*acdb', '*abc', 'ba'])}"
            for _ in range(int(rng.integers(1, 3)))
        )
    if k == 3:
        return f"--op-attrs={_pick(rng, op_ids)}:{_pick(rng, names)}:{value()}"
    if k == 4:
        return str(
            _pick(
                rng,
                [
                    "--reset",
                    "--graph",
                    "--engine=cpu",
                    "-v5",
                    "--bogus",
                    "--case=",
                    "'unbalanced",
                    "--batch=",
                    "--bo\x1bgus=\x01",
                    "--case=a\x00b.json",
                    "--case=\u2028\ufffe.json",
                    "--batch=\x7f",
                    "--dt=f32\x0c",
                    "--in-shapes=0:\u0661x4x7",
                    "# \x00 comment",
                ],
            )
        )
    if k == 5:
        return f"--in-shapes={_pick(rng, ids)}:{dims()}"
    if k == 6:
        return f"--op-attrs={_pick(rng, op_ids)}:{_pick(rng, names)}:{dims()}"
    return "--case=case.json"


def m_harness(
    rng: np.random.Generator, g: dict[str, Any], text: str
) -> tuple[Files, str, bool, str]:
    lines = []
    for _ in range(int(rng.integers(1, 6))):
        opts = [_option(rng, g) for _ in range(int(rng.integers(0, 5)))]
        lines.append(" ".join(["--reset", *opts, "--case=case.json"]))
    harness = "\n".join(lines) + "\n"
    return (
        {"case.json": text.encode(), "harness_x": harness.encode()},
        "harness_x",
        False,
        "harness: " + " | ".join(lines)[:300],
    )


def m_batch(rng: np.random.Generator, g: dict[str, Any], text: str) -> tuple[Files, str, bool, str]:
    """Harness files that include each other, themselves, missing or unreadable files, or
    multiply their cases."""
    n = int(rng.integers(1, 5))
    names = [f"harness_{k}" for k in range(n)]
    files: Files = {"case.json": text.encode()}
    includes: dict[int, list[int]] = {}
    for k, name in enumerate(names):
        body = []
        for _ in range(int(rng.integers(1, 4))):
            target = int(rng.integers(n))
            includes.setdefault(k, []).append(target)
            body.append(f"--batch={names[target]}")
        body.append("--reset --case=case.json")
        files[name] = "\n".join(body).encode()
    reachable, cyclic = _reach(includes)
    extra = int(rng.integers(5))
    if extra == 0:
        files[names[-1]] += b"\n--batch=missing_file\n"
    elif extra == 1:
        files["bad"] = b"--case=case.json\n\xff\n"
        files[names[0]] += b"\n--batch=bad\n"
    elif extra == 2:
        mbs = ",".join(str(i) for i in range(1, 400))
        shapes = ",".join(f"0:{i}x4x7" for i in range(1, 400))
        files[names[0]] += (
            f"\n--reset --mb={mbs} --dt=f32,bf16,f16 --in-shapes={shapes} --case=case.json\n".encode()
        )
    elif extra == 3:
        files[names[0]] += b"\n--batch=.\n--batch=/dev/zero\n--batch=" + b"a" * 5000 + b"\n"
    # a file reading itself (directly or through others) is INVALID; so is a missing or bad one
    malformed_somewhere = cyclic or extra in (1, 2, 3) or (extra == 0 and n - 1 in reachable)
    return (
        files,
        names[0],
        malformed_somewhere,
        f"{n} harness files including each other {includes} (extra {extra})",
    )


def _reach(includes: dict[int, list[int]]) -> tuple[set[int], bool]:
    """(the files read from file 0, whether one of them includes a file being read)."""
    seen: set[int] = set()
    cyclic = False
    stack: list[tuple[int, list[int]]] = [(0, [0])]
    while stack:
        k, path = stack.pop()
        seen.add(k)
        for t in includes.get(k, []):
            if t in path:
                cyclic = True
            elif len(path) < 16:
                stack.append((t, path + [t]))
    return seen, cyclic


#: (mutation, weight); MALFORMING below: the mutations whose malformed flag is trusted
MUTATIONS: list[tuple[Mutation, int]] = [
    (m_delete, 8),
    (m_duplicate, 4),
    (m_retype, 8),
    (m_number, 10),
    (m_bigint, 3),
    (m_dtype, 6),
    (m_rank, 6),
    (m_swap_ids, 4),
    (m_two_tensors, 4),
    (m_op_ids, 2),
    (m_cycle, 5),
    (m_deep, 3),
    (m_truncate, 3),
    (m_random_bytes, 4),
    (m_non_utf8, 2),
    (m_huge_file, 1),
    (m_many, 6),
    (m_harness, 12),
    (m_batch, 5),
    (m_geometry, 10),
    (m_float_attr, 6),
    (m_sizes, 6),
]
MALFORMING = {m.__name__ for m, _ in MUTATIONS} - {"m_batch"}  # m_batch: "some case INVALID"


def _mutate(rng: np.random.Generator) -> tuple[Path, Files, str, bool, str, str]:
    seed = _pick(rng, SEEDS)
    text = seed.read_text(encoding="utf-8")
    g = json.loads(text)
    weights = np.array([w for _, w in MUTATIONS], dtype=float)
    mutation = MUTATIONS[int(rng.choice(len(MUTATIONS), p=weights / weights.sum()))][0]
    try:
        files, entry, malformed, what = mutation(rng, copy.deepcopy(g), text)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        # a structural mutation on a graph an earlier one broke: a plain retype instead
        mutation = m_retype
        files, entry, malformed, what = mutation(rng, copy.deepcopy(g), text)
    return seed, files, entry, malformed, what, mutation.__name__


def trial(rng: np.random.Generator, index: int) -> str:
    seed, files, entry, malformed, what, name = _mutate(rng)
    label = (
        f"{name} on {seed.relative_to(REPO) if seed.is_relative_to(REPO) else seed.name}: {what}"
    )
    directory = tempfile.mkdtemp(prefix="conformance_fuzz_")
    previous = onednn_convt.limits._limit  # the limit set before (None: the default)
    try:
        for fname, data in files.items():
            Path(directory, fname).write_bytes(data)
        onednn_convt.set_memory_limit(MEMORY_LIMIT)
        try:
            cases = collect([os.path.join(directory, entry)])
            results = run_cases(cases)
            reports(results, directory)
        except Exception as e:  # noqa: BLE001 - an escape is the finding
            raise Failure(
                f"{label}: {type(e).__name__} escaped: {e}\n{traceback.format_exc(limit=-6)}"
            ) from None
    finally:
        onednn_convt.set_memory_limit(previous)
        shutil.rmtree(directory, ignore_errors=True)
    outcomes = [r.outcome for r in results]
    errors = [r for r in results if r.outcome == ERROR]
    if errors:
        r = errors[0]
        raise Failure(f"{label}: ERROR {r.case.location} {r.case.id[:200]}: {r.message[:1500]}")
    if malformed and name in MALFORMING and PASSED in outcomes:
        r = next(r for r in results if r.outcome == PASSED)
        raise Failure(f"{label}: a malformed file PASSED ({r.case.location} {r.case.id[:200]})")
    if name == "m_batch" and malformed and INVALID not in outcomes:
        raise Failure(f"{label}: no case of the harness files is INVALID: {outcomes}")
    counts = {o: outcomes.count(o) for o in sorted(set(outcomes))}
    first = next((r.message.splitlines()[0][:160] for r in results if r.message), "")
    return f"{label[:400]} -> {counts} {first}"


def reports(results: list[Any], directory: str) -> None:
    """Write and read back the JSON and JUnit reports, and each result's report lines."""
    for r in results:
        report.describe(r, verbose=True)
    path = os.path.join(directory, "report.json")
    report.write_json(path, results, 0.0)
    with open(path, encoding="utf-8") as f:
        json.load(f)
    path = os.path.join(directory, "report.xml")
    report.write_junit(path, results, 0.0)
    ET.parse(path)

"""Hostile arguments to every public entry point of the package.

Each trial draws a small valid problem, an entry point (the three op classes, their
functions in ``functional.py``, ``with_constant_weights``, the legacy
``ConvTransposeBackpropFilters``, a fused or int8 ConvTranspose, ``PostOp`` /
``Dequantize`` / ``Quantize``, ``reference.*``, the ``set_*`` functions) and, in most
trials, one corruption of one argument: a value of the wrong type (strings, bytes, None,
dicts, NaN/inf, huge ints, bools, NumPy scalars, nested lists, objects with a lying
``__len__`` / ``__array__`` / ``__dlpack__``, ndarray subclasses, torch tensors), a wrong
dtype (int, object, complex, structured, datetime, ...), a wrong rank or shape (empty dims,
huge broadcast views of stride 0), a bad attribute value, or an ``out=`` that is read-only,
misaligned, aliased, of the wrong dtype.

A corruption is tagged ``invalid`` (the call must raise), ``valid`` (a different spelling
of a valid call: it must succeed) or ``maybe``. A trial passes when the call either
succeeds with a result matching the float64 reference (where the call was valid), or
raises ``ValueError``, ``TypeError``, ``MemoryError`` or the package's ``UnsupportedError``
with a message naming the entry point. The fuzzer's own hostile objects raise
:class:`Hostile`; that exception propagating is right (the package does not swallow a
caller's exception). Anything else (another exception, a crash, a hang) is a finding.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onednn_convt as oc
from harness import Failure
from onednn_convt import Dequantize, PostOp, Quantize, accuracy, reference

NAME = "api"
PER_PROCESS = 40
TIMEOUT = 60.0
DTYPES = {"f32": np.dtype(np.float32), "bf16": oc.dtypes.FLOAT_DTYPES["bf16"], "f16": np.dtype(np.float16)}
FWD, BWD_D, BWD_W = "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"
FUNCTIONS = {FWD: "conv_transpose", BWD_D: "conv_transpose_backward_data", BWD_W: "conv_transpose_backward_weights"}
LISTS = ("strides", "pads_begin", "pads_end", "dilations", "output_padding")
ALLOWED = (ValueError, TypeError, MemoryError, oc.UnsupportedError)


class Hostile(Exception):
    """Raised by the fuzzer's hostile objects: the caller's own exception, which may propagate."""


# -- hostile objects ---------------------------------------------------------------------------
class LyingLen:
    """Says it has ``n`` items, then fails to give them."""

    def __init__(self, n: int, how: str) -> None:
        self.n, self.how = n, how

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if self.how == "index":
            raise IndexError(i)
        if self.how == "hostile":
            raise Hostile("__getitem__")
        return 1.0 if i < 2 else [1.0, 2.0]  # ragged

    def __iter__(self) -> Any:
        if self.how == "hostile":
            raise Hostile("__iter__")
        return iter([1, 2])


class LyingArray:
    """Has ``__array__`` that raises, or returns something that is not the array it claims."""

    def __init__(self, how: str, shape: tuple[int, ...] = (2, 2)) -> None:
        self.how, self.shape = how, shape

    def __len__(self) -> int:
        return self.shape[0] if self.shape else 0

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        if self.how == "hostile":
            raise Hostile("__array__")
        if self.how == "list":
            return [[1.0, 2.0]]
        if self.how == "none":
            return None
        if self.how == "string":
            return "not an array"
        return np.ones(self.shape, np.float32)  # "shape": the wrong shape


class LyingDLPack:
    """A DLPack producer whose ``__dlpack__`` / ``__dlpack_device__`` misbehave."""

    def __init__(self, how: str, array: np.ndarray | None = None) -> None:
        self.how = how
        self.array = np.ones((2, 3, 3), np.float32) if array is None else array
        self._capsule: Any = None

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **_: Any) -> Any:
        if self.how == "raises":
            raise Hostile("__dlpack__")
        if self.how == "int":
            return 42
        if self.how == "none":
            return None
        if self.how == "string":
            return "capsule"
        if self.how == "reused":  # the same capsule twice: consumed after the first import
            if self._capsule is None:
                self._capsule = self.array.__dlpack__()
            return self._capsule
        if self.how == "old":  # a producer older than DLPack 1.0: no max_version keyword
            if max_version is not None:
                raise TypeError("unexpected keyword max_version")
            return self.array.__dlpack__()
        return self.array.__dlpack__(max_version=max_version) if max_version else self.array.__dlpack__()

    def __dlpack_device__(self) -> Any:
        if self.how == "device_raises":
            raise Hostile("__dlpack_device__")
        if self.how == "device_none":
            return None
        if self.how == "device_string":
            return "cpu"
        if self.how == "device_short":
            return ()
        if self.how == "device_cuda":
            return (2, 0)
        if self.how == "device_huge":
            return (2**70, 0)
        return (1, 0)


class Tagged(np.ndarray):
    """A user's own ndarray subclass."""


class HashRaises:
    """An attribute value whose hash raises (the functions cache ops by attributes)."""

    def __hash__(self) -> int:
        raise Hostile("__hash__")

    def __index__(self) -> int:
        return 1


def _memmap(a: np.ndarray) -> np.memmap:
    fd, path = tempfile.mkstemp(prefix="api_fuzz_")
    os.close(fd)
    m = np.memmap(path, a.dtype, "w+", shape=a.shape)
    m[...] = a
    os.unlink(path)  # the mapping keeps the memory
    return m


def _misaligned(a: np.ndarray) -> np.ndarray:
    buf = np.zeros(a.nbytes + 1, np.uint8)
    view = np.ndarray(a.shape, a.dtype, buffer=buf, offset=1)
    view[...] = a
    return view


def _read_only(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


# -- a valid problem ---------------------------------------------------------------------------
@dataclass
class Problem:
    """One small valid problem: shapes and attributes of the three ops."""

    code: str
    rank: int
    n: int
    ic: int
    oc: int
    groups: int
    kernel: list[int]
    src: list[int]
    attrs: dict[str, Any]
    dst: list[int] = field(default_factory=list)

    @property
    def dtype(self) -> np.dtype[Any]:
        return DTYPES[self.code]

    def act(self, c: int, spatial: list[int]) -> tuple[int, ...]:
        return (self.n, c, *spatial) if self.attrs["data_format"] == "NCX" else (self.n, *spatial, c)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        o = self.oc // self.groups
        return (self.ic, o, *self.kernel) if self.attrs["weights_format"] == "IOX" else (*self.kernel, o, self.ic)


def draw(rng: np.random.Generator) -> Problem:
    rank = int(rng.choice([1, 2, 3], p=[0.3, 0.5, 0.2]))
    groups = int(rng.choice([1, 1, 1, 2, 3]))
    ic, oc_ = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 5))
    kernel = [int(rng.integers(1, 4)) for _ in range(rank)]
    strides = [int(rng.integers(1, 4)) for _ in range(rank)]
    dil = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
    ek = [d * (k - 1) + 1 for k, d in zip(kernel, dil)]
    pb = [int(rng.integers(0, e)) for e in ek]
    pe = [int(rng.integers(0, e)) for e in ek]
    op_ = [int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in strides]
    src = [int(rng.integers(1, 6)) for _ in range(rank)]
    attrs: dict[str, Any] = {"strides": strides, "pads_begin": pb, "pads_end": pe, "dilations": dil, "output_padding": op_,
                                 "groups": groups, "data_format": str(rng.choice(["NCX", "NXC"])),
                                 "weights_format": str(rng.choice(["IOX", "XOI"]))}
    dst = [s * (x - 1) + e - b - a + o for x, s, e, b, a, o in zip(src, strides, ek, pb, pe, op_)]
    if min(dst) < 1:  # pads crop everything: no pads
        attrs["pads_begin"], attrs["pads_end"] = [0] * rank, [0] * rank
        dst = [s * (x - 1) + e + o for x, s, e, o in zip(src, strides, ek, op_)]
    code = str(rng.choice(["f32", "f32", "bf16", "f16"]))
    return Problem(code, rank, int(rng.integers(1, 3)), ic, oc_, groups, kernel, src, attrs, dst)


def _bwd(attrs: dict[str, Any]) -> dict[str, Any]:
    """The reference's backward functions take no output_padding."""
    return {k: v for k, v in attrs.items() if k != "output_padding"}


@dataclass
class Case:
    """One call: what it is, the names its errors must carry, and how to judge a result."""

    what: str
    names: tuple[str, ...]
    call: Callable[[], Any]
    expect: str = "valid"  # "valid", "invalid", "maybe"
    check: Callable[[Any], None] | None = None
    cleanup: Callable[[], None] | None = None


def compare(what: str, got: Any, ref: np.ndarray, mag: np.ndarray, code: str, reduction: int,
            dtype: Any = None) -> None:
    """``got`` matches ``ref`` within the accuracy rule, judged on the magnitude ``mag``."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(got, torch.Tensor):
        got = got.float().numpy() if got.dtype == torch.bfloat16 else got.numpy()
    if not isinstance(got, np.ndarray):
        raise Failure(f"{what}: returned {type(got).__name__}, expected an array")
    if got.shape != ref.shape:
        raise Failure(f"{what}: result shape {got.shape}, expected {ref.shape}")
    if dtype is not None and got.dtype != dtype:
        raise Failure(f"{what}: result dtype {got.dtype}, expected {dtype}")
    g = np.asarray(got, np.float64)
    if not np.all(np.isfinite(g)):
        raise Failure(f"{what}: non-finite values in the result")
    tol = accuracy.tolerance(code, reduction) * (float(np.max(mag)) if mag.size else 0.0)
    err = float(np.max(np.abs(g - ref))) if ref.size else 0.0
    if err > tol:
        raise Failure(f"{what}: off by {err:.3g} (tolerance {tol:.3g})")


# -- the inputs of each op, valid -------------------------------------------------------------
def tensors(p: Problem, op: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    dt = p.dtype
    src = rng.uniform(-1, 1, p.act(p.ic, p.src)).astype(dt)
    w = rng.uniform(-1, 1, p.weights_shape).astype(dt)
    dd = rng.uniform(-1, 1, p.act(p.oc, p.dst)).astype(dt)
    if op == FWD:
        out = {"src": src, "weights": w}
        if rng.random() < 0.5:
            out["bias"] = rng.uniform(-1, 1, p.oc).astype(dt)
        return out
    if op == BWD_D:
        return {"diff_dst": dd, "weights": w}
    out = {"src": src, "diff_dst": dd}
    if rng.random() < 0.5:
        out["weights_shape"] = np.array(p.weights_shape, np.int32)
    return out


def reference_of(p: Problem, op: str, t: dict[str, Any], attrs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """(reference, magnitude of the terms, reduction length) of a valid call."""
    f64 = {k: np.asarray(v, np.float64) for k, v in t.items() if k != "weights_shape"}
    ab = {k: np.abs(v) for k, v in f64.items()}
    k = math.prod(p.kernel)
    if op == FWD:
        return (reference.conv_transpose(f64["src"], f64["weights"], f64.get("bias"), **attrs),
                reference.conv_transpose(ab["src"], ab["weights"], ab.get("bias"), **attrs), (p.ic // p.groups) * k)
    if op == BWD_D:
        return (reference.conv_transpose_backward_data(f64["diff_dst"], f64["weights"], **_bwd(attrs)),
                reference.conv_transpose_backward_data(ab["diff_dst"], ab["weights"], **_bwd(attrs)),
                (p.oc // p.groups) * k)
    return (reference.conv_transpose_backward_weights(f64["src"], f64["diff_dst"], p.weights_shape, **_bwd(attrs)),
            reference.conv_transpose_backward_weights(ab["src"], ab["diff_dst"], p.weights_shape, **_bwd(attrs)),
            p.n * math.prod(p.dst))


def out_shape(p: Problem, op: str) -> tuple[int, ...]:
    return {FWD: p.act(p.oc, p.dst), BWD_D: p.act(p.ic, p.src), BWD_W: p.weights_shape}[op]


# -- corruptions --------------------------------------------------------------------------------
def tensor_corruptions(p: Problem, a: np.ndarray) -> list[tuple[str, Callable[[], Any], str]]:
    """(label, make the value, expectation) for an input tensor ``a``."""
    shape = a.shape
    torch = None
    out: list[tuple[str, Callable[[], Any], str]] = [
        ("None", lambda: None, "invalid"),
        ("str", lambda: "abc", "invalid"),
        ("bytes", lambda: b"xy", "invalid"),
        ("float", lambda: 3.5, "invalid"),
        ("nan", lambda: float("nan"), "invalid"),
        ("huge int", lambda: 10**30, "invalid"),
        ("bool", lambda: True, "invalid"),
        ("dict", dict, "invalid"),
        ("set", lambda: {1, 2}, "invalid"),
        ("object", lambda: object(), "invalid"),
        ("function", lambda: print, "invalid"),
        ("numpy scalar", lambda: a.dtype.type(1.0) if a.dtype.kind == "f" else np.float32(1), "invalid"),
        ("ragged list", lambda: [[1.0, 2.0], [3.0]], "invalid"),
        ("nested list (float64)", lambda: a.astype(np.float64).tolist(), "invalid"),
        ("float64", lambda: a.astype(np.float64), "invalid"),
        ("int32", lambda: a.astype(np.int32), "invalid"),
        ("int64", lambda: a.astype(np.int64), "invalid"),
        ("uint8", lambda: a.astype(np.uint8), "invalid"),
        ("bool array", lambda: a.astype(bool), "invalid"),
        ("object array", lambda: a.astype(object), "invalid"),
        ("complex", lambda: a.astype(np.complex64), "invalid"),
        ("structured", lambda: np.zeros(shape, [("a", "f4"), ("b", "f4")]), "invalid"),
        ("datetime", lambda: np.zeros(shape, "datetime64[s]"), "invalid"),
        ("unicode", lambda: np.zeros(shape, "<U3"), "invalid"),
        ("void", lambda: np.zeros(shape, "V4"), "invalid"),
        ("longdouble", lambda: a.astype(np.longdouble), "invalid"),
        ("big-endian", lambda: a.astype(a.dtype.newbyteorder(">")) if a.dtype.kind == "f" and a.dtype.itemsize > 1
            and a.dtype.byteorder != "|" and a.dtype != DTYPES["bf16"] else a.astype(">f8"), "maybe"),
        ("rank 0", lambda: np.ones((), a.dtype), "invalid"),
        ("rank 1", lambda: np.ones((3,), a.dtype), "invalid"),
        ("rank 2", lambda: np.ones((2, 3), a.dtype), "invalid"),
        ("rank 6", lambda: np.ones((1,) * 6, a.dtype), "invalid"),
        ("rank 7", lambda: np.ones(shape + (1,) * (7 - len(shape)), a.dtype), "invalid"),
        ("empty dim", lambda: np.ones(shape[:-1] + (0,), a.dtype), "invalid"),
        ("empty first dim", lambda: np.ones((0,) + shape[1:], a.dtype), "invalid"),
        ("huge broadcast 2**31", lambda: np.broadcast_to(np.ones((1,) * len(shape), a.dtype), (2**31,) + shape[1:]), "maybe"),
        ("huge broadcast 2**40", lambda: np.broadcast_to(np.ones((1,) * len(shape), a.dtype), shape[:-1] + (2**40,)), "invalid"),
        ("huge broadcast every dim", lambda: np.broadcast_to(np.ones((1,) * len(shape), a.dtype), (2**12,) * len(shape)), "invalid"),
        ("lying __len__ (IndexError)", lambda: LyingLen(5, "index"), "invalid"),
        ("lying __len__ (huge)", lambda: LyingLen(2**62, "index"), "invalid"),
        ("lying __len__ (negative)", lambda: LyingLen(-1, "index"), "invalid"),
        ("lying __len__ (ragged)", lambda: LyingLen(3, "ragged"), "invalid"),
        ("lying __len__ (raises)", lambda: LyingLen(3, "hostile"), "invalid"),
        ("__array__ raises", lambda: LyingArray("hostile"), "invalid"),
        ("__array__ gives a list", lambda: LyingArray("list"), "invalid"),
        ("__array__ gives None", lambda: LyingArray("none"), "invalid"),
        ("__array__ gives a string", lambda: LyingArray("string"), "invalid"),
        ("__array__ of the wrong shape", lambda: LyingArray("shape", (2, 2)), "invalid"),
        ("__dlpack__ raises", lambda: LyingDLPack("raises"), "invalid"),
        ("__dlpack__ gives an int", lambda: LyingDLPack("int"), "invalid"),
        ("__dlpack__ gives None", lambda: LyingDLPack("none"), "invalid"),
        ("__dlpack__ gives a string", lambda: LyingDLPack("string"), "invalid"),
        ("__dlpack__ capsule reused", lambda: LyingDLPack("reused", a), "maybe"),
        ("__dlpack__ without max_version", lambda: LyingDLPack("old", a), "maybe"),
        ("__dlpack_device__ raises", lambda: LyingDLPack("device_raises", a), "invalid"),
        ("__dlpack_device__ gives None", lambda: LyingDLPack("device_none", a), "invalid"),
        ("__dlpack_device__ gives a string", lambda: LyingDLPack("device_string", a), "invalid"),
        ("__dlpack_device__ gives ()", lambda: LyingDLPack("device_short", a), "invalid"),
        ("__dlpack_device__ says cuda", lambda: LyingDLPack("device_cuda", a), "invalid"),
        ("__dlpack_device__ huge", lambda: LyingDLPack("device_huge", a), "invalid"),
        ("memmap", lambda: _memmap(a), "valid"),
        ("user subclass", lambda: a.view(Tagged), "valid"),
        ("masked array", lambda: np.ma.masked_array(a), "invalid"),
        ("np.matrix", lambda: np.asmatrix(np.ones((2, 2), np.float32)), "invalid"),
        ("recarray", lambda: np.rec.array(np.zeros(shape, [("a", "f4")])), "invalid"),
        ("Fortran order", lambda: np.asfortranarray(a), "valid"),
        ("reversed", lambda: np.flip(np.flip(a).copy()), "valid"),
        ("step view", lambda: np.repeat(a, 2, axis=-1)[..., ::2], "valid"),
        ("misaligned", lambda: _misaligned(a), "valid"),
        ("read-only", lambda: _read_only(a), "valid"),
        ("zero-stride view of a constant", lambda: np.broadcast_to(a.reshape(-1)[:1].reshape((1,) * a.ndim), shape), "valid"),
        ("wrong shape (+1 on last dim)", lambda: np.ones(shape[:-1] + (shape[-1] + 1,), a.dtype), "maybe"),
        ("wrong shape (+5 on first dim)", lambda: np.ones((shape[0] + 5,) + shape[1:], a.dtype), "maybe"),
    ]
    if _torch() is not None:
        torch = _torch()
        out += [
            ("torch tensor", lambda: torch.from_numpy(np.asarray(a, np.float32)).to(
                {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[p.code]), "maybe"),
            ("torch requires_grad", lambda: torch.ones(shape, requires_grad=True), "invalid"),
            ("torch float64", lambda: torch.ones(shape, dtype=torch.float64), "invalid"),
            ("torch int", lambda: torch.ones(shape, dtype=torch.int32), "invalid"),
            ("torch complex", lambda: torch.ones(shape, dtype=torch.complex64), "invalid"),
            ("torch meta device", lambda: torch.ones(shape, device="meta"), "invalid"),
            ("torch sparse", lambda: torch.ones(shape).to_sparse(), "invalid"),
            ("torch conj view", lambda: torch.ones(shape, dtype=torch.complex64).conj(), "invalid"),
            ("torch quantized", lambda: torch.quantize_per_tensor(torch.ones(shape), 0.1, 0, torch.quint8), "invalid"),
        ]
    return out


def weights_shape_corruptions(p: Problem) -> list[tuple[str, Callable[[], Any], str]]:
    """The weights_shape input of BackwardWeights: any 1-D integer array-like is valid."""
    ws = list(p.weights_shape)
    return [
        ("int64", lambda: np.array(ws, np.int64), "valid"), ("uint8", lambda: np.array(ws, np.uint8), "valid"),
        ("list", lambda: list(ws), "maybe"), ("tuple", lambda: tuple(ws), "maybe"),
        ("float", lambda: np.array(ws, np.float32), "invalid"), ("2-d", lambda: np.array([ws], np.int32), "invalid"),
        ("one too long", lambda: np.array(ws + [1], np.int32), "invalid"), ("zero", lambda: np.array([0] * len(ws)), "invalid"),
        ("negative", lambda: np.array([-1] * len(ws)), "invalid"), ("huge", lambda: np.array([2**40] * len(ws)), "invalid"),
        ("2**63-1", lambda: np.array([2**63 - 1] * len(ws)), "invalid"), ("uint64 2**64-1", lambda: np.array([2**64 - 1] * len(ws), np.uint64), "invalid"),
        ("strings", lambda: [str(v) for v in ws], "invalid"), ("bool array", lambda: np.ones(len(ws), bool), "invalid"),
        ("object array", lambda: np.array(ws, object), "maybe"), ("None", lambda: None, "maybe"),
        ("lying __len__", lambda: LyingLen(len(ws), "hostile"), "invalid"), ("masked", lambda: np.ma.masked_array(ws), "invalid"),
        ("mismatching", lambda: np.array([v + 1 for v in ws]), "invalid"),
    ]


def list_attr_corruptions(rank: int, name: str, current: Any) -> list[tuple[str, Any, str]]:
    ones = [1] * rank
    bad: list[tuple[str, Any, str]] = [
        ("None", None, "maybe"), ("str", "1", "invalid"), ("bytes", b"1", "invalid"), ("float", 1.5, "invalid"),
        ("nan", float("nan"), "invalid"), ("inf", float("inf"), "invalid"), ("bool", True, "invalid"),
        ("dict", {1: 2}, "invalid"), ("set", {1}, "invalid"), ("object", object(), "invalid"),
        ("complex", 3j, "invalid"), ("list of floats", [1.0] * rank, "invalid"), ("list of None", [None] * rank, "invalid"),
        ("nested list", [ones], "invalid"), ("too long", ones + [1], "invalid"), ("empty list", [], "invalid"),
        ("2**31", [2**31] * rank, "invalid"), ("2**63", [2**63] * rank, "invalid"), ("2**64", [2**64] * rank, "invalid"),
        ("10**30", [10**30] * rank, "invalid"), ("-1", [-1] * rank, "invalid"), ("-2**63", [-(2**63)] * rank, "invalid"),
        ("lying __len__", LyingLen(rank, "hostile"), "invalid"), ("0-d array", np.array(1), "maybe"),
        ("2-d array", np.ones((1, rank), np.int64), "invalid"), ("float array", np.ones(rank), "invalid"),
        ("generator", (1 for _ in range(rank)), "maybe"), ("hash raises", HashRaises(), "maybe"),
        ("numpy ints", [np.int64(v) for v in current], "valid"), ("tuple", tuple(current), "valid"),
        ("numpy array", np.array(current, np.int32), "maybe"),
    ]
    if name in ("strides", "dilations"):
        bad.append(("zero", [0] * rank, "invalid"))
    return bad


STRING_BAD: list[tuple[str, Any, str]] = [
    ("None", None, "maybe"),  # not given: the default ("int", 1, "invalid"), ("bytes", b"NCX", "invalid"), ("empty", "", "invalid"),
    ("trailing space", "NCX ", "invalid"), ("nonsense", "NCHW", "invalid"), ("list", ["NCX"], "invalid"),
    ("object", object(), "invalid"), ("unicode", "NCX\u200b", "invalid"), ("very long", "N" * 100000, "invalid"),
]
GROUPS_BAD: list[tuple[str, Any, str]] = [
    ("0", 0, "invalid"), ("-1", -1, "invalid"), ("True", True, "invalid"), ("1.5", 1.5, "invalid"),
    ("2**63", 2**63, "invalid"), ("2**64", 2**64, "invalid"), ("'2'", "2", "invalid"), ("None", None, "invalid"),
    ("[1]", [1], "maybe"), ("nan", float("nan"), "invalid"), ("huge 2**40", 2**40, "invalid"),
]
BOOL_BAD: list[tuple[str, Any, str]] = [
    ("'False'", "False", "invalid"), ("'no'", "no", "invalid"), ("0", 0, "invalid"), ("1", 1, "invalid"),
    ("None", None, "invalid"), ("0.0", 0.0, "invalid"), ("[False]", [False], "invalid"),
    ("np.False_", np.False_, "valid"), ("False", False, "valid"),
]


def attr_corruption(p: Problem, rng: np.random.Generator, attrs: dict[str, Any]) -> tuple[str, str]:
    """Corrupt one attribute of ``attrs`` in place; (label, expectation)."""
    name = str(rng.choice(["list", "list", "string", "groups", "strict", "unknown", "output_padding", "auto_pad"]))
    if name == "list":
        attr = str(rng.choice(LISTS[:4]))
        options = list_attr_corruptions(p.rank, attr, attrs[attr])
        label, value, expect = options[int(rng.integers(len(options)))]
        attrs[attr] = value
        return f"{attr}={label}", expect
    if name == "string":
        attr = str(rng.choice(["data_format", "weights_format", "auto_pad"]))
        label, value, expect = STRING_BAD[int(rng.integers(len(STRING_BAD)))]
        attrs[attr] = value
        return f"{attr}={label}", expect
    if name == "groups":
        label, value, expect = GROUPS_BAD[int(rng.integers(len(GROUPS_BAD)))]
        attrs["groups"] = value
        if label == "None":  # not given: groups 1, which other shapes may fit
            expect = "maybe"
        if label == "[1]":  # a one-element list (the library's reading of it)
            expect = "maybe" if p.groups == 1 else "invalid"
        return f"groups={label}", expect
    if name == "strict":
        label, value, expect = BOOL_BAD[int(rng.integers(len(BOOL_BAD)))]
        attrs["strict"] = value
        return f"strict={label}", expect
    if name == "unknown":
        attr = str(rng.choice(["stride", "padding", "kernel_shape", "filter_format", "bias", "dilation", "__class__"]))
        attrs[attr] = 1
        return f"unknown attribute {attr}", "invalid"
    if name == "output_padding":
        s = attrs["strides"]
        value = list(s)  # == stride: too large
        choice = int(rng.integers(4))
        if choice == 1:
            value = [-1] * p.rank
        elif choice == 2:
            value = [2**62] * p.rank
        elif choice == 3:
            value = [0.5] * p.rank
        attrs["output_padding"] = value
        return f"output_padding={value}", "invalid"
    value = str(rng.choice(["same_upper", "SAME_LOWER", "valid", "none", "Same_Upper", "NOTSET", "EXPLICIT"]))
    attrs["auto_pad"] = value
    # lower or mixed case is valid (spec D2); SAME pads change dst's size: maybe
    return f"auto_pad={value!r}", "invalid" if value in ("NOTSET", "EXPLICIT") else "maybe"


def out_corruptions(p: Problem, shape: tuple[int, ...], dt: Any, inputs: dict[str, np.ndarray]) -> list[tuple[str, Callable[[], Any], str]]:
    torch = _torch()
    first = next(iter(inputs.values()))
    out: list[tuple[str, Callable[[], Any], str]] = [
        ("wrong shape", lambda: np.zeros(shape[:-1] + (shape[-1] + 1,), dt), "invalid"),
        ("wrong rank", lambda: np.zeros(shape + (1,), dt), "invalid"),
        ("wrong dtype (float64)", lambda: np.zeros(shape, np.float64), "invalid"),
        ("wrong dtype (int32)", lambda: np.zeros(shape, np.int32), "invalid"),
        ("read-only", lambda: _read_only(np.zeros(shape, dt)), "invalid"),
        ("broadcast", lambda: np.broadcast_to(np.zeros((1,) * len(shape), dt), shape), "invalid" if math.prod(shape) > 1 else "maybe"),
        ("zero-strided writeable", lambda: np.lib.stride_tricks.as_strided(np.zeros(1, dt), shape, (0,) * len(shape)),
         "invalid" if math.prod(shape) > 1 else "maybe"),
        ("flipped", lambda: np.flip(np.zeros(shape, dt)), "maybe"),
        ("misaligned", lambda: _misaligned(np.zeros(shape, dt)), "maybe"),
        ("strided view", lambda: np.zeros(shape[:-1] + (2 * shape[-1],), dt)[..., ::2], "valid"),
        ("strided view, step 4", lambda: np.zeros(shape[:-1] + (4 * shape[-1],), dt)[..., ::4], "valid"),
        ("Fortran order", lambda: np.asfortranarray(np.zeros(shape, dt)), "valid"),
        ("memmap", lambda: _memmap(np.zeros(shape, dt)), "valid"),
        ("user subclass", lambda: np.zeros(shape, dt).view(Tagged), "valid"),
        ("masked array", lambda: np.ma.masked_array(np.zeros(shape, dt)), "invalid"),
        ("a list", lambda: np.zeros(shape, dt).tolist(), "invalid"),
        ("a string", lambda: "out", "invalid"),
        ("an input itself", lambda: first, "invalid"),
        ("an input's memory, reshaped", lambda: first.reshape(-1)[: math.prod(shape)].reshape(shape)
            if first.size >= math.prod(shape) and first.dtype == dt else np.zeros(shape, np.int8), "invalid"),
        ("__dlpack__ raises", lambda: LyingDLPack("raises"), "invalid"),
    ]
    if torch is not None:
        out.append(("torch tensor with NumPy inputs", lambda: torch.zeros(shape), "invalid"))
    return out


# -- entry points ---------------------------------------------------------------------------------
def op_case(p: Problem, rng: np.random.Generator, op: str, how: str) -> Case:
    """The op class, its function, or with_constant_weights, with one corruption (or none)."""
    t = tensors(p, op, rng)
    attrs = dict(p.attrs)
    if op != FWD and rng.random() < 0.5:
        attrs.pop("output_padding")  # the backward ops' output_padding is optional
    if op == BWD_W and "weights_shape" not in t:
        attrs["weights_shape"] = list(p.weights_shape)
    clean_attrs = dict(attrs)
    clean_t = dict(t)
    names = (op, FUNCTIONS[op]) if how == "function" else (op,)
    if how == "constant":
        names = (op, "with_constant_weights")
    out: Any = None
    expect, label = "valid", "valid call"
    kind = str(rng.choice(["none", "tensor", "tensor", "attr", "attr", "out", "arity"], p=[0.15, 0.2, 0.2, 0.15, 0.15, 0.1, 0.05]))
    shape = out_shape(p, op)
    if kind == "tensor":
        name = str(rng.choice(list(t)))
        options = weights_shape_corruptions(p) if name == "weights_shape" else tensor_corruptions(p, t[name])
        label, make, expect = options[int(rng.integers(len(options)))]
        t[name] = make()
        if label == "None" and name in ("bias", "weights_shape"):
            expect = "maybe"  # an optional input not given
        label = f"{name}={label}"
    elif kind == "attr":
        label, expect = attr_corruption(p, rng, attrs)
        if "strict" in attrs and expect == "valid":
            clean_attrs["strict"] = attrs["strict"]
        if "=numpy ints" in label or "=tuple" in label:
            pass
    elif kind == "out":
        options = out_corruptions(p, shape, p.dtype, t)
        label, make, expect = options[int(rng.integers(len(options)))]
        out = make()
        label = f"out={label}"
    elif kind == "arity":
        label, expect = "one input too many", "invalid"
        t["extra"] = np.ones(3, p.dtype)
        if op == BWD_W and "weights_shape" not in t:
            t["weights_shape"] = np.array(p.weights_shape, np.int32)
    elif rng.random() < 0.3:  # a valid out=
        out = np.zeros(shape, p.dtype)
        label = "valid call with out="
    # a generator is consumed by the call: the check normalizes a list of the same values
    norm_attrs = dict(attrs)
    for key, value in list(attrs.items()):
        if isinstance(value, types.GeneratorType):
            norm_attrs[key] = list(value)
            attrs[key] = (v for v in norm_attrs[key])
    inputs = list(t.values())
    if op == FWD and "bias" not in t and "extra" in t:
        inputs.insert(2, None)
    cls = {FWD: oc.ConvTranspose, BWD_D: oc.ConvTransposeBackwardData, BWD_W: oc.ConvTransposeBackwardWeights}[op]
    fn = {FWD: oc.conv_transpose, BWD_D: oc.conv_transpose_backward_data, BWD_W: oc.conv_transpose_backward_weights}[op]
    what = f"{how} {op} {p.code} rank={p.rank} {label} attrs={attrs}"

    def call() -> Any:
        kw = {} if out is None else {"out": out}
        if how == "function":
            return fn(*inputs, **kw, **attrs)
        if how == "constant":
            bound = cls(**attrs).with_constant_weights(t["weights"])
            rest = [v for k, v in t.items() if k != "weights"]
            if op == FWD and "bias" not in t and "extra" in t:
                rest.insert(1, None)  # the extra input after a bias not given
            return bound(*rest, **kw)
        return cls(**attrs)(*inputs, **kw)

    def check(result: Any) -> None:
        # the values the call saw: arrays as given (views, subclasses, other shapes), the
        # clean arrays behind other objects; the attributes as the op normalized them
        used = {k: np.asarray(v) if isinstance(v, np.ndarray) and not isinstance(v, np.ma.MaskedArray) else clean_t[k]
                for k, v in t.items() if k in clean_t}
        ref_attrs = {k: v for k, v in cls(**norm_attrs).attrs.items() if v is not None and k != "weights_shape"}
        if used.get("weights_shape") is not None or "weights_shape" in clean_attrs:
            ref_attrs.pop("output_padding", None)
        ref, mag, _ = reference_of(p, op, used, ref_attrs)
        w = used.get("weights", used.get("src"))
        red = int(w.size) if op != BWD_W else p.n * math.prod(p.dst)  # an upper bound: shapes may differ
        if out is not None and result is not out:
            raise Failure(f"{what}: out= given, the result is not out")
        if isinstance(result, np.ma.MaskedArray):
            raise Failure(f"{what}: a masked array result")
        compare(what, np.asarray(result) if isinstance(result, np.ndarray) else result, ref, mag, p.code, red)

    return Case(what, names, call, expect, check)


def fused_case(p: Problem, rng: np.random.Generator) -> Case:
    """A float fused ConvTranspose (post_ops=) with one corruption of its post-ops or tensors."""
    t = tensors(p, FWD, rng)
    attrs = dict(p.attrs)
    dst = p.act(p.oc, p.dst)
    kinds = ["ReLU", "Tanh", "Sigmoid", "Abs", "Add", "Multiply", "Maximum", "Clamp", "LeakyReLU"]
    chain_kinds = [str(k) for k in rng.choice(kinds, int(rng.integers(1, 4)))]
    extra = {"Clamp": {"min": -0.5, "max": 0.5}, "LeakyReLU": {"alpha": 0.1}}
    chain: list[Any] = [PostOp(k, **extra.get(k, {})) for k in chain_kinds]
    operands = [rng.uniform(-1, 1, dst).astype(p.dtype) for k in chain_kinds if PostOp(k, **extra.get(k, {})).is_binary]
    label, expect = "valid chain", "valid"
    choice = int(rng.integers(14))
    bad_operands = list(operands)
    post_ops: Any = chain
    if choice == 1:
        post_ops, label, expect = [1, 2], "post_ops=[1, 2]", "invalid"
    elif choice == 2:
        post_ops, label, expect = ["ReLU"] * 4, "4 post-ops", "invalid"
    elif choice == 3:
        post_ops, label, expect = ["Pow"], "post_ops=['Pow']", "invalid"
    elif choice == 4:
        post_ops, label, expect = {"ReLU": 1}, "post_ops=dict", "invalid"
    elif choice == 5 and operands:
        bad_operands = operands[:-1]
        label, expect = "a post-op tensor missing", "invalid"
    elif choice == 6:
        bad_operands = operands + [operands[0] if operands else np.ones(1, p.dtype)]
        label, expect = "a post-op tensor too many", "invalid"
    elif choice == 7 and operands:
        bad_operands = [np.ones(dst[:-1] + (dst[-1] + 1,), p.dtype)] + operands[1:]
        label, expect = "a post-op tensor that does not broadcast", "invalid"
    elif choice == 8 and operands:
        bad_operands = [operands[0].astype(np.float64)] + operands[1:]
        label, expect = "a post-op tensor of float64", "invalid"
    elif choice == 9 and operands:
        bad_operands = [None] + operands[1:]
        label, expect = "a post-op tensor None", "invalid"
    elif choice == 10:
        post_ops, label, expect = "ReLU", "post_ops='ReLU' (a string)", "maybe"
    elif choice == 11 and operands:
        bad_operands = [np.ma.masked_array(operands[0])] + operands[1:]
        label, expect = "a masked post-op tensor", "invalid"
    elif choice == 12 and operands:
        bad_operands = [np.broadcast_to(np.ones((1,) * len(dst), p.dtype), (2**20,) + dst[1:])] + operands[1:]
        label, expect = "a huge broadcast post-op tensor", "invalid"
    elif choice == 13:
        post_ops, label, expect = [PostOp("Add", dequantize=None), object()], "post_ops with an object", "invalid"
    what = f"fused ConvTranspose {p.code} {label} chain={chain_kinds} attrs={attrs}"
    bias = t.get("bias")

    def call() -> Any:
        return oc.ConvTranspose(**attrs, post_ops=post_ops)(t["src"], t["weights"], bias, *bad_operands)

    def check(result: Any) -> None:
        f64 = [np.asarray(x, np.float64) for x in (t["src"], t["weights"])]
        chain_used = [PostOp(post_ops)] if isinstance(post_ops, str) else chain
        b = None if bias is None else np.asarray(bias, np.float64)
        y = reference.conv_transpose(f64[0], f64[1], b, **attrs)
        mag = reference.conv_transpose(np.abs(f64[0]), np.abs(f64[1]), None if b is None else np.abs(b), **attrs)
        ref = reference.fused_conv_transpose(f64[0], f64[1], b, [np.asarray(x, np.float64) for x in bad_operands],
                                             post_ops=chain_used, **attrs)
        # the chain moves values by at most a factor 1 per step (these kinds): the conv's
        # tolerance, plus the dtype's rounding of each step
        red = (p.ic // p.groups) * math.prod(p.kernel)
        tol = accuracy.tolerance(p.code, red) * float(np.max(mag)) * 4 + 8 * accuracy.epsilon(p.code) * (1 + np.abs(ref))
        g = np.asarray(result, np.float64)
        if g.shape != ref.shape or not np.all(np.abs(g - ref) <= tol):
            raise Failure(f"{what}: off by {float(np.max(np.abs(g - ref))):.3g} ({y.shape})")

    return Case(what, ("ConvTranspose",), call, expect, check)


def int8_case(p: Problem, rng: np.random.Generator) -> Case:
    """An int8 ConvTranspose with one corruption of its quantization or int8 tensors."""
    attrs = dict(p.attrs)
    src = rng.integers(0, 50, p.act(p.ic, p.src)).astype(np.uint8)
    w = rng.integers(-60, 60, p.weights_shape).astype(np.int8)
    sdq, wdq, dq = Dequantize(scales=0.5, zps=3), Dequantize(scales=0.25), Quantize(scales=2.0, zps=5, dtype="u8")
    label, expect = "valid int8", "valid"
    choice = int(rng.integers(12))
    args: list[Any] = [src, w]
    kw: dict[str, Any] = {"src_dequantize": sdq, "weights_dequantize": wdq, "dst_quantize": dq}
    if choice == 1:
        args[0], label, expect = src.astype(np.float32), "f32 src", "invalid"
    elif choice == 2:
        args[1], label, expect = w.astype(np.uint8), "u8 weights", "invalid"
    elif choice == 3:
        kw["weights_dequantize"], label, expect = None, "no weights_dequantize", "invalid"
    elif choice == 4:
        kw["src_dequantize"], label, expect = dq, "a Quantize as src_dequantize", "invalid"
    elif choice == 5:
        kw["weights_dequantize"], label, expect = Dequantize(scales=0.25, zps=1), "weights zero point 1", "invalid"
    elif choice == 6:
        kw["src_dequantize"], label, expect = Dequantize(scales=[0.5, 0.5], qtype="per_channel"), "per-channel src", "invalid"
    elif choice == 7:
        kw["dst_quantize"], label, expect = "u8", "dst_quantize='u8'", "invalid"
    elif choice == 8:
        args.append(np.ones(p.oc, np.float64))
        label, expect = "a float64 bias", "invalid"
    elif choice == 9:
        args[0], label, expect = np.ma.masked_array(src), "a masked src", "invalid"
    elif choice == 10:
        kw["src_dequantize"], label, expect = {"scales": 0.5}, "a dict as src_dequantize", "invalid"
    elif choice == 11:
        args[0], label, expect = src.astype(np.int8), "s8 src", "valid"
    what = f"int8 ConvTranspose {label} attrs={attrs}"

    def call() -> Any:
        return oc.ConvTranspose(**attrs, **kw)(*args)

    def check(result: Any) -> None:
        ref = reference.fused_conv_transpose(args[0], w, None, [], src_dequantize=sdq, weights_dequantize=wdq,
                                             dst_quantize=dq, **attrs)
        pre = reference.fused_conv_transpose(args[0], w, None, [], src_dequantize=sdq, weights_dequantize=wdq, **attrs)
        g = np.asarray(result, np.float64)
        # one quantization step where the f32 value sits near a rounding boundary
        near = np.abs(pre / 2.0 + 5 - np.floor(pre / 2.0 + 5) - 0.5) < 1e-3
        if g.shape != ref.shape or np.any((np.abs(g - ref) > 0) & ~near) or np.any(np.abs(g - ref) > 1):
            raise Failure(f"{what}: off by {float(np.max(np.abs(g - ref))):.3g}")

    return Case(what, ("ConvTranspose",), call, expect, check)


def quant_case(rng: np.random.Generator) -> Case:
    """PostOp / Dequantize / Quantize built with hostile attributes."""
    cls = str(rng.choice(["PostOp", "Dequantize", "Quantize"]))
    values: list[tuple[str, Any, str]] = [
        ("str", "1", "invalid"), ("bytes", b"1", "invalid"), ("None", None, "maybe"), ("nan", float("nan"), "invalid"),
        ("inf", float("inf"), "invalid"), ("1e39", 1e39, "invalid"), ("1e-46", 1e-46, "maybe"), ("bool", True, "invalid"),
        ("dict", {"a": 1}, "invalid"), ("huge int", 10**400, "invalid"), ("2**31", 2**31, "maybe"),
        ("-2**31-1", -(2**31) - 1, "maybe"), ("2**63", 2**63, "maybe"), ("1.5", 1.5, "maybe"), ("complex", 1j, "invalid"),
        ("list of str", ["1"], "invalid"), ("empty list", [], "invalid"), ("2-d array", np.ones((2, 2)), "invalid"),
        ("lying __len__", LyingLen(3, "hostile"), "invalid"), ("numpy int", np.int64(3), "maybe"),
        ("numpy float", np.float32(0.5), "maybe"), ("0-d array", np.array(2), "maybe"), ("object", object(), "invalid"),
        ("-1", -1, "maybe"), ("0", 0, "maybe"), ("256", 256, "maybe"),
    ]
    label, value, expect = values[int(rng.integers(len(values)))]
    if cls == "PostOp":
        kind = str(rng.choice(["LeakyReLU", "Clamp", "Elu", "SoftPlus", "HardSigmoid", "ReLU", "Add"]))
        attr = {"LeakyReLU": "alpha", "Clamp": "min", "Elu": "alpha", "SoftPlus": "beta", "HardSigmoid": "alpha",
                "ReLU": "alpha", "Add": "dequantize"}[kind]
        defaults = {"Clamp": {"min": -1.0, "max": 1.0}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "LeakyReLU": {"alpha": 0.1},
                    "Elu": {"alpha": 1.0}}.get(kind, {})
        kw = dict(defaults)
        kw[attr] = value
        if rng.random() < 0.2:
            what = f"PostOp({label!r} as the kind)"
            return Case(what, ("PostOp",), lambda: PostOp(value), "maybe" if isinstance(value, str) else "invalid")
        what = f"PostOp({kind}, {attr}={label})"
        return Case(what, ("PostOp",), lambda: PostOp(kind, **kw), expect if attr != "dequantize" else "invalid"
                    if value is not None else "valid")
    attr = str(rng.choice(["scales", "zps", "qtype", "axis", "dtype"] if cls == "Quantize" else ["scales", "zps", "qtype", "axis"]))
    what = f"{cls}({attr}={label})"
    kw = {attr: value}
    maker = Quantize if cls == "Quantize" else Dequantize

    def check(q: Any) -> None:  # what was accepted is what the library can take
        scales = np.asarray(q.scales, np.float64)
        if not np.all(np.isfinite(scales.astype(np.float32))) or np.any(scales.astype(np.float32) == 0):
            raise Failure(f"{what}: accepted scales {q.scales} that are not finite and non-zero in f32")
        if any(not isinstance(z, int) or isinstance(z, bool) or not -(2**31) <= z < 2**31 for z in q.zps):
            raise Failure(f"{what}: accepted zero points {q.zps} outside s32 or not ints")

    return Case(what, (cls,), lambda: maker(**kw), "maybe" if expect != "invalid" else "invalid", check)


def reference_case(p: Problem, rng: np.random.Generator) -> Case:
    """reference.* with one hostile argument (its errors are ValueError, naming the function)."""
    op = str(rng.choice([FWD, BWD_D, BWD_W]))
    t = tensors(p, op, rng)
    attrs = _bwd(p.attrs) if op != FWD else dict(p.attrs)
    fn_name = {FWD: "conv_transpose", BWD_D: "conv_transpose_backward_data", BWD_W: "conv_transpose_backward_weights"}[op]
    fn = getattr(reference, fn_name)
    args: list[Any] = [t[k] for k in t if k != "weights_shape"]
    if op == FWD:
        args = [t["src"], t["weights"], t.get("bias")]
    if op == BWD_W:
        args.append(list(p.weights_shape))
    choice = int(rng.integers(3))
    label, expect = "valid", "valid"
    if choice == 1:
        i = int(rng.integers(2))
        options = [(lbl, mk, ex) for lbl, mk, ex in tensor_corruptions(p, np.asarray(args[i]))
                   if not lbl.startswith(("huge", "torch"))]  # NumPy float64: a huge view is a huge copy
        label, make, expect = options[int(rng.integers(len(options)))]
        args[i] = make()
        label = f"input {i}={label}"
        if expect == "invalid" and label.split("=", 1)[1] in ("float64", "int32", "int64", "uint8", "bool array",
                                                              "nested list (float64)", "longdouble", "numpy scalar",
                                                              "object array", "empty first dim"):
            expect = "maybe"  # the reference computes in float64: any real array will do
    elif choice == 2:
        label, expect = attr_corruption(p, rng, attrs)
        attrs.pop("strict", None)
        for bad in ("output_padding",):
            if op != FWD:
                attrs.pop(bad, None)
        if expect == "invalid" and not label.split("=", 1)[-1].startswith(("str", "bytes", "dict", "set", "object",
                                                                          "complex", "list of", "nested", "lying",
                                                                          "2-d", "float", "nan", "inf", "bool")):
            expect = "maybe"  # the float64 oracle need not refuse what only oneDNN cannot hold
    what = f"reference.{fn_name} {label} attrs={attrs}"
    return Case(what, (fn_name,), lambda: fn(*args, **attrs), "maybe" if expect == "valid" and choice else expect)


def legacy_case(p: Problem, rng: np.random.Generator) -> Case:
    """ConvTransposeBackpropFilters: its own filter_format / filter_shape and inputs."""
    fmt = str(rng.choice(["XIO", "OIX"]))
    attrs = {k: v for k, v in p.attrs.items() if k != "weights_format"}
    attrs["weights_format"] = "XOI" if fmt == "XIO" else "IOX"
    q = Problem(p.code, p.rank, p.n, p.ic, p.oc, p.groups, p.kernel, p.src, attrs, p.dst)
    t = tensors(q, BWD_W, rng)
    shape = list(q.weights_shape)
    if fmt == "OIX":
        shape[0], shape[1] = shape[1], shape[0]
    else:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    legacy_attrs = {k: v for k, v in attrs.items() if k != "weights_format"}
    legacy_attrs["filter_format"] = fmt
    inputs: list[Any] = [t["src"], t["diff_dst"], np.array(shape, np.int64)]
    choice = int(rng.integers(10))
    label, expect = "valid", "valid"
    if choice == 1:
        legacy_attrs["filter_format"], label, expect = ["XIO"], "filter_format=['XIO']", "invalid"
    elif choice == 2:
        legacy_attrs["filter_format"], label, expect = "XOI", "filter_format='XOI'", "invalid"
    elif choice == 3:
        inputs[2], label, expect = "abc", "filter_shape='abc'", "invalid"
    elif choice == 4:
        inputs[2], label, expect = np.array([shape]), "filter_shape 2-d", "invalid"
    elif choice == 5:
        inputs = inputs[:2]
        legacy_attrs["filter_shape"], label, expect = 7, "filter_shape attribute 7", "invalid"
    elif choice == 6:
        inputs[0], label, expect = np.ma.masked_array(inputs[0]), "masked input_forward", "invalid"
    elif choice == 7:
        label, expect = "out= of the wrong dtype", "invalid"
    elif choice == 8:
        inputs[2], label, expect = np.array(shape, np.float32), "filter_shape of floats", "invalid"
    elif choice == 9:
        legacy_attrs["strict"], label, expect = "False", "strict='False'", "invalid"
    out = np.zeros(shape, np.float64) if choice == 7 else None
    what = f"ConvTransposeBackpropFilters {p.code} {label} attrs={legacy_attrs}"

    def check(result: Any) -> None:
        ref, mag, red = reference_of(q, BWD_W, t, attrs)
        axes = (0, 1) if fmt == "OIX" else (-2, -1)
        compare(what, result, ref.swapaxes(*axes), mag.swapaxes(*axes), q.code, red)

    def call() -> Any:
        return oc.ConvTransposeBackpropFilters(**legacy_attrs)(*inputs, **({} if out is None else {"out": out}))

    return Case(what, ("ConvTransposeBackpropFilters",), call, expect, check)


def setter_case(rng: np.random.Generator) -> Case:
    """set_memory_limit / set_cache_capacity / set_debug_fill / set_autotune with hostile values
    (never autotune on: it times candidates); the state is put back afterwards."""
    name = str(rng.choice(["set_memory_limit", "set_cache_capacity", "set_debug_fill", "set_autotune"]))
    values: list[tuple[str, Any]] = [
        ("str", "1G"), ("bytes", b"1"), ("float", 1.5), ("nan", float("nan")), ("bool True", True), ("bool False", False),
        ("-1", -1), ("0", 0), ("2**31", 2**31), ("2**63", 2**63), ("2**64", 2**64), ("10**30", 10**30), ("dict", {}),
        ("None", None), ("numpy int", np.int64(5)), ("numpy bool", np.False_), ("'False'", "False"), ("object", object()),
    ]
    label, value = values[int(rng.integers(len(values)))]
    if name == "set_autotune" and value is True:
        value, label = False, "bool False"
    expect = "maybe"
    if name == "set_debug_fill":
        expect = "valid" if isinstance(value, (bool, np.bool_)) else "invalid"
    what = f"{name}({label})"
    fn = getattr(oc, name)
    capacity = int(oc.cache_info()["capacity"])

    def cleanup() -> None:
        oc.set_memory_limit(None)
        oc.set_debug_fill(False)
        oc.set_autotune(False)
        oc.set_cache_capacity(capacity)

    def check(result: Any) -> None:
        if name == "set_cache_capacity" and (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
                                             or not 0 <= value < 2**63):
            raise Failure(f"{what}: accepted")
        if name == "set_memory_limit" and value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise Failure(f"{what}: accepted")

    return Case(what, (name,), lambda: fn(value), expect, check, cleanup)


# -- the trial -----------------------------------------------------------------------------------
def run_case(case: Case) -> str:
    try:
        result = case.call()
    except Hostile:
        return f"{case.what}: the hostile object's own exception propagated"
    except ALLOWED as e:
        message = str(e)
        if case.expect == "valid":
            raise Failure(f"{case.what}: a valid call raised {type(e).__name__}: {message[:400]}") from None
        if not any(n in message for n in case.names):
            raise Failure(f"{case.what}: {type(e).__name__} does not name {' or '.join(case.names)}: {message[:400]}") from None
        if len(message) > 20000:
            raise Failure(f"{case.what}: a {len(message)}-character message") from None
        return f"{case.what}: {type(e).__name__}"
    except BaseException as e:  # noqa: BLE001 - every other escape is a finding
        raise Failure(f"{case.what}: raised {type(e).__name__}: {str(e)[:400]}") from None
    finally:
        if case.cleanup is not None:
            case.cleanup()
    if case.expect == "invalid":
        raise Failure(f"{case.what}: an invalid call returned {type(result).__name__}")
    if case.check is not None:
        case.check(result)
    return f"{case.what}: returned"


def trial(rng: np.random.Generator, index: int) -> str:
    p = draw(rng)
    entry = str(rng.choice(["class", "function", "constant", "legacy", "fused", "int8", "quant", "reference", "setter"],
                           p=[0.22, 0.14, 0.1, 0.07, 0.1, 0.08, 0.12, 0.1, 0.07]))
    if entry in ("class", "function", "constant"):
        op = str(rng.choice([FWD, BWD_D] if entry == "constant" else [FWD, BWD_D, BWD_W]))
        case = op_case(p, rng, op, entry)
    elif entry == "legacy":
        case = legacy_case(p, rng)
    elif entry == "fused":
        case = fused_case(p, rng)
    elif entry == "int8":
        case = int8_case(p, rng)
    elif entry == "quant":
        case = quant_case(rng)
    elif entry == "reference":
        case = reference_case(p, rng)
    else:
        case = setter_case(rng)
    return run_case(case)

"""Property tests (hypothesis) over the public API: random valid problems against the
reference, random invalid ones that may raise only ValueError, TypeError or MemoryError.

Valid problems run in this process with the debug fill on (outputs start as NaN, so an
element the library leaves unwritten fails the comparison), with inputs given as every kind
of NumPy view (strided, reversed, broadcast, Fortran order, misaligned, read-only) and
outputs given through ``out=`` views of a larger guarded buffer (nothing outside the view
may change).

Invalid problems are crash-prone (oneDNN 3.2 aborts or raises SIGFPE on several), so each
one runs in a long-lived child interpreter (:class:`Worker`); a child that dies or hangs is
a failure whose message is a script reproducing the call. The child runs with
``ONEDNN_CONVT_MEMORY_LIMIT=1G`` and a 6 GiB address-space cap, so an estimate that lets a
huge problem through shows up as NumPy's own MemoryError (which does not name the op and
fails the test) rather than as a machine out of memory.

A few hundred examples per property in the default run; thousands with ``pytest -m slow``.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onednn_convt as oc
import pytest
from helpers import DTYPES, OPS, Config, assert_close, configs
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

FWD, BWD_D, BWD_W = OPS
CLASSES = {FWD: "oc.ConvTranspose", BWD_D: "oc.ConvTransposeBackwardData", BWD_W: "oc.ConvTransposeBackwardWeights"}
FUNCTIONS = {
    FWD: "oc.conv_transpose",
    BWD_D: "oc.conv_transpose_backward_data",
    BWD_W: "oc.conv_transpose_backward_weights",
}
DEFAULT_EXAMPLES = 300
SLOW_EXAMPLES = 3000
COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much]}


# ---------------------------------------------------------------------------------------------
# valid problems, in process
# ---------------------------------------------------------------------------------------------
VIEWS = ("dense", "dense", "fortran", "step", "reversed", "broadcast", "misaligned", "readonly")


def as_view(x: np.ndarray, kind: str, axis: int) -> np.ndarray:
    """An array equal to ``x`` laid out as ``kind`` (for broadcast, ``x`` is constant on ``axis``)."""
    if kind == "fortran":
        return np.asfortranarray(x)
    if kind == "step":
        shape = list(x.shape)
        shape[axis] *= 2
        big = np.zeros(shape, x.dtype)
        index = [slice(None)] * x.ndim
        index[axis] = slice(None, None, 2)
        big[tuple(index)] = x
        return big[tuple(index)]
    if kind == "reversed":
        return np.flip(np.ascontiguousarray(np.flip(x, axis)), axis)
    if kind == "broadcast":
        return np.broadcast_to(x.take([0], axis), x.shape)
    if kind == "misaligned":
        buf = np.zeros(x.nbytes + 1, np.uint8)
        view = np.ndarray(x.shape, x.dtype, buffer=buf, offset=1)
        view[...] = x
        return view
    if kind == "readonly":
        y = x.copy()
        y.flags.writeable = False
        return y
    return x


def guarded_out(shape: tuple[int, ...], dtype: Any, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out view, the buffer under it, a mask of the buffer elements outside the view)."""
    if kind == "dense":
        buf = np.full(shape, 7, dtype)
        return buf, buf, np.zeros(shape, bool)
    # every other element along the last axis, in a buffer with a row of guard values
    big = (*shape[:-1], 2 * shape[-1] + 1)
    buf = np.full(big, 7, dtype)
    view = buf[..., 1::2]
    mask = np.ones(big, bool)
    mask[..., 1::2] = False
    return view, buf, mask


@st.composite
def valid_calls(draw: Any) -> dict[str, Any]:
    cfg = draw(configs())
    return {
        "cfg": cfg,
        "op": draw(st.sampled_from(OPS)),
        "code": draw(st.sampled_from(("f32", "f32", "bf16", "f16"))),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "views": [draw(st.sampled_from(VIEWS)) for _ in range(3)],
        "axes": [draw(st.integers(0, len(cfg.src) + 1)) for _ in range(3)],
        "out": draw(st.sampled_from((None, "dense", "strided"))),
        "functional": draw(st.booleans()),
        "weights_shape_input": draw(st.booleans()),
    }


def run_valid(case: dict[str, Any]) -> None:
    cfg: Config = case["cfg"]
    op, code = case["op"], case["code"]
    t = cfg.tensors(np.random.default_rng(case["seed"]), code)
    names = {FWD: ["src", "weights", "bias"], BWD_D: ["diff_dst", "weights"], BWD_W: ["src", "diff_dst"]}[op]
    values = []
    for name, kind, axis in zip(names, case["views"], case["axes"]):
        x = t[name]
        axis %= x.ndim
        if kind == "broadcast":  # constant along the axis, the same values for the reference
            x = np.ascontiguousarray(np.broadcast_to(x.take([0], axis), x.shape))
            t[name] = x
        values.append(as_view(x, kind, axis))
    if op == FWD and not cfg.bias:
        values = values[:2]
    attrs = cfg.attrs(op)
    if op == BWD_W:
        if case["weights_shape_input"]:
            values.append(np.array(cfg.weights_shape, np.int32))
        else:
            attrs["weights_shape"] = cfg.weights_shape
    a = {k: np.abs(np.asarray(v, np.float64)) for k, v in t.items()}  # for the magnitude of the terms
    if op == FWD:
        ref = cfg.ref_forward(t["src"], t["weights"], t["bias"] if cfg.bias else None)
        magnitude = cfg.ref_forward(a["src"], a["weights"], a["bias"] if cfg.bias else None)
        reduction = cfg.fwd_reduction
    elif op == BWD_D:
        ref = cfg.ref_backward_data(t["diff_dst"], t["weights"])
        magnitude = cfg.ref_backward_data(a["diff_dst"], a["weights"])
        reduction = cfg.bwd_data_reduction
    else:
        ref = cfg.ref_backward_weights(t["src"], t["diff_dst"])
        magnitude = cfg.ref_backward_weights(a["src"], a["diff_dst"])
        reduction = cfg.bwd_weights_reduction
    out = buf = mask = None
    if case["out"] is not None:
        out, buf, mask = guarded_out(ref.shape, DTYPES[code], case["out"])
        guard = buf[mask].copy()
    if case["functional"]:
        fn = {FWD: oc.conv_transpose, BWD_D: oc.conv_transpose_backward_data, BWD_W: oc.conv_transpose_backward_weights}[op]
        got = fn(*values, out=out, **attrs)
    else:
        cls = {FWD: oc.ConvTranspose, BWD_D: oc.ConvTransposeBackwardData, BWD_W: oc.ConvTransposeBackwardWeights}[op]
        got = cls(**attrs)(*values, out=out)
    what = f"{op} {code} {cfg} views={case['views']} out={case['out']}"
    assert got.dtype == DTYPES[code], what
    if out is not None:
        assert got is out, what
        assert np.array_equal(buf[mask], guard), f"{what}: wrote outside the out= view"
    assert_close(got, ref, code, reduction, what, magnitude)


def run_valid_filled(case: dict[str, Any]) -> None:
    """:func:`run_valid` with the debug fill on: outputs start as NaN, so unwritten elements fail."""
    before = oc.debug_fill()
    oc.set_debug_fill(True)
    try:
        run_valid(case)
    finally:
        oc.set_debug_fill(before)


#: found by the search: one output, nine products that cancel to 1/40 of their magnitude
#: (the tolerance's scale is the magnitude of the terms, not of the result)
CANCELLING = {
    "cfg": Config(src=(1, 1), kernel=(3, 3), n=1, ic=1, oc=1, dilations=(3, 3), data_format="NCX", weights_format="IOX"),
    "op": BWD_D, "code": "f32", "seed": 52540, "views": ["dense"] * 3, "axes": [0, 0, 0], "out": None,
    "functional": False, "weights_shape_input": False,
}


@settings(max_examples=DEFAULT_EXAMPLES, **COMMON)
@given(valid_calls())
@example(CANCELLING)
def test_valid_problems_match_reference(case):
    run_valid_filled(case)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **COMMON)
@given(valid_calls())
def test_valid_problems_match_reference_many(case):
    run_valid_filled(case)


# ---------------------------------------------------------------------------------------------
# invalid problems, in a child interpreter
# ---------------------------------------------------------------------------------------------
#: Helpers the generated calls use; also the head of every reproducing script.
PRELUDE = """\
import math
import numpy as np, ml_dtypes
import onednn_convt as oc

def arr(shape, dtype=np.float32):
    return np.ones(shape, dtype)

def big(shape, dtype=np.float32):  # any size, no memory: every stride 0
    return np.broadcast_to(np.ones((1,) * len(shape), dtype), shape)

def ro(shape, dtype=np.float32):
    a = np.ones(shape, dtype)
    a.flags.writeable = False
    return a

def flipped(shape, dtype=np.float32):
    return np.flip(np.ones(shape, dtype))

def zero_strided(shape, dtype=np.float32):  # writeable, every element the same memory
    return np.lib.stride_tricks.as_strided(np.ones(1, dtype), shape, (0,) * len(shape))

def misaligned(shape, dtype=np.float32):
    dtype = np.dtype(dtype)
    buf = np.zeros(math.prod(shape) * dtype.itemsize + 1, np.uint8)
    a = np.ndarray(shape, dtype, buffer=buf, offset=1)
    a[...] = 1
    return a

def sharing(shape_a, shape_b, dtype=np.float32, shift=0):  # two arrays over one buffer
    base = np.ones(max(math.prod(shape_a), math.prod(shape_b) + shift), dtype)
    return base[: math.prod(shape_a)].reshape(shape_a), base[shift : shift + math.prod(shape_b)].reshape(shape_b)
"""

_LOOP = """
import json, os, resource, sys
if "libasan" not in os.environ.get("LD_PRELOAD", ""):  # ASan maps terabytes of shadow memory
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
for _line in sys.stdin:
    _req = json.loads(_line)
    _ns = dict(globals())
    try:
        exec(_req["setup"], _ns)
    except Exception as e:
        _res = {"status": "setup", "type": type(e).__name__, "message": str(e)}
    else:
        try:
            exec(_req["call"], _ns)
        except BaseException as e:
            _res = {"status": "raised", "type": type(e).__name__, "message": str(e)[:3000]}
        else:
            _res = {"status": "returned"}
    print(json.dumps(_res), flush=True)
"""

WORKER_ENV = {"ONEDNN_CONVT_MEMORY_LIMIT": "1G"}


class Worker:
    """A child interpreter that runs one call per request and survives exceptions.

    If the call kills it (signal, abort) or hangs, :meth:`run` reports that, with the
    child's stderr, and the next request starts a new child.
    """

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the worker
        self.calls = 0
        self.crashes = 0

    def _start(self) -> subprocess.Popen[str]:
        self.stderr.seek(0)
        self.stderr.truncate()
        env = {**os.environ, **WORKER_ENV}
        return subprocess.Popen(
            [sys.executable, "-u", "-c", PRELUDE + _LOOP], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env,
        )

    def run(self, setup: str, call: str, timeout: float = 120) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.calls += 1
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps({"setup": setup, "call": call}) + "\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else ""
        if line:
            return json.loads(line)  # type: ignore[no-any-return]
        hung = not ready
        if hung:
            proc.kill()
        code = proc.wait()
        self.crashes += 1
        self.stderr.seek(0)
        err = self.stderr.read()[-3000:]
        self._discard()
        return {"status": "hung" if hung else "crashed", "returncode": code, "stderr": err}

    def _discard(self) -> None:
        """Close the child's pipes (ending it: stdin EOF ends its loop) and forget it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except BrokenPipeError:
                pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        self._discard()
        self.stderr.close()


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def reproducer(setup: str, call: str) -> str:
    env = " ".join(f"{k}={v}" for k, v in WORKER_ENV.items())
    return f"{env} python - <<'EOF'\n{PRELUDE}\n{setup}\n{call}\nEOF"


@dataclass
class Tensor:
    """One input (or out=) as code: ``maker(shape, dtype)`` or a literal expression."""

    shape: tuple[int, ...]
    dtype: str = "np.float32"
    maker: str = "arr"
    literal: str | None = None

    def code(self) -> str:
        return self.literal if self.literal is not None else f"{self.maker}({self.shape!r}, {self.dtype})"


@dataclass
class Call:
    """An op call as code: attributes and inputs are code strings, so anything can go in."""

    op: str
    attrs: dict[str, str]
    inputs: list[Tensor | None]
    out: Tensor | None = None
    functional: bool = False
    setup: list[str] = field(default_factory=list)
    what: str = ""

    def code(self) -> str:
        inputs = list(self.inputs)
        while inputs and inputs[-1] is None:
            inputs.pop()
        args = ", ".join("None" if t is None else t.code() for t in inputs)
        out = "" if self.out is None else f"out={self.out.code()}"
        kw = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        if self.functional:
            return f"{FUNCTIONS[self.op]}({', '.join(x for x in (args, out, kw) if x)})"
        return f"{CLASSES[self.op]}({kw})({', '.join(x for x in (args, out) if x)})"


def valid_call(cfg: Config, op: str, dtype: str, functional: bool, ws_input: bool) -> Call:
    attrs = {k: repr(v) for k, v in cfg.attrs(op).items()}
    if op == FWD:
        inputs = [Tensor(cfg.src_shape, dtype), Tensor(cfg.weights_shape, dtype)]
        if cfg.bias:
            inputs.append(Tensor((cfg.oc,), dtype))
    elif op == BWD_D:
        inputs = [Tensor(cfg.dst_shape, dtype), Tensor(cfg.weights_shape, dtype)]
    else:
        inputs = [Tensor(cfg.src_shape, dtype), Tensor(cfg.dst_shape, dtype)]
        if ws_input:
            inputs.append(Tensor((len(cfg.weights_shape),), literal=f"np.array({list(cfg.weights_shape)!r}, np.int32)"))
        else:
            attrs["weights_shape"] = repr(cfg.weights_shape)
    return Call(op, attrs, inputs, functional=functional)  # type: ignore[arg-type]


def output_shape(cfg: Config, op: str) -> tuple[int, ...]:
    return {FWD: cfg.dst_shape, BWD_D: cfg.src_shape, BWD_W: cfg.weights_shape}[op]


def channel_axis(cfg: Config) -> int:
    return 1 if cfg.data_format == "NCX" else len(cfg.src) + 1


LISTS = ("strides", "pads_begin", "pads_end", "dilations")
HUGE = (2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, 10**30)
BAD_DTYPES = (
    "np.float64", "np.int32", "np.int64", "np.int8", "np.uint8", "np.bool_", "np.complex64",
    "object", "'>f4'", "'<U3'", "'datetime64[s]'", "np.longdouble",
)
NON_ARRAYS = ("None", "'abc'", "3.5", "7", "{}", "object()", "b'xy'", "[[1.0, 2.0], [3.0]]", "{1, 2}", "print")


def invalid_kinds(op: str) -> list[str]:
    kinds = [
        "rank", "channels", "groups", "zero_dim", "zero_attr", "negative", "list_length", "dtype",
        "mixed_dtypes", "non_array", "huge_attr", "huge_shape", "bad_string", "bad_attr_type",
        "unknown_attr", "output_padding", "out",
    ]
    if op == FWD:
        kinds.append("bias")
    if op == BWD_W:
        kinds += ["weights_shape", "spatial", "batch"]
    return kinds


def corrupt(draw: Any, call: Call, cfg: Config) -> Call:
    """Make ``call`` invalid in one drawn way (each way is invalid whatever the config)."""
    op, rank = call.op, len(cfg.src)
    kind = draw(st.sampled_from(invalid_kinds(op)))
    call.what = kind
    tensors = [i for i, t in enumerate(call.inputs[:2])]
    dtype = call.inputs[0].dtype  # type: ignore[union-attr]
    if kind == "rank":
        i = draw(st.sampled_from(tensors))
        t = call.inputs[i]
        assert t is not None
        new_rank = draw(st.sampled_from([r for r in range(8) if r != t.shape.__len__()]))
        shape = tuple(t.shape[:new_rank]) + (2,) * max(0, new_rank - len(t.shape))
        call.inputs[i] = replace(t, shape=shape)
    elif kind == "channels":
        delta = draw(st.integers(1, 3))
        if op == BWD_W and draw(st.booleans()):  # the attribute's I dim instead of the data
            ws = list(cfg.weights_shape)
            ws[0 if cfg.weights_format == "IOX" else -1] += delta
            call.attrs["weights_shape"] = repr(tuple(ws))
            call.inputs = call.inputs[:2]
        else:
            t = call.inputs[0]
            assert t is not None
            shape = list(t.shape)
            shape[channel_axis(cfg)] += delta
            call.inputs[0] = replace(t, shape=tuple(shape))
    elif kind == "groups":
        call.attrs["groups"] = draw(st.sampled_from(
            ["0", "-1", repr(-cfg.groups), repr(cfg.ic + 1), "2**63", "2**64", "True", "1.5", "'2'", repr([cfg.groups])]
        ))
    elif kind == "zero_dim":
        i = draw(st.sampled_from(tensors))
        t = call.inputs[i]
        assert t is not None
        axis = draw(st.integers(0, len(t.shape) - 1))
        call.inputs[i] = replace(t, shape=t.shape[:axis] + (0,) + t.shape[axis + 1 :])
    elif kind == "zero_attr":
        name = draw(st.sampled_from(("strides", "dilations")))
        values = [1] * rank
        values[draw(st.integers(0, rank - 1))] = 0
        call.attrs[name] = repr(values if draw(st.booleans()) else 0)
    elif kind == "negative":
        name = draw(st.sampled_from(LISTS + ("output_padding",)))
        values = list(getattr(cfg, name))
        values[draw(st.integers(0, rank - 1))] = -draw(st.integers(1, 2**63))
        call.attrs[name] = repr(values)
    elif kind == "list_length":
        name = draw(st.sampled_from(LISTS + ("output_padding",)))
        length = draw(st.sampled_from([n for n in range(6) if n != rank]))
        call.attrs[name] = repr([1] * length)
    elif kind == "dtype":
        i = draw(st.sampled_from(tensors + ([2] if len(call.inputs) > 2 and op == FWD else [])))
        t = call.inputs[i]
        assert t is not None
        call.inputs[i] = replace(t, dtype=draw(st.sampled_from(BAD_DTYPES)))
    elif kind == "mixed_dtypes":
        i = draw(st.sampled_from(tensors))
        t = call.inputs[i]
        assert t is not None
        others = [d for d in ("np.float32", "ml_dtypes.bfloat16", "np.float16") if d != dtype]
        call.inputs[i] = replace(t, dtype=draw(st.sampled_from(others)))
    elif kind == "non_array":
        i = draw(st.sampled_from(tensors))
        literal = draw(st.sampled_from(NON_ARRAYS))
        call.inputs[i] = Tensor((), literal=literal)
    elif kind == "huge_attr":
        name = draw(st.sampled_from(LISTS + ("output_padding",)))
        values = list(getattr(cfg, name))
        i = draw(st.integers(0, rank - 1))
        values[i] = draw(st.sampled_from(HUGE))
        if name == "dilations" and cfg.kernel[i] == 1:  # no extent: only the value itself is out of range
            values[i] = max(values[i], 2**31)
        if name.startswith("pads"):  # auto_pad would override them
            call.attrs["auto_pad"] = "'None'"
        call.attrs[name] = repr(values)
        if name == "output_padding":  # a stride to match, so only the size is wrong
            call.attrs["strides"] = repr([v + 1 if v in HUGE else s for v, s in zip(values, cfg.strides)])
    elif kind == "huge_shape":
        i = draw(st.sampled_from(tensors))
        t = call.inputs[i]
        assert t is not None
        axis = draw(st.integers(0, len(t.shape) - 1))
        size = draw(st.sampled_from((2**31 - 1, 2**31, 2**33, 2**40)))
        shape = t.shape[:axis] + (size,) + t.shape[axis + 1 :]
        assume(math.prod(shape) < 2**60)
        call.inputs[i] = replace(t, shape=shape, maker="big")
    elif kind == "bad_string":
        name = draw(st.sampled_from(("auto_pad", "data_format", "weights_format")))
        bad = {
            "auto_pad": ["'same'", "'EXPLICIT'", "''", "'SAME UPPER'", "'NOTSET'"],
            "data_format": ["'NCHW'", "'nc'", "'NHWC'", "'NCX '", "''"],  # any case is right: 'ncx' is NCX
            "weights_format": ["'OIX'", "'XIO'", "'io'", "'OIHW'", "''"],
        }[name]
        call.attrs[name] = draw(st.sampled_from(bad))
    elif kind == "bad_attr_type":
        name = draw(st.sampled_from(LISTS + ("output_padding", "auto_pad", "data_format", "weights_format", "groups")))
        call.attrs[name] = draw(st.sampled_from(["1.5", "'2'", "[1.0]", "object()", "{1: 2}", "b'NCX'", "[None]", "3j"]))
    elif kind == "unknown_attr":
        name = draw(st.sampled_from(("stride", "padding", "kernel_shape", "filter_format", "bias", "dilation")))
        call.attrs[name] = "1"
    elif kind == "output_padding":
        values = list(cfg.strides)
        i = draw(st.integers(0, rank - 1))
        values = [0] * rank
        values[i] = cfg.strides[i] + draw(st.integers(0, 3))
        call.attrs["output_padding"] = repr(values)
    elif kind == "out":
        shape = output_shape(cfg, op)
        variant = draw(st.sampled_from(
            ["shape", "dtype", "readonly", "broadcast", "zero_strided", "flipped", "misaligned", "alias", "non_array", "rank"]
        ))
        if variant in ("zero_strided", "flipped", "broadcast") and max(shape) == 1:
            variant = "shape"  # a single element has no stride to get wrong
        call.what = f"out:{variant}"
        if variant == "shape":
            axis = draw(st.integers(0, len(shape) - 1))
            call.out = Tensor(shape[:axis] + (shape[axis] + draw(st.integers(1, 3)),) + shape[axis + 1 :], dtype)
        elif variant == "rank":
            call.out = Tensor(shape + (1,), dtype)
        elif variant == "dtype":
            call.out = Tensor(shape, draw(st.sampled_from([d for d in BAD_DTYPES + ("np.float16", "np.float32") if d != dtype])))
        elif variant == "readonly":
            call.out = Tensor(shape, dtype, "ro")
        elif variant == "broadcast":
            call.out = Tensor(shape, dtype, "big")
        elif variant == "zero_strided":
            call.out = Tensor(shape, dtype, "zero_strided")
        elif variant == "flipped":
            call.out = Tensor(shape, dtype, "flipped")
        elif variant == "misaligned":
            call.out = Tensor(shape, dtype, "misaligned")
        elif variant == "alias":
            i = draw(st.sampled_from(tensors))
            t = call.inputs[i]
            assert t is not None
            shift = draw(st.integers(0, max(0, math.prod(t.shape) - 1)))
            call.setup.append(f"_in, _out = sharing({t.shape!r}, {shape!r}, {dtype}, {shift})")
            call.inputs[i] = Tensor(t.shape, literal="_in")
            call.out = Tensor(shape, literal="_out")
        else:
            call.out = Tensor((), literal=draw(st.sampled_from(("[0.0]", "(1, 2)", "3.0", "'out'", "object()"))))
    elif kind == "bias":
        variant = draw(st.sampled_from(["length", "2d", "dtype", "non_array"]))
        call.what = f"bias:{variant}"
        if variant == "length":
            call.inputs[2:] = [Tensor((cfg.oc + draw(st.sampled_from((-1, 1, 2))) or 2,), dtype)]
        elif variant == "2d":
            call.inputs[2:] = [Tensor(draw(st.sampled_from(((1, cfg.oc), (cfg.oc, 1), (cfg.oc, 1, 1)))), dtype)]
        elif variant == "dtype":
            call.inputs[2:] = [Tensor((cfg.oc,), draw(st.sampled_from(BAD_DTYPES)))]
        else:
            call.inputs[2:] = [Tensor((), literal=draw(st.sampled_from(NON_ARRAYS[1:])))]
    elif kind == "weights_shape":
        variant = draw(st.sampled_from(["zero", "negative", "mismatch", "huge", "float", "2d", "length", "strings"]))
        call.what = f"weights_shape:{variant}"
        ws = list(cfg.weights_shape)
        axis = draw(st.integers(0, len(ws) - 1))
        if variant == "zero":
            ws[axis] = 0
        elif variant == "negative":
            ws[axis] = -draw(st.integers(1, 5))
        elif variant == "mismatch":  # a kernel size the shapes cannot have (SAME pads would absorb it)
            call.attrs["auto_pad"] = "'None'"
            k_axes = range(2, len(ws)) if cfg.weights_format == "IOX" else range(len(ws) - 2)
            ws[draw(st.sampled_from(list(k_axes)))] += draw(st.integers(40, 60))
        elif variant == "huge":
            ws[axis] = draw(st.sampled_from([h for h in HUGE if h < 2**63]))  # the int64 array holds it
        literal = f"np.array({ws!r}, np.int64)"
        if variant == "float":
            literal = f"np.array({ws!r}, np.float32)"
        elif variant == "2d":
            literal = f"np.array([{ws!r}], np.int32)"
        elif variant == "length":
            literal = f"np.array({ws + [1]!r}, np.int32)"
        elif variant == "strings":
            literal = repr([str(x) for x in ws])
        call.attrs.pop("weights_shape", None)
        call.inputs = call.inputs[:2] + [Tensor((), literal=literal)]
    elif kind == "spatial":  # diff_dst one stride too long: no output_padding < stride explains it
        t = call.inputs[1]
        assert t is not None
        axis = draw(st.integers(0, rank - 1))
        shape = list(t.shape)
        shape[axis + (2 if cfg.data_format == "NCX" else 1)] += cfg.strides[axis]
        call.inputs[1] = replace(t, shape=tuple(shape))
    elif kind == "batch":
        t = call.inputs[1]
        assert t is not None
        call.inputs[1] = replace(t, shape=(t.shape[0] + draw(st.integers(1, 3)),) + t.shape[1:])
    return call


@st.composite
def invalid_calls(draw: Any) -> Call:
    cfg = draw(configs())
    op = draw(st.sampled_from(OPS))
    dtype = draw(st.sampled_from(("np.float32", "ml_dtypes.bfloat16", "np.float16")))
    call = valid_call(cfg, op, dtype, draw(st.booleans()), draw(st.booleans()))
    return corrupt(draw, call, cfg)


ALLOWED = ("ValueError", "TypeError", "MemoryError")


def check_invalid(worker: Worker, call: Call) -> None:
    setup, code = "\n".join(call.setup), call.code()
    result = worker.run(setup, code)
    repro = reproducer(setup, code)
    status = result["status"]
    if status == "setup":
        assume(False)  # the generated arrays themselves cannot exist (e.g. too many bytes)
    assert status not in ("crashed", "hung"), (
        f"[{call.what}] the call {status} the interpreter (exit code {result.get('returncode')}); "
        f"stderr:\n{result['stderr']}\nreproduce with:\n{repro}"
    )
    assert status == "raised", f"[{call.what}] an invalid call returned normally:\n{repro}"
    message = result["message"]
    assert result["type"] in ALLOWED, (
        f"[{call.what}] raised {result['type']}: {message}\nexpected one of {ALLOWED}; reproduce with:\n{repro}"
    )
    names = (call.op, FUNCTIONS[call.op].split(".")[1] + "()")  # Python's own errors name the function
    assert any(n in message for n in names), f"[{call.what}] the message does not name the op: {message!r}\n{repro}"


@settings(max_examples=DEFAULT_EXAMPLES, **COMMON)
@given(invalid_calls())
def test_invalid_problems_raise_documented_exceptions(worker, call):
    check_invalid(worker, call)


@pytest.mark.slow
@settings(max_examples=SLOW_EXAMPLES, **COMMON)
@given(invalid_calls())
def test_invalid_problems_raise_documented_exceptions_many(worker, call):
    check_invalid(worker, call)


def test_worker_reports_a_crash_with_a_reproducer(worker):
    """The harness: a call that kills the child fails with the call in a runnable script."""
    # SIGKILL: no handler can turn it into something else (ASan would catch a SIGFPE)
    result = worker.run("", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert result["status"] == "crashed" and result["returncode"] == -9
    assert worker.run("", "oc.ConvTranspose()(arr((1, 2, 2)), arr((1, 2, 2)))")["status"] == "returned"
    assert "python - <<'EOF'" in reproducer("", "f()") and "\nf()\nEOF" in reproducer("", "f()")


def test_worker_reports_a_hang(worker):
    result = worker.run("", "import time; time.sleep(30)", timeout=1)
    assert result["status"] == "hung"
    assert worker.run("", "x = 1")["status"] == "returned"


def test_generated_valid_calls_run(worker):
    """The invalid generator starts from valid calls: they must return, in every op and entry."""
    for op in OPS:
        cfg = Config(src=(5, 4), kernel=(3, 2), ic=4, oc=6, groups=2, strides=2, bias=True)
        for functional in (False, True):
            for ws_input in (False, True):
                call = valid_call(cfg, op, "ml_dtypes.bfloat16", functional, ws_input)
                result = worker.run("", call.code())
                assert result["status"] == "returned", (call.code(), result)

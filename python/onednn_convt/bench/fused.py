"""``onednn-convt bench --suite fused``: a fused ConvTranspose (bias and post-ops in one
library partition) against the same computation unfused and in PyTorch.

Layers: the models suite's (:func:`onednn_convt.bench.suites.layers`), forward only; the
slow inverse-STFT-like layer only when ``--layers`` names it (the tiny suite's layer can be
named too). Per layer, dtype (f32, bf16) and data format (NCX by default), four post-op
chains, each after the bias (:data:`CASES`); and, in f32's place, one int8 chain (u8 src,
s8 weights, bias, ReLU, u8 dst). Per row, these run in rounds of alternating batches
(:func:`onednn_convt.bench.timing.measure_rounds`), so that every figure of a row sees the
same moments of this noisy machine (PyTorch's and the allocating fused call's batches first
in each round, each after a short sleep; the others without):

* ``fused``: one call of ``ConvTranspose(post_ops=...)`` with ``out=``; ``op.fused`` and
  ``op.partitions`` are recorded (a row the library did not fuse says so);
* ``unfused``: the plain ``ConvTranspose`` (with the bias) with ``out=``, then the same
  post-ops in NumPy, in place (GELU, erf form, through a float32 buffer);
* ``post``: the NumPy post-ops alone (out of place from a ready dst into a buffer, then in
  place: the same bytes as in ``unfused``);
* ``pass``: one memory pass over dst in place, as a post-op run after the op makes it: each
  byte read once and written back (a bitwise XOR with 0 over a copy of dst seen as
  integers: no arithmetic to speak of, any dtype), the least a post-op's pass costs;
* ``copy``: one NumPy copy of dst into another buffer, for comparison: it also reads the
  destination's lines before writing them (write-allocate), 1.3-2.3x a pass here;
* ``fused (alloc)``: the fused call allocating its result, as PyTorch's does;
* ``torch``: ``torch.nn.functional.conv_transpose{1,2,3}d`` with the bias, then the post-ops
  with torch ops (in place where torch has them), on tensors made once, in the same memory
  format and thread count. int8: ``torch.ao.nn.quantized.ConvTranspose{1,2,3}d`` (the
  first quantized engine of :data:`TORCH_QENGINES` whose result passes the check) then the
  quantized ReLU.

Derived per row: ``fused / unfused``, ``torch / fused`` (against the allocating fused call),
``saved`` (the median of per-round differences unfused - fused), ``saved / post`` and
``saved / pass``: at or above 1, fusion saves at least the post-op's memory pass.

Before timing, each row's fused result is checked against the unfused one (and against
PyTorch's) within the dtype's tolerance; a row that fails is reported as an error, not
timed, and the command exits 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from .. import dtypes
from . import peers, report, suites, timing
from .runner import TOLERANCE

Record = dict[str, Any]


@dataclass(frozen=True)
class PostCase:
    """A chain of post-ops after the bias.

    Attributes:
        name: short name in tables (``"bias+ReLU"``).
        kinds: the library post-op kinds, in order.
        operands: per binary post-op, its second tensor: ``"full"`` (dst's shape, a
            residual) or ``"channel"`` (one value per output channel).
    """

    name: str
    kinds: tuple[str, ...]
    operands: tuple[str, ...] = ()


#: the post-op chains of every float row
CASES = (
    PostCase("bias+ReLU", ("ReLU",)),
    PostCase("bias+Add", ("Add",), ("full",)),
    PostCase("bias+GELU", ("GELU",)),
    PostCase("bias+Add+ReLU+Mul", ("Add", "ReLU", "Multiply"), ("full", "channel")),
)

#: the int8 row's chain: u8 src, s8 weights, f32 bias, ReLU, u8 dst
INT8_CASE = "bias+ReLU->u8"

#: dtypes of the suite (int8 rows go with f32)
DTYPES = ("f32", "bf16")

#: int8 rows: largest difference from the unfused result, in units of the u8 output's
#: last place (rounding boundaries: f32 accumulation against the library's integer one),
#: and the largest share of elements that may differ by that much
INT8_LSB, INT8_SHARE = 1, 0.01
#: the same against PyTorch's quantized ConvTranspose (it requantizes its own way)
TORCH_INT8_LSB, TORCH_INT8_SHARE = 2, 0.05

#: quantized engines of the PyTorch int8 peer, in the order tried: the first whose result
#: passes the check is timed (x86 is PyTorch's default on x86 CPUs; on PyTorch 2.13 it and
#: onednn return wrong results for ConvTranspose with in != out channels, fbgemm is right)
TORCH_QENGINES = ("x86", "onednn", "fbgemm")

#: seconds of sleep before PyTorch's batch and the allocating fused call's (the next one):
#: the other OpenMP runtime's threads stop spinning meanwhile
GAP = 0.02


class Mismatch(RuntimeError):
    """A row's fused result differs from the unfused (or PyTorch's) one beyond tolerance."""


# -- layers -------------------------------------------------------------------------------
def layers(names: Optional[Sequence[str]] = None) -> list[suites.Layer]:
    """The models suite's layers (without the slow one), or those named, from the models
    and tiny suites.

    Raises:
        ValueError: a name that is in neither suite.
    """
    pool = {lay.name: lay for s in ("models", "tiny") for lay in suites.layers(s)}
    if names is None:
        return [lay for lay in suites.layers("models") if not lay.slow]
    unknown = [n for n in names if n not in pool]
    if unknown:
        msg = f"bench: unknown layer(s) {', '.join(unknown)} for the fused suite; expected {', '.join(pool)}"
        raise ValueError(msg)
    return [pool[n] for n in names]


# -- NumPy post-ops -----------------------------------------------------------------------
def _scipy_erf() -> Optional[Callable[..., Any]]:
    """scipy.special.erf, or None without SciPy (not a dependency)."""
    try:
        return importlib.import_module("scipy.special").erf  # type: ignore[no-any-return]
    except ImportError:
        return None


def _erf_name() -> str:
    if _scipy_erf() is None:
        return "NumPy polynomial (Abramowitz-Stegun 7.1.26, error < 1.5e-7)"
    return "scipy.special.erf"


def _erf(x: np.ndarray) -> None:
    """erf of a float32 array, in place."""
    erf = _scipy_erf()
    if erf is not None:
        erf(x, out=x)
        return
    a = np.abs(x)
    t = 1.0 / (1.0 + np.float32(0.3275911) * a)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    y = 1.0 - poly * np.exp(-a * a)
    np.copysign(y, x, out=x)


def numpy_post(
    src: np.ndarray, dst: np.ndarray, kinds: Sequence[str], operands: Sequence[np.ndarray], tmp: Optional[np.ndarray]
) -> None:
    """The post-ops ``kinds`` in NumPy: the first reads ``src`` and writes ``dst`` (the same
    array: in place), the others run in place on ``dst``. ``operands``: the binary
    post-ops' second tensors, in order; ``tmp``: a float32 buffer of dst's shape (GELU)."""
    pending = iter(operands)
    x = src
    for kind in kinds:
        if kind == "ReLU":
            np.maximum(x, 0, out=dst)
        elif kind == "Add":
            np.add(x, next(pending), out=dst)
        elif kind == "Multiply":
            np.multiply(x, next(pending), out=dst)
        elif kind == "GELU":  # 0.5 x (1 + erf(x / sqrt 2)), in float32
            assert tmp is not None
            np.multiply(x, np.float32(1 / math.sqrt(2)), out=tmp, dtype=np.float32)
            _erf(tmp)
            np.multiply(tmp, np.float32(0.5), out=tmp)
            np.add(tmp, np.float32(0.5), out=tmp)
            np.multiply(x, tmp, out=dst, dtype=np.float32, casting="unsafe")
        else:  # pragma: no cover - CASES names only the kinds above
            msg = f"bench: no NumPy post-op for {kind}"
            raise ValueError(msg)
        x = dst


def quantize_u8(y: np.ndarray, scale: float, q: np.ndarray) -> None:
    """The library's Quantize to u8 (zero point 0) of float32 ``y`` into ``q``; ``y`` is
    overwritten."""
    np.divide(y, np.float32(scale), out=y)
    np.rint(y, out=y)
    np.clip(y, 0, 255, out=y)
    np.copyto(q, y, casting="unsafe")


# -- checks -------------------------------------------------------------------------------
def check_close(what: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> float:
    """The relative error of ``got`` against ``want`` (max abs difference over max abs).

    Raises:
        Mismatch: above ``tolerance``, or NaN.
    """
    err = peers.relative_error(got, want)
    if not err <= tolerance:
        msg = f"{what}: relative error {err:.3g} above the tolerance {tolerance:.3g}"
        raise Mismatch(msg)
    return err


def check_u8(what: str, got: np.ndarray, want: np.ndarray, lsb: int, share: float) -> tuple[int, float]:
    """(largest difference, share of elements that differ) of two u8 arrays.

    Raises:
        Mismatch: a difference above ``lsb``, or more than ``share`` of the elements differ.
    """
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    worst = int(diff.max()) if diff.size else 0
    differ = float(np.count_nonzero(diff)) / max(1, diff.size)
    if worst > lsb or differ > share:
        msg = (f"{what}: u8 results differ by up to {worst} (allowed {lsb}) in {100 * differ:.2f}% of the "
               f"elements (allowed {100 * share:.2f}%)")
        raise Mismatch(msg)
    return worst, differ


# -- PyTorch ------------------------------------------------------------------------------
def _tensor(torch: Any, a: np.ndarray) -> Any:
    """A torch tensor on ``a``'s memory (bf16 through a uint16 view)."""
    if a.dtype == dtypes.FLOAT_DTYPES["bf16"]:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _memory_format(torch: Any, rank: int) -> Any:
    from ..torch_run import channels_last_format  # torch is imported: so may this be

    return channels_last_format(rank)


def torch_activation(torch: Any, a: Any, nxc: bool, rank: int) -> Any:
    """An activation of our layout as PyTorch's (N, C, X...) in the matching memory format
    (channels_last for NXC; in 1-D a channels-last strided view)."""
    if not nxc:
        return a.contiguous()
    t = a.movedim(-1, 1)
    fmt = _memory_format(torch, rank)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def torch_weights(torch: Any, w: Any, xoi: bool, rank: int) -> Any:
    """Weights of our layout as PyTorch's (I, O/groups, X...), in the activations' memory format."""
    if xoi:
        w = w.movedim((-1, -2), (0, 1))
        fmt = _memory_format(torch, rank)
        return w.contiguous(memory_format=fmt) if fmt is not None else w.contiguous()
    return w.contiguous()


def _conv(torch: Any, rank: int) -> Any:
    f = torch.nn.functional
    return {1: f.conv_transpose1d, 2: f.conv_transpose2d, 3: f.conv_transpose3d}[rank]


def torch_to_numpy(result: Any, nxc: bool) -> np.ndarray:
    """A PyTorch result as float32 NumPy in our layout."""
    r = result.float().contiguous().numpy()
    return np.moveaxis(r, 1, -1) if nxc else r


# -- one row ------------------------------------------------------------------------------
@dataclass
class Inputs:
    """One layer's tensors in one dtype and format, shared by its rows."""

    cfg: suites.Config
    src: np.ndarray
    w: np.ndarray
    bias: np.ndarray
    residual: np.ndarray
    channel: np.ndarray

    @property
    def rank(self) -> int:
        return len(self.cfg.layer.spatial)

    @property
    def nxc(self) -> bool:
        return self.cfg.data_format == "NXC"

    @property
    def dst_shape(self) -> tuple[int, ...]:
        lay = self.cfg.layer
        return self.cfg.activation_shape(lay.oc, lay.dst_spatial)


def make_inputs(layer: suites.Layer, dtype: str, fmt: str, seed: int = 0) -> Inputs:
    """src and weights as the models suite makes them; a bias, a residual of dst's shape and
    a per-channel factor (in 0.5..1.5), all in ``dtype``."""
    cfg = suites.Config("fused", layer, "fwd", dtype, fmt)
    case = cfg.build(seed)
    dt = dtypes.FLOAT_DTYPES[dtype]
    rng = np.random.default_rng(seed + 1)
    dst_shape = cfg.activation_shape(layer.oc, layer.dst_spatial)
    bias = rng.standard_normal(layer.oc, dtype=np.float32).astype(dt)
    residual = rng.standard_normal(dst_shape, dtype=np.float32).astype(dt)
    per = rng.uniform(0.5, 1.5, layer.oc).astype(np.float32).astype(dt)
    channel = per.reshape((1, layer.oc) + (1,) * len(layer.spatial)) if fmt == "NCX" else per
    return Inputs(cfg, case.args[0], case.args[1], bias, residual, channel)


def _base(inp: Inputs, case: str, dtype: str) -> Record:
    cfg, lay = inp.cfg, inp.cfg.layer
    return {
        "key": f"fused/{lay.name}/{case}/{dtype}/{cfg.data_format}",
        "layer": lay.name, "shape": lay.describe(), "case": case, "dtype": dtype, "format": cfg.data_format,
        "dst_shape": list(inp.dst_shape),
    }


def _fusion_state(op: Any, rec: Record) -> None:
    rec["lowering"] = op.lowering
    rec["fused"] = op.fused is True
    rec["partitions"] = op.partitions
    if not (op.fused is True and op.partitions == 1):
        rec["note"] = f"not fused: {op.lowering}"


def _time_row(
    rec: Record, runners: dict[str, Callable[[], Any]], opts: Options, dst_bytes: int,
) -> None:
    """Time the runners in rounds and derive the row's figures. ``runners``: ``fused``,
    ``unfused``, ``post``, ``pass``, ``copy``, ``fused_alloc`` and optionally ``torch``."""
    # PyTorch's batch and the allocating fused call's come first in each round, each after a
    # sleep (the other OpenMP runtime's threads stop spinning), so that both start alike; the
    # rest follow without sleeps
    names = [n for n in ("torch", "fused_alloc", "fused", "fused_inplace", "unfused", "post", "pass", "copy")
             if n in runners]
    torch_first: Optional[float] = None
    if "torch" in runners and opts.torch_limit > 0:  # a very slow PyTorch call is timed alone
        start = time.perf_counter()
        runners["torch"]()
        torch_first = time.perf_counter() - start
        if torch_first > opts.torch_limit:
            names.remove("torch")
        else:
            torch_first = None
    gaps = [GAP if n in ("torch", "fused_alloc") and "torch" in names else 0.0 for n in names]
    monitor = timing.LoadMonitor()
    results, samples = timing.measure_rounds(
        [timing.python_runner(runners[n]) for n in names], opts.repeat, opts.budget, gaps)
    rec["others_cpu"] = monitor.others()
    t = dict(zip(names, results))
    s = dict(zip(names, samples))
    for n in names:
        rec[f"{n}_ms"] = t[n].median * 1e3
        rec[f"{n}_iqr_ms"] = t[n].iqr * 1e3
    rec["samples"] = t["fused"].samples
    if torch_first is not None:
        rec["torch_ms"] = torch_first * 1e3
        rec["torch_once"] = True
    saved = [u - f for u, f in zip(s["unfused"], s["fused"])]
    rec["saved_ms"] = _median(saved) * 1e3
    rec["fused_vs_unfused"] = rec["fused_ms"] / rec["unfused_ms"]
    rec["saved_vs_post"] = rec["saved_ms"] / rec["post_ms"]
    rec["saved_vs_pass"] = rec["saved_ms"] / rec["pass_ms"]
    if "fused_inplace" in s:
        inplace = [u - f for u, f in zip(s["unfused"], s["fused_inplace"])]
        rec["saved_inplace_ms"] = _median(inplace) * 1e3
        rec["saved_inplace_vs_pass"] = rec["saved_inplace_ms"] / rec["pass_ms"]
        if rec["saved_inplace_ms"] > rec["saved_ms"]:
            saved = inplace
    # the best call's per-round savings, in passes: their quartiles say how far noise reaches
    q1, _, q3 = timing.quartiles(sorted(v * 1e3 / rec["pass_ms"] for v in saved))
    rec["best_saved_vs_pass"] = max(rec["saved_vs_pass"], rec.get("saved_inplace_vs_pass", -math.inf))
    rec["best_saved_vs_pass_q1"], rec["best_saved_vs_pass_q3"] = q1, q3
    rec["pass_gbs"] = 2 * dst_bytes / (rec["pass_ms"] * 1e-3) / 1e9
    if rec.get("torch_ms") is not None:
        rec["torch_vs_fused"] = rec["torch_ms"] / rec["fused_alloc_ms"]


def in_place_pass(dst: np.ndarray) -> Callable[[], None]:
    """A runner of one memory pass over a copy of ``dst`` in place: each byte read once and
    written back (XOR with 0 over the bytes seen as the widest unsigned integers that tile
    them), as a post-op applied after the op reads and writes dst."""
    scratch = np.ascontiguousarray(dst).copy().reshape(-1).view(np.uint8)
    width = next(w for w in (8, 4, 2, 1) if scratch.size % w == 0)
    words = scratch.view(f"u{width}")

    def run() -> None:
        np.bitwise_xor(words, 0, out=words)

    return run


def _median(values: Sequence[float]) -> float:
    return timing.quartiles(sorted(values))[1]


@dataclass
class Options:
    """How much effort each row gets.

    Attributes:
        repeat: rounds per row.
        budget: seconds per row's rounds, about (at least 3 rounds).
        torch: compare with PyTorch when it is installed.
        torch_limit: a PyTorch call slower than this many seconds is timed once, alone.
        wait_idle: before each row, wait up to this many seconds for other processes to go quiet.
        retry_busy: run again up to this many times the rows during which other processes
            used more than :data:`BUSY` CPUs.
    """

    repeat: int = 7
    budget: float = 2.0
    torch: bool = True
    torch_limit: float = 5.0
    wait_idle: float = 0.0
    retry_busy: int = 0


def float_row(inp: Inputs, case: PostCase, opts: Options) -> Record:
    """One float row: build, check, time."""
    import onednn_convt as oc

    cfg = inp.cfg
    rec = _base(inp, case.name, cfg.dtype)
    attrs = cfg.attrs()
    fused = oc.ConvTranspose(**attrs, post_ops=[oc.PostOp(k) for k in case.kinds])
    plain = oc.ConvTranspose(**attrs)
    operands = [inp.residual if o == "full" else inp.channel for o in case.operands]
    dt = inp.src.dtype
    shape = inp.dst_shape
    out_f, out_u = np.empty(shape, dt), np.empty(shape, dt)
    tmp = np.empty(shape, np.float32) if "GELU" in case.kinds else None
    src, w, bias = inp.src, inp.w, inp.bias

    start = time.perf_counter()
    fused(src, w, bias, *operands, out=out_f)
    rec["compile_ms"] = (time.perf_counter() - start) * 1e3
    _fusion_state(fused, rec)
    plain(src, w, bias, out=out_u)
    rec["plain_lowering"] = plain.lowering
    y0 = out_u.copy()  # the plain op's dst, for the post-op-alone and pass runners
    buf, copy = np.empty(shape, dt), np.empty(shape, dt)

    def run_fused() -> None:
        fused(src, w, bias, *operands, out=out_f)

    def run_unfused() -> None:
        plain(src, w, bias, out=out_u)
        numpy_post(out_u, out_u, case.kinds, operands, tmp)

    def run_post() -> None:
        numpy_post(y0, buf, case.kinds, operands, tmp)

    def run_copy() -> None:
        np.copyto(copy, y0)

    def run_fused_alloc() -> Any:
        return fused(src, w, bias, *operands)

    runners: dict[str, Callable[[], Any]] = {
        "fused": run_fused, "unfused": run_unfused, "post": run_post, "pass": in_place_pass(y0),
        "copy": run_copy, "fused_alloc": run_fused_alloc,
    }
    run_fused()
    run_unfused()
    tol = TOLERANCE[cfg.dtype]
    what = rec["key"]
    rec["err_unfused"] = check_close(f"{what}: fused against unfused", out_f, out_u, tol)
    rec["err_alloc"] = check_close(f"{what}: fused allocating against out=", run_fused_alloc(), out_f, 0.0)
    if case.operands[:1] == ("full",):  # a residual first: out= the residual, the call in place
        residual = operands[0].copy()

        def run_fused_inplace() -> None:  # the residual accumulates the results: timing only
            fused(src, w, bias, residual, *operands[1:], out=residual)

        rec["err_inplace"] = check_close(
            f"{what}: fused with out= the residual against out=",
            fused(src, w, bias, residual, *operands[1:], out=residual), out_f, 0.0)
        rec["inplace_lowering"] = fused.lowering
        runners["fused_inplace"] = run_fused_inplace

    torch = peers.torch_module() if opts.torch else None
    if torch is not None:
        call = _torch_float(torch, inp, case, operands)
        result = call()
        rec["err_torch"] = check_close(f"{what}: fused against PyTorch", out_f, torch_to_numpy(result, inp.nxc), 2 * tol)
        del result
        runners["torch"] = call
    _time_row(rec, runners, opts, out_f.nbytes)
    return rec


def _torch_float(torch: Any, inp: Inputs, case: PostCase, operands: Sequence[np.ndarray]) -> Callable[[], Any]:
    """PyTorch's ConvTranspose with the bias, then ``case``'s post-ops, on tensors made once."""
    lay, rank, nxc = inp.cfg.layer, inp.rank, inp.nxc
    x = torch_activation(torch, _tensor(torch, inp.src), nxc, rank)
    w = torch_weights(torch, _tensor(torch, inp.w), inp.cfg.weights_format == "XOI", rank)
    b = _tensor(torch, inp.bias)
    seconds = []
    for kind_of, a in zip(case.operands, operands):
        if kind_of == "full":
            seconds.append(torch_activation(torch, _tensor(torch, a), nxc, rank))
        else:
            seconds.append(_tensor(torch, a).reshape((1, lay.oc) + (1,) * rank))
    conv = _conv(torch, rank)
    gelu = torch.nn.functional.gelu
    stride, pad, zeros, ones = [lay.stride] * rank, [lay.pad] * rank, [0] * rank, [1] * rank
    kinds = case.kinds

    def call() -> Any:
        with torch.inference_mode():
            y = conv(x, w, b, stride, pad, zeros, lay.groups, ones)
            pending = iter(seconds)
            for kind in kinds:
                if kind == "ReLU":
                    y.relu_()
                elif kind == "Add":
                    y.add_(next(pending))
                elif kind == "Multiply":
                    y.mul_(next(pending))
                else:  # GELU: no in-place form
                    y = gelu(y)
            return y

    return call


def int8_row(inp: Inputs, opts: Options) -> Record:
    """The int8 row of an f32 layer: u8 src, s8 weights (per-tensor scales), f32 bias, ReLU,
    u8 dst (zero points 0; dst's scale from the largest f32 result). Its unfused form is the
    int8 ConvTranspose with an f32 dst (Dequantize, ConvTranspose and BiasAdd: one partition
    too), then ReLU and Quantize in NumPy, so that fused/unfused is the fusion of the ReLU
    and the Quantize alone, both with the int8 kernel."""
    import onednn_convt as oc

    cfg = inp.cfg
    rec = _base(inp, INT8_CASE, "int8")
    attrs = cfg.attrs()
    s_src = 4.0 / 255
    src_u8 = np.clip(np.rint(np.abs(inp.src) / s_src), 0, 255).astype(np.uint8)
    s_w = float(np.max(np.abs(inp.w))) / 127 or 1.0
    w_s8 = np.clip(np.rint(inp.w / s_w), -127, 127).astype(np.int8)
    bias = inp.bias.astype(np.float32)
    src_dq, w_dq = oc.Dequantize(scales=s_src, zps=0), oc.Dequantize(scales=s_w)
    plain = oc.ConvTranspose(**attrs, src_dequantize=src_dq, weights_dequantize=w_dq)  # f32 dst
    shape = inp.dst_shape
    y = np.empty(shape, np.float32)
    plain(src_u8, w_s8, bias, out=y)
    s_dst = float(np.max(y)) / 255 or 1.0
    rec["scales"] = {"src": s_src, "weights": s_w, "dst": s_dst}
    fused = oc.ConvTranspose(**attrs, src_dequantize=src_dq, weights_dequantize=w_dq, dst_quantize=oc.Quantize(scales=s_dst, zps=0, dtype="u8"),
                             post_ops=[oc.PostOp("ReLU")])
    q_f, q_u = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
    start = time.perf_counter()
    fused(src_u8, w_s8, bias, out=q_f)
    rec["compile_ms"] = (time.perf_counter() - start) * 1e3
    _fusion_state(fused, rec)
    rec["plain_lowering"] = plain.lowering
    y0 = y.copy()
    buf, copy, q_p = np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.uint8)

    def run_fused() -> None:
        fused(src_u8, w_s8, bias, out=q_f)

    def run_unfused() -> None:
        plain(src_u8, w_s8, bias, out=y)
        np.maximum(y, 0, out=y)
        quantize_u8(y, s_dst, q_u)

    def run_post() -> None:
        np.maximum(y0, 0, out=buf)
        quantize_u8(buf, s_dst, q_p)

    def run_copy() -> None:
        np.copyto(copy, y0)

    def run_fused_alloc() -> Any:
        return fused(src_u8, w_s8, bias)

    runners: dict[str, Callable[[], Any]] = {
        "fused": run_fused, "unfused": run_unfused, "post": run_post, "pass": in_place_pass(y0),
        "copy": run_copy, "fused_alloc": run_fused_alloc,
    }
    run_fused()
    run_unfused()
    what = rec["key"]
    rec["lsb_unfused"], rec["differ_unfused"] = check_u8(f"{what}: fused against unfused", q_f, q_u,
                                                         INT8_LSB, INT8_SHARE)
    # the unfused form shares the int8 kernel: also against the f32 op on the dequantized tensors
    f32_ref = oc.ConvTranspose(**attrs)(src_u8.astype(np.float32) * np.float32(s_src),
                                        w_s8.astype(np.float32) * np.float32(s_w), bias)
    q_ref = np.empty(shape, np.uint8)
    quantize_u8(np.maximum(f32_ref, 0, out=f32_ref), s_dst, q_ref)
    rec["lsb_f32"], rec["differ_f32"] = check_u8(f"{what}: fused against the f32 op", q_f, q_ref,
                                                 INT8_LSB, INT8_SHARE)
    del f32_ref, q_ref
    check_u8(f"{what}: fused allocating against out=", run_fused_alloc(), q_f, 0, 0.0)
    torch = peers.torch_module() if opts.torch else None
    if torch is not None:
        rejected: dict[str, str] = {}
        for engine in TORCH_QENGINES:
            if engine not in torch.backends.quantized.supported_engines:
                continue
            try:
                call = _torch_int8(torch, engine, inp, src_u8, w_s8, bias, (s_src, s_w, s_dst))
                with _quiet_quantized():
                    got = call()
                r = got.int_repr().contiguous().numpy()
                r = np.moveaxis(r, 1, -1) if inp.nxc else r
                rec["lsb_torch"], rec["differ_torch"] = check_u8(
                    f"PyTorch int8 ({engine})", q_f, r, TORCH_INT8_LSB, TORCH_INT8_SHARE)
            except (RuntimeError, AttributeError, NotImplementedError) as e:  # Mismatch too
                rejected[engine] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            rec["torch_engine"] = engine
            runners["torch"] = call
            break
        if rejected:
            rec["torch_rejected"] = rejected
        if "torch" not in runners:
            rec["torch_error"] = "no quantized engine gave the right result: " + "; ".join(
                f"{k}: {v}" for k, v in rejected.items())
    with _quiet_quantized():
        _time_row(rec, runners, opts, y.nbytes)
    rec["pass_bytes_of"] = "f32 dst (the unfused intermediate)"
    return rec


@contextlib.contextmanager
def _quiet_quantized() -> Iterator[None]:
    """A context in which PyTorch's deprecation warning for quantized tensors is ignored."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
        yield


def _torch_int8(
    torch: Any, engine: str, inp: Inputs, src_u8: np.ndarray, w_s8: np.ndarray, bias: np.ndarray,
    scales: tuple[float, float, float],
) -> Callable[[], Any]:
    """PyTorch's quantized ConvTranspose (u8 in, s8 weights, u8 out) with its weights packed
    for quantized ``engine``, then its quantized ReLU."""
    lay, rank, nxc = inp.cfg.layer, inp.rank, inp.nxc
    s_src, s_w, s_dst = scales
    qnn = torch.ao.nn.quantized
    module = {1: qnn.ConvTranspose1d, 2: qnn.ConvTranspose2d, 3: qnn.ConvTranspose3d}[rank]
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine  # the weights are packed for this engine
    with _quiet_quantized():
        m = module(lay.ic, lay.oc, lay.kernel, stride=lay.stride, padding=lay.pad, groups=lay.groups)
        w = torch_weights(torch, torch.from_numpy(w_s8), inp.cfg.weights_format == "XOI", rank).contiguous()
        qw = torch._make_per_tensor_quantized_tensor(w, s_w, 0)
        m.set_weight_bias(qw, torch.from_numpy(bias))
        m.scale, m.zero_point = s_dst, 0
        x = torch._make_per_tensor_quantized_tensor(torch.from_numpy(src_u8), s_src, 0)
        qx = torch_activation(torch, x, nxc, rank)
    torch.backends.quantized.engine = before
    relu = torch.relu

    def call() -> Any:
        with torch.inference_mode():
            return relu(m(qx))

    return call


# -- the suite ----------------------------------------------------------------------------
def plan(
    layer_list: Sequence[suites.Layer], dtypes_: Sequence[str], formats: Sequence[str], int8: bool = True,
) -> list[tuple[suites.Layer, str, str, Optional[PostCase]]]:
    """The rows, in order: per layer and format, each dtype's four chains; after f32's, the
    int8 row (case None)."""
    rows: list[tuple[suites.Layer, str, str, Optional[PostCase]]] = []
    for lay in layer_list:
        for fmt in formats:
            for dt in dtypes_:
                rows += [(lay, dt, fmt, c) for c in CASES]
                if dt == "f32" and int8:
                    rows.append((lay, dt, fmt, None))
    return rows


def measure(
    layer_list: Sequence[suites.Layer], dtypes_: Sequence[str], formats: Sequence[str], opts: Options,
    int8: bool = True,
) -> list[Record]:
    """Every row: checked, then timed; a row that fails has ``error`` (and no timings). With
    ``opts.retry_busy``, rows during which other processes used more than ``BUSY`` CPUs run
    again (up to that many times), keeping the quieter measurement."""
    rows = plan(layer_list, dtypes_, formats, int8)
    cache: dict[tuple[str, str, str], Inputs] = {}
    start = time.perf_counter()

    def one(lay: suites.Layer, dt: str, fmt: str, case: Optional[PostCase], label: str) -> Record:
        name = case.name if case is not None else INT8_CASE
        print(f"{label} {lay.name} {name} {'int8' if case is None else dt} {fmt} ...",
              end="", file=sys.stderr, flush=True)
        key = (lay.name, dt, fmt)
        if key not in cache:
            cache.clear()  # one layer's tensors at a time
            cache[key] = make_inputs(lay, dt, fmt)
        inp = cache[key]
        if opts.wait_idle > 0:
            timing.wait_for_quiet(opts.wait_idle)
        try:
            rec = float_row(inp, case, opts) if case is not None else int8_row(inp, opts)
        except Exception as e:  # noqa: BLE001 - recorded, reported, and the exit code says so
            rec = _base(inp, name, "int8" if case is None else dt)
            rec["error"] = f"{type(e).__name__}: {e}"
        print(" " + _progress(rec) + f"  [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)
        return rec

    width = len(str(len(rows)))
    records = [one(*row, f"[{i:>{width}}/{len(rows)}]") for i, row in enumerate(rows, 1)]
    for attempt in range(1, opts.retry_busy + 1):
        again = [i for i, r in enumerate(records) if _busy(r) > BUSY]
        if not again:
            break
        print(f"retry {attempt}: {len(again)} rows ran while other processes were busy", file=sys.stderr, flush=True)
        for n, i in enumerate(again, 1):
            rec = one(*rows[i], f"[retry {n}/{len(again)}]")
            if not rec.get("error") and _busy(rec) < _busy(records[i]):
                rec["retried"] = attempt
                records[i] = rec
    return records


#: CPUs used by other processes above which a row counts as disturbed (as in the other suites)
BUSY = 0.2

#: fused/unfused above which the notes list a row as one where fusion made the call slower
SLOWER = 1.05


def _busy(rec: Record) -> float:
    return float(rec.get("others_cpu") or 0)


def _progress(rec: Record) -> str:
    if rec.get("error"):
        return f"ERROR {rec['error']}"
    text = (f"fused {rec['fused_ms']:.3g} ms, unfused {rec['unfused_ms']:.3g} ms "
            f"({rec['fused_vs_unfused']:.2f}), saved/pass {rec['saved_vs_pass']:.2f}")
    if rec.get("torch_ms") is not None:
        text += f", torch {rec['torch_ms']:.3g} ms ({rec['torch_vs_fused']:.2f}x)"
    if not rec.get("fused"):
        text += f", NOT FUSED ({rec.get('lowering')})"
    return text


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.{digits}g}"
    return str(v)


def _r(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _torch_cell(r: Record) -> str:
    if r.get("torch_error"):
        return "n/a"
    return _f(r.get("torch_ms")) + (" (once)" if r.get("torch_once") else "")


def _check_cell(r: Record) -> str:
    if r["dtype"] == "int8":
        parts = [(f"{r['lsb_unfused']} LSB ({100 * r['differ_unfused']:.2g}%), f32 op {r['lsb_f32']} LSB "
                  f"({100 * r['differ_f32']:.2g}%)")]
        if r.get("lsb_torch") is not None:
            parts.append(f"{r['lsb_torch']} LSB ({100 * r['differ_torch']:.2g}%, {r['torch_engine']})")
        return " / ".join(parts)
    parts = [f"{r['err_unfused']:.1e}"]
    if r.get("err_torch") is not None:
        parts.append(f"{r['err_torch']:.1e}")
    return " / ".join(parts)


#: (header, cell) of the per-row table
COLUMNS: list[tuple[str, Callable[[Record], str]]] = [
    ("layer", lambda r: r["layer"]),
    ("post-ops", lambda r: r["case"]),
    ("dtype", lambda r: r["dtype"]),
    ("fmt", lambda r: r["format"]),
    ("1 partition", lambda r: "yes" if r.get("fused") and r.get("partitions") == 1 else "NO"),
    ("fused ms", lambda r: _f(r.get("fused_ms"))),
    ("unfused ms", lambda r: _f(r.get("unfused_ms"))),
    ("fused/unfused", lambda r: _r(r.get("fused_vs_unfused"))),
    ("saved ms", lambda r: _f(r.get("saved_ms"))),
    ("NumPy post ms", lambda r: _f(r.get("post_ms"))),
    ("saved/post", lambda r: _r(r.get("saved_vs_post"))),
    ("pass ms", lambda r: _f(r.get("pass_ms"))),
    ("copy ms", lambda r: _f(r.get("copy_ms"))),
    ("saved/pass", lambda r: _r(r.get("saved_vs_pass"))),
    ("in place ms", lambda r: _f(r.get("fused_inplace_ms"))),
    ("saved/pass in place", lambda r: _r(r.get("saved_inplace_vs_pass"))),
    ("best saved/pass [q1, q3]", lambda r: f"{_r(r.get('best_saved_vs_pass'))} "
     f"[{_r(r.get('best_saved_vs_pass_q1'))}, {_r(r.get('best_saved_vs_pass_q3'))}]"),
    ("fused alloc ms", lambda r: _f(r.get("fused_alloc_ms"))),
    ("torch ms", _torch_cell),
    ("torch/fused", lambda r: _r(r.get("torch_vs_fused"))),
    ("check: unfused / torch", _check_cell),
    ("busy", lambda r: _f(r.get("others_cpu"), 1)),
]


def markdown_table(records: Sequence[Record]) -> str:
    """Every row as a Markdown table (a failed row shows its error)."""
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in records:
        if r.get("error"):
            lines.append(f"| {r['layer']} | {r['case']} | {r['dtype']} | {r['format']} | ERROR: {r['error']} |")
            continue
        lines.append("| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |")
    return "\n".join(lines)


def summary(records: Sequence[Record]) -> list[Record]:
    """Per dtype (f32, bf16, int8): geomeans of fused/unfused and torch/fused, the median and
    smallest saved/pass, and counts of the rows that saved at least one pass, where fusion was
    slower (fused/unfused above :data:`SLOWER`) or not one partition."""
    out = []
    for dt in ("f32", "bf16", "int8"):
        rows = [r for r in records if r["dtype"] == dt and not r.get("error")]
        if not rows:
            continue
        torch_rows = [r["torch_vs_fused"] for r in rows if r.get("torch_vs_fused")]
        passes = [r["best_saved_vs_pass"] for r in rows]
        out.append({
            "dtype": dt, "rows": len(rows),
            "fused_vs_unfused": report._geomean([r["fused_vs_unfused"] for r in rows]),
            "torch_vs_fused": report._geomean(torch_rows) if torch_rows else None,
            "saved_vs_pass_median": _median(passes),
            "saved_vs_pass_min": min(passes),
            "saved_at_least_one_pass": sum(p >= 1 for p in passes),
            "below_one_pass_beyond_noise": sum(r["best_saved_vs_pass_q3"] < 1 for r in rows),
            "fused_slower": sum(r["fused_vs_unfused"] > SLOWER for r in rows),
            "not_one_partition": sum(not (r.get("fused") and r.get("partitions") == 1) for r in rows),
        })
    return out


def summary_table(items: Sequence[Record]) -> str:
    lines = [
        ("| dtype | rows | geomean fused/unfused | geomean torch/fused | saved/pass: median | min "
         f"| rows saving >= 1 pass | rows below 1 pass beyond noise (q3 < 1) "
         f"| rows where fused is slower (fused/unfused > {SLOWER}) | rows not one partition |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in items:
        lines.append(
            f"| {s['dtype']} | {s['rows']} | {s['fused_vs_unfused']:.2f} | {_r(s['torch_vs_fused'])} | "
            f"{s['saved_vs_pass_median']:.2f} | {s['saved_vs_pass_min']:.2f} | {s['saved_at_least_one_pass']} | "
            f"{s['below_one_pass_beyond_noise']} | "
            f"{s['fused_slower']} | {s['not_one_partition']} |"
        )
    return "\n".join(lines)


LEGEND = """\
Columns: *fused ms*: one call of `ConvTranspose(post_ops=...)` with `out=`; *unfused ms*: the plain
`ConvTranspose` with the bias (`out=`), then the same post-ops in NumPy, in place (int8: the int8
ConvTranspose with an f32 dst, itself one partition, then ReLU and Quantize to u8 in NumPy); *saved ms*: median of the
per-round differences unfused - fused; *NumPy post ms*: the post-ops alone in NumPy on a ready dst
(int8: ReLU and Quantize); *pass ms*: one memory pass over dst in place (each byte read once and written back: a
bitwise XOR with 0 over dst's bytes; int8: over the f32 dst), the memory pass a post-op costs at the
least; *copy ms*: a NumPy copy of dst into another buffer, for comparison (the write-allocate reads the
destination too, so a copy costs more than a pass); *saved/pass* at or above 1: fusion
saves at least the post-op's memory pass; *in place ms*: the fused call with `out=` its residual (chains
whose first post-op adds a tensor of dst's shape), and its *saved/pass*; *best saved/pass [q1, q3]*: the
better of the two calls, with the quartiles of its per-round savings in passes (q3 below 1: it saves less
than a pass beyond this machine's noise; the summary's saved/pass figures are these); *fused alloc ms*: the fused call allocating its result, as
PyTorch's call does; *torch/fused*: PyTorch's time over the allocating fused call (above 1: ours is
faster); *check*: relative error of the fused result against the unfused one / PyTorch's (int8: the
largest difference in u8 steps and the share of elements that differ, against the unfused result, the
f32 op on the dequantized tensors and PyTorch's, with the quantized engine that passed); *busy*: CPUs other processes
used meanwhile. Times are medians of alternating batches (torch, fused alloc, fused, unfused, post,
pass, copy, torch, ...; a short sleep before torch's and fused alloc's batches lets the other OpenMP
runtime's threads stop spinning). NumPy's bf16 arithmetic (ml_dtypes) runs scalar loops, several
times slower than a memory pass: bf16's unfused figures are mostly NumPy's cost, saved/pass says how
much more than one pass fusion saved."""


def run(args: argparse.Namespace, meta: dict[str, Any]) -> int:
    """The fused suite: print and write ``fused.md`` / ``fused.json`` to ``args.out``."""
    quick = args.quick
    opts = Options(
        repeat=args.repeat or (3 if quick else 7),
        budget=args.budget or (0.05 if quick else 2.0),
        torch=not args.no_torch and peers.torch_module() is not None,
        torch_limit=args.torch_limit,
        wait_idle=max(0.0, args.wait_idle),
        retry_busy=max(0, args.retry_busy),
    )
    try:
        names = args.layers
        chosen = layers(names)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    wanted = args.dtypes or list(DTYPES)
    bad = [d for d in wanted if d not in DTYPES]
    if bad:
        print(f"bench: the fused suite runs {', '.join(DTYPES)}, not {', '.join(bad)}", file=sys.stderr)
        return 2
    formats = args.formats or ["NCX"]
    meta = dict(meta, gelu_numpy_erf=_erf_name(),
                torch_quantized_engines_tried=list(TORCH_QENGINES) if opts.torch else None)
    start = time.perf_counter()
    records = measure(chosen, wanted, formats, opts, int8="f32" in wanted)
    items = summary(records)
    failed = [r for r in records if r.get("error")]
    header = "\n".join(report.header_lines(meta, None))
    notes = [f"NumPy GELU (erf form) through {meta['gelu_numpy_erf']}."]
    if opts.torch:
        engines = sorted({r["torch_engine"] for r in records if r.get("torch_engine")})
        rejected = sorted({e for r in records for e in r.get("torch_rejected", {})})
        notes.append(
            "PyTorch int8 peer: `torch.ao.nn.quantized.ConvTranspose{1,2,3}d` (u8 src, s8 weights, u8 dst; "
            "`torch.ao.nn.quantized.functional` has no conv_transpose), then the quantized ReLU; quantized "
            f"engines tried in the order {', '.join(TORCH_QENGINES)}, the first whose result passes the check "
            f"timed: {', '.join(engines) or 'none'}"
            + (f"; rejected on some row: {', '.join(rejected)} (see each row's torch_rejected in the JSON)"
               if rejected else "") + ".")
    seen: set[str] = set()
    for r in records:
        if r.get("note"):
            notes.append(f"{r['key']}: {r['note']}")
        if r.get("torch_error"):
            notes.append(f"{r['key']}: PyTorch failed: {r['torch_error']}")
        for engine, why in r.get("torch_rejected", {}).items():
            if engine not in seen:
                seen.add(engine)
                notes.append(f"PyTorch int8 engine {engine} rejected (first on {r['key']}): {why}")
    slower = [r for r in records if not r.get("error") and r["fused_vs_unfused"] > SLOWER]
    if slower:
        notes.append(f"fused slower than unfused (fused/unfused above {SLOWER}) on {len(slower)} row(s): "
                     + ", ".join(f"{r['layer']} {r['case']} {r['dtype']} {r['format']} ({r['fused_vs_unfused']:.2f})"
                                 for r in slower))
    busy = [r for r in records if _busy(r) > BUSY]
    if busy:
        notes.append(f"WARNING: other processes used more than {BUSY} CPUs during {len(busy)} row(s) (column "
                     "busy; --wait-idle, --retry-busy): those timings are slower and noisier")
    if failed:
        notes.append(f"FAILED: {len(failed)} row(s): " + "; ".join(f"{r['key']}: {r['error']}" for r in failed))
    intro = (
        f"Fused ConvTranspose (bias and post-ops in one library partition) against the unfused op followed by "
        f"NumPy and against PyTorch, forward, {opts.repeat} rounds per row ({opts.budget:g} s budget)."
    )
    text = (header + "\n\n" + intro + "\n\n" + summary_table(items) + "\n\n" + markdown_table(records) + "\n\n"
            + LEGEND + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    print()
    print(text)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = args.name or "fused"
    (out / f"{base}.md").write_text(text)
    report.write_json({"meta": meta, "options": vars(opts), "elapsed_s": time.perf_counter() - start,
                       "summary": items, "results": records, "notes": notes}, out / f"{base}.json")
    print(f"\nwrote {out / (base + '.md')}, {out / (base + '.json')}", file=sys.stderr)
    if failed:
        print(f"bench: {len(failed)} fused row(s) FAILED their checks (see above)", file=sys.stderr)
        return 1
    return 0

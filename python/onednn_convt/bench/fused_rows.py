"""What every row of the fused suite shares: its inputs, its record, how it is timed, the options."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .. import dtypes
from . import suites, timing
from .fused_checks import GAP, Record, median


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


def base_record(inp: Inputs, case: str, dtype: str) -> Record:
    cfg, lay = inp.cfg, inp.cfg.layer
    return {
        "key": f"fused/{lay.name}/{case}/{dtype}/{cfg.data_format}",
        "layer": lay.name, "shape": lay.describe(), "case": case, "dtype": dtype, "format": cfg.data_format,
        "dst_shape": list(inp.dst_shape),
    }


def fusion_state(op: Any, rec: Record) -> None:
    rec["lowering"] = op.lowering
    rec["fused"] = op.fused is True
    rec["partitions"] = op.partitions
    if not (op.fused is True and op.partitions == 1):
        rec["note"] = f"not fused: {op.lowering}"


def time_row(
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
    rec["saved_ms"] = median(saved) * 1e3
    rec["fused_vs_unfused"] = rec["fused_ms"] / rec["unfused_ms"]
    rec["saved_vs_post"] = rec["saved_ms"] / rec["post_ms"]
    rec["saved_vs_pass"] = rec["saved_ms"] / rec["pass_ms"]
    if "fused_inplace" in s:
        inplace = [u - f for u, f in zip(s["unfused"], s["fused_inplace"])]
        rec["saved_inplace_ms"] = median(inplace) * 1e3
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



"""Threads fuzzer: many threads calling ops while the caches evict and op objects die.

Each trial (its own process) draws a few problems of the three ops (f32 and bf16, 1-D to
3-D, NCX/NXC, groups, dilations: some run as oneDNN kernels bound to the thread that made
them, see ``CompiledOp::thread_bound_``), computes their references first, then starts 2-8
threads that call them in random order, each with its own op objects or shared ones, with
and without ``out=``; meanwhile a chaos thread shrinks and clears the compiled-partition
cache, drops op objects (made again later) and collects garbage. Every result is compared
with its reference; a wrong one fails the trial, and the harness catches a crash or a hang.
"""

from __future__ import annotations

import gc
import math
import threading
from typing import Any

import numpy as np

import onednn_convt as oc
from harness import Failure
from onednn_convt import accuracy, reference

NAME = "threads"
PER_PROCESS = 1
TIMEOUT = 180.0
DTYPES = {"f32": np.float32, "bf16": oc.dtypes.FLOAT_DTYPES["bf16"]}


def _problem(rng: np.random.Generator) -> dict[str, Any]:
    """One small valid problem with its inputs and reference."""
    op = str(rng.choice(["fwd", "bwd_d", "bwd_w"]))
    code = str(rng.choice(["f32", "bf16"]))
    rank = int(rng.choice([1, 2, 3]))
    groups = int(rng.choice([1, 1, 2]))
    ic, oc_ = groups * int(rng.integers(1, 9)), groups * int(rng.integers(1, 9))
    kernel = [int(rng.integers(1, 4)) for _ in range(rank)]
    strides = [int(rng.integers(1, 3)) for _ in range(rank)]
    dilations = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
    fmt = str(rng.choice(["NCX", "NXC"]))
    attrs = dict(strides=strides, dilations=dilations, groups=groups, data_format=fmt,
                 weights_format="IOX" if fmt == "NCX" else "XOI",
                 pads_begin=[int(rng.integers(0, d * (k - 1) + 1)) for k, d in zip(kernel, dilations)])
    n = int(rng.integers(1, 4))
    src = [int(rng.integers(2, 7)) for _ in range(rank)]
    dst = [s * (x - 1) + d * (k - 1) + 1 - pb for x, k, s, d, pb in zip(src, kernel, strides, dilations,
                                                                    attrs["pads_begin"])]
    dt = DTYPES[code]
    act = (lambda c, sp: (n, c, *sp)) if fmt == "NCX" else (lambda c, sp: (n, *sp, c))
    wshape = (ic, oc_ // groups, *kernel) if fmt == "NCX" else (*kernel, oc_ // groups, ic)
    x = rng.standard_normal(act(ic, src)).astype(dt)
    w = rng.standard_normal(wshape).astype(dt)
    dd = rng.standard_normal(act(oc_, dst)).astype(dt)
    f64 = [np.asarray(a, np.float64) for a in (x, w, dd)]
    if op == "fwd":
        args: tuple[Any, ...] = (x, w)
        ref = reference.conv_transpose(f64[0], f64[1], **attrs)
        reduction = ic // groups * math.prod(kernel)
    elif op == "bwd_d":
        args = (dd, w)
        ref = reference.conv_transpose_backward_data(f64[2], f64[1], **attrs)
        reduction = oc_ // groups * math.prod(kernel)
    else:
        args = (x, dd, np.array(wshape))
        ref = reference.conv_transpose_backward_weights(f64[0], f64[2], wshape, **attrs)
        reduction = n * math.prod(dst)
    scale = float(np.max(np.abs(ref))) or 1.0
    return dict(op=op, code=code, attrs=attrs, args=args, ref=ref, dtype=dt,
                tol=accuracy.tolerance(code, reduction) * scale * 4)


def _make(p: dict[str, Any]) -> Any:
    cls = {"fwd": oc.ConvTranspose, "bwd_d": oc.ConvTransposeBackwardData,
           "bwd_w": oc.ConvTransposeBackwardWeights}[p["op"]]
    return cls(**p["attrs"])


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    problems = [_problem(rng) for _ in range(int(rng.integers(2, 7)))]
    threads = int(rng.integers(2, 9))
    calls = int(rng.integers(20, 80))
    shared = [_make(p) for p in problems]
    box = {"shared": shared}
    errors: list[str] = []
    stop = threading.Event()
    seeds = rng.integers(0, 2**31, threads + 1)

    def work(seed: int) -> None:
        r = np.random.default_rng(seed)
        own = [_make(p) for p in problems] if r.random() < 0.5 else None
        p: dict[str, Any] = problems[0]
        op: Any = None
        try:
            for _ in range(calls):
                k = int(r.integers(len(problems)))
                p = problems[k]
                ops = own if own is not None and r.random() < 0.7 else box["shared"]
                op = ops[k]
                if r.random() < 0.3:
                    out = np.empty(p["ref"].shape, p["dtype"])
                    got = op(*p["args"], out=out)
                else:
                    got = op(*p["args"])
                err = float(np.max(np.abs(np.asarray(got, np.float64) - p["ref"])))
                if not err <= p["tol"]:
                    errors.append(f"{p['op']} {p['code']} {p['attrs']}: off by {err:.3g} ({op.lowering})")
                    return
                if own is not None and r.random() < 0.05:
                    own[k] = _make(p)  # the old object (and its plans) dies on this thread
        except Exception as e:  # noqa: BLE001 - any error in a worker is a finding
            errors.append(f"{p['op']} {p['code']} {p['attrs']} ({op.lowering}): {type(e).__name__}: {e}")

    def chaos(seed: int) -> None:
        r = np.random.default_rng(seed)
        while not stop.is_set():
            roll = r.random()
            if roll < 0.3:
                oc.set_cache_capacity(int(r.integers(0, 8)))
            elif roll < 0.5:
                oc.clear_cache()
            elif roll < 0.7:
                box["shared"] = [_make(p) for p in problems]  # the old objects die here
                gc.collect()
            stop.wait(float(r.uniform(0.001, 0.02)))

    pool = [threading.Thread(target=work, args=(int(s),)) for s in seeds[:threads]]
    agent = threading.Thread(target=chaos, args=(int(seeds[-1]),))
    agent.start()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stop.set()
    agent.join()
    oc.set_cache_capacity(256)
    if errors:
        raise Failure(f"{len(errors)} thread(s) failed; first: {errors[0]}")
    return f"{threads} threads x {calls} calls over {len(problems)} problems"

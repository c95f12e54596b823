"""Threads fuzzer: many threads calling ops while the caches evict and op objects die.

Each trial (its own process) draws a few problems of the three ops (f32 and bf16, 1-D to
3-D, NCX/NXC, groups, dilations: some run as oneDNN kernels bound to the thread that made
them, see ``CompiledOp::thread_bound_``), computes their references first, then starts 2-8
threads that call them in random order, each with its own op objects or shared ones, with
and without ``out=``; meanwhile a chaos thread shrinks and clears the compiled-partition
cache, drops op objects (made again later) and collects garbage. Where torch is installed,
some problems are ``onednn_convt.torch`` calls (forward alone, or forward and both
gradients through autograd), whose executors the torch path shares between threads by
signature; the chaos thread empties that table too. Every result is compared with its
reference; a wrong one fails the trial, and the harness catches a crash or a hang.
"""

from __future__ import annotations

import gc
import importlib.util
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


def torch_or_none(rng: np.random.Generator) -> Any:
    """torch, for half the trials where it is installed (they mix torch problems in), else
    None. Imported only then: an imported torch changes what a forked child does
    (``onednn_convt.native.OPENMP_PEERS``)."""
    if rng.random() >= 0.5 or importlib.util.find_spec("torch") is None:
        return None
    import torch

    # imported here, before any thread starts: a child forked while another thread was in
    # its first import waits for that import's lock forever (CPython's, not the package's)
    import onednn_convt.torch  # noqa: F401

    return torch


def _torch_problem(rng: np.random.Generator, torch: Any) -> dict[str, Any]:
    """One small ``onednn_convt.torch`` call, with torch's float64 results as reference."""
    from onednn_convt import torch_run  # imports torch: only in the trials that use it

    code = str(rng.choice(["f32", "bf16"]))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[code]
    rank = int(rng.choice([1, 2, 3]))
    groups = int(rng.choice([1, 1, 2]))
    ic, oc_ = groups * int(rng.integers(1, 9)), groups * int(rng.integers(1, 9))
    kernel = [int(rng.integers(1, 4)) for _ in range(rank)]
    stride = [int(rng.integers(1, 3)) for _ in range(rank)]
    dilation = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
    padding = [int(rng.integers(0, d * (k - 1) + 1)) for k, d in zip(kernel, dilation)]
    out_pad = [int(rng.integers(0, s)) for s in stride]
    n = int(rng.integers(1, 4))
    src = [int(rng.integers(2, 7)) for _ in range(rank)]
    # pads that leave an output of at least one element
    padding = [min(p, ((x - 1) * s + d * (k - 1) + o) // 2)
               for p, x, s, d, k, o in zip(padding, src, stride, dilation, kernel, out_pad)]
    geometry = (stride, padding, out_pad, groups, dilation)
    x = torch.randn(n, ic, *src).to(dtype)
    if rank > 1 and rng.random() < 0.5:
        x = x.contiguous(memory_format=torch_run.channels_last_format(rank))
    w = (torch.randn(ic, oc_ // groups, *kernel) / math.sqrt(ic // groups * math.prod(kernel))).to(dtype)
    b = torch.randn(oc_).to(dtype) if rng.random() < 0.5 else None
    fn = getattr(torch.nn.functional, f"conv_transpose{rank}d")
    ref_x, ref_w = x.double().requires_grad_(), w.double().requires_grad_()
    ref = fn(ref_x, ref_w, None if b is None else b.double(), *geometry)
    g = torch.randn(ref.shape).to(dtype)
    grads = torch.autograd.grad(ref, [ref_x, ref_w], g.double())
    # the terms' magnitude (the same sums over |values|) scales each tolerance: a bias may
    # cancel a sum, and a low-precision result is rounded before the bias and after
    abs_x, abs_w = ref_x.detach().abs().requires_grad_(), ref_w.detach().abs().requires_grad_()
    mag = fn(abs_x, abs_w, None if b is None else b.double().abs(), *geometry)
    mags = [mag.detach(), *torch.autograd.grad(mag, [abs_x, abs_w], g.double().abs())]
    k = math.prod(kernel)
    refs = [(ref.detach().numpy(), ic // groups * k), (grads[0].numpy(), oc_ // groups * k),
            (grads[1].numpy(), n * math.prod(ref.shape[2:]))]
    tols = [accuracy.tolerance(code, red) * (float(m.max()) or 1.0) * 4 for (_, red), m in zip(refs, mags)]
    return dict(op="torch", code=code, attrs=dict(rank=rank, geometry=geometry, layout=tuple(x.stride())),
                args=(x, w, b, g), refs=[r for r, _ in refs], tols=tols, grads=bool(rng.random() < 0.5))


def _torch_call(p: dict[str, Any], torch: Any) -> str:
    """Run a torch problem (forward, and the gradients of src and weights where it asks);
    returns what was off, or ""."""
    import onednn_convt.torch as oct

    x, w, b, g = p["args"]
    fn = getattr(oct, f"conv_transpose{p['attrs']['rank']}d")
    if p["grads"]:
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        out = fn(xr, wr, b, *p["attrs"]["geometry"])
        results = [out, *torch.autograd.grad(out, [xr, wr], g)]
    else:
        with torch.no_grad():
            results = [fn(x, w, b, *p["attrs"]["geometry"])]
    for name, got, want, tol in zip(("output", "d src", "d weight"), results, p["refs"], p["tols"]):
        err = float(np.max(np.abs(got.detach().double().numpy() - want)))
        if not err <= tol:
            return f"{name} off by {err:.3g}"
    return ""


def _make(p: dict[str, Any]) -> Any:
    if p["op"] == "torch":
        return None  # the torch path's ops and executors are shared by signature
    cls = {"fwd": oc.ConvTranspose, "bwd_d": oc.ConvTransposeBackwardData,
           "bwd_w": oc.ConvTransposeBackwardWeights}[p["op"]]
    return cls(**p["attrs"])


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    torch = torch_or_none(rng)
    with_torch = torch is not None
    problems = [_torch_problem(rng, torch) if with_torch and rng.random() < 0.5 else _problem(rng)
                for _ in range(int(rng.integers(2, 7)))]
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
                if p["op"] == "torch":
                    off = _torch_call(p, torch)
                    if off:
                        errors.append(f"torch {p['code']} {p['attrs']} grads={p['grads']}: {off}")
                        return
                    continue
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
            lowering = "torch" if op is None else op.lowering
            errors.append(f"{p['op']} {p['code']} {p['attrs']} ({lowering}): {type(e).__name__}: {e}")

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
            elif roll < 0.8 and with_torch:
                from onednn_convt import torch_run

                torch_run._FAST.clear()  # the torch path's executors die (as evicted)
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
    n_torch = sum(p["op"] == "torch" for p in problems)
    return f"{threads} threads x {calls} calls over {len(problems)} problems ({n_torch} torch)"

"""What the guards cost (onednn_convt.guards): guarded bf16 calls against the same call in
f32 and against PyTorch, on model-like shapes each guard routes, side by side.

    python benchmarks/guards.py [--repeats 15] [--out benchmarks/results/guards.md]

For each shape, one process times our guarded bf16 call (out=, the route the guard picks)
and our f32 call in alternating batches (median of ``--repeats`` batches, each about 20 ms
of calls). PyTorch (bf16 and f32, the same op through autograd's formulas: BackwardData is
``conv{1,2,3}d`` of diff_dst, the forward ``conv_transpose{1,2,3}d``) runs in a child
process per shape, because its oneDNN has the same AMX kernels: a crash there is reported
as such, and its bf16 result is checked against the float64 reference.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Shape:
    name: str
    op: str  # "bwd_d" or "fwd"
    src: tuple[int, ...]  # forward src spatial
    kernel: tuple[int, ...]
    stride: int | tuple[int, ...]
    n: int
    ic: int
    oc: int
    bias: bool = False
    nxc: bool = False  # NXC activations and XOI weights (else NCX and IOX)

    def attrs(self) -> dict[str, Any]:
        return {"strides": self.stride, "data_format": "NXC" if self.nxc else "NCX",
                "weights_format": "XOI" if self.nxc else "IOX"}

    def dst(self) -> tuple[int, ...]:
        strides = self.stride if isinstance(self.stride, tuple) else (self.stride,) * len(self.src)
        return tuple(s * (x - 1) + k for x, k, s in zip(self.src, self.kernel, strides))


SHAPES = [
    Shape("unet2d k2s2 bwd_d", "bwd_d", (32, 32), (2, 2), 2, 8, 128, 64),
    Shape("unet2d k2s2 bwd_d NXC/XOI", "bwd_d", (32, 32), (2, 2), 2, 8, 128, 64, nxc=True),
    Shape("unet2d k2s2 bwd_d (wide)", "bwd_d", (16, 16), (2, 2), 2, 8, 512, 256),
    Shape("unet3d k2s2 bwd_d", "bwd_d", (8, 16, 16), (2, 2, 2), 2, 2, 64, 32),
    Shape("1x1 s2 bwd_d", "bwd_d", (32, 32), (1, 1), 2, 8, 128, 128),
    Shape("issue 3-D k1x2x3 s3x2x3 bwd_d", "bwd_d", (6, 2, 4), (1, 2, 3), (3, 2, 3), 2, 48, 96),
    Shape("audio 1-D k4s4 bwd_d", "bwd_d", (1024,), (4,), 4, 4, 256, 128),
    Shape("unet2d k2s2 fwd+bias", "fwd", (32, 32), (2, 2), 2, 8, 128, 64, bias=True),
    Shape("unet2d k2s2 fwd+bias NXC/XOI", "fwd", (32, 32), (2, 2), 2, 8, 128, 64, bias=True, nxc=True),
    Shape("dcgan-like k4s2 fwd+bias", "fwd", (16, 16), (4, 4), 2, 8, 256, 128, bias=True),
]


def tensors(shape: Shape, dtype: Any, ncx: bool = False) -> dict[str, np.ndarray]:
    """The call's arrays, in the shape's layouts (``ncx``: in NCX/IOX whatever the shape's)."""
    rng = np.random.default_rng(0)
    t = {
        "src": rng.standard_normal((shape.n, shape.ic, *shape.src)).astype(dtype),
        "weights": (rng.standard_normal((shape.ic, shape.oc, *shape.kernel)) * 0.1).astype(dtype),
        "bias": rng.standard_normal(shape.oc).astype(dtype),
        "diff_dst": rng.standard_normal((shape.n, shape.oc, *shape.dst())).astype(dtype),
    }
    if shape.nxc and not ncx:
        r = len(shape.kernel)
        for name in ("src", "diff_dst"):
            t[name] = np.ascontiguousarray(np.moveaxis(t[name], 1, -1))
        t["weights"] = np.ascontiguousarray(t["weights"].transpose(*range(2, 2 + r), 1, 0))
    return t


def batch_timer(fn: Callable[[], Any]) -> Callable[[], float]:
    """A function timing one batch of ``fn`` calls (sized to ~20 ms), seconds per call."""
    fn()
    start = time.perf_counter()
    fn()
    calls = max(1, int(0.02 / max(time.perf_counter() - start, 1e-6)))

    def batch() -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls

    return batch


def alternate(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, batches alternating between them."""
    timers = {k: batch_timer(f) for k, f in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, t in timers.items():
            samples[k].append(t())
    return {k: float(np.median(v)) for k, v in samples.items()}


def ours(shape: Shape, repeats: int) -> dict[str, Any]:
    import onednn_convt as oc

    calls, lowering = {}, {}
    for code, dtype in (("bf16", ml_dtypes.bfloat16), ("f32", np.float32)):
        t = tensors(shape, dtype)
        if shape.op == "bwd_d":
            op = oc.ConvTransposeBackwardData(**shape.attrs())
            out = np.empty(t["src"].shape, dtype)
            calls[code] = lambda op=op, t=t, out=out: op(t["diff_dst"], t["weights"], out=out)
        else:
            op = oc.ConvTranspose(**shape.attrs())
            out = np.empty(t["diff_dst"].shape, dtype)
            calls[code] = lambda op=op, t=t, out=out: op(t["src"], t["weights"], t["bias"], out=out)
        calls[code]()
        lowering[code] = f"{op.lowering}" + (f" [{op.guard}]" if op.guard else "")
    times = alternate(calls, repeats)
    return {"isa": oc.info()["cpu_isa"], "bf16": times["bf16"], "f32": times["f32"], "lowering": lowering["bf16"]}


def torch_peer(shape: Shape, repeats: int) -> dict[str, Any]:
    import onednn_convt as oc
    import torch

    torch.set_num_threads(oc.info()["threads"] or 1)
    r = len(shape.kernel)
    conv = getattr(torch.nn.functional, f"conv{r}d")
    conv_t = getattr(torch.nn.functional, f"conv_transpose{r}d")
    calls, err = {}, None
    for code, dtype, tdtype in (("bf16", ml_dtypes.bfloat16, torch.bfloat16), ("f32", np.float32, torch.float32)):
        t = {k: torch.from_numpy(v.astype(np.float32)).to(tdtype) for k, v in tensors(shape, dtype, ncx=True).items()}
        if shape.op == "bwd_d":
            calls[code] = lambda t=t: conv(t["diff_dst"], t["weights"], stride=shape.stride)
        else:
            calls[code] = lambda t=t: conv_t(t["src"], t["weights"], t["bias"], stride=shape.stride)
        with torch.no_grad():
            got = calls[code]().float().numpy().astype(np.float64)
        if code == "bf16":
            t64 = {k: v.float().numpy().astype(np.float64) for k, v in t.items()}
            ncx = {"strides": shape.stride, "data_format": "NCX", "weights_format": "IOX"}
            ref = (oc.reference.conv_transpose_backward_data(t64["diff_dst"], t64["weights"], **ncx)
                   if shape.op == "bwd_d" else
                   oc.reference.conv_transpose(t64["src"], t64["weights"], t64["bias"], **ncx))
            err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    with torch.no_grad():
        times = alternate(calls, repeats)
    return {"torch_bf16": times["bf16"], "torch_f32": times["f32"], "torch_bf16_err": err}


def child(kind: str, index: int, repeats: int) -> dict[str, Any]:
    code = f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import guards as g; " \
           f"print(json.dumps(g.{kind}(g.SHAPES[{index}], {repeats})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] or ''}"}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = ["| shape | our lowering (bf16) [guard] | ours bf16 ms | ours f32 ms | bf16/f32 | torch bf16 ms | torch f32 ms | "
            "ours bf16 / torch bf16 | torch bf16 error |", "|" + " --- |" * 9]
    isa = None
    for i, shape in enumerate(SHAPES):
        o = child("ours", i, args.repeats)
        p = child("torch_peer", i, args.repeats)
        isa = o.get("isa", isa)
        ms = lambda v: f"{v * 1e3:.3f}" if isinstance(v, float) else "-"  # noqa: E731
        if "error" in p:
            tb, tf, ratio, err = p["error"], "-", "-", "-"
        else:
            tb, tf = ms(p["torch_bf16"]), ms(p["torch_f32"])
            ratio, err = f"{o['bf16'] / p['torch_bf16']:.2f}", f"{p['torch_bf16_err']:.2g}"
        row = (f"| {shape.name} | {o.get('lowering', o.get('error'))} | {ms(o.get('bf16'))} | {ms(o.get('f32'))} | "
               f"{o['bf16'] / o['f32']:.2f} | {tb} | {tf} | {ratio} | {err} |")
        rows.append(row)
        print(row, flush=True)
    text = f"CPU ISA: {isa}; median of {args.repeats} alternating batches; PyTorch in NCX.\n\n" + "\n".join(rows) + "\n"
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

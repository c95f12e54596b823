"""``onednn-convt bench --suite step``: a DCGAN generator's training step, with
``onednn_convt.torch`` against the same network in torch, side by side in one process.

The network is DCGAN's generator (Radford et al.): z (nz x 1 x 1) through five
ConvTranspose2d layers (k4; s1 p0, then s2 p1) with BatchNorm and ReLU between them and
Tanh at the end, to 3 x 64 x 64. One step is ``zero_grad``, the forward, an MSE loss
against a fixed target and the backward (no optimizer update: it is the same code in
both). Both networks start from the same parameters and take the same inputs; before
timing, each one's gradients are compared with those of the same network in float64
(torch's modules), so a fast wrong step cannot pass, and both errors are reported.

Timing alternates batches of steps of the two networks (ours, torch's, ours, ...) and
reports medians and their interquartile range; the ratio is torch's median over ours
(above 1: ours is faster). f32 and bf16 (the whole network in bf16, as ``.to(bfloat16)``
makes it), NCHW and channels_last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from . import report, timing

#: DCGAN's generator: (in, out, stride, padding) per ConvTranspose2d, kernel 4
LAYERS = ((100, 512, 1, 0), (512, 256, 2, 1), (256, 128, 2, 1), (128, 64, 2, 1), (64, 3, 2, 1))


def generator(torch: Any, conv: Any, width: float = 1.0) -> Any:
    """DCGAN's generator with ``conv`` as its ConvTranspose2d class; ``width`` scales the
    channels of the hidden layers (1.0: DCGAN's 512-256-128-64)."""
    nn = torch.nn
    layers: list[Any] = []
    for i, (cin, cout, stride, pad) in enumerate(LAYERS):
        cin = cin if i == 0 else int(cin * width)
        last = i == len(LAYERS) - 1
        cout = cout if last else int(cout * width)
        layers.append(conv(cin, cout, 4, stride, pad, bias=False))
        layers += [nn.Tanh()] if last else [nn.BatchNorm2d(cout), nn.ReLU(True)]
    return nn.Sequential(*layers)


def _step(torch: Any, model: Any, z: Any, target: Any) -> Any:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(z).float(), target)
    loss.backward()
    return loss


def _pair(torch: Any, batch: int, dtype: Any, channels_last: bool) -> tuple[Any, Any, Any, Any]:
    from .. import torch as oct

    torch.manual_seed(0)
    theirs = generator(torch, torch.nn.ConvTranspose2d)
    ours = generator(torch, oct.ConvTranspose2d)
    ours.load_state_dict(theirs.state_dict())
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    theirs, ours = (m.to(dtype=dtype, memory_format=fmt) for m in (theirs, ours))
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(batch, 100, 1, 1, generator=gen).to(dtype=dtype, memory_format=fmt)
    target = torch.rand(batch, 3, 64, 64, generator=gen) * 2 - 1
    return ours, theirs, z, target


def _errors(torch: Any, ours: Any, theirs: Any, z: Any, target: Any) -> tuple[float, float]:
    """Each network's largest gradient error against the same network in float64 (torch's
    modules), relative to the largest gradient of each parameter."""
    reference = generator(torch, torch.nn.ConvTranspose2d).double()
    reference.load_state_dict(theirs.state_dict())
    _step(torch, reference, z.double(), target.double())
    errors = []
    for model in (ours, theirs):
        _step(torch, model, z, target)
        worst = 0.0
        for p, r in zip(model.parameters(), reference.parameters()):
            scale = float(r.grad.abs().max()) or 1.0
            worst = max(worst, float((p.grad.double() - r.grad).abs().max()) / scale)
        errors.append(worst)
    return errors[0], errors[1]


#: largest relative gradient error of ours accepted before timing (or twice torch's)
TOLERANCE = {"f32": 1e-3, "bf16": 0.1}


def measure(batch: int, repeat: int, budget: float) -> list[dict[str, Any]]:
    """Time both networks' steps in f32 and bf16, NCHW and channels_last."""
    import torch

    rows = []
    for code, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        for channels_last in (False, True):
            layout = "channels_last" if channels_last else "NCHW"
            print(f"  step {code} {layout} ...", end="", file=sys.stderr, flush=True)
            ours, theirs, z, target = _pair(torch, batch, dtype, channels_last)
            err_ours, err_torch = _errors(torch, ours, theirs, z, target)
            if err_ours > max(TOLERANCE[code], 2 * err_torch):
                msg = (f"step {code} {layout}: gradients off the float64 network's by {err_ours:.2g} of their "
                       f"scale (torch's: {err_torch:.2g})")
                raise RuntimeError(msg)
            a = timing.python_runner(lambda: _step(torch, ours, z, target))
            b = timing.python_runner(lambda: _step(torch, theirs, z, target))
            t_ours, t_torch, _ = timing.measure_difference(a, b, repeat, budget)
            row = {
                "dtype": code, "layout": layout, "batch": batch,
                "ours_ms": 1e3 * t_ours.median, "ours_iqr_ms": 1e3 * t_ours.iqr,
                "torch_ms": 1e3 * t_torch.median, "torch_iqr_ms": 1e3 * t_torch.iqr,
                "vs_torch": t_torch.median / t_ours.median, "samples": t_ours.samples,
                "grad_err": err_ours, "torch_grad_err": err_torch,
            }
            rows.append(row)
            print(f" ours {row['ours_ms']:.1f} ms, torch {row['torch_ms']:.1f} ms ({row['vs_torch']:.2f}x)",
                  file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = [
        "| dtype | layout | batch | onednn_convt.torch step (ms) | torch step (ms) | torch / ours "
        "| grad error: ours | torch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['layout']} | {r['batch']} | {r['ours_ms']:.1f} ± {r['ours_iqr_ms'] / 2:.1f} | "
            f"{r['torch_ms']:.1f} ± {r['torch_iqr_ms'] / 2:.1f} | {r['vs_torch']:.2f} | {r['grad_err']:.1e} "
            f"| {r['torch_grad_err']:.1e} |"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace, meta: dict[str, Any], batch: int = 16) -> int:
    """The step suite: print and write ``step.md`` / ``step.json`` to ``args.out``."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench: the step suite needs torch (pip install torch)", file=sys.stderr)
        return 2
    repeat = args.repeat or (5 if args.quick else 9)
    budget = args.budget or (0.5 if args.quick else 6.0)
    start = time.perf_counter()
    rows = measure(batch, repeat, budget)
    table = markdown(rows)
    header = (
        f"DCGAN generator (nz 100 -> 3x64x64, five ConvTranspose2d k4), batch {batch}: zero_grad, forward, "
        "MSE loss, backward. Medians ± half the IQR of alternating batches of steps (ours, torch's, ...)."
    )
    print()
    print("\n".join(report.header_lines(meta, None)))
    print(header)
    print(table)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = args.name or "step"
    (out / f"{base}.md").write_text("\n".join(report.header_lines(meta, None)) + "\n\n" + header + "\n\n" + table + "\n")
    report.write_json({"meta": meta, "results": rows, "elapsed_s": time.perf_counter() - start}, out / f"{base}.json")
    print(f"\nwrote {out / (base + '.md')}, {out / (base + '.json')}", file=sys.stderr)
    return 0

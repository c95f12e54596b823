"""``onednn-convt bench --suite step``: ``onednn_convt.torch`` against torch itself, side by
side in one process, as a torch user meets it.

* **DCGAN step.** DCGAN's generator (Radford et al.): z (nz x 1 x 1) through five
  ConvTranspose2d layers (k4; s1 p0, then s2 p1) with BatchNorm and ReLU between them and
  Tanh at the end, to 3 x 64 x 64, batch 16. One step is ``zero_grad``, the forward, an
  MSE loss against a fixed target and the backward (no optimizer update: it is the same code
  in both). Both networks start from the same parameters and take the same inputs; before
  timing, each one's gradients are compared with those of the same network in float64
  (torch's modules), so a fast wrong step cannot pass, and both errors are reported.
* **Small step.** The same on a small 3-layer generator (z 16 -> 3 x 16 x 16, 32 and 16
  hidden channels, batch 8), where each call's overhead counts.
* **Tiny call.** One ``conv_transpose2d`` on the tiny suite's layer (1x4x5x5 -> 3 channels,
  k3, with bias) against ``torch.nn.functional.conv_transpose2d``: for inference (under
  ``torch.no_grad``) and in training (weights that require grad: the graph is recorded).
* **Weights layout.** Each network's DCGAN step with its ConvTranspose weights contiguous,
  then channels_last (``model.to(memory_format=torch.channels_last)`` makes them so), on the
  same NCHW activations: what channels_last weights cost each.

Timing alternates batches of the two sides (ours, torch's, ours, ...) and reports medians and
their interquartile range; the ratio is torch's median over ours (above 1: ours is faster).
f32 and bf16 (the whole network in bf16, as ``.to(bfloat16)`` makes it), NCHW and
channels_last.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from . import report, timing

#: DCGAN's generator: (in, out, stride, padding) per ConvTranspose2d, kernel 4
LAYERS = ((100, 512, 1, 0), (512, 256, 2, 1), (256, 128, 2, 1), (128, 64, 2, 1), (64, 3, 2, 1))


#: the small generator: (in, out, stride, padding) per ConvTranspose2d, kernel 4; z of 16
SMALL_LAYERS = ((16, 32, 1, 0), (32, 16, 2, 1), (16, 3, 2, 1))
#: (batch, nz, output side) of each network's step
NETWORKS = {"dcgan": (16, 100, 64), "small": (8, 16, 16)}


def generator(torch: Any, conv: Any, width: float = 1.0, layers: Any = LAYERS) -> Any:
    """DCGAN's generator (or another ``layers`` list) with ``conv`` as its ConvTranspose2d
    class; ``width`` scales the channels of the hidden layers (1.0: DCGAN's 512-256-128-64)."""
    nn = torch.nn
    out: list[Any] = []
    for i, (cin, cout, stride, pad) in enumerate(layers):
        cin = cin if i == 0 else int(cin * width)
        last = i == len(layers) - 1
        cout = cout if last else int(cout * width)
        out.append(conv(cin, cout, 4, stride, pad, bias=False))
        out += [nn.Tanh()] if last else [nn.BatchNorm2d(cout), nn.ReLU(True)]
    return nn.Sequential(*out)


def _step(torch: Any, model: Any, z: Any, target: Any) -> Any:
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(z).float(), target)
    loss.backward()
    return loss


def _pair(torch: Any, network: str, dtype: Any, channels_last: bool, weights_last: bool = False
          ) -> tuple[Any, Any, Any, Any]:
    """(ours, torch's, z, target) of ``network``; ``weights_last``: channels_last
    ConvTranspose weights, NCHW activations."""
    from .. import torch as oct

    layers = LAYERS if network == "dcgan" else SMALL_LAYERS
    batch, nz, side = NETWORKS[network]
    torch.manual_seed(0)
    theirs = generator(torch, torch.nn.ConvTranspose2d, layers=layers)
    ours = generator(torch, oct.ConvTranspose2d, layers=layers)
    ours.load_state_dict(theirs.state_dict())
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    theirs, ours = (m.to(dtype=dtype, memory_format=fmt) for m in (theirs, ours))
    if weights_last:
        for m in (theirs, ours):
            for layer in m:
                if isinstance(layer, torch.nn.ConvTranspose2d):
                    layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(batch, nz, 1, 1, generator=gen).to(dtype=dtype, memory_format=fmt)
    target = torch.rand(batch, 3, side, side, generator=gen) * 2 - 1
    return ours, theirs, z, target


def _errors(torch: Any, ours: Any, theirs: Any, z: Any, target: Any) -> tuple[float, float]:
    """Each network's largest gradient error against the same network in float64 (torch's
    modules), relative to the largest gradient of each parameter."""
    reference = generator(torch, torch.nn.ConvTranspose2d, layers=LAYERS if len(theirs) == 3 * len(LAYERS) - 1
                          else SMALL_LAYERS).double()
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


def _checked_pair(torch: Any, network: str, code: str, dtype: Any, channels_last: bool,
                  weights_last: bool = False) -> tuple[Any, Any, Any, Any, float, float]:
    """:func:`_pair` with both networks' gradient errors, after refusing ours past tolerance."""
    ours, theirs, z, target = _pair(torch, network, dtype, channels_last, weights_last)
    err_ours, err_torch = _errors(torch, ours, theirs, z, target)
    if err_ours > max(TOLERANCE[code], 2 * err_torch):
        msg = (f"step {network} {code}: gradients off the float64 network's by {err_ours:.2g} of their "
               f"scale (torch's: {err_torch:.2g})")
        raise RuntimeError(msg)
    return ours, theirs, z, target, err_ours, err_torch


def _side_by_side(a: Any, b: Any, repeat: int, budget: float) -> dict[str, float]:
    """Both callables timed in alternating batches: medians (ms), half IQRs, torch / ours."""
    t_ours, t_torch, _ = timing.measure_difference(timing.python_runner(a), timing.python_runner(b), repeat, budget)
    return {"ours_ms": 1e3 * t_ours.median, "ours_iqr_ms": 1e3 * t_ours.iqr,
            "torch_ms": 1e3 * t_torch.median, "torch_iqr_ms": 1e3 * t_torch.iqr,
            "vs_torch": t_torch.median / t_ours.median, "samples": t_ours.samples}


def _dtypes(torch: Any) -> tuple[tuple[str, Any], ...]:
    return (("f32", torch.float32), ("bf16", torch.bfloat16))


def measure(network: str, repeat: int, budget: float) -> list[dict[str, Any]]:
    """Time both networks' steps in f32 and bf16, NCHW and channels_last."""
    import torch

    rows = []
    for code, dtype in _dtypes(torch):
        for channels_last in (False, True):
            layout = "channels_last" if channels_last else "NCHW"
            print(f"  {network} step {code} {layout} ...", end="", file=sys.stderr, flush=True)
            ours, theirs, z, target, err_ours, err_torch = _checked_pair(torch, network, code, dtype, channels_last)
            row = {"network": network, "dtype": code, "layout": layout, "batch": NETWORKS[network][0],
                   **_side_by_side(lambda: _step(torch, ours, z, target), lambda: _step(torch, theirs, z, target),
                                   repeat, budget),
                   "grad_err": err_ours, "torch_grad_err": err_torch}
            rows.append(row)
            print(f" ours {row['ours_ms']:.2f} ms, torch {row['torch_ms']:.2f} ms ({row['vs_torch']:.2f}x)",
                  file=sys.stderr, flush=True)
    return rows


def measure_calls(repeat: int, budget: float) -> list[dict[str, Any]]:
    """One conv_transpose2d of the tiny layer, ours and torch's, for inference and training."""
    import torch

    from .. import torch as oct

    rows = []
    gen = torch.Generator().manual_seed(2)
    for code, dtype in _dtypes(torch):
        x = torch.randn(1, 4, 5, 5, generator=gen).to(dtype)
        w = torch.randn(4, 3, 3, 3, generator=gen).to(dtype)
        b = torch.randn(3, generator=gen).to(dtype)
        want = torch.nn.functional.conv_transpose2d(x.double(), w.double(), b.double())
        got = oct.conv_transpose2d(x, w, b)
        if float((got.double() - want).abs().max()) > TOLERANCE[code] * float(want.abs().max()):
            raise RuntimeError(f"tiny call {code}: ours differs from torch's float64 result")
        for mode in ("inference", "training"):
            wg, bg = (t.clone().requires_grad_(mode == "training") for t in (w, b))
            print(f"  tiny call {code} {mode} ...", end="", file=sys.stderr, flush=True)
            with torch.no_grad() if mode == "inference" else contextlib.nullcontext():
                t = _side_by_side(lambda: oct.conv_transpose2d(x, wg, bg),
                                  lambda: torch.nn.functional.conv_transpose2d(x, wg, bg), repeat, budget)
            row: dict[str, Any] = {"dtype": code, "mode": mode, "vs_torch": t["vs_torch"], "samples": t["samples"]}
            for key in ("ours", "torch"):  # microseconds: these calls are short
                row[f"{key}_us"] = 1e3 * t[f"{key}_ms"]
                row[f"{key}_iqr_us"] = 1e3 * t[f"{key}_iqr_ms"]
            rows.append(row)
            print(f" ours {row['ours_us']:.1f} us, torch {row['torch_us']:.1f} us "
                  f"(ours / torch {1 / row['vs_torch']:.2f})", file=sys.stderr, flush=True)
    return rows


def measure_weights(repeat: int, budget: float) -> list[dict[str, Any]]:
    """Each network's DCGAN step with contiguous, then channels_last, ConvTranspose weights
    (NCHW activations), the two alternated: the time channels_last weights add."""
    import torch

    rows = []
    for code, dtype in _dtypes(torch):
        plain = _checked_pair(torch, "dcgan", code, dtype, False)
        last = _checked_pair(torch, "dcgan", code, dtype, False, weights_last=True)
        for side, index in (("onednn_convt.torch", 0), ("torch", 1)):
            print(f"  weights layout {code} {side} ...", end="", file=sys.stderr, flush=True)
            a, b = plain[index], last[index]
            z, target = plain[2], plain[3]
            t = _side_by_side(lambda: _step(torch, b, z, target), lambda: _step(torch, a, z, target), repeat, budget)
            row = {"dtype": code, "side": side, "contiguous_ms": t["torch_ms"], "contiguous_iqr_ms": t["torch_iqr_ms"],
                   "channels_last_ms": t["ours_ms"], "channels_last_iqr_ms": t["ours_iqr_ms"],
                   "cost": t["ours_ms"] / t["torch_ms"], "grad_err": last[4 + index]}
            rows.append(row)
            print(f" contiguous {row['contiguous_ms']:.1f} ms, channels_last {row['channels_last_ms']:.1f} ms",
                  file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """Step rows as a Markdown table."""
    lines = [
        "| network | dtype | layout | batch | onednn_convt.torch step (ms) | torch step (ms) | torch / ours "
        "| grad error: ours | torch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['network']} | {r['dtype']} | {r['layout']} | {r['batch']} | {r['ours_ms']:.2f} ± "
            f"{r['ours_iqr_ms'] / 2:.2f} | {r['torch_ms']:.2f} ± {r['torch_iqr_ms'] / 2:.2f} | {r['vs_torch']:.2f} "
            f"| {r['grad_err']:.1e} | {r['torch_grad_err']:.1e} |"
        )
    return "\n".join(lines)


def calls_markdown(rows: list[dict[str, Any]]) -> str:
    """Tiny-call rows as a Markdown table."""
    lines = ["| dtype | mode | onednn_convt.torch (us) | torch (us) | ours / torch |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['mode']} | {r['ours_us']:.1f} ± {r['ours_iqr_us'] / 2:.1f} | "
                     f"{r['torch_us']:.1f} ± {r['torch_iqr_us'] / 2:.1f} | {1 / r['vs_torch']:.2f} |")
    return "\n".join(lines)


def weights_markdown(rows: list[dict[str, Any]]) -> str:
    """Weights-layout rows as a Markdown table."""
    lines = ["| dtype | step of | contiguous weights (ms) | channels_last weights (ms) | channels_last / contiguous |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['side']} | {r['contiguous_ms']:.1f} ± {r['contiguous_iqr_ms'] / 2:.1f} | "
                     f"{r['channels_last_ms']:.1f} ± {r['channels_last_iqr_ms'] / 2:.1f} | {r['cost']:.2f} |")
    return "\n".join(lines)


#: the targets: DCGAN step ratio, small step ratio, tiny call at most this multiple of torch's time
TARGETS = {"dcgan": 1.1, "small": 1.0, "call": 2.0}


def target_lines(steps: list[dict[str, Any]], calls: list[dict[str, Any]]) -> list[str]:
    """Each target, the worst row against it, and whether it is met."""
    lines = []
    for network in ("dcgan", "small"):
        rows = [r for r in steps if r["network"] == network]
        worst = min(rows, key=lambda r: r["vs_torch"])
        met = "met" if worst["vs_torch"] >= TARGETS[network] else "MISSED"
        lines.append(f"- {network} step >= {TARGETS[network]:.1f}x torch: worst {worst['vs_torch']:.2f} "
                     f"({worst['dtype']} {worst['layout']}): {met}")
    worst = max(calls, key=lambda r: 1 / r["vs_torch"])
    met = "met" if 1 / worst["vs_torch"] <= TARGETS["call"] else "MISSED"
    lines.append(f"- tiny call <= {TARGETS['call']:.0f}x torch's time: worst {1 / worst['vs_torch']:.2f} "
                 f"({worst['dtype']} {worst['mode']}): {met}")
    return lines


def run(args: argparse.Namespace, meta: dict[str, Any]) -> int:
    """The step suite: print and write ``step.md`` / ``step.json`` to ``args.out``."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench: the step suite needs torch (pip install torch)", file=sys.stderr)
        return 2
    repeat = args.repeat or (5 if args.quick else 9)
    budget = args.budget or (0.5 if args.quick else 6.0)
    start = time.perf_counter()
    try:
        steps = measure("dcgan", repeat, budget) + measure("small", repeat, budget / 2)
        calls = measure_calls(repeat, budget / 4)
        weights = measure_weights(repeat, budget)
    except RuntimeError as e:  # a wrong result: nothing is timed past it
        print(f"\nbench: FAILED: {e}", file=sys.stderr)
        return 1
    batch = NETWORKS["dcgan"][0]
    text = "\n\n".join([
        "\n".join(report.header_lines(meta, None)),
        f"DCGAN generator (nz 100 -> 3x64x64, five ConvTranspose2d k4), batch {batch}, and a small generator "
        f"(nz 16 -> 3x16x16, three ConvTranspose2d k4), batch {NETWORKS['small'][0]}: zero_grad, forward, MSE loss, "
        "backward. Medians ± half the IQR of alternating batches of steps (ours, torch's, ...).",
        markdown(steps),
        "One conv_transpose2d of the tiny layer (1x4x5x5 -> 3 channels, k3, bias): inference under torch.no_grad, "
        "training with weights that require grad (the graph recorded). Alternating batches of calls.",
        calls_markdown(calls),
        "DCGAN step (NCHW activations) with the ConvTranspose weights contiguous and channels_last, alternated, "
        "each network on its own.",
        weights_markdown(weights),
        "Targets:\n" + "\n".join(target_lines(steps, calls)),
    ])
    print()
    print(text)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = args.name or "step"
    (out / f"{base}.md").write_text(text + "\n")
    doc = {"meta": meta, "results": steps, "calls": calls, "weights": weights,
           "elapsed_s": time.perf_counter() - start}
    report.write_json(doc, out / f"{base}.json")
    print(f"\nwrote {out / (base + '.md')}, {out / (base + '.json')}", file=sys.stderr)
    return 0

"""The rules' choices with and without one lowering, timed side by side in one process.

Usage::

    python benchmarks/lowering_ab.py --without "Lifted to 2-D" \\
        --layers-json benchmarks/random_layers_1d_depthwise.json --dtypes f32,bf16 [--json out.json] \\
        [--everywhere]

For each configuration (layer, op, dtype, data format; weights IOX with NCX, XOI with NXC)
two op objects are made: one whose lowering the rules choose as they do today ("new"), one
chosen with the lowering ``--without`` names taken out of every problem's candidates, its
polyphase phases' too ("old": the rules before that lowering existed). Both results are
compared (the largest difference over the largest value is printed), then timed in alternation: five rounds of each, each round as
many calls as fill about 0.15 s, the median per call kept. Prints each configuration's
times, lowerings and old/new ratio, and the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np

import onednn_convt as oc
from onednn_convt import cpu, lowering
from onednn_convt.lowering import rules

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
OPS = ("fwd", "bwd_d", "bwd_w")


def _per_call_ms(f: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e3


def _op(name: str, layer: dict[str, Any], fmt: str, code: str,
        rng: np.random.Generator) -> tuple[Any, Callable[[], Any]]:
    """The op object of ``name`` (not yet run) and a call of it on one layer's random arrays."""
    n, ic, oc_, groups = layer["n"], layer["ic"], layer["oc"], layer["groups"]
    src, kernel, stride, pad = layer["spatial"], layer["kernel"], layer["stride"], layer["pad"]
    rank = len(src)
    dst = [(x - 1) * stride - 2 * pad + k for x, k in zip(src, kernel)]
    wf = "IOX" if fmt == "NCX" else "XOI"

    def act(c: int, sp: list[int]) -> tuple[int, ...]:
        return (n, c, *sp) if fmt == "NCX" else (n, *sp, c)

    dtype = DTYPES[code]

    def rand(shape: tuple[int, ...]) -> Any:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)

    wshape = (ic, oc_ // groups, *kernel) if wf == "IOX" else (*kernel, oc_ // groups, ic)
    attrs = dict(strides=[stride] * rank, pads_begin=[pad] * rank, pads_end=[pad] * rank, groups=groups,
                 data_format=fmt, weights_format=wf)
    if name == "fwd":
        x, w = rand(act(ic, src)), rand(wshape)
        fwd = oc.ConvTranspose(**attrs)
        return fwd, lambda: fwd(x, w)
    if name == "bwd_d":
        dd, w = rand(act(oc_, dst)), rand(wshape)
        bwd_d = oc.ConvTransposeBackwardData(**attrs)
        return bwd_d, lambda: bwd_d(dd, w)
    x, dd = rand(act(ic, src)), rand(act(oc_, dst))
    bwd_w = oc.ConvTransposeBackwardWeights(weights_shape=wshape, **attrs)
    return bwd_w, lambda: bwd_w(x, dd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--without", required=True, help="the candidate lowering the old choices do without")
    parser.add_argument("--layers-json", type=Path, required=True, help="layers, as onednn-convt tune --layers-json")
    parser.add_argument("--layers", default="", help="only these layers (names, comma-separated)")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="f32")
    parser.add_argument("--formats", default="NCX,NXC")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--everywhere", action="store_true",
                        help="the rules measured apart from the tables (lifted, depth taps) take their lowering for "
                             "every problem it fits on this CPU: to measure where this CPU's rule should take it")
    args = parser.parse_args(argv)
    if args.everywhere:
        here = rules.this_cpu()
        for module in lowering.MEASURED_APART.values():
            module.MEASURED_ON = {**module.MEASURED_ON, here: lambda p: True}
    layers = json.loads(args.layers_json.read_text(encoding="utf-8"))
    if args.layers:
        wanted = set(args.layers.split(","))
        layers = [layer for layer in layers if layer["name"] in wanted]
    valid = lowering._valid

    def without(p: Any, native: bool) -> list[str]:
        return [name for name in valid(p, native) if name != args.without]

    rng = np.random.default_rng(0)
    rows = []
    for layer in layers:
        for code in args.dtypes.split(","):
            for fmt in args.formats.split(","):
                for name in args.ops.split(","):
                    calls, results, ops = [], [], []
                    seed = int(rng.integers(2**32))
                    for old in (True, False):
                        op, call = _op(name, layer, fmt, code, np.random.default_rng(seed))  # the same arrays
                        lowering._valid = without if old else valid  # type: ignore[assignment]
                        try:
                            results.append(np.asarray(call(), np.float64))  # the plan: chosen here
                        finally:
                            lowering._valid = valid  # type: ignore[assignment]
                        calls.append(call)
                        ops.append(op)
                    diff = float(np.max(np.abs(results[0] - results[1])) / (np.max(np.abs(results[0])) or 1.0))
                    one = _per_call_ms(calls[0], 1)
                    reps = max(1, min(30, int(150 / max(one, 0.05))))
                    times: list[list[float]] = [[], []]
                    for _ in range(5):
                        for i, call in enumerate(calls):
                            times[i].append(_per_call_ms(call, reps))
                    old_ms, new_ms = (statistics.median(t) for t in times)
                    lowerings = [str(op.lowering) for op in ops]
                    row = {"layer": layer["name"], "op": name, "dtype": code, "format": fmt, "old_ms": old_ms,
                           "new_ms": new_ms, "old_over_new": old_ms / new_ms, "old": lowerings[0], "new": lowerings[1], "difference": diff}
                    rows.append(row)
                    print(f"{layer['name']:26s} {name:5s} {code:4s} {fmt}  old {old_ms:8.2f} ms [{lowerings[0]}]"
                          f"  new {new_ms:8.2f} ms [{lowerings[1]}]  old/new {old_ms / new_ms:5.2f}  difference {diff:.1e}",
                          flush=True)
    ratios = [r["old_over_new"] for r in rows]
    if ratios:
        print(f"{len(ratios)} configurations: old/new geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}, "
              f"min {min(ratios):.2f}, max {max(ratios):.2f}")
    if args.json:
        record = {"without": args.without, "everywhere": args.everywhere, "cpu": cpu.detect().name, "rows": rows}
        args.json.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

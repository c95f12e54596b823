"""Phased plans with their sums fused in the library, and with NumPy adding fresh parts,
timed side by side in one process.

Usage::

    python benchmarks/sums_ab.py (--suite models | --layers-json benchmarks/random_layers_3d_depthwise.json) \\
        [--layers a,b] [--formats NCX,NXC] [--dtypes f32,bf16] [--ops fwd,bwd_d,bwd_w] [--json out.json]

For each configuration (layer, op, dtype, data format), built as ``onednn-convt bench``
builds it, whose rules' plan has phases that add to the result with a fused sum
(:class:`onednn_convt.plan.SumPlan`), the same plan runs both ways: as planned ("fused"),
and with its ``sums`` cleared, so that each such phase writes a fresh part that NumPy adds
("parts"). The results are compared (largest difference over the largest value), then the
two are timed in alternation: seven rounds of each, each round as many calls as fill about
0.1 s, the median per call kept. Prints each configuration's times and parts/fused ratio,
and the geometric mean of the ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from lowering_ab import _per_call_ms  # the sibling script's timer (this folder is on sys.path when run)

from onednn_convt import cpu
from onednn_convt.bench import suites
from onednn_convt.tune import layers_from_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--suite", choices=sorted(suites.SUITES), help="a bench suite's layers")
    source.add_argument("--layers-json", type=Path, help="layers as onednn-convt bench --layers-json reads them")
    parser.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    parser.add_argument("--formats", default="NCX,NXC")
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--ops", default=",".join(suites.OPS))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    names = set(filter(None, args.layers.split(",")))
    rows = []
    suite = args.suite or suites.CUSTOM
    layers = suites.layers(args.suite) if args.suite else layers_from_json(args.layers_json, "sums_ab")
    for layer in layers:
        if names and layer.name not in names:
            continue
        for op_name in args.ops.split(","):
            for fmt in args.formats.split(","):
                for code in args.dtypes.split(","):
                    case = suites.Config(suite, layer, op_name, code, fmt).build()
                    op = case.op

                    def call(case: Any = case) -> Any:
                        return case.op(*case.args)

                    call()
                    plan = op.last_plan
                    fused_sums = list(getattr(plan, "sums", None) or [])
                    if not any(fused_sums):
                        continue

                    def fused(plan: Any = plan, sums: list[Any] = fused_sums, call: Any = call) -> Any:
                        plan.sums = sums
                        return call()

                    def parts(plan: Any = plan, call: Any = call) -> Any:
                        plan.sums = []
                        return call()

                    a, b = np.asarray(fused(), np.float64), np.asarray(parts(), np.float64)
                    diff = float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))
                    n = max(1, int(0.1 / max(1e-5, _per_call_ms(fused, 1) / 1e3)))
                    t_fused, t_parts = [], []
                    for _ in range(7):
                        t_fused.append(_per_call_ms(fused, n))
                        t_parts.append(_per_call_ms(parts, n))
                    row = dict(layer=layer.name, op=op_name, format=fmt, dtype=code, lowering=op.lowering,
                               fused_phases=sum(s is not None for s in fused_sums), phases=len(fused_sums),
                               fused_ms=statistics.median(t_fused), parts_ms=statistics.median(t_parts), diff=diff)
                    row["ratio"] = row["parts_ms"] / row["fused_ms"]
                    rows.append(row)
                    print(f"{row['layer']:28s} {op_name:5s} {fmt} {code:4s} fused {row['fused_phases']:3d}/{row['phases']:3d}"
                          f"  fused {row['fused_ms']:8.3f} ms  parts {row['parts_ms']:8.3f} ms  x{row['ratio']:.2f}"
                          f"  diff {diff:.1e}", flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"cpu": cpu.detect().name, "configurations": len(rows),
               "geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else None,
               "min": min(ratios, default=None), "max_diff": max((r["diff"] for r in rows), default=None)}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

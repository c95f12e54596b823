"""Phased calls through their C++ executor, and through the Python path, timed side by side
in one process.

Usage::

    python benchmarks/phased_executor_ab.py (--suite broad | --layers-json benchmarks/random_layers_3d_depthwise.json) \\
        [--layers a,b] [--formats NCX,NXC] [--dtypes f32,bf16] [--ops fwd,bwd_d,bwd_w] [--json out.json]

For each configuration (layer, op, dtype, data format), built as ``onednn-convt bench``
builds it, whose rules' plan is phased (polyphase, depth taps, per group) and has a phased
executor (:func:`onednn_convt.plan._phased_executor`), two op objects of that configuration
make the same plan: one keeps the executor ("executor"), the other drops it and runs every
call through :meth:`onednn_convt.plan.PhasedPlan.run` ("python"). Their results are
compared bit for bit, then the two are timed in alternation: eleven rounds of each, each
round as many calls as fill about 20 ms, the median per call kept. Prints each
configuration's times and python/executor ratio, and the geometric mean of the ratios.
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

from onednn_convt import cpu, native
from onednn_convt.bench import suites
from onednn_convt.tune import layers_from_json

#: layers left out of a suite by default: a call of 0.1-0.3 s, where a few microseconds do not show
SLOW_LAYERS = ("hifigan", "istft")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--suite", choices=sorted(suites.SUITES), help="a bench suite's layers")
    source.add_argument("--layers-json", type=Path, help="layers as onednn-convt bench --layers-json reads them")
    parser.add_argument("--layers", default="", help="comma-separated layer names (default: all but the slow ones)")
    parser.add_argument("--formats", default="NCX,NXC")
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--ops", default=",".join(suites.OPS))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    names = set(filter(None, args.layers.split(",")))
    rows = []
    suite = args.suite or suites.CUSTOM
    layers = suites.layers(args.suite) if args.suite else layers_from_json(args.layers_json, "phased_executor_ab")
    for layer in layers:
        if (names and layer.name not in names) or (not names and layer.name in SLOW_LAYERS):
            continue
        for op_name in args.ops.split(","):
            for fmt in args.formats.split(","):
                for code in args.dtypes.split(","):
                    config = suites.Config(suite, layer, op_name, code, fmt)
                    with_executor, without = config.build(), config.build()
                    first = with_executor.op(*with_executor.args)
                    executor = getattr(with_executor.op.last_plan, "executor", None)
                    if not isinstance(executor, native.PhasedExecutor):
                        continue
                    without.op(*without.args)
                    without.op.last_plan.executor = None  # its later calls take the Python path
                    without.op._fast = None

                    def fast(case: Any = with_executor) -> Any:
                        return case.op(*case.args)

                    def python(case: Any = without) -> Any:
                        return case.op(*case.args)

                    a, b = np.asarray(fast()), np.asarray(python())
                    assert without.op._fast is None, "the Python op took a fast path"
                    same = bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)) and
                                np.array_equal(np.asarray(first).view(np.uint8), a.view(np.uint8)))
                    n = max(1, min(200, int(0.02 / max(1e-6, _per_call_ms(fast, 1) / 1e3))))
                    t_fast, t_python = [], []
                    for r in range(11):
                        for times, f in ((t_fast, fast), (t_python, python))[:: 1 if r % 2 == 0 else -1]:
                            times.append(_per_call_ms(f, n))
                    row = dict(layer=layer.name, op=op_name, format=fmt, dtype=code, lowering=with_executor.op.lowering,
                               steps=executor.steps, executor_ms=statistics.median(t_fast),
                               python_ms=statistics.median(t_python), same_bits=same)
                    row["ratio"] = row["python_ms"] / row["executor_ms"]
                    rows.append(row)
                    print(f"{row['layer']:28s} {op_name:5s} {fmt} {code:4s} {executor.steps:3d} steps"
                          f"  executor {row['executor_ms']:8.3f} ms  python {row['python_ms']:8.3f} ms"
                          f"  x{row['ratio']:.2f}  same bits {same}", flush=True)
    ratios = [r["ratio"] for r in rows]
    summary = {"cpu": cpu.detect().name, "configurations": len(rows),
               "geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else None,
               "min": min(ratios, default=None), "max": max(ratios, default=None),
               "same_bits": all(r["same_bits"] for r in rows)}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

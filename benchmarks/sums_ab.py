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

import statistics
from typing import Any

import ab_configs  # the sibling modules (this folder is on sys.path when run)
import numpy as np
from lowering_ab import _per_call_ms


def main(argv: list[str] | None = None) -> int:
    args = ab_configs.parser(__doc__.split("\n\n")[0]).parse_args(argv)
    rows = []
    for config in ab_configs.configurations(args, "sums_ab"):
        layer, op_name, fmt, code = config.layer, config.op, config.data_format, config.dtype
        case = config.build()
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
    return ab_configs.report(args, rows, max_diff=max((r["diff"] for r in rows), default=None))


if __name__ == "__main__":
    raise SystemExit(main())

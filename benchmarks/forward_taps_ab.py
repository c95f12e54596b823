"""The forward's depth taps writing the planes no earlier tap met, against every op adding to
a filled dst, timed side by side in one process.

Usage::

    python benchmarks/forward_taps_ab.py --layers-json benchmarks/random_layers_3d_depthwise.json \\
        [--layers a,b] [--formats NCX,NXC] [--dtypes f32,bf16] [--json out.json]

For each forward configuration (built as ``onednn-convt bench`` builds it) that the rules
run by depth taps and whose taps can write (:func:`onednn_convt.lowering.depth_taps._forward_order`),
two op objects of that configuration plan their first call: one as the lowering builds it
("writes": each tap that meets new planes writes them, the rest add, the bias after them),
one with every op adding to a dst filled first ("adds", the form before). Their results are
compared (the sums' order differs, so to the dtype's tolerance), then the two are timed in
alternation: eleven rounds of each, each round as many calls as fill about 20 ms, the median
per call kept. Prints each configuration's times and adds/writes ratio, whether the new plan
has a phased executor, and the geometric mean of the ratios.
"""

from __future__ import annotations

from typing import Any

import ab_configs  # the sibling modules (this folder is on sys.path when run)
import numpy as np

from onednn_convt import native
from onednn_convt.lowering import base, depth_taps


def _planned(config: Any, writes: bool) -> Any:
    """A built case of ``config`` after its first call, planned with the taps writing or not."""
    case = config.build()
    order = depth_taps._forward_order
    if not writes:
        depth_taps._forward_order = lambda p, reach: None  # type: ignore[assignment]
    try:
        case.op(*case.args)
    finally:
        depth_taps._forward_order = order  # type: ignore[assignment]
    return case


def main(argv: list[str] | None = None) -> int:
    parser = ab_configs.parser(__doc__.split("\n\n")[0])
    parser.set_defaults(ops="fwd")
    args = parser.parse_args(argv)
    rows = []
    for config in ab_configs.configurations(args, "forward_taps_ab"):
        writes = _planned(config, True)
        low = getattr(writes.op.last_plan, "lowering", None)
        if not (writes.op.lowering or "").startswith(base.DEPTH_TAPS) or low is None or \
                all(ph.accumulate for ph in low.phases if ph.lowering is not None):
            continue
        adds = _planned(config, False)

        def new(case: Any = writes) -> Any:
            return case.op(*case.args)

        def old(case: Any = adds) -> Any:
            return case.op(*case.args)

        a, b = np.asarray(new(), np.float64), np.asarray(old(), np.float64)
        error = float(np.abs(a - b).max()) / max(1.0, float(np.abs(b).max()))
        writes_ms, adds_ms = ab_configs.alternated(new, old)
        executor = isinstance(getattr(writes.op.last_plan, "executor", None), native.PhasedExecutor)
        row = dict(layer=config.layer.name, op=config.op, format=config.data_format, dtype=config.dtype,
                   lowering=writes.op.lowering, executor=executor, writes_ms=writes_ms,
                   adds_ms=adds_ms, max_rel_diff=error)
        row["ratio"] = row["adds_ms"] / row["writes_ms"]
        rows.append(row)
        print(f"{row['layer']:28s} {row['format']} {row['dtype']:4s} executor {str(executor):5s}"
              f"  adds {row['adds_ms']:8.3f} ms  writes {row['writes_ms']:8.3f} ms  x{row['ratio']:.2f}"
              f"  diff {error:.1e}", flush=True)
    return ab_configs.report(args, rows, max=max((r["ratio"] for r in rows), default=None))


if __name__ == "__main__":
    raise SystemExit(main())

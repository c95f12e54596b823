"""The no-table check: on a CPU with no rules table of its own, how much slower than the
library's own op does the conservative default run? By the tuner's side-by-side times.

For each configuration of ``onednn-convt tune --json`` runs, the lowering the default table
chooses (the process runs as ``ONEDNN_CONVT_CPU=unknown``) is looked up among the candidates
the tuner timed, and its time is divided by the library op's (ConvTranspose,
ConvTransposeBackwardData, ConvTransposeBackwardWeights) in the same record::

    python benchmarks/no_table.py benchmarks/results/zen5/tune_models.json ...

Prints, per run, the configurations compared, the geometric mean of that ratio and each
configuration above ``--limit`` (issue target: none above 1.10). A configuration whose
chosen lowering the tuner did not time is listed as such and left out.
"""

from __future__ import annotations

import os

os.environ["ONEDNN_CONVT_CPU"] = "unknown"  # before the package reads it

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from onednn_convt.bench import suites  # noqa: E402
from onednn_convt.lowering import rules  # noqa: E402

#: each op's own library op (the op's name), by the bench's op key
LIBRARY_OP = {key: name for name, key in suites.OP_ALIASES.items()}


def default_choice(key: str) -> str:
    """The lowering this process (no table: the default) runs a bench configuration as."""
    suite, layer, op, dtype, fmt = key.split("/")
    config = next(iter(suites.configs(suite, ops=(op,), dtypes_=(dtype,), formats=(fmt,), layer_names=(layer,))))
    case = config.build()
    case.op(*case.args)
    return str(case.op.last_plan.lowering.name)


def check(records: list[dict[str, Any]], limit: float) -> tuple[list[float], list[tuple[str, str, float]], list[str]]:
    """(each compared configuration's ratio, those above ``limit``, those not timed)."""
    ratios: list[float] = []
    over: list[tuple[str, str, float]] = []
    untimed: list[str] = []
    for r in records:
        times = r.get("times_us") or {}
        library = LIBRARY_OP[r["op"]]
        if library not in times or len(times) < 2:
            continue
        chosen = default_choice(r["key"])
        if chosen not in times:
            untimed.append(f"{r['key']} ({chosen})")
            continue
        ratio = times[chosen] / times[library]
        ratios.append(ratio)
        if ratio > limit:
            over.append((r["key"], chosen, ratio))
    return ratios, over, untimed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="onednn-convt tune --json files")
    parser.add_argument("--limit", type=float, default=1.10, help="the most the default may take over the library op")
    args = parser.parse_args(argv)
    print(rules.report())
    worst = 0
    for path in args.runs:
        ratios, over, untimed = check(json.loads(path.read_text(encoding="utf-8"))["records"], args.limit)
        geomean = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
        print(f"{path}: {len(ratios)} configurations, geomean {geomean:.3f}x the library op's time, "
              f"{len(over)} above {args.limit:.2f}x")
        for key, chosen, ratio in over:
            print(f"    {key}: {chosen} {ratio:.2f}x")
        for key in untimed:
            print(f"    not timed: {key}")
        worst = max(worst, len(over))
    return 1 if worst else 0


if __name__ == "__main__":
    sys.exit(main())

"""How well the nearest-layers rules choose for layers they were not fitted on, from tuning runs alone.

For each tuned configuration, the rules' choice (``rules_table.nearest_choice``) is made
from the other measured layers, and scored by that candidate's time over the fastest one's,
as the tuner measured them on the configuration itself (1.0: the rules chose the fastest)::

    python benchmarks/rules_cv.py benchmarks/results/zen4/tune_models.json \\
        benchmarks/results/zen4/tune_broad_fit.json benchmarks/results/zen4/tune_tiny.json \\
        --holdout benchmarks/results/zen4/tune_broad_holdout.json

* **Leave one layer out** over the runs given first: each configuration chosen by the
  layers of every other suite layer (the fit).
* **Holdout** (``--holdout``): each configuration of those runs chosen by the whole fit, as a
  CPU's table fitted without them would choose.

Prints, for each, the geometric mean of the ratio, how many configurations took more than
1.5x and 2x the fastest candidate's time, and the worst ones. Runs that tuned a configuration
more than once merge as ``make_rules.py --repeats`` merges them (each candidate's upper
median time); ``--remeasured`` runs replace the records of their configurations. The times
are single tuning measurements: a ratio says which way a choice leans, not a bench figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
from pathlib import Path
from typing import Any

from make_rules import LIBRARY_OP, measured_layers, merge_repeat

from onednn_convt.lowering import rules_table

#: how many of the worst configurations each part lists
WORST = 8


def layers(paths: list[Path], remeasured: list[Path]) -> tuple[rules_table.Measured, ...]:
    """The measured layers of ``paths`` (repeats merged; the records of ``remeasured`` runs
    replacing theirs, for the configurations ``paths`` tuned)."""
    def records(path: Path) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = json.loads(path.read_text(encoding="utf-8"))["records"]
        return found

    old = [r for p in paths for r in records(p)]
    tuned = {r["key"] for r in old}
    newer = [r for p in remeasured for r in records(p) if r["key"] in tuned]
    replaced = {r["key"] for r in newer}
    merged: dict[str, dict[str, Any]] = {}
    for r in [r for r in old if r["key"] not in replaced] + newer:
        if r["key"] in merged:
            merge_repeat(merged[r["key"]], r)
        else:
            merged[r["key"]] = dict(r)
    with contextlib.redirect_stderr(io.StringIO()):  # records of layers no suite has today
        found = measured_layers(list(merged.values()))
    doc = {"format": rules_table.FORMAT, "cpu": "cv", "isa": "cv", "layers": found}
    return rules_table.parse(doc, "cv").layers


def scored(pool: tuple[rules_table.Measured, ...], tests: tuple[rules_table.Measured, ...],
           leave_out: bool) -> list[tuple[rules_table.Measured, str, float]]:
    """Each test configuration, the rules' choice for it from ``pool`` (without its own suite
    layer where ``leave_out``) and that choice's time over the fastest's. Where the layers
    cannot say, the library's own op (the rules' fallback would decide)."""
    out = []
    for m in tests:
        fit = tuple(x for x in pool if x.layer != m.layer) if leave_out else pool
        names = sorted(m.ratios)
        choice = rules_table.nearest_choice(fit, (m.op, m.dtype, m.data_format), m.shape, m.features, names)
        if choice is None:
            own = LIBRARY_OP[m.op]
            choice = own if own in m.ratios else min(names, key=m.ratios.__getitem__)
        out.append((m, choice, m.ratios[choice]))
    return out


def report(title: str, rows: list[tuple[rules_table.Measured, str, float]]) -> None:
    """Print one part's summary and worst configurations."""
    ratios = [r for _, _, r in rows]
    geomean = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"{title}: {len(rows)} configurations, chosen over fastest: geomean {geomean:.3f}, "
          f"above 1.5x {sum(r > 1.5 for r in ratios)}, above 2x {sum(r > 2 for r in ratios)}")
    for m, choice, r in sorted(rows, key=lambda row: -row[2])[:WORST]:
        best = min(m.ratios, key=m.ratios.__getitem__)
        print(f"  {r:6.2f}  {m.layer} {m.op} {m.dtype} {m.data_format}: {choice} (fastest {best})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fit", nargs="+", type=Path, help="onednn-convt tune --json runs: the fit")
    parser.add_argument("--holdout", nargs="*", type=Path, default=[], help="runs of the layers held out")
    parser.add_argument("--remeasured", type=Path, action="append", default=[], metavar="RUN",
                        help="runs whose records replace the others' of the same configurations")
    args = parser.parse_args(argv)
    fit = layers(args.fit, args.remeasured)
    report("leave one layer out (fit)", scored(fit, fit, leave_out=True))
    if args.holdout:
        fitted = {m.layer for m in fit}
        held = tuple(m for m in layers(args.holdout, args.remeasured) if m.layer not in fitted)
        report("holdout (chosen by the fit)", scored(fit, held, leave_out=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

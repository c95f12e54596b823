"""Two rules tables side by side: which configurations they run differently (a polyphase
lowering's phases included) and, with ``--time``, how fast, alternated in one process.

A table decides more than a call's lowering: a polyphase lowering's stride-1 phases are
chosen by the same table, so a table that keeps every call's choice can still move a
phase's. This lists every configuration whose lowering, phases included, differs, and
times those old against new::

    python benchmarks/table_ab.py OLD.json NEW.json --suites models,tiny,broad-fit,broad-holdout
    python benchmarks/table_ab.py OLD.json NEW.json --layers-json benchmarks/random_layers_s4.json \\
        --dtypes f32 --time --json ab.json

Each table stands in for this CPU's own in turn (``rules_table.TABLES``). ``--time`` makes
an op object per table for each differing configuration, warms both, then calls them
alternated (old, new, new, old, ...) for 9 rounds, 5 where a call takes over 50 ms, 3 over
300 ms, and prints each one's median time (ms), old over new and the geometric mean: above
1, the new table is faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from onednn_convt import cpu, dtypes, guards, lowering, ops, tune
from onednn_convt.bench import suites
from onednn_convt.lowering import rules, rules_table
from onednn_convt.lowering.base import Lowering
from onednn_convt.problem import Problem

Clock = Callable[[], float]


@contextmanager
def standing_in(table: rules_table.Table) -> Iterator[None]:
    """Within the block, ``table`` is this CPU's own table (op objects made and first
    called there keep its choices)."""
    me = (cpu.detect().microarchitecture, rules.isa_class(guards.dispatch_isa()) or "none")
    saved = rules_table.TABLES
    rules_table.TABLES = {me: table}
    try:
        yield
    finally:
        rules_table.TABLES = saved


def describe(low: Lowering) -> str:
    """A lowering's name, a polyphase one's with its phases' (``-``: a phase of bias or
    zeros alone)."""
    if not low.phases:
        return low.name or low.kind
    inner = ",".join("-" if ph.lowering is None else describe(ph.lowering) for ph in low.phases)
    return f"{low.name}[{inner}]"


def problem(cfg: suites.Config) -> Problem:
    """The problem of a configuration, from its shapes alone (no arrays allocated)."""
    lay = cfg.layer
    dtype = dtypes.FLOAT_DTYPES[cfg.dtype]

    def empty(shape: Sequence[int]) -> np.ndarray:
        return np.broadcast_to(np.zeros((), dtype), tuple(shape))

    src, w = empty(cfg.activation_shape(lay.ic, lay.spatial)), empty(cfg.weights_shape)
    dd = empty(cfg.activation_shape(lay.oc, lay.dst_spatial))
    attrs = cfg.attrs()
    if cfg.op == "fwd":
        return ops.ConvTranspose(**attrs)._problem([src, w, empty((lay.oc,)) if cfg.bias else None], cfg.dtype)
    if cfg.op == "bwd_d":
        return ops.ConvTransposeBackwardData(**attrs)._problem([dd, w], cfg.dtype)
    return ops.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **attrs)._problem(
        [src, dd, None], cfg.dtype)


def choices(table: rules_table.Table, configs: Sequence[suites.Config]) -> dict[str, str]:
    """Each configuration's lowering under ``table`` (:func:`describe`), by key."""
    with standing_in(table):
        out = {}
        for cfg in configs:
            p = problem(cfg)
            out[cfg.key] = describe(lowering.build(p, lowering.rule(p)))
    return out


def time_pair(cfg: suites.Config, old: rules_table.Table, new: rules_table.Table,
              clock: Clock = time.perf_counter) -> dict[str, Any]:
    """Old table's op against new table's on one configuration, alternated (module doc):
    each one's lowering and median time in ms."""
    case = cfg.build()
    made = {}
    for tag, table in (("old", old), ("new", new)):
        with standing_in(table):
            op = cfg.build().op
            op(*case.args)  # compiled with this table's choices
        made[tag] = op

    def once(tag: str) -> float:
        t0 = clock()
        made[tag](*case.args)
        return clock() - t0

    first = once("old")
    rounds = 9 if first < 0.05 else 5 if first < 0.3 else 3
    times: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(rounds):
        for tag in ("old", "new") if i % 2 == 0 else ("new", "old"):
            times[tag].append(once(tag))
    return {"old": made["old"].lowering, "new": made["new"].lowering,
            "old_ms": round(statistics.median(times["old"]) * 1e3, 4),
            "new_ms": round(statistics.median(times["new"]) * 1e3, 4)}


def named_configs(args: argparse.Namespace) -> list[suites.Config]:
    """The configurations of ``--suites`` and ``--layers-json`` files, of ``--ops``,
    ``--dtypes`` and ``--formats``."""
    wanted = (args.ops.split(","), args.dtypes.split(","), args.formats.split(","))
    out = [c for s in filter(None, args.suites.split(",")) for c in suites.configs(s, *wanted)]
    for path in args.layers_json:
        out += suites.configs(suites.CUSTOM, *wanted, custom=tune.layers_from_json(path, "table_ab"))
    return out


def summary(ratios: Sequence[float], new: str) -> str:
    """The line that sums up old-over-new time ratios: their geometric mean, how many moved
    by more than 10% either way (``new`` names the new side), the extremes."""
    return (f"old over new: geomean {statistics.geometric_mean(ratios):.3f} over {len(ratios)}, "
            f"{sum(x < 1 / 1.1 for x in ratios)} more than 1.10x slower with {new}, "
            f"{sum(x > 1.1 for x in ratios)} more than 1.10x faster, min {min(ratios):.2f}, max {max(ratios):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="a rules table (JSON)")
    parser.add_argument("new", type=Path, help="another")
    parser.add_argument("--suites", default="", help="comma-separated suites to compare on")
    parser.add_argument("--layers-json", type=Path, action="append", default=[],
                        help="a layers file (tune --layers-json) to compare on (repeatable)")
    parser.add_argument("--ops", default=",".join(suites.OPS))
    parser.add_argument("--dtypes", default=",".join(suites.DTYPES))
    parser.add_argument("--formats", default=",".join(suites.FORMATS))
    parser.add_argument("--time", action="store_true", help="time the configurations that differ")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args(argv)
    old, new = rules_table.read(args.old), rules_table.read(args.new)
    configs = named_configs(args)
    if not configs:
        print("table_ab: give --suites or --layers-json", file=sys.stderr)
        return 2
    before, after = choices(old, configs), choices(new, configs)
    differ = [c for c in configs if before[c.key] != after[c.key]]
    print(f"{len(differ)} of {len(configs)} configurations run differently")
    out: dict[str, Any] = {}
    for cfg in differ:
        out[cfg.key] = {"old_lowering": before[cfg.key], "new_lowering": after[cfg.key]}
        if not args.time:
            print(f"{cfg.key}\n    old {before[cfg.key]}\n    new {after[cfg.key]}")
            continue
        out[cfg.key] |= time_pair(cfg, old, new)
        r = out[cfg.key]
        print(f"{cfg.key:<50} {r['old_ms']:9.2f} {r['new_ms']:9.2f} ms  {r['old_ms'] / r['new_ms']:5.2f}  "
              f"{r['old']} -> {r['new']}", flush=True)
    if args.time and differ:
        print(summary([r["old_ms"] / r["new_ms"] for r in out.values()], "the new table"))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

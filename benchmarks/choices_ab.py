"""The rules' choices of two checkouts side by side: a change to the rules' code (not only to a
table, which ``table_ab.py`` compares in one process) run old against new.

``dump`` writes each configuration's rules' choice under the package it imports (its code
and its shipped table: an old checkout's with ``PYTHONPATH``, its compiled ``_core``
beside it); ``time`` makes, for every configuration the two dumps run differently, an op
object forced to each dump's choice (``verbose_kernels.force_lowerings``; the top-level
lowering: a polyphase lowering's phases are chosen by the running checkout's rules, as
they are for both dumps where the change left the phases' choices alone) and calls the
two alternated (old, new, new, old, ...), each
sample as many calls as fill about 10 ms, 11 rounds (5 where a call takes over 50 ms, 3 over
300 ms); it prints each one's median time (ms), old over new and the geometric mean (above 1,
the new choices are faster)::

    PYTHONPATH=OLD_CHECKOUT/python python benchmarks/choices_ab.py dump old.json \\
        --suites models,tiny --layers-json benchmarks/random_layers_s4.json
    python benchmarks/choices_ab.py dump new.json --suites models,tiny --layers-json ...
    python benchmarks/choices_ab.py time old.json new.json --suites models,tiny --layers-json ... \\
        [--only custom/s4] [--json ab.json]

The configurations are rebuilt from the same ``--suites``, ``--layers-json``, ``--ops``,
``--dtypes`` and ``--formats`` in both steps.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from table_ab import describe, named_configs, problem, summary
from verbose_kernels import force_lowerings

from onednn_convt import lowering
from onednn_convt.bench import suites

#: the least time one timed sample takes, in seconds (repeating the call)
SAMPLE_SECONDS = 0.01


def dump(cfgs: Sequence[suites.Config]) -> dict[str, dict[str, str]]:
    """Each configuration's rules' choice: its name and its description (phases included)."""
    out = {}
    for cfg in cfgs:
        p = problem(cfg)
        name = lowering.rule(p)
        out[cfg.key] = {"name": name, "described": describe(lowering.build(p, name))}
    return out


def time_pair(cfg: suites.Config, old: str, new: str, forced: dict[str, str | None],
              clock: Callable[[], float] = time.perf_counter) -> tuple[float, float]:
    """Median seconds per call of the configuration run as ``old`` and as ``new``, alternated."""
    case = cfg.build()
    made = {}
    for tag, name in (("old", old), ("new", new)):
        forced["name"] = name
        try:
            op = cfg.build().op
            op(*case.args)  # planned (and compiled) as forced
        finally:
            forced["name"] = None
        made[tag] = op

    def sample(tag: str, k: int) -> float:
        start = clock()
        for _ in range(k):
            made[tag](*case.args)
        return (clock() - start) / k

    first = sample("old", 1)
    k = max(1, math.ceil(SAMPLE_SECONDS / max(first, 1e-6)))
    rounds = 11 if first < 0.05 else 5 if first < 0.3 else 3
    times: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(rounds):
        for tag in ("old", "new") if i % 2 == 0 else ("new", "old"):
            times[tag].append(sample(tag, k))
    return statistics.median(times["old"]), statistics.median(times["new"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("dump", "time"))
    parser.add_argument("files", nargs="+", type=Path, help="dump: the file to write; time: the old and new dumps")
    parser.add_argument("--suites", default="", help="comma-separated suites")
    parser.add_argument("--layers-json", type=Path, action="append", default=[], help="a layers file (repeatable)")
    parser.add_argument("--ops", default=",".join(suites.OPS))
    parser.add_argument("--dtypes", default=",".join(suites.DTYPES))
    parser.add_argument("--formats", default=",".join(suites.FORMATS))
    parser.add_argument("--only", default="", help="time the configurations whose key starts so")
    parser.add_argument("--json", type=Path, help="time: write the timings here")
    args = parser.parse_args(argv)
    cfgs = named_configs(args)
    if not cfgs:
        parser.error("give --suites or --layers-json")
    if args.command == "dump":
        if len(args.files) != 1:
            parser.error("dump takes one file")
        args.files[0].write_text(json.dumps(dump(cfgs), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {len(cfgs)} choices to {args.files[0]}")
        return 0
    if len(args.files) != 2:
        parser.error("time takes the old and the new dump")
    old, new = (json.loads(f.read_text(encoding="utf-8")) for f in args.files)
    differ = [c for c in cfgs if c.key.startswith(args.only) and c.key in old and c.key in new
              and old[c.key]["described"] != new[c.key]["described"]]
    print(f"{len(differ)} of {len(cfgs)} configurations run differently")
    forced = force_lowerings()
    out: dict[str, Any] = {}
    for cfg in differ:
        a, b = old[cfg.key], new[cfg.key]
        old_s, new_s = time_pair(cfg, a["name"], b["name"], forced)
        out[cfg.key] = {"old": a["described"], "new": b["described"], "old_ms": round(old_s * 1e3, 4),
                        "new_ms": round(new_s * 1e3, 4)}
        print(f"{cfg.key:<55} {old_s * 1e3:9.3f} {new_s * 1e3:9.3f} ms  {old_s / new_s:5.2f}  "
              f"{a['name']} -> {b['name']}", flush=True)
    if out:
        print(summary([r["old_ms"] / r["new_ms"] for r in out.values()], "the new choices"))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

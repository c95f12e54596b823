"""What a tuned second process pays: its first call against an untuned process's, each in a
fresh Python process.

Usage::

    ONEDNN_CONVT_CACHE_DIR=tuned onednn-convt bench --suite models --skip-slow --autotune ...
    python benchmarks/second_process.py --cache-dir tuned [--pairs 2] [--layers unet,conv3d]

For every models configuration whose choice the cache holds: ``--pairs`` rounds of two new
processes, one with ``ONEDNN_CONVT_AUTOTUNE=1`` (it reads the cache when the package is
imported, then compiles the tuned choice) and one without (the rules' choice), which one
starts first alternating from round to round. Each process times ``import onednn_convt``
and the configuration's first call (its compile included). Prints the medians per row and
the median ratio tuned/untuned of the first calls and of the imports, and writes them as
JSON (``--out``). A tuned process that tunes again (the cache did not serve it) is an error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from onednn_convt.bench import suites

#: the child: import, build the configuration, time its first call
CHILD = """
import json, sys, time
start = time.perf_counter()
import onednn_convt
imported = time.perf_counter() - start
from onednn_convt.bench import suites
cfg = next(c for c in suites.configs("models", skip_slow=True) if c.key == sys.argv[1])
case = cfg.build()
start = time.perf_counter()
case.op(*case.args)
first = time.perf_counter() - start
tuning = case.op.tuning
print(json.dumps({"import_ms": imported * 1e3, "first_ms": first * 1e3, "lowering": case.op.lowering,
                  "cached": None if tuning is None else tuning.cached}))
"""


def child(key: str, tuned: bool, cache_dir: str) -> dict[str, Any]:
    env = dict(os.environ, ONEDNN_CONVT_CACHE_DIR=cache_dir)
    env.pop("ONEDNN_CONVT_AUTOTUNE", None)
    if tuned:
        env["ONEDNN_CONVT_AUTOTUNE"] = "1"
    out = subprocess.run([sys.executable, "-c", CHILD, key], env=env, capture_output=True, text=True, check=True)
    rec: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if tuned and rec["cached"] is False:
        msg = f"{key}: the tuned process tuned again (the cache did not serve it)"
        raise SystemExit(msg)
    return rec


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", required=True, help="a tuning cache directory the autotuned bench filled")
    parser.add_argument("--pairs", type=int, default=2, help="rounds of a tuned and an untuned process per row")
    parser.add_argument("--layers", default="", help="only these models layers, comma-separated")
    parser.add_argument("--out", default="second_process.json", help="the JSON file to write")
    args = parser.parse_args(argv)
    layers = set(filter(None, args.layers.split(",")))
    configs = [c for c in suites.configs("models", skip_slow=True) if not layers or c.layer.name in layers]
    rows = []
    for n, cfg in enumerate(configs, 1):
        runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for i in range(args.pairs):
            for tuned in ((True, False) if i % 2 == 0 else (False, True)):
                runs[tuned].append(child(cfg.key, tuned, args.cache_dir))
        if runs[True][0]["cached"] is None:  # one candidate: nothing was tuned
            continue
        row = {"key": cfg.key, "lowering": runs[True][0]["lowering"]}
        for tuned, name in ((True, "tuned"), (False, "untuned")):
            for what in ("first_ms", "import_ms"):
                row[f"{name}_{what}"] = statistics.median(r[what] for r in runs[tuned])
        row["first_ratio"] = row["tuned_first_ms"] / row["untuned_first_ms"]
        row["import_ratio"] = row["tuned_import_ms"] / row["untuned_import_ms"]
        rows.append(row)
        print(f"[{n}/{len(configs)}] {cfg.key}: first call {row['tuned_first_ms']:.1f} / "
              f"{row['untuned_first_ms']:.1f} ms ({row['first_ratio']:.2f}), import "
              f"{row['tuned_import_ms']:.0f} / {row['untuned_import_ms']:.0f} ms", file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for what in ("first_ratio", "import_ratio"):
        values = sorted(r[what] for r in rows)
        q1, mid, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
        summary[what] = {"median": mid, "q1": q1, "q3": q3, "max": values[-1]}
    extra = statistics.median(r["tuned_import_ms"] - r["untuned_import_ms"] for r in rows)
    summary["import_extra_ms"] = extra
    print(f"{len(rows)} tuned rows, {args.pairs} pairs of processes each: first call tuned/untuned median "
          f"{summary['first_ratio']['median']:.3f} [q1 {summary['first_ratio']['q1']:.3f}, "
          f"q3 {summary['first_ratio']['q3']:.3f}]; import tuned/untuned median "
          f"{summary['import_ratio']['median']:.3f} (+{extra:.1f} ms: platformdirs, reading the cache)")
    Path(args.out).write_text(json.dumps({"pairs": args.pairs, "summary": summary, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

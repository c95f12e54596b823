"""What the side-by-side scripts share: their command line (a suite's layers, or a layers
JSON file as ``onednn-convt bench --layers-json`` reads it, filtered by layer names, ops,
data formats and dtypes), the configurations it names, in order, two calls timed in
alternation, and the summary of their rows."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from lowering_ab import _per_call_ms  # a sibling module (this folder is on sys.path when run)

from onednn_convt import cpu
from onednn_convt.bench import suites
from onednn_convt.tune import layers_from_json


def parser(description: str) -> argparse.ArgumentParser:
    """The shared options: --suite or --layers-json, --layers, --formats, --dtypes, --ops, --json."""
    p = argparse.ArgumentParser(description=description)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--suite", choices=sorted(suites.SUITES), help="a bench suite's layers")
    source.add_argument("--layers-json", type=Path, help="layers as onednn-convt bench --layers-json reads them")
    p.add_argument("--layers", default="", help="comma-separated layer names (default: all)")
    p.add_argument("--formats", default="NCX,NXC")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--ops", default=",".join(suites.OPS))
    p.add_argument("--json", help="write the rows here")
    return p


def configurations(args: argparse.Namespace, script: str, skipped: Sequence[str] = ()) -> Iterator[suites.Config]:
    """Each configuration (layer, op, data format, dtype) the options name, in that order;
    ``skipped``: layers left out unless --layers names them."""
    names = set(filter(None, args.layers.split(",")))
    suite = args.suite or suites.CUSTOM
    layers = suites.layers(args.suite) if args.suite else layers_from_json(args.layers_json, script)
    for layer in layers:
        if (names and layer.name not in names) or (not names and layer.name in skipped):
            continue
        for op_name in args.ops.split(","):
            for fmt in args.formats.split(","):
                for code in args.dtypes.split(","):
                    yield suites.Config(suite, layer, op_name, code, fmt)


def alternated(first: Callable[[], Any], second: Callable[[], Any], rounds: int = 11,
               seconds: float = 0.02) -> tuple[float, float]:
    """Median milliseconds per call of ``first`` and ``second``, timed in alternation (the
    order swapped every round): ``rounds`` rounds of each, each as many calls (at most 200)
    as fill about ``seconds`` by ``second``'s first call."""
    n = max(1, min(200, int(seconds / max(1e-6, _per_call_ms(second, 1) / 1e3))))
    times: tuple[list[float], list[float]] = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            times[i].append(_per_call_ms((first, second)[i], n))
    return statistics.median(times[0]), statistics.median(times[1])


def report(args: argparse.Namespace, rows: list[dict[str, Any]], **extra: Any) -> int:
    """Prints the summary of ``rows`` (each with a ``ratio``: the geometric mean and the
    least, and ``extra``) as JSON, and writes it with the rows to --json if given; 0."""
    ratios = [r["ratio"] for r in rows]
    summary = {"cpu": cpu.detect().name, "configurations": len(rows),
               "geomean": math.exp(statistics.fmean(math.log(r) for r in ratios)) if ratios else None,
               "min": min(ratios, default=None), **extra}
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    return 0

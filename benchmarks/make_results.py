"""Write benchmarks/RESULTS.md from the JSON files of ``onednn-convt bench`` runs.

Usage::

    python benchmarks/make_results.py benchmarks/results/zen5/models-rules.json ...

The page opens with one row per run (CPU, rules or autotuned, geomean speed over PyTorch per
dtype, rows below 0.90, the slowest row). Then each run gives a section: what ran (versions,
CPU, threads, peak, date, command), the figures it measured, its chart if one was written beside the JSON, and its table. A text file NOTES.md beside
this script, if present, is appended as the analysis.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from onednn_convt.bench import report

HERE = Path(__file__).resolve().parent


def summary(recs: list[dict]) -> str:
    """A grid for the README: a row per layer and op, a column per dtype and format; each cell
    our median ms and PyTorch's time over ours (above 1: we are faster), or where PyTorch
    was not timed (f16 on a CPU that emulates it: target 5) our f16 time over our f32 time
    of the same configuration."""
    cells: dict[tuple[str, str], dict[tuple[str, str], dict]] = {}
    for r in recs:
        if r.get("median_ms") is not None:
            cells.setdefault((r["layer"], r["op"]), {})[(r["dtype"], r["format"])] = r
    cols = [(dt, fmt) for dt in ("f32", "bf16", "f16") for fmt in ("NCX", "NXC")
            if any((dt, fmt) in row for row in cells.values())]

    def cell(row: dict, dt: str, fmt: str) -> str:
        r = row.get((dt, fmt))
        if r is None:
            return "-"
        vs = r.get("vs_torch")
        if dt == "f16" and not vs:
            f32 = row.get(("f32", fmt))
            return f"{r['median_ms']:.3g} ({r['median_ms'] / f32['median_ms']:.2f}x f32)" if f32 else f"{r['median_ms']:.3g}"
        return f"{r['median_ms']:.3g} ({vs:.2f}x)" if vs else f"{r['median_ms']:.3g}"

    lines = ["| layer | op | " + " | ".join(f"{dt} {fmt}" for dt, fmt in cols) + " |",
             "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for (layer, op), row in cells.items():
        lines.append(f"| {layer} | {op} | " + " | ".join(cell(row, dt, fmt) for dt, fmt in cols) + " |")
    return "\n".join(lines)


def section(path: Path) -> str:
    doc = report.read_json(path)
    meta, peak, recs = doc["meta"], doc["peak"], doc["results"]
    title = " + ".join(sorted({r["suite"] for r in recs}))
    rel = path.relative_to(HERE) if path.is_relative_to(HERE) else path
    how = ", autotuned" if meta.get("autotune") else ""
    lines = [f"## Suite `{title}`: ISA {meta.get('cpu_isa', '?')}{how}", ""]
    lines += [f"- {ln}" for ln in report.header_lines(meta, peak)]
    lines += [
        f"- run {meta['date']}, {doc['elapsed_s'] / 60:.1f} min: `onednn-convt {' '.join(meta['argv'])}`",
        f"- files: [{rel.with_suffix('.json')}]({rel.with_suffix('.json')}), "
        f"[{rel.with_suffix('.csv')}]({rel.with_suffix('.csv')})",
        "",
        "",
        "What this run measured:",
        "",
        report.summary_text(doc["targets"]),
        "",
    ]
    busy = [r["others_cpu"] for r in recs if r.get("others_cpu") is not None]
    if busy and max(busy) > 0.2:
        lines += [
            f"Other processes used up to {max(busy):.1f} CPUs during this run "
            f"({sum(b > 0.2 for b in busy)} of {len(busy)} configurations above 0.2, column `busy`): "
            "those rows are slower and noisier than this machine can do.",
            "",
        ]
    png = path.with_suffix(".png")
    if png.exists():
        lines += [f"![speed against PyTorch per configuration]({png.relative_to(HERE)})", ""]
    lines += [
        "Our median ms per call; in brackets PyTorch's time over ours (above 1: we are faster), "
        "or for f16 where PyTorch was not timed, our f16 time over our f32 time:",
        "",
        summary(recs),
        "",
        "Every column:",
        "",
        report.markdown_table(recs),
        "",
    ]
    return "\n".join(lines)


def overview(paths: list[Path]) -> str:
    """One row per run: the CPU, how the lowering was chosen, and the speed over PyTorch
    (PyTorch's time / ours) as geomean per dtype, the rows below 0.90 and the slowest row."""
    lines = ["| run | CPU | lowering | rows | geomean | f32 | bf16 | below 0.90 | slowest |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path in paths:
        doc = report.read_json(path)
        meta, recs = doc["meta"], doc["results"]
        ratios = [(r["dtype"], r["vs_torch"], f"{r['layer']}/{r['op']}/{r['dtype']}/{r['format']}")
                  for r in recs if r.get("vs_torch")]
        if not ratios:
            continue

        def geo(xs: list[float]) -> str:
            return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.2f}" if xs else "-"

        low = min(ratios, key=lambda t: t[1])
        how = "autotuned" if meta.get("autotune") else "rules"
        lines.append(
            f"| {path.stem} | {meta.get('cpu_model', '?')} | {how} | {len(ratios)} | {geo([v for _, v, _ in ratios])} "
            f"| {geo([v for d, v, _ in ratios if d == 'f32'])} | {geo([v for d, v, _ in ratios if d == 'bf16'])} "
            f"| {sum(v < 0.90 for _, v, _ in ratios)} | {low[1]:.2f} ({low[2]}) |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or sorted((HERE / "results").glob("*.json"))
    parts = [
        "# Benchmark results (each run names its CPU)",
        "",
        "Produced by `onednn-convt bench` (see [README.md](README.md) for how to run and read it) "
        "and `python benchmarks/make_results.py`.",
        "",
        report.LEGEND,
        "",
        "## Speed over PyTorch, run by run",
        "",
        overview(paths),
        "",
    ]
    notes = HERE / "NOTES.md"
    parts += [section(p) for p in paths]
    if notes.exists():
        parts += [notes.read_text()]
    (HERE / "RESULTS.md").write_text("\n".join(parts))
    print(f"wrote {HERE / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

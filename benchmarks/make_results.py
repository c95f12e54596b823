"""Write benchmarks/RESULTS.md from the JSON files of ``onednn-convt bench`` runs.

Usage::

    python benchmarks/make_results.py benchmarks/results/models.json benchmarks/results/tiny.json

Each run gives a section: what ran (versions, threads, peak, date, command), its targets,
its chart if one was written beside the JSON, and its table. A text file NOTES.md beside
this script, if present, is appended as the analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path

from onednn_convt.bench import report

HERE = Path(__file__).resolve().parent


def section(path: Path) -> str:
    doc = report.read_json(path)
    meta, peak, recs = doc["meta"], doc["peak"], doc["results"]
    title = " + ".join(sorted({r["suite"] for r in recs}))
    rel = path.relative_to(HERE) if path.is_relative_to(HERE) else path
    lines = [f"## Suite `{title}`", ""]
    lines += [f"- {ln}" for ln in report.header_lines(meta, peak)]
    lines += [
        f"- run {meta['date']}, {doc['elapsed_s'] / 60:.1f} min: `onednn-convt {' '.join(meta['argv'])}`",
        f"- files: [{rel.with_suffix('.json')}]({rel.with_suffix('.json')}), "
        f"[{rel.with_suffix('.csv')}]({rel.with_suffix('.csv')})",
        "",
        "Targets (issue 4), as this run measured them:",
        "",
        "```",
        report.targets_text(doc["targets"]),
        "```",
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
    lines += [report.markdown_table(recs), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or sorted((HERE / "results").glob("*.json"))
    parts = [
        "# Benchmark results on this machine",
        "",
        "Produced by `onednn-convt bench` (see [README.md](README.md) for how to run and read it) "
        "and `python benchmarks/make_results.py`.",
        "",
        report.LEGEND,
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

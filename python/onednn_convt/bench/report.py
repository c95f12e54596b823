"""Results out: the stdout table, Markdown, CSV, JSON, the PNG chart, targets and --compare.

A run's records are flat dicts (see :mod:`onednn_convt.bench.runner`); the JSON file holds
``{"meta": ..., "peak": ..., "results": [...], "targets": [...]}`` and is what
``--compare`` reads back.
"""

from __future__ import annotations

import csv
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Callable, Optional

from .. import arguments
from .runner import constant_disagrees, flagged, torch_disagrees

Record = dict[str, Any]


# -- formatting ---------------------------------------------------------------------------
def _num(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 100:
            return f"{v:.0f}"
        return f"{v:.{digits}g}"
    return str(v)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v:.0f}%"


def _ratio(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _err(r: Record) -> str:
    e = r.get("ref_err")
    if e is None:
        return "-"
    return f"{e:.1e}" + (" !" if flagged(r) else "")


def _iqr(r: Record) -> str:
    if r.get("median_ms") is None:
        return "-"
    return f"{100 * r['iqr_ms'] / r['median_ms']:.0f}%" if r["median_ms"] else "-"


def _lowering(r: Record) -> str:
    low = r.get("lowering") or "-"
    return low.replace(" (f32 emulation)", "*")


def _torch(r: Record) -> str:
    if r.get("torch_ms") is not None:
        return ("~" if r.get("torch_estimated") else "") + _num(r["torch_ms"]) + (" !" if torch_disagrees(r) else "")
    return "n/a" if r.get("torch_error") else "-"


def _const(r: Record) -> str:
    """The constant-weights gain, marked ``~`` where the two calls wrote different bytes
    within tolerance (another lowering or kernel: autotuning times the bound op apart),
    ``!`` where they differ by more (:func:`.runner.constant_disagrees`), and ``?`` where
    they differ in a run that did not record by how much (before ``const_err``)."""
    if r.get("const_gain") is None:
        return "-"
    if r.get("const_equal"):
        mark = ""
    elif r.get("const_err") is None:
        mark = "?"
    else:
        mark = "!" if constant_disagrees(r) else "~"
    return _ratio(r["const_gain"]) + mark


#: (header, formatter) of the table columns
COLUMNS: list[tuple[str, Callable[[Record], str]]] = [
    ("layer", lambda r: r["layer"]),
    ("op", lambda r: r["op"]),
    ("dtype", lambda r: r["dtype"]),
    ("fmt", lambda r: r["format"]),
    ("lowering", _lowering),
    ("compile ms", lambda r: _num(r.get("compile_ms"))),
    ("median ms", lambda r: _num(r.get("median_ms"))),
    ("IQR", _iqr),
    ("GFLOP/s", lambda r: _num(r.get("gflops"))),
    ("peak", lambda r: _pct(r.get("pct_peak"))),
    ("native ms", lambda r: _num(r.get("native_ms"))),
    ("overhead us", lambda r: _num(r.get("overhead_us"))),
    ("const w", _const),
    ("torch ms", _torch),
    ("vs torch", lambda r: _ratio(r.get("vs_torch"))),
    ("ref ms", lambda r: _num(r.get("ref_ms"))),
    ("ref err", _err),
    ("alloc B (out=)", lambda r: _num(r.get("alloc_out_bytes"))),
    ("RSS MB", lambda r: _num(r.get("rss_peak_mb"))),
    ("recompiles", lambda r: _num(r.get("repeat_misses"))),
    ("busy", lambda r: _num(r.get("others_cpu"), 1)),
]

LEGEND = (
    "compile = first call - steady median; median/IQR = our call (allocating its result); "
    "peak = % of the measured matmul peak for the dtype; native = the compiled partition in a C++ "
    "loop; overhead = our out= call - native, median of paired samples taken in alternation (for lowering* = emulated in f32 the native loop times "
    "the f32 kernel only, so overhead includes the conversions; for MatMul it includes the "
    "overlap-add); const w = our out= time over that of the same call with the weights bound as "
    "constant (with_constant_weights: reordered once), timed in alternation (~ = the two results differ "
    "within tolerance, as another lowering's or kernel's do; ! = beyond it; ? = they differ, by how much not recorded); torch = PyTorch's time (! = its result "
    "and ours differ beyond tolerance); vs torch = torch time / our time (> 1: we are faster; ~ = PyTorch too slow to run, "
    "estimated from batch 1 times N); ref err = max abs error / "
    "max abs value against the float64 reference (! = above the dtype's tolerance); alloc = "
    "bytes tracemalloc sees allocated during one out= call; recompiles = cache misses after the "
    "first call; busy = CPUs used by other processes meanwhile (timings with busy > 0.2 are unreliable)."
)


def _rows(records: Sequence[Record]) -> list[list[str]]:
    rows = []
    for r in records:
        if r.get("error"):
            rows.append([r["layer"], r["op"], r["dtype"], r["format"], "ERROR: " + r["error"][:80]])
        else:
            rows.append([f(r) for _, f in COLUMNS])
    return rows


def text_table(records: Sequence[Record]) -> str:
    """A fixed-width table, one line per configuration."""
    return fixed_width([h for h, _ in COLUMNS], _rows(records), left=5)


def fixed_width(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int) -> str:
    """``rows`` under ``headers`` in columns as wide as their widest cell, the first ``left``
    columns aligned left and the others right; a cell starting with ``ERROR`` ends its row
    and sets no width."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row[: len(widths)]):
            if not cell.startswith("ERROR"):
                widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(cells):
            if c.startswith("ERROR"):
                out.append(c)
                break
            out.append(c.ljust(widths[i]) if i < left else c.rjust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def markdown_rows(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``headers`` as a Markdown table (short rows padded, ``|`` in a cell as ``/``)."""
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    for row in rows:
        row = list(row) + [""] * (len(headers) - len(row))
        out.append("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
    return "\n".join(out)


def markdown_table(records: Sequence[Record]) -> str:
    """The same table in Markdown."""
    return markdown_rows([h for h, _ in COLUMNS], _rows(records))


def header_lines(meta: dict[str, Any], peak: Optional[dict[str, Any]]) -> list[str]:
    """What ran: versions, CPU, threads, peak."""
    lines = [
        (f"oneDNN {meta['onednn_version']} ({meta['onednn_commit'][:12]}) from {os.path.basename(meta['libdnnl'])}, "
         f"runtime {meta['cpu_runtime']}, ISA {meta['cpu_isa']}"),
        (f"threads {meta['threads']} (oneDNN/OpenMP {meta['omp_threads']}, PyTorch {meta.get('torch_threads')}) "
         f"on {meta['cpus']} CPUs; {meta['cpu_model']}"),
        "PyTorch " + (f"{meta['torch']} (bundles oneDNN {meta['torch_onednn']})" if meta.get("torch") else "not installed"),
        "dtypes: " + ", ".join(f"{k} {v}" for k, v in meta["dtype_support"].items()),
    ]
    table = meta.get("rules_table")  # results written before it was recorded have none
    if table:
        digest = table.get("table_sha256")
        lines.append(f"rules table: {table.get('table') or 'none (the hand-written rules)'}"
                     + (f" (sha256 {digest[:12]})" if digest else ""))
    if peak:
        lines.append(
            f"peak (oneDNN MatMul {peak['size']}^3): f32 {peak['f32_gflops']:.1f} GFLOP/s, "
            f"bf16 {peak['bf16_gflops']:.1f} ({peak['bf16_source']}), f16 {peak['f16_gflops']:.1f} "
            f"({peak['f16_source']}); NumPy matmul f32 {peak['numpy_f32_gflops']:.1f}"
            + (f"; other processes used {peak['others_cpu']:.1f} CPUs meanwhile"
               if peak.get("others_cpu") is not None else "")
        )
    return lines


# -- targets ------------------------------------------------------------------------------
def _ok(records: Iterable[Record]) -> list[Record]:
    return [r for r in records if not r.get("error")]


def geomean(values: Sequence[float]) -> float:
    """The geometric mean of positive ``values`` (at least one)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def copies_by_design(r: Record) -> bool:
    """Whether a row's plan allocates per call by design (target 6 leaves it out): an
    emulated dtype's f32 copies, or a MatMul lowering's layout copies in Python, whether
    the rules chose it (``"MatMul"``) or the tuner (``"MatMul (tuned: ...)"``)."""
    return bool(r["emulated"]) or str(r.get("lowering", "")).startswith("MatMul")


def targets(records: Sequence[Record]) -> list[dict[str, Any]]:
    """The six targets of issue 4 and those of issue 16 (7: speed, 8: tuning cost), each with its
    measured figure and whether it is met.

    ``met`` is None when the run has no configuration the target looks at.
    """
    recs = _ok(records)
    out: list[dict[str, Any]] = []

    def add(n: int, text: str, figure: str, met: Optional[bool]) -> None:
        out.append({"id": n, "target": text, "figure": figure, "met": met})

    # 1. speed over PyTorch on models, f32 and bf16
    sel = [r for r in recs if r["suite"] == "models" and r["dtype"] in ("f32", "bf16") and r.get("vs_torch")]
    if sel:
        g = geomean([r["vs_torch"] for r in sel])
        worst = min(sel, key=lambda r: r["vs_torch"])
        below = sum(r["vs_torch"] < 1.0 for r in sel)
        fig = (f"geomean {g:.2f} over {len(sel)}; min {worst['vs_torch']:.2f} ({worst['key']}); "
               f"{below} below 1.0, {sum(r['vs_torch'] < 0.9 for r in sel)} below 0.90")
        f32 = [r for r in sel if r["dtype"] == "f32"]
        if f32 and len(f32) < len(sel):
            w32 = min(f32, key=lambda r: r["vs_torch"])
            fig += (f"; f32 alone: geomean {geomean([r['vs_torch'] for r in f32]):.2f} over {len(f32)}, "
                    f"min {w32['vs_torch']:.2f}, {sum(r['vs_torch'] < 0.9 for r in f32)} below 0.90")
        bound = [r["vs_torch"] * r.get("const_gain", 1.0) for r in sel]
        if any(r.get("const_gain") for r in sel):
            # not the target's figure (plain calls): the same rows with fwd/bwd_d weights bound
            fig += (f"; with weights bound as constant (fwd, bwd_d; vs torch x const w): geomean "
                    f"{geomean(bound):.2f}, min {min(bound):.2f}, {sum(b < 0.9 for b in bound)} below 0.90")
        add(1, "models: geomean speed over PyTorch >= 1.10 (f32+bf16), none below 0.90",
            fig, g >= 1.10 and worst["vs_torch"] >= 0.90)
    else:
        add(1, "models: geomean speed over PyTorch >= 1.10 (f32+bf16), none below 0.90", "not run", None)
    # 1b (issue 16). every dtype against PyTorch: rules >= 1.10, none < 0.90; autotuned >= 1.25, none < 0.95
    every = [r for r in recs if r["suite"] == "models" and r.get("vs_torch")]
    tuned = any("(tuned:" in str(r.get("lowering")) for r in every)
    low, floor = (1.25, 0.95) if tuned else (1.10, 0.90)
    text = (f"models, f32+bf16+f16 ({'autotuned' if tuned else 'rules'}): geomean speed over PyTorch >= "
            f"{low:.2f}, none below {floor:.2f}")
    if every:
        g = geomean([r["vs_torch"] for r in every])
        worst = min(every, key=lambda r: r["vs_torch"])
        per = ", ".join(
            f"{dt} {geomean([r['vs_torch'] for r in every if r['dtype'] == dt]):.2f}"
            for dt in ("f32", "bf16", "f16") if any(r["dtype"] == dt for r in every)
        )
        fig = (f"geomean {g:.2f} over {len(every)} ({per}); min {worst['vs_torch']:.2f} ({worst['key']}); "
               f"{sum(r['vs_torch'] < floor for r in every)} below {floor:.2f}")
        add(7, text, fig, g >= low and worst["vs_torch"] >= floor)
    else:
        add(7, text, "not run", None)
    # 8 (issue 16). the tuner's cost, and what a tuned second process pays
    text = ("autotuned: tuning a models signature costs <= 2 s; a tuned second process's first call "
            "<= the untuned first call (median ratio, paired in one run)")
    paired = [r for r in recs if r["suite"] == "models" and r.get("first_tuned_vs_untuned")]
    tuning = [r["tuning"]["seconds"] for r in recs if r["suite"] == "models" and isinstance(r.get("tuning"), dict)
              and not r["tuning"].get("cached") and r["tuning"].get("seconds") is not None]
    if paired and tuning:
        ratios = sorted(r["first_tuned_vs_untuned"] for r in paired)
        q1, mid, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        fig = (f"tuning median {statistics.median(tuning):.2f} s, max {max(tuning):.2f} s over {len(tuning)}; "
               f"first call tuned/untuned median {mid:.2f} [q1 {q1:.2f}, q3 {q3:.2f}] over {len(ratios)} rows; "
               f"reading the cache file when autotuning is turned on: median "
               f"{statistics.median(r['cache_read_ms'] for r in paired):.2f} ms")
        add(8, text, fig, max(tuning) <= 2.0 and mid <= 1.0)
    else:
        add(8, text, "not run", None)

    # 2. compile time, and the inverse-STFT layer against PyTorch
    text = "every configuration compiles in < 0.5 s; the inverse-STFT layer within 1.5x of PyTorch"
    if recs:
        slowest = max(recs, key=lambda r: r["compile_ms"])
        fig = f"max compile {slowest['compile_ms']:.0f} ms ({slowest['key']})"
        met: Optional[bool] = slowest["compile_ms"] < 500
        stft = [r for r in recs if r["layer"] == "istft" and r["dtype"] in ("f32", "bf16") and r.get("vs_torch")]
        if stft:
            w = min(stft, key=lambda r: r["vs_torch"])
            fig += f"; istft worst time/PyTorch {1 / w['vs_torch']:.2f}x ({w['key']})"
            met = bool(met and 1 / w["vs_torch"] <= 1.5)
        else:
            fig += "; istft not compared"
        add(2, text, fig, met)
    else:
        add(2, text, "not run", None)

    # 3. large compute-bound shapes against the peak
    sel = [r for r in recs if r["compute_bound"] and r["dtype"] in ("f32", "bf16") and r.get("pct_peak") is not None]
    text = "large compute-bound shapes >= 90% of the measured peak (f32 and bf16)"
    if sel:
        parts, met = [], True
        for dt in ("f32", "bf16"):
            d = [r for r in sel if r["dtype"] == dt]
            if d:
                w = min(d, key=lambda r: r["pct_peak"])
                best = max(d, key=lambda r: r["pct_peak"])
                parts.append(f"{dt} min {w['pct_peak']:.0f}% ({w['key']}), max {best['pct_peak']:.0f}%")
                met = met and w["pct_peak"] >= 90
        add(3, text, "; ".join(parts), met)
    else:
        add(3, text, "not run", None)

    # 4. tiny: overhead and total against PyTorch
    sel = [r for r in recs if r["suite"] == "tiny"]
    text = "tiny: binding overhead <= 2 us over the native loop; total <= 1.3x PyTorch"
    if sel:
        parts4: list[str] = []
        met = True
        for label, d in (("f32", [r for r in sel if r["dtype"] == "f32"]), ("all dtypes", sel)):
            if not d:
                continue
            w = max(d, key=lambda r: r["overhead_us"])
            part = f"{label}: max overhead {w['overhead_us']:.1f} us ({w['key']})"
            t = [r for r in d if r.get("vs_torch")]
            if t:
                wt = min(t, key=lambda r: r["vs_torch"])
                part += f", worst time/PyTorch {1 / wt['vs_torch']:.2f}x ({wt['key']})"
                met = met and 1 / wt["vs_torch"] <= 1.3
            met = met and w["overhead_us"] <= 2.0
            parts4.append(part)
        add(4, text, "; ".join(parts4), met)
    else:
        add(4, text, "not run", None)

    # 5. f16 against f32
    same = {(r["suite"], r["layer"], r["op"], r["format"]): r for r in recs if r["dtype"] == "f32"}
    pairs = [(r, same[k]) for r in recs if r["dtype"] == "f16"
             and (k := (r["suite"], r["layer"], r["op"], r["format"])) in same]
    text = "f16 (emulated here) <= 1.5x the f32 time of the same configuration"
    if pairs:
        ratios = [(a["median_ms"] / b["median_ms"], a["key"]) for a, b in pairs]
        worst_r, worst_k = max(ratios)
        g = geomean([x for x, _ in ratios])
        add(5, text, f"max {worst_r:.2f}x ({worst_k}); geomean {g:.2f}x over {len(ratios)}", worst_r <= 1.5)
    else:
        add(5, text, "not run", None)

    # 6. no recompiles, out= allocates nothing
    text = "a repeated call never recompiles; out= allocates nothing"
    if recs:
        misses = sum(r["repeat_misses"] for r in recs)
        hits = sum(r["repeat_hits"] for r in recs)
        direct = [r for r in recs if r.get("alloc_out_bytes") is not None and not copies_by_design(r)]
        fig = f"recompiles {misses} (cache hits after the first call {hits})"
        met = misses == 0
        if direct:
            w = max(direct, key=lambda r: r["alloc_out_bytes"])
            fig += f"; out= allocates max {w['alloc_out_bytes']} B per call on native plans ({w['key']})"
            met = met and w["alloc_out_bytes"] <= 1024
        emu = [r for r in recs if r.get("alloc_out_bytes") is not None and r not in direct]
        if emu:
            w = max(emu, key=lambda r: r["alloc_out_bytes"])
            fig += f"; on emulated/MatMul plans max {w['alloc_out_bytes']} B ({w['key']}, {w['lowering']})"
        add(6, text, fig, met)
    else:
        add(6, text, "not run", None)
    return sorted(out, key=lambda t: int(t["id"]))


def targets_text(items: Sequence[dict[str, Any]]) -> str:
    """One line per target: MET / MISSED / n/a, the target and its figure."""
    word = {True: "MET   ", False: "MISSED", None: "n/a   "}
    return "\n".join(f"[{word[t['met']]}] {t['id']}. {t['target']}: {t['figure']}" for t in items)


#: what each of :func:`targets`' figures measures, in a user's words (:func:`summary_text`)
SUMMARY_LABELS = {
    1: "speed over PyTorch, models suite, f32 and bf16 (PyTorch's time / ours)",
    7: "speed over PyTorch, models suite, every dtype (PyTorch's time / ours)",
    8: "autotuning: cost per signature, and a tuned process's first call / an untuned one's",
    2: "compile time",
    3: "large compute-bound shapes, % of the measured peak",
    4: "tiny problem: overhead over the native loop, and time against PyTorch",
    5: "f16 time / f32 time of the same configuration",
    6: "recompiles on repeated calls; bytes an out= call allocates",
}


def summary_text(items: Sequence[dict[str, Any]]) -> str:
    """The figures of :func:`targets` as plain lines, ``- what: figure``, for the figures
    this run measured (no goals, no verdicts: those are in the JSON's ``targets``)."""
    lines = [f"- {SUMMARY_LABELS.get(int(t['id']), t['target'])}: "
             + str(t["figure"]).replace("; istft not compared", "")
             for t in items if t["figure"] != "not run"]
    return "\n".join(lines) or "- nothing to summarize"


# -- files --------------------------------------------------------------------------------
def write_csv(records: Sequence[Record], path: Path) -> None:
    """One row per configuration, every field."""
    fields: list[str] = []
    for r in records:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in records:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})


def write_json(doc: dict[str, Any], path: Path) -> None:
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file written by :func:`write_json`.

    Raises:
        ValueError: the file cannot be read, or is not a benchmark result file (each result
            an object with a string ``key`` and a ``median_ms`` positive number or null).
    """
    expected = f"bench: --compare {path}: expected a JSON result file of 'onednn-convt bench'"
    try:
        doc = arguments.read_json_file(path)
    except (OSError, ValueError, RecursionError) as e:
        raise ValueError(f"{expected}, got {e!r}") from None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or not all(_comparable(r) for r in results):
        raise ValueError(f"{expected} (a 'results' list of objects with 'key' and 'median_ms')")
    if not isinstance(doc.get("meta", {}), dict):
        raise ValueError(f"{expected} (its 'meta' an object)")
    return dict(doc)


def _comparable(result: Any) -> bool:
    """Whether a result read from a file has what :func:`compare` reads."""
    if not isinstance(result, dict) or not isinstance(result.get("key"), str):
        return False
    median = result.get("median_ms")
    if median is None:
        return True
    if isinstance(median, bool) or not isinstance(median, (int, float)):
        return False
    try:
        value = float(median)
    except OverflowError:  # an integer past a float's range
        return False
    return math.isfinite(value) and value > 0


def compare(old: dict[str, Any], records: Sequence[Record]) -> str:
    """Per configuration present in both runs: old and new median and the speed-up old/new."""
    before = {r["key"]: r for r in old["results"] if r.get("median_ms")}
    lines = [f"{'configuration':<44} {'old ms':>10} {'new ms':>10} {'speed-up':>9}"]
    ratios = []
    for r in records:
        o = before.get(r["key"])
        if o is None or not r.get("median_ms"):
            continue
        ratio = o["median_ms"] / r["median_ms"]
        ratios.append(ratio)
        lines.append(f"{r['key']:<44} {_num(o['median_ms']):>10} {_num(r['median_ms']):>10} {ratio:>8.2f}x")
    if not ratios:
        return "compare: no configuration in common with the old run"
    lines.append(f"geomean speed-up {geomean(ratios):.2f}x over {len(ratios)} configurations "
                 f"(old run: oneDNN {old.get('meta', {}).get('onednn_version', '?')})")
    return "\n".join(lines)


def chart(records: Sequence[Record], path: Path) -> bool:
    """PNG chart: our speed over PyTorch's per configuration (or % of peak without PyTorch),
    plus, for the sweep suite, GFLOP/s against each swept variable. False if matplotlib is
    not installed or there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    recs = _ok(records)
    if not recs:
        return False
    sweeps = sorted({r["sweep_axis"] for r in recs if r.get("sweep_axis")})
    versus = any(r.get("vs_torch") for r in recs)
    fig_h = max(4.0, 0.16 * len(recs) + 1.5)
    ncols = 1 + (1 if sweeps else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(9 * ncols, fig_h), squeeze=False)
    ax = axes[0][0]
    labels = [f"{r['layer']} {r['op']} {r['dtype']} {r['format']}" for r in recs]
    colors = {"fwd": "tab:blue", "bwd_d": "tab:orange", "bwd_w": "tab:green"}
    if versus:
        values = [r.get("vs_torch") or float("nan") for r in recs]
        ax.barh(range(len(recs)), values, color=[colors[r["op"]] for r in recs])
        ax.set_xscale("log")
        ax.axvline(1.0, color="k", lw=1)
        ax.axvline(1.1, color="k", lw=1, ls="--")
        ax.axvline(0.9, color="r", lw=1, ls=":")
        ax.set_xlabel("our speed / PyTorch's (log; > 1 = faster)")
    else:
        ax.barh(range(len(recs)), [r.get("pct_peak") or 0 for r in recs], color=[colors[r["op"]] for r in recs])
        ax.set_xlabel("% of measured peak")
    ax.set_yticks(range(len(recs)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.set_title("per configuration (blue fwd, orange bwd_d, green bwd_w)")
    if sweeps:
        sx = axes[0][1]
        markers = {"n": "o", "c": "s", "x": "^"}
        for axis in sweeps:
            for op in ("fwd", "bwd_d", "bwd_w"):
                pts = sorted((r["sweep_value"], r["gflops"]) for r in recs
                             if r.get("sweep_axis") == axis and r["op"] == op and r["dtype"] == "f32"
                             and r["format"] == "NXC")
                if pts:
                    sx.plot(*zip(*pts), marker=markers.get(axis, "o"), color=colors[op],
                            label=f"{op} vs {axis}")
        sx.set_xscale("log", base=2)
        sx.set_xlabel("swept value (N, channels or spatial size)")
        sx.set_ylabel("GFLOP/s (f32, NXC)")
        sx.legend(fontsize=7)
        sx.set_title("sweep: cost against N, channels, spatial size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

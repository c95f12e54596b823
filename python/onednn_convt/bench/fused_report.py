"""The fused suite's tables: per-row progress and Markdown, the per-dtype summary, the legend."""


from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from . import report
from .fused_checks import Record, median


#: CPUs used by other processes above which a row counts as disturbed (as in the other suites)
BUSY = 0.2

#: fused/unfused above which the notes list a row as one where fusion made the call slower
SLOWER = 1.05


def busy(rec: Record) -> float:
    return float(rec.get("others_cpu") or 0)


def progress(rec: Record) -> str:
    if rec.get("error"):
        return f"ERROR {rec['error']}"
    text = (f"fused {rec['fused_ms']:.3g} ms, unfused {rec['unfused_ms']:.3g} ms "
            f"({rec['fused_vs_unfused']:.2f}), saved/pass {rec['saved_vs_pass']:.2f}")
    if rec.get("torch_ms") is not None:
        text += f", torch {rec['torch_ms']:.3g} ms ({rec['torch_vs_fused']:.2f}x)"
    if not rec.get("fused"):
        text += f", NOT FUSED ({rec.get('lowering')})"
    return text


def _f(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.{digits}g}"
    return str(v)


def _r(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _torch_cell(r: Record) -> str:
    if r.get("torch_error"):
        return "n/a"
    return _f(r.get("torch_ms")) + (" (once)" if r.get("torch_once") else "")


def _check_cell(r: Record) -> str:
    if r["dtype"] == "int8":
        parts = [(f"{r['lsb_unfused']} LSB ({100 * r['differ_unfused']:.2g}%), f32 op {r['lsb_f32']} LSB "
                  f"({100 * r['differ_f32']:.2g}%)")]
        if r.get("lsb_torch") is not None:
            parts.append(f"{r['lsb_torch']} LSB ({100 * r['differ_torch']:.2g}%, {r['torch_engine']})")
        return " / ".join(parts)
    parts = [f"{r['err_unfused']:.1e}"]
    if r.get("err_torch") is not None:
        parts.append(f"{r['err_torch']:.1e}")
    return " / ".join(parts)


#: (header, cell) of the per-row table
COLUMNS: list[tuple[str, Callable[[Record], str]]] = [
    ("layer", lambda r: r["layer"]),
    ("post-ops", lambda r: r["case"]),
    ("dtype", lambda r: r["dtype"]),
    ("fmt", lambda r: r["format"]),
    ("1 partition", lambda r: "yes" if r.get("fused") and r.get("partitions") == 1 else "NO"),
    ("fused ms", lambda r: _f(r.get("fused_ms"))),
    ("unfused ms", lambda r: _f(r.get("unfused_ms"))),
    ("fused/unfused", lambda r: _r(r.get("fused_vs_unfused"))),
    ("saved ms", lambda r: _f(r.get("saved_ms"))),
    ("NumPy post ms", lambda r: _f(r.get("post_ms"))),
    ("saved/post", lambda r: _r(r.get("saved_vs_post"))),
    ("pass ms", lambda r: _f(r.get("pass_ms"))),
    ("copy ms", lambda r: _f(r.get("copy_ms"))),
    ("saved/pass", lambda r: _r(r.get("saved_vs_pass"))),
    ("in place ms", lambda r: _f(r.get("fused_inplace_ms"))),
    ("saved/pass in place", lambda r: _r(r.get("saved_inplace_vs_pass"))),
    ("best saved/pass [q1, q3]", lambda r: f"{_r(r.get('best_saved_vs_pass'))} "
     f"[{_r(r.get('best_saved_vs_pass_q1'))}, {_r(r.get('best_saved_vs_pass_q3'))}]"),
    ("fused alloc ms", lambda r: _f(r.get("fused_alloc_ms"))),
    ("torch ms", _torch_cell),
    ("torch/fused", lambda r: _r(r.get("torch_vs_fused"))),
    ("check: unfused / torch", _check_cell),
    ("busy", lambda r: _f(r.get("others_cpu"), 1)),
]


def markdown_table(records: Sequence[Record]) -> str:
    """Every row as a Markdown table (a failed row shows its error)."""
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in records:
        if r.get("error"):
            lines.append(f"| {r['layer']} | {r['case']} | {r['dtype']} | {r['format']} | ERROR: {r['error']} |")
            continue
        lines.append("| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |")
    return "\n".join(lines)


def summary(records: Sequence[Record]) -> list[Record]:
    """Per dtype (f32, bf16, int8): geomeans of fused/unfused and torch/fused, the median and
    smallest saved/pass, and counts of the rows that saved at least one pass, where fusion was
    slower (fused/unfused above :data:`SLOWER`) or not one partition."""
    out = []
    for dt in ("f32", "bf16", "int8"):
        rows = [r for r in records if r["dtype"] == dt and not r.get("error")]
        if not rows:
            continue
        torch_rows = [r["torch_vs_fused"] for r in rows if r.get("torch_vs_fused")]
        passes = [r["best_saved_vs_pass"] for r in rows]
        out.append({
            "dtype": dt, "rows": len(rows),
            "fused_vs_unfused": report.geomean([r["fused_vs_unfused"] for r in rows]),
            "torch_vs_fused": report.geomean(torch_rows) if torch_rows else None,
            "saved_vs_pass_median": median(passes),
            "saved_vs_pass_min": min(passes),
            "saved_at_least_one_pass": sum(p >= 1 for p in passes),
            "below_one_pass_beyond_noise": sum(r["best_saved_vs_pass_q3"] < 1 for r in rows),
            "fused_slower": sum(r["fused_vs_unfused"] > SLOWER for r in rows),
            "not_one_partition": sum(not (r.get("fused") and r.get("partitions") == 1) for r in rows),
        })
    return out


def summary_table(items: Sequence[Record]) -> str:
    lines = [
        ("| dtype | rows | geomean fused/unfused | geomean torch/fused | saved/pass: median | min "
         f"| rows saving >= 1 pass | rows below 1 pass beyond noise (q3 < 1) "
         f"| rows where fused is slower (fused/unfused > {SLOWER}) | rows not one partition |"),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in items:
        lines.append(
            f"| {s['dtype']} | {s['rows']} | {s['fused_vs_unfused']:.2f} | {_r(s['torch_vs_fused'])} | "
            f"{s['saved_vs_pass_median']:.2f} | {s['saved_vs_pass_min']:.2f} | {s['saved_at_least_one_pass']} | "
            f"{s['below_one_pass_beyond_noise']} | "
            f"{s['fused_slower']} | {s['not_one_partition']} |"
        )
    return "\n".join(lines)


LEGEND = """\
Columns: *fused ms*: one call of `ConvTranspose(post_ops=...)` with `out=`; *unfused ms*: the plain
`ConvTranspose` with the bias (`out=`), then the same post-ops in NumPy, in place (int8: the int8
ConvTranspose with an f32 dst, itself one partition, then ReLU and Quantize to u8 in NumPy); *saved ms*: median of the
per-round differences unfused - fused; *NumPy post ms*: the post-ops alone in NumPy on a ready dst
(int8: ReLU and Quantize); *pass ms*: one memory pass over dst in place (each byte read once and written back: a
bitwise XOR with 0 over dst's bytes; int8: over the f32 dst), the memory pass a post-op costs at the
least; *copy ms*: a NumPy copy of dst into another buffer, for comparison (the write-allocate reads the
destination too, so a copy costs more than a pass); *saved/pass* at or above 1: fusion
saves at least the post-op's memory pass; *in place ms*: the fused call with `out=` its residual (chains
whose first post-op adds a tensor of dst's shape), and its *saved/pass*; *best saved/pass [q1, q3]*: the
better of the two calls, with the quartiles of its per-round savings in passes (q3 below 1: it saves less
than a pass beyond this machine's noise; the summary's saved/pass figures are these); *fused alloc ms*: the fused call allocating its result, as
PyTorch's call does; *torch/fused*: PyTorch's time over the allocating fused call (above 1: ours is
faster); *check*: relative error of the fused result against the unfused one / PyTorch's (int8: the
largest difference in u8 steps and the share of elements that differ, against the unfused result, the
f32 op on the dequantized tensors and PyTorch's, with the quantized engine that passed); *busy*: CPUs other processes
used meanwhile. Times are medians of alternating batches (torch, fused alloc, fused, unfused, post,
pass, copy, torch, ...; a short sleep before torch's and fused alloc's batches lets the other OpenMP
runtime's threads stop spinning). NumPy's bf16 arithmetic (ml_dtypes) runs scalar loops, several
times slower than a memory pass: bf16's unfused figures are mostly NumPy's cost, saved/pass says how
much more than one pass fusion saved."""



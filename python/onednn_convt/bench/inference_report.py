"""The inference runtimes' table (``onednn-convt bench --peers``): per configuration that a
peer ran, our call with the weights bound as constant and each peer's time, ratio and
error, measured side by side (the bench's runner records them: :mod:`.runner`); then each
peer's geometric mean and why the others did not fit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from .inference_peers import PEERS, PREFIX
from .report import Record, fixed_width, geomean, markdown_rows
from .runner import TOLERANCE

LEGEND = (
    "ours = our call with the weights bound as constant (with_constant_weights), as each peer's graph "
    "holds them; vs = the peer's time / ours (> 1: we are faster), timed in rounds with ours; "
    "err = max abs difference from our result / max abs value (! = above the dtype's tolerance); "
    "(f32) after a time: the peer's kernel computed in f32, not in the row's dtype."
)


def _peer_cells(r: Record, prefix: str) -> list[str]:
    if r.get(f"{prefix}_error"):
        return ["failed", "-", "-"]
    ms = r.get(f"{prefix}_ms")
    if ms is None:
        return ["-", "-", "-"]
    precision = r.get(f"{prefix}_precision")
    time = f"{ms:.3g}" + (f" ({precision})" if precision and precision != r["dtype"] else "")
    err = r.get(f"{prefix}_err")
    mark = "!" if err is not None and err > TOLERANCE[r["dtype"]] else ""
    return [time, f"{r[f'vs_{prefix}']:.2f}", "-" if err is None else f"{err:.1e}{mark}"]


def _rows(records: Sequence[Record]) -> tuple[list[str], list[list[str]]]:
    headers = ["layer", "op", "dtype", "fmt", "ours ms"]
    for peer in PEERS:
        headers += [f"{peer} ms", "vs", "err"]
    ran = [r for r in records if r.get("peers_ours_ms") is not None
           or any(r.get(f"{PREFIX[p]}_error") for p in PEERS)]
    rows = []
    for r in ran:
        ours = r.get("peers_ours_ms")
        row = [r["layer"], r["op"], r["dtype"], r["format"], "-" if ours is None else f"{ours:.3g}"]
        for peer in PEERS:
            row += _peer_cells(r, PREFIX[peer])
        rows.append(row)
    return headers, rows


def summary(records: Sequence[Record]) -> list[str]:
    """Per peer: the geometric mean of its time over ours and the worst row; its failures;
    and why it did not fit the other configurations (each reason with its count)."""
    lines = []
    for peer in PEERS:
        prefix = PREFIX[peer]
        ran = [r for r in records if r.get(f"vs_{prefix}")]
        if ran:
            mean = geomean([r[f"vs_{prefix}"] for r in ran])
            worst = min(ran, key=lambda r: r[f"vs_{prefix}"])
            lines.append(f"- {peer}: its time / ours, geomean {mean:.2f} over {len(ran)} configurations; "
                         f"min {worst[f'vs_{prefix}']:.2f} ({worst['key']})")
        for r in records:
            if r.get(f"{prefix}_error"):
                lines.append(f"- {peer} failed on {r['key']}: {r[f'{prefix}_error']}")
        reasons = Counter(r[f"{prefix}_note"] for r in records if r.get(f"{prefix}_note"))
        for why, count in reasons.most_common():
            lines.append(f"- {peer} did not fit {count} configurations: {why}")
    return lines


def text(records: Sequence[Record]) -> str:
    """The table in fixed width, its legend and :func:`summary`."""
    headers, rows = _rows(records)
    table = fixed_width(headers, rows, left=4) if rows else "(no configuration fits a peer)"
    return "Inference runtimes:\n" + table + "\n\n" + LEGEND + "\n" + "\n".join(summary(records))


def markdown(records: Sequence[Record]) -> str:
    """The same in Markdown."""
    headers, rows = _rows(records)
    table = markdown_rows(headers, rows) if rows else "(no configuration fits a peer)"
    return "Inference runtimes:\n\n" + table + "\n\n" + LEGEND + "\n\n" + "\n".join(summary(records))

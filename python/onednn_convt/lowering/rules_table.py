"""The measured rules, as data: which lowering was fastest, per CPU, dispatch ISA and problem class.

Each table is a JSON file in ``tables/`` beside this module, made by
``benchmarks/make_rules.py`` from ``onednn-convt tune --retune`` runs on one CPU
(:mod:`onednn_convt.cpu`) at one dispatch ISA, with its provenance::

    {"format": 1,
     "cpu": "zen4", "cpu_name": "AMD Zen4 (AMD EPYC, family 25 model 17)", "isa": "avx512_core_bf16",
     "onednn": "3.2.0 40112196...", "threads": 2, "date": "2026-11-25", "suites": ["models", "tiny"],
     "sources": ["benchmarks/results/zen4/tune_models.json", ...], "note": "...",
     "rules": [{"op": "ConvTranspose", "dtype": "bf16", "data_format": "NCX", "shape_class": "dense",
                "lowering": "ConvolutionBackwardData", "rows": ["dcgan2"],
                "scores": {"ConvolutionBackwardData": 1.0, "ConvTranspose": 1.02}}, ...]}

``scores`` holds each candidate's geometric mean, over the class's rows, of its time over the
row's fastest (1.0: fastest on every row). ``default.json`` (``"cpu": "default"``) is the
conservative table for a CPU with none of its own: the library's own op in the native dtype,
except where another lowering won by a margin on every CPU measured (``make_rules.py
--default``). :func:`select` says which table applies here and why.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

FORMAT = 1
DIRECTORY = Path(__file__).resolve().parent / "tables"
#: the table of CPUs without one of their own
DEFAULT_NAME = "default"

Key = tuple[str, str, str, str]  # op, dtype, data_format, shape_class


@dataclass(frozen=True)
class Table:
    """One measured table (see the module docstring for the file)."""

    name: str
    cpu: str
    isa: str
    provenance: dict[str, Any]
    entries: dict[Key, str] = field(default_factory=dict)
    scores: dict[Key, dict[str, float]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line: what it was measured on, when, with which suites."""
        p = self.provenance
        if self.cpu == DEFAULT_NAME:
            return f"the conservative default ({p.get('note', 'made from the tables of every CPU measured')})"
        return (f"measured on {p.get('cpu_name', self.cpu)} at {self.isa}, oneDNN {p.get('onednn', '?')}, "
                f"{p.get('threads', '?')} threads, {p.get('date', '?')}, suites {', '.join(p.get('suites', []))}")


def parse(data: Any, name: str) -> Table:
    """The table in a file's JSON ``data``; ValueError where it is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        msg = f"rules table {name}: expected a JSON object of format {FORMAT}"
        raise ValueError(msg)
    entries: dict[Key, str] = {}
    scores: dict[Key, dict[str, float]] = {}
    try:
        for rule in data["rules"]:
            key = (str(rule["op"]), str(rule["dtype"]), str(rule["data_format"]), str(rule["shape_class"]))
            if key in entries:
                msg = f"rules table {name}: two rules for {key}"
                raise ValueError(msg)
            entries[key] = str(rule["lowering"])
            scores[key] = {str(k): float(v) for k, v in rule.get("scores", {}).items()}
        provenance = {k: v for k, v in data.items() if k not in ("format", "rules")}
        return Table(name, str(data["cpu"]), str(data["isa"]), provenance, entries, scores)
    except (KeyError, TypeError, AttributeError) as e:
        msg = f"rules table {name}: malformed ({e!r})"
        raise ValueError(msg) from None


def read(path: Path) -> Table:
    """The table in ``path``."""
    return parse(json.loads(path.read_text(encoding="utf-8")), path.stem)


@functools.lru_cache(maxsize=None)
def _shipped() -> tuple[dict[tuple[str, str], Table], Optional[Table]]:
    tables: dict[tuple[str, str], Table] = {}
    default = None
    for path in sorted(DIRECTORY.glob("*.json")):
        table = read(path)
        if table.cpu == DEFAULT_NAME:
            default = table
        else:
            tables[(table.cpu, table.isa)] = table
    return tables, default


#: tests replace these (None: the shipped tables)
TABLES: Optional[dict[tuple[str, str], Table]] = None
DEFAULT: Optional[Table] = None
_use_shipped_default = True


def tables() -> dict[tuple[str, str], Table]:
    """Every CPU's table, by (microarchitecture, dispatch ISA class)."""
    return _shipped()[0] if TABLES is None else TABLES


def default() -> Optional[Table]:
    """The conservative table of CPUs without one."""
    if DEFAULT is not None or not _use_shipped_default:
        return DEFAULT
    return _shipped()[1]


def use_no_tables() -> None:
    """No measured table at all (the hand-written rules alone): for tests."""
    global TABLES, DEFAULT, _use_shipped_default
    TABLES, DEFAULT, _use_shipped_default = {}, None, False


def use_shipped_tables() -> None:
    """Back to the shipped tables."""
    global TABLES, DEFAULT, _use_shipped_default
    TABLES, DEFAULT, _use_shipped_default = None, None, True


def select(cpu: str, isa_class: Optional[str]) -> tuple[Optional[Table], str]:
    """The table for a CPU (:attr:`onednn_convt.cpu.Cpu.microarchitecture`) at a dispatch
    ISA class, and why: its own, else the conservative default, else none."""
    if isa_class is not None:
        own = tables().get((cpu, isa_class))
        if own is not None:
            return own, f"this CPU's own table: {own.describe()}"
    fallback = default()
    mine = ", ".join(f"{c}/{i}" for c, i in sorted(tables()))
    if fallback is not None:
        return fallback, f"no table for {cpu} at {isa_class} (tables: {mine or 'none'}): {fallback.describe()}"
    return None, f"no table for {cpu} at {isa_class} and no default: the hand-written rules"

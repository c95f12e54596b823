"""The measured rules, as data: which lowering was fastest, per CPU, dispatch ISA and layer.

Each CPU's table is a JSON file in ``tables/`` beside this module, made by
``benchmarks/make_rules.py`` from ``onednn-convt tune --retune`` runs on one CPU
(:mod:`onednn_convt.cpu`) at one dispatch ISA, with its provenance and, for each tuned
configuration (a suite layer as one op, dtype and data format), its shape and each
candidate's time over the fastest's::

    {"format": 2,
     "cpu": "zen5", "cpu_name": "AMD Zen5 (AMD EPYC, family 26 model 2)", "isa": "avx512_core_bf16",
     "onednn": "3.2.0 40112196...", "threads": "2", "date": "2026-11-26",
     "suites": ["broad-fit", "models", "tiny"], "sources": ["benchmarks/results/zen5/tune_models.json", ...],
     "note": "...",
     "layers": [{"layer": "models/dcgan1", "op": "ConvTranspose", "dtype": "f32", "data_format": "NCX",
                 "n": 16, "ic": 512, "oc": 256, "groups": 1, "src": [4, 4], "kernel": [4, 4],
                 "strides": [2, 2], "ratios": {"Polyphase": 1.0, "ConvolutionBackwardData": 1.08, ...}}, ...]}

A problem of a measured layer's shape runs as that layer ran fastest; any other problem as
its :data:`NEIGHBOURS` nearest measured layers of the same op, dtype and data format ran
fastest (:meth:`Table.choose`, by :func:`onednn_convt.problem.features`), a small call's
among the small layers and a larger one's among the larger where the table measured both
(:data:`SMALL_CALL_FLOPS`). A layer of a
``tune --layers-json`` run (a user's, or ``benchmarks/random_layers.py``'s) carries
``"phases": false``: it chooses for problems, not for the stride-1 phases of a polyphase
lowering. So does a configuration tuned again after a change to the code
(``make_rules.py --remeasured``); the record it replaced stays, marked ``"calls": false``, to
choose phases alone: a re-tune moves no phase.
``default.json`` (``"cpu": "default"``) is the conservative table for a CPU with none of its
own, keyed by :func:`onednn_convt.problem.shape_class` instead (``"rules"``: the library's own
op in the native dtype, except where another lowering won by a margin on every CPU measured,
two at least, and took at most 1.10x the library op's time on each of the class's measured
layers; ``make_rules.py --default``). :func:`select` says which table applies here and why.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import problem

FORMAT = 2
DIRECTORY = Path(__file__).resolve().parent / "tables"
#: the table of CPUs without one of their own
DEFAULT_NAME = "default"
#: how many measured layers a problem's lowering is chosen from
NEIGHBOURS = 3
#: the time ratio a candidate is given on a neighbour where it was not measured
UNMEASURED = 2.0
#: FLOPs (2 x multiply-adds) up to which a call is small: a few tenths of a millisecond or
#: less on 2 cores, where each library op's and each Python step's fixed cost weighs as much
#: as the arithmetic. A problem chooses from the measured layers on its side of this line
#: where the table measured both sides (:data:`SIDE_LAYERS`; :func:`nearest_choice`): on an
#: AMD Zen3, a table whose nearest layers to small problems were large ones chose polyphase
#: and MatMul lowerings that ran up to 270x the library op's time on them
#: (benchmarks/NOTES.md), and small layers added to it moved large problems' choices (bf16
#: ones of held-out random layers 0.25-5.2x as fast)
SMALL_CALL_FLOPS = 20_000_000
#: measured layers of a problem's op, dtype and data format that each side of
#: SMALL_CALL_FLOPS must hold for the split to apply: a table that measured small calls
#: (the Zen3's small random layers), not one whose few small layers are suite layers (the
#: other CPUs' tables, whose choices stay as they were measured and checked)
SIDE_LAYERS = 12

Key = tuple[str, str, str, str]  # op, dtype, data_format, shape_class


@dataclass(frozen=True)
class Measured:
    """One tuned configuration: a suite layer run as one op, dtype and data format.

    Attributes:
        layer: ``suite/name`` of the layer.
        op, dtype, data_format: the configuration.
        n, ic, oc, groups, src, kernel, strides: the layer's forward shape (as in
            :class:`onednn_convt.problem.Problem`).
        ratios: each candidate lowering that ran it (refused or wrong ones left out), its
            time over the fastest one's (1.0: the fastest).
        phases: whether it chooses the lowerings of polyphase phases too (the JSON's
            ``"phases": false`` where not: see :meth:`Table.choose`).
        calls: whether it chooses for problems (the JSON's ``"calls": false`` where not: a
            record that a re-tune of its configuration replaced, kept to choose phases
            alone, see :meth:`Table.choose`).
    """

    layer: str
    op: str
    dtype: str
    data_format: str
    n: int
    ic: int
    oc: int
    groups: int
    src: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    ratios: dict[str, float]
    phases: bool = True
    calls: bool = True
    #: :func:`onednn_convt.problem.features` of the layer (made once, with the layer: not a
    #: functools.cached_property, whose lock in Python 3.11 a fork can leave held)
    features: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", problem.features(self.kernel, self.strides, self.groups, self.ic,
                                                               self.oc, self.src, self.n))

    @property
    def shape(self) -> tuple[int, int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """batch, input and output channels, groups, src, kernel and strides."""
        return (self.n, self.ic, self.oc, self.groups, self.src, self.kernel, self.strides)

    @property
    def shape_class(self) -> str:
        """:func:`onednn_convt.problem.shape_class` of the layer."""
        return problem.shape_class(self.kernel, self.strides, self.groups, self.ic, self.oc, self.src, self.n)

    @property
    def gemm_grouped(self) -> bool:
        """:func:`onednn_convt.problem.gemm_grouped` of the layer."""
        return problem.gemm_grouped(len(self.kernel), self.groups, self.ic, self.oc)

    @property
    def small_call(self) -> bool:
        """Whether the layer's calls are small (:data:`SMALL_CALL_FLOPS`)."""
        return problem.flops(self.n, self.ic, self.oc, self.groups, self.kernel, self.src) <= SMALL_CALL_FLOPS


@dataclass(frozen=True)
class Table:
    """One measured table (see the module docstring for the file)."""

    name: str
    cpu: str
    isa: str
    provenance: dict[str, Any]
    entries: dict[Key, str] = field(default_factory=dict)
    scores: dict[Key, dict[str, float]] = field(default_factory=dict)
    layers: tuple[Measured, ...] = ()
    #: the SHA-256 of the file it was read from (hex; "" for a table made in memory): which
    #: table a benchmark ran, recorded in its result files
    digest: str = ""
    #: the layers of each op, dtype and data format; with ``True``, those that choose for
    #: phases (made once, with the table, rather than each call's choice reading every layer)
    _by_config: dict[tuple[str, str, str, bool], tuple[Measured, ...]] = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        out: dict[tuple[str, str, str, bool], list[Measured]] = {}
        for m in self.layers:
            for phase in (False, True):
                if m.phases if phase else m.calls:
                    out.setdefault((m.op, m.dtype, m.data_format, phase), []).append(m)
        object.__setattr__(self, "_by_config", {k: tuple(v) for k, v in out.items()})

    @property
    def call_layers(self) -> tuple[Measured, ...]:
        """The measured layers that choose for problems (the records kept for phases alone
        left out): each configuration once."""
        return tuple(m for m in self.layers if m.calls)

    def describe(self) -> str:
        """One line: what it was measured on, when, with which suites."""
        p = self.provenance
        if self.cpu == DEFAULT_NAME:
            return f"the conservative default ({p.get('note', 'made from the tables of every CPU measured')})"
        return (f"measured on {p.get('cpu_name', self.cpu)} at {self.isa}, oneDNN {p.get('onednn', '?')}, "
                f"{p.get('threads', '?')} threads, {p.get('date', '?')}, suites {', '.join(p.get('suites', []))}")

    def small_calls(self) -> str:
        """How the table chooses for a small call (:data:`SMALL_CALL_FLOPS`), for
        ``info()["rules"]``: among its measured small calls where it holds
        :data:`SIDE_LAYERS` of them and of larger ones for an op, dtype and data format
        (grouped 3-D layers that oneDNN 3.2 runs on its gemm convolution counted apart, as
        :func:`nearest_choice` chooses for them apart), else among all its layers, whose
        nearest to a small call may be large ones."""
        if not self.layers:
            return "by shape class, as every call (the default table)"
        kinds = [[m for m in layers if m.gemm_grouped == gemm]  # chosen among apart (nearest_choice)
                 for (_, _, _, phase), layers in self._by_config.items() if not phase for gemm in (False, True)]
        counts = [(sum(m.small_call for m in kind), len(kind)) for kind in kinds if kind]
        split = [small for small, total in counts if _split_by_size(small, total)]
        flops = f"calls of at most {SMALL_CALL_FLOPS / 1e6:g} MFLOP"
        if split:
            rest = "" if len(split) == len(counts) else "; among all its layers for the others"
            return (f"among its measured {flops} ({min(split)}-{max(split)} layers) for {len(split)} of its "
                    f"{len(counts)} op, dtype and data format configurations (grouped 3-D layers on oneDNN's "
                    f"gemm convolution apart){rest}")
        most = max((small for small, _ in counts), default=0)
        return (f"among all its layers: it measured at most {most} {flops} per op, dtype and data format, "
                f"fewer than the {SIDE_LAYERS} that would choose for them alone, so a small call may take a "
                f"large layer's choice (docs/performance.md says how to tune small layers into a table)")

    def choose(self, p: problem.Problem, names: Sequence[str], *, phase: bool = False) -> Optional[str]:
        """The lowering of ``names`` (those that can run ``p``) that ran fastest on the
        measured layers nearest to ``p``, or None where the table cannot say.

        A table of layers: the layers of ``p``'s op, dtype and data format whose shape is
        ``p``'s (batch, channels, groups, src, kernel and strides), if any; else the
        :data:`NEIGHBOURS` of them nearest to it (Euclidean distance between :func:`onednn_convt.problem.features`)
        among those on ``p``'s side of :data:`SMALL_CALL_FLOPS` where each side holds
        :data:`SIDE_LAYERS` at least (a phase's choice looks at all), weighted 1, 1/2, 1/3
        from the nearest. Each candidate of ``names`` measured on one of
        them at least is scored by the weighted mean of the logarithm of its time ratio
        there, counted as :data:`UNMEASURED` (twice the fastest's time) on a layer where it
        was not measured (it did not apply, or was refused); the lowest score wins.
        A table of classes (the default): its entry for ``p``'s class.

        ``phase``: ``p`` is a phase of a polyphase lowering, chosen for among the measured
        layers that choose phases (:attr:`Measured.phases`); a problem, among those that
        choose for problems (:attr:`Measured.calls`). A polyphase time in a table was
        measured with the phases lowered as the table then chose; layers added later
        (``make_rules.py`` adds those of ``tune --layers-json`` so) must not move those
        choices: on an AMD Zen3, 120 random layers in the Zen3 table chose anew the phases of
        7 of the suites' 780 configurations, and all 7 ran slower (1.07-3.5x). Nor must a
        re-tune (``make_rules.py --remeasured``): its records choose for problems, and the
        records they replaced for phases. On an AMD Zen4 the re-tune that brought the tiles
        MatMul's BackwardWeights moved the phases of 5 configurations (its 1x1 phases took
        that MatMul), 2.0-2.4x slower on two of them (``benchmarks/NOTES.md``).

        A grouped 3-D problem that oneDNN 3.2 runs on its gemm convolution
        (:attr:`onednn_convt.problem.Problem.gemm_grouped`) is chosen for only by measured
        layers of that kind; a table with none (the classes do not tell them apart) says
        nothing, and the fallback rules choose."""
        if not self.layers:
            if p.gemm_grouped:
                return None
            chosen = self.entries.get((p.op, p.dtype, p.data_format, p.shape_class))
            return chosen if chosen in names else None
        shape = (p.n, p.ic, p.oc, p.groups, p.src, p.kernel, p.geometry.strides)
        layers = self._by_config.get((p.op, p.dtype, p.data_format, phase), ())
        return nearest_choice(layers, (p.op, p.dtype, p.data_format), shape, p.features, names, by_size=not phase)


def nearest_choice(layers: Sequence[Measured], config: tuple[str, str, str],
                   shape: tuple[int, int, int, int, tuple[int, ...], tuple[int, ...], tuple[int, ...]],
                   features: tuple[float, ...], names: Sequence[str], *, by_size: bool = True) -> Optional[str]:
    """:meth:`Table.choose` over ``layers`` for a problem of ``config`` (op, dtype, data
    format), ``shape`` (as :attr:`Measured.shape`) and ``features``
    (:func:`onednn_convt.problem.features`); ``benchmarks/rules_cv.py`` calls it on measured
    layers left out of the table. ``by_size``: from the layers on the problem's side of
    :data:`SMALL_CALL_FLOPS` where each side has :data:`SIDE_LAYERS` (a polyphase phase's
    choice is not: the table's polyphase times were measured with its phases chosen from
    every layer)."""
    n, ic, oc, groups, src, kernel, _ = shape
    gemm = problem.gemm_grouped(len(kernel), groups, ic, oc)  # measured layers of its kind only
    mine = [m for m in layers if (m.op, m.dtype, m.data_format) == config and m.gemm_grouped == gemm]
    if by_size:
        small = problem.flops(n, ic, oc, groups, kernel, src) <= SMALL_CALL_FLOPS
        side = [m for m in mine if m.small_call == small]
        if _split_by_size(len(side), len(mine)):
            mine = side
    near = [m for m in mine if m.shape == shape]  # this very layer: its own times, weighted alike
    weights = [1.0] * len(near)
    if not near:
        near = sorted(mine, key=lambda m: math.dist(m.features, features))[:NEIGHBOURS]
        weights = [1 / (1 + i) for i in range(len(near))]

    def score(name: str) -> float:
        logs = (math.log(m.ratios.get(name, UNMEASURED)) for m in near)
        return sum(w * x for w, x in zip(weights, logs)) / sum(weights)

    measured = [n for n in names if any(n in m.ratios for m in near)]
    return min(measured, key=score) if measured else None


def _split_by_size(one_side: int, layers: int) -> bool:
    """Whether ``layers`` measured layers of a configuration, ``one_side`` of them on one side
    of :data:`SMALL_CALL_FLOPS`, hold :data:`SIDE_LAYERS` on each side: a problem then
    chooses among those on its own side alone."""
    return min(one_side, layers - one_side) >= SIDE_LAYERS


def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def parse(data: Any, name: str, digest: str = "") -> Table:
    """The table in a file's JSON ``data`` (``digest``: the file's SHA-256); ValueError
    where it is not one."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        msg = f"rules table {name}: expected a JSON object of format {FORMAT}"
        raise ValueError(msg)
    entries: dict[Key, str] = {}
    scores: dict[Key, dict[str, float]] = {}
    try:
        for rule in data.get("rules", []):
            key = (str(rule["op"]), str(rule["dtype"]), str(rule["data_format"]), str(rule["shape_class"]))
            if key in entries:
                msg = f"rules table {name}: two rules for {key}"
                raise ValueError(msg)
            entries[key] = str(rule["lowering"])
            scores[key] = {str(k): float(v) for k, v in rule.get("scores", {}).items()}
        layers = tuple(
            Measured(str(m["layer"]), str(m["op"]), str(m["dtype"]), str(m["data_format"]), int(m["n"]),
                     int(m["ic"]), int(m["oc"]), int(m["groups"]), _ints(m["src"]), _ints(m["kernel"]),
                     _ints(m["strides"]), {str(k): float(v) for k, v in m["ratios"].items()},
                     _flag(m.get("phases", True)), _flag(m.get("calls", True)))
            for m in data.get("layers", [])
        )
        for m in layers:
            if not m.ratios or min(m.ratios.values()) <= 0 or len({len(m.src), len(m.kernel), len(m.strides)}) != 1:
                msg = f"rules table {name}: layer {m.layer} {m.op} {m.dtype} {m.data_format} is malformed"
                raise ValueError(msg)
        provenance = {k: v for k, v in data.items() if k not in ("format", "rules", "layers")}
        return Table(name, str(data["cpu"]), str(data["isa"]), provenance, entries, scores, layers, digest)
    except (KeyError, TypeError, AttributeError) as e:
        msg = f"rules table {name}: malformed ({e!r})"
        raise ValueError(msg) from None


def read(path: Path) -> Table:
    """The table in ``path``."""
    raw = path.read_bytes()
    return parse(json.loads(raw.decode("utf-8")), path.stem, hashlib.sha256(raw).hexdigest())


@functools.lru_cache(maxsize=None)
def _shipped_stems() -> frozenset[str]:
    """The names of the shipped tables' files: ``<cpu>-<isa class>`` and ``default``."""
    return frozenset(p.stem for p in DIRECTORY.glob("*.json"))


@functools.lru_cache(maxsize=None)
def _shipped() -> tuple[dict[tuple[str, str], Table], Optional[Table]]:
    tables: dict[tuple[str, str], Table] = {}
    default = None
    for stem in sorted(_shipped_stems()):
        table = _shipped_file(stem)
        assert table is not None
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
    return _shipped_file(DEFAULT_NAME)


@functools.lru_cache(maxsize=None)
def _shipped_file(stem: str) -> Optional[Table]:
    """The shipped table in ``tables/<stem>.json``, read alone (a process reads the one
    table that applies to it, not all: they came to 1.5 MB, 110 ms a process), or None.
    ``stem`` is looked up among the files' names, not made into a path: it holds the
    user's ``ONEDNN_CONVT_CPU``, which may be any text (a path, or a name too long for
    one, raised OSError from every op's first call)."""
    return read(DIRECTORY / f"{stem}.json") if stem in _shipped_stems() else None


def _own(cpu: str, isa_class: str) -> Optional[Table]:
    """The table of ``cpu`` at ``isa_class``: the shipped file named so (``make_rules.py``
    names each ``<cpu>-<isa class>.json``), or the tests' :data:`TABLES`."""
    if TABLES is not None:
        return TABLES.get((cpu, isa_class))
    own = _shipped_file(f"{cpu}-{isa_class}")
    return own if own is not None and (own.cpu, own.isa) == (cpu, isa_class) else None


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
        own = _own(cpu, isa_class)
        if own is not None:
            return own, f"this CPU's own table: {own.describe()}"
    fallback = default()
    if TABLES is None:  # the files' names, not their tables (read alone, as they apply)
        keys = [tuple(stem.split("-", 1)) for stem in _shipped_stems() if stem != DEFAULT_NAME]
    else:
        keys = list(TABLES)
    mine = ", ".join(f"{c}/{i}" for c, i in sorted(keys))
    if fallback is not None:
        return fallback, f"no table for {cpu} at {isa_class} (tables: {mine or 'none'}): {fallback.describe()}"
    return None, f"no table for {cpu} at {isa_class} and no default: the hand-written rules"

"""Make the measured rules tables (``python/onednn_convt/lowering/tables/*.json``) from tuning runs.

Each input is the ``--json`` file of one ``onednn-convt tune --retune`` run on one CPU at one
dispatch ISA (its ``isa`` field; the ``cpu`` field names the CPU, or give ``--cpu``). The
runs of one CPU and ISA class are merged into one table (a configuration tuned in two of
them is an error, unless ``--repeats``: then each candidate keeps its upper median time
over the runs, the higher of two, the middle of three; a
configuration tuned again after a change to the code, in ``--remeasured`` runs, chooses for
problems by its new records and for polyphase phases by its earlier ones, so that a re-tune
moves no phase (``--retuned-phases``: by its new ones for both, as the Zen3 and Zen5 tables
were made and benchmarked); a ``--supersede`` run is a ``--remeasured`` one made after a
candidate's own code changed, whose records drop the earlier ``--remeasured`` records of
the same configurations rather than merge with them; where the tuner timed a rival of the
rules' choice a second time, the record's ``confirm_us``, those two candidates count that
second timing)::

    onednn-convt tune --suite models --skip-slow --retune --json benchmarks/results/zen5/tune_models.json
    onednn-convt tune --suite broad-fit --retune --json benchmarks/results/zen5/tune_broad_fit.json
    onednn-convt tune --suite tiny --retune --json benchmarks/results/zen5/tune_tiny.json
    python benchmarks/make_rules.py benchmarks/results/zen5/tune_models.json \
        benchmarks/results/zen5/tune_broad_fit.json benchmarks/results/zen5/tune_tiny.json
    python benchmarks/make_rules.py --default        # the conservative table, from every CPU's

A CPU's table keeps each tuned configuration with two or more candidates (one is a guard's
route) as a measured layer: the suite layer's shape and each candidate's time over the
fastest's (candidates refused or wrong there are left out). A problem then runs as its
nearest measured layers ran fastest (:meth:`onednn_convt.lowering.rules_table.Table.choose`).

``--default`` writes ``default.json``, the rules of a CPU with no table of its own, per
class (op, dtype, data format, :func:`onednn_convt.problem.shape_class`): the library's own
op in the native dtype (ConvTranspose, ConvTransposeBackwardData,
ConvTransposeBackwardWeights; never "... in f32"), unless one other lowering beat it by at
least ``--margin`` on every CPU measured that has the class, took at most ``--row-limit``
times the library op's time on each of the class's layers there (a class won on the mean
can hold a layer where the rival is slower), and at least ``--min-cpus`` CPUs have it (a
lowering one CPU alone measured on a class stays that CPU's: a polyphase win on Zen5 3-D
layers ran 3.5x slower than the library's op on another 3-D layer of the same class). A
candidate's score in a class is the geometric mean, over the class's layers, of its time over the fastest candidate
measured on all of them (:func:`class_scores`). Tables measured under an
``ONEDNN_MAX_CPU_ISA`` cap do not count: a cap changes the instructions, not the machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from onednn_convt import guards
from onednn_convt.bench import suites
from onednn_convt.lowering import rules_table
from onednn_convt.lowering.base import POLYPHASE
from onednn_convt.lowering.rules import ISA_CLASSES, isa_class
from onednn_convt.problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD

OPS = {"fwd": FORWARD, "bwd_d": BACKWARD_DATA, "bwd_w": BACKWARD_WEIGHTS}
#: each op's own library op (the conservative default's choice)
LIBRARY_OP = {FORWARD: "ConvTranspose", BACKWARD_DATA: "ConvTransposeBackwardData",
              BACKWARD_WEIGHTS: "ConvTransposeBackwardWeights"}
TARGET = rules_table.DIRECTORY


def score(rows: list[dict[str, float]], name: str, among: set[str]) -> float:
    """Geometric mean over ``rows`` of ``name``'s time over the row's fastest of ``among``."""
    return math.exp(sum(math.log(r[name] / min(r[n] for n in among)) for r in rows) / len(rows))


def record_layer(record: dict[str, Any]) -> suites.Layer | None:
    """The layer a tuning record measured: the suite layer its key names, or for a layer of
    ``tune --layers-json`` (suite ``custom``) the shape the record carries; None if neither."""
    shape = record.get("layer")
    if record["key"].split("/")[0] == suites.CUSTOM and isinstance(shape, dict):
        return suites.Layer(name=record["key"].split("/")[1], n=shape["n"], ic=shape["ic"], oc=shape["oc"],
                            spatial=tuple(shape["spatial"]), kernel=tuple(shape["kernel"]), stride=shape["stride"],
                            pad=shape["pad"], groups=shape["groups"])
    return suite_layer(record["key"])


def suite_layer(key: str) -> suites.Layer | None:
    """The suite layer a record's key (``suite/layer/op/dtype/format``) names, or None."""
    suite, name = key.split("/")[:2]
    try:
        return next(x for x in suites.layers(suite) if x.name == name)
    except (ValueError, StopIteration):
        return None


def measured_layers(records: list[dict[str, Any]], remeasured: frozenset[str] = frozenset(),
                    replaced: bool = False) -> list[dict[str, Any]]:
    """The table's layers: each record with two or more candidates timed, its layer's shape
    (:func:`record_layer`) and each candidate's time over the fastest's (a record whose layer
    is in no suite and carries no shape is left out, saying so). A record of a configuration
    in ``remeasured`` (tuned again after a change to the code) chooses for problems only
    (``"phases": false``); ``replaced``: these are the records such runs replaced, kept to
    choose phases only (``"calls": false``; one that chooses no phases is left out). A
    re-tune moves no phase: the table's polyphase times were measured with the phases its
    earlier records chose (:meth:`onednn_convt.lowering.rules_table.Table.choose`)."""
    out = []
    for r in records:
        phases = record_chooses_phases(r) and r["key"] not in remeasured
        if replaced and not phases:
            continue
        times = record_times(r)
        if r.get("chosen") is None or len(times) < 2:
            continue
        lay = record_layer(r)
        if lay is None:
            print(f"{r['key']}: no such suite layer today; left out", file=sys.stderr)
            continue
        best = min(times.values())
        out.append({"layer": "/".join(r["key"].split("/")[:2]), "op": OPS[r["op"]], "dtype": r["dtype"],
                    "data_format": r["data_format"], "n": lay.n, "ic": lay.ic, "oc": lay.oc, "groups": lay.groups,
                    "src": list(lay.spatial), "kernel": list(lay.kernel), "strides": [lay.stride] * len(lay.kernel),
                    "ratios": {n: round(t / best, 4) for n, t in sorted(times.items())},
                    **({} if phases else {"phases": False}), **({"calls": False} if replaced else {})})
    return sorted(out, key=_layer_order)


def _layer_order(m: dict[str, Any]) -> tuple[str, str, str, str, bool]:
    """A table's order of its layers: by configuration, a replaced record after the one
    that replaced it."""
    return (m["op"], m["dtype"], m["data_format"], m["layer"], not m.get("calls", True))


def record_chooses_phases(record: dict[str, Any]) -> bool:
    """Whether a record's layer chooses the lowerings of polyphase phases (as
    :attr:`onednn_convt.lowering.rules_table.Measured.phases`): a suite layer does, a layer of
    ``tune --layers-json`` does not. The suites' polyphase times, and their bench figures,
    were measured with the phases the suite layers chose; a user's or a random layer, nearer
    to some phase, would choose it anew, untimed (:meth:`Table.choose
    <onednn_convt.lowering.rules_table.Table.choose>`)."""
    return record["key"].split("/")[0] != suites.CUSTOM


def record_times(record: dict[str, Any]) -> dict[str, float]:
    """A tuning record's time of each candidate: its ``times_us``, where the tuner timed a
    rival of the rules' choice a second time (``confirm_us``: the two alone, alternated) the
    second timing of those two, and where a later process timed them a third time
    (``recheck_us``, a record of ``tune`` without ``--retune``) that one. The latest timing
    decided the choice: on an AMD Zen4 a stall slowed ConvolutionBackwardWeights through every
    round of the first (1.64 ms; 0.61-0.79 ms in five other runs), and the second kept the
    rules' choice."""
    return {**(record.get("times_us") or {}), **(record.get("confirm_us") or {}), **(record.get("recheck_us") or {})}


def merge_repeat(kept: dict[str, Any], again: dict[str, Any]) -> None:
    """Merge a repeated tuning of one configuration into ``kept``: each candidate keeps the
    upper median of its times over the runs (:func:`upper_median`; a candidate timed once,
    that time). With two runs that is the higher time, so that a choice must be fast in both:
    on an AMD Zen5 KVM guest some kernels run in two speeds from one process to another,
    minutes apart, while others beside them hold theirs (HiFi-GAN's k4 s2 1-D NCX
    ConvTranspose, f32: 5.8 and 15.1 ms; the ConvolutionBackwardData of the same call 6.0 and
    6.2 ms): a table keeping the faster time chose it, and it ran at 0.41x PyTorch in the
    bench. With three, one run's stall no longer decides either way: on an AMD Zen4 one tuning
    pass timed the 32-group k4 s2 bf16 NXC ConvTranspose at 30.3 ms, six other processes at
    0.84-1.21 ms, and the table kept it as the slowest candidate."""
    runs = kept.setdefault("runs_us", {n: [t] for n, t in record_times(kept).items()})
    for name, t in record_times(again).items():
        runs.setdefault(name, []).append(t)
    kept["times_us"] = {n: upper_median(ts) for n, ts in runs.items()}
    kept.pop("confirm_us", None)  # in runs_us now
    kept.pop("recheck_us", None)


def upper_median(values: list[float]) -> float:
    """The median of ``values``, the higher middle one of an even count."""
    return sorted(values)[len(values) // 2]


def class_scores(layers: tuple[rules_table.Measured, ...]) -> dict[rules_table.Key, dict[str, float]]:
    """Per class (op, dtype, data format, today's shape class): each candidate measured on
    every layer of the class, scored by :func:`score` over them."""
    groups: dict[rules_table.Key, list[dict[str, float]]] = defaultdict(list)
    for m in layers:
        groups[(m.op, m.dtype, m.data_format, m.shape_class)].append(m.ratios)
    out = {}
    for key, rows in sorted(groups.items()):
        common = set.intersection(*(set(r) for r in rows))
        if common:
            out[key] = {n: round(score(rows, n, common), 4) for n in sorted(common)}
    return out


def class_worst(layers: tuple[rules_table.Measured, ...]) -> dict[rules_table.Key, dict[str, float]]:
    """Per class: each candidate's largest time over the library's own op's, on one layer of
    the class where both were timed."""
    out: dict[rules_table.Key, dict[str, float]] = defaultdict(dict)
    for m in layers:
        own = m.ratios.get(LIBRARY_OP[m.op])
        if own is None:
            continue
        worst = out[(m.op, m.dtype, m.data_format, m.shape_class)]
        for n, r in m.ratios.items():
            worst[n] = max(worst.get(n, 0.0), r / own)
    return dict(out)


def cannot_run(table: rules_table.Table, key: rules_table.Key, name: str) -> bool:
    """Whether ``name`` is no candidate of ``key``'s class on ``table``'s CPU: the polyphase
    lowering in bf16 runs natively only (:func:`onednn_convt.lowering.polyphase.applies`),
    so an ISA that computes bf16 in f32 offers "Polyphase in f32" instead."""
    return name == POLYPHASE and key[1] == "bf16" and table.isa not in BF16_NATIVE_CLASSES


#: the measured tables' ISA classes where oneDNN 3.2 runs bf16 natively (guards.BF16_NATIVE)
BF16_NATIVE_CLASSES = frozenset(c for isa, c in ISA_CLASSES.items() if isa in guards.BF16_NATIVE)


def default_rules(tables: list[rules_table.Table], margin: float, min_cpus: int = 2,
                  row_limit: float = 1.10) -> list[dict[str, Any]]:
    """The conservative default's rules (see the module docstring)."""
    scored = {t.name: class_scores(t.call_layers) for t in tables}
    worst = {t.name: class_worst(t.call_layers) for t in tables}
    keys = sorted(set().union(*scored.values())) if scored else []
    out = []
    for key in keys:
        op = key[0]
        own = LIBRARY_OP[op]
        having = [t for t in tables if own in scored[t.name].get(key, {})]
        choice, why = own, "the library's own op"
        if len(having) >= min_cpus and len(having) == sum(key in scored[t.name] for t in tables):
            # a rival is judged on the CPUs that can run it: a CPU where it is no candidate
            # (the native-bf16 polyphase where bf16 is computed in f32) has no say on it
            rivals = set.union(*(set(scored[t.name][key]) for t in having)) - {own}

            def judges(n: str) -> list[rules_table.Table]:
                return [t for t in having if not cannot_run(t, key, n)]

            winners = [n for n in sorted(rivals) if not n.endswith(" in f32") and len(judges(n)) >= min_cpus
                       and all(scored[t.name][key].get(n, math.inf) * margin <= scored[t.name][key][own]
                               and worst[t.name].get(key, {}).get(n, math.inf) <= row_limit for t in judges(n))]
            if winners:
                choice = min(winners, key=lambda n: max(scored[t.name][key][n] for t in judges(n)))
                having = judges(choice)
                why = "won by " + ", ".join(
                    f"{scored[t.name][key][own] / scored[t.name][key][choice]:.2f}x on {t.name}" for t in having)
        out.append({"op": key[0], "dtype": key[1], "data_format": key[2], "shape_class": key[3],
                    "lowering": choice, "why": why,
                    "scores": {t.name: scored[t.name].get(key, {}).get(choice, math.nan) for t in having}})
    return out


def write(path: Path, doc: dict[str, Any]) -> None:
    """The table as JSON: one line per provenance field, rule and measured layer."""
    lines = []
    for k, v in doc.items():
        if isinstance(v, list) and v and isinstance(v[0], dict):
            items = ",\n  ".join(json.dumps(x) for x in v)
            lines.append(f" {json.dumps(k)}: [\n  {items}\n ]")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="onednn-convt tune --json files")
    parser.add_argument("--out", type=Path, default=TARGET, help="the tables' directory")
    parser.add_argument("--cpu", help="the CPU's key (onednn_convt.cpu), where the runs do not name it")
    parser.add_argument("--cpu-name", help="its readable name, where the runs do not give it")
    parser.add_argument("--capped", action="store_true",
                        help="the runs were made under ONEDNN_MAX_CPU_ISA caps (kept out of the default)")
    parser.add_argument("--repeats", action="store_true",
                        help="runs may tune a configuration again: each candidate keeps its upper median "
                             "time over them (of two, the higher)")
    parser.add_argument("--remeasured", type=Path, action="append", default=[], metavar="RUN",
                        help="a run that tuned configurations again after a change to the code: its records "
                             "replace those of the same configurations in the other runs, which still choose "
                             "polyphase phases (repeat for more; several of them merge as --repeats)")
    parser.add_argument("--supersede", type=Path, action="append", default=[], metavar="RUN",
                        help="a --remeasured run made after a candidate's own code changed: its records also "
                             "drop those of the same configurations in the earlier --remeasured runs, which "
                             "timed that candidate as it was (repeat for more; they merge as --repeats)")
    parser.add_argument("--retuned-phases", action="store_true",
                        help="the --remeasured runs' records choose polyphase phases too, and the records they "
                             "replace are dropped (as the Zen3 and Zen5 tables were made, and benchmarked: there "
                             "a re-tune moves phases)")
    parser.add_argument("--note", default="", help="a sentence kept in the table's provenance")
    parser.add_argument("--date", default=datetime.date.today().isoformat(),
                        help="when the runs were made (--default: when its rules were drawn from the tables); "
                             "a table's files are remade byte for byte only with the date they were made with")
    parser.add_argument("--default", action="store_true", help="write default.json from the tables in --out")
    parser.add_argument("--margin", type=float, default=1.10, help="--default: how much faster a rival must be")
    parser.add_argument("--row-limit", type=float, default=1.10,
                        help="--default: the most a rival may take over the library op's time on any measured layer")
    parser.add_argument("--min-cpus", type=int, default=2,
                        help="--default: how many CPUs must have measured a class before a rival may win it")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.default:
        tables = [rules_table.read(p) for p in sorted(args.out.glob("*.json")) if p.stem != rules_table.DEFAULT_NAME]
        native = [t for t in tables if not t.provenance.get("capped")]
        doc = {"format": rules_table.FORMAT, "cpu": rules_table.DEFAULT_NAME, "isa": "any",
               "date": args.date, "margin": args.margin, "min_cpus": args.min_cpus,
               "made_from": [t.name for t in native],
               "row_limit": args.row_limit,
               "note": (f"the library's own op, unless another lowering won by {args.margin:.2f}x or more on "
                        f"every CPU measured and took at most {args.row_limit:.2f}x its time on every layer "
                        f"measured, at least {args.min_cpus} CPUs of: "
                        f"{', '.join(t.provenance.get('cpu_name', t.cpu) for t in native)}"),
               "rules": default_rules(native, args.margin, args.min_cpus, args.row_limit)}
        write(args.out / f"{rules_table.DEFAULT_NAME}.json", doc)
        print(f"wrote {args.out / 'default.json'}: {len(doc['rules'])} rules from {len(native)} tables")
        return 0
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    args.remeasured = [*args.remeasured, *args.supersede]
    runs = [(path, json.loads(path.read_text(encoding="utf-8"))) for path in [*args.runs, *args.remeasured]]
    remeasured = {r["key"] for path, run in runs[len(args.runs):] for r in run["records"]}
    superseded = {r["key"] for path, run in runs if path in args.supersede for r in run["records"]}
    for path, run in runs:  # earlier re-tunes of those configurations timed the old code
        if path in args.remeasured and path not in args.supersede:
            run["records"] = [r for r in run["records"] if r["key"] not in superseded]
    for path, run in runs:
        replaced = []
        if path not in args.remeasured:  # the records they replace choose phases alone
            replaced = [] if args.retuned_phases else [r for r in run["records"] if r["key"] in remeasured]
            run["records"] = [r for r in run["records"] if r["key"] not in remeasured]
        cls = isa_class(run["isa"])
        cpu = run.get("cpu", {}).get("microarchitecture") or args.cpu
        if cls is None or not cpu:
            print(f"{path}: {'ISA ' + run['isa'] + ' has no class' if cls is None else 'no CPU: give --cpu'}; skipped",
                  file=sys.stderr)
            if not cpu:
                return 2
            continue
        group = groups.setdefault((cpu, cls), {"records": [], "replaced": [], "sources": [], "contexts": set(),
                                               "cpu_name": run.get("cpu", {}).get("name") or args.cpu_name or cpu})
        known = {r["key"]: r for r in group["records"]}
        again = sorted(set(known).intersection(r["key"] for r in run["records"]))
        if again and not (args.repeats or path in args.remeasured):
            print(f"{path}: {again[0]} was tuned in another run of {cpu} at {cls} too; give each configuration "
                  "once, or merge repeated runs with --repeats", file=sys.stderr)
            return 2
        for kept, new in ((group["records"], run["records"]), (group["replaced"], replaced)):
            earlier = {r["key"]: r for r in kept}
            for r in new:
                if r["key"] in earlier:
                    merge_repeat(earlier[r["key"]], r)
                else:
                    kept.append(r)
        group["sources"].append(path.as_posix())
        group["contexts"].add(run["context"])
    for (cpu, cls), group in sorted(groups.items()):
        contexts = sorted(group["contexts"])
        onednn = {c.split(";")[0].removeprefix("oneDNN ") for c in contexts}
        threads = {c.split("threads ")[1].split(";")[0] for c in contexts}
        suite_names = sorted({r["key"].split("/")[0] for r in group["records"]})
        doc = {"format": rules_table.FORMAT, "cpu": cpu, "cpu_name": group["cpu_name"], "isa": cls,
               "capped": args.capped, "onednn": "/".join(sorted(onednn)), "threads": "/".join(sorted(threads)),
               "date": args.date, "suites": suite_names, "sources": group["sources"],
               "note": args.note,
               "layers": sorted(measured_layers(group["records"], frozenset() if args.retuned_phases else
                                                frozenset(remeasured))
                                + measured_layers(group["replaced"], replaced=True), key=_layer_order)}
        name = f"{cpu}-{cls}"
        write(args.out / f"{name}.json", doc)
        print(f"wrote {args.out / (name + '.json')}: {len(doc['layers'])} measured configurations")
    return 0


if __name__ == "__main__":
    sys.exit(main())

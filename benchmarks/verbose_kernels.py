"""Which oneDNN kernels and reorders one steady-state call runs, per benchmark configuration.

Usage::

    python benchmarks/verbose_kernels.py models/unet/bwd_d/f32/NXC [more keys...]
    python benchmarks/verbose_kernels.py --suite models --layers depthwise --dtypes f32
    python benchmarks/verbose_kernels.py models/unet/bwd_d/f32/NCX --lowering Convolution
    python benchmarks/verbose_kernels.py models/unet/bwd_d/f32/NCX --torch
    python benchmarks/verbose_kernels.py custom/up1/fwd/f32/NXC --layers-json my_layers.json

It sets ONEDNN_VERBOSE=1 before oneDNN loads, runs each configuration twice (the first call
compiles), then five times more, and prints the ``exec`` lines of one call with each
primitive's median time over the five: primitive kind, implementation, memory formats and
milliseconds. ``reorder`` lines are layout conversions
that the compiled partition does on every call. ``--lowering NAME`` runs each configuration
as that candidate (one of ``onednn_convt.lowering.candidates``) instead of the rules' choice:
the kernels of the fastest candidate, where a layer is slow whatever runs it. ``--torch``
adds the kernels of PyTorch's call of the same configuration (its bundled oneDNN prints the
same lines).

``--bench RUN.json --below 0.95`` names the kernels of every row of a bench run slower than
that ratio to PyTorch: each configuration runs as the row ran (an autotuned row as its
tuned candidate; a rules row as the rules choose today), and a table at the end gives, per
row, the kernel that took the most time (summed over a polyphase call's phases), and the
time in reorders::

    python benchmarks/verbose_kernels.py --bench benchmarks/results/zen4/holdout-autotune.json --below 0.95
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional


def _exec_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ",exec," in ln and ln.startswith("onednn_verbose")]


def _captured(fn: Callable[[], Any]) -> str:
    """What ``fn`` writes to the process's stdout (file descriptor 1), as text."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return tmp.read().decode(errors="replace")


#: the candidate every op object made after :func:`force_lowerings` runs where it can
_forced: dict[str, Optional[str]] = {"name": None}


def force_lowerings() -> dict[str, Optional[str]]:
    """Make :func:`onednn_convt.lowering.rule` answer the returned dict's ``"name"`` (where
    set) where that candidate can run the problem, from now on; the parts of a plan (the
    stride-1 phases of a polyphase one) keep the rules' choice. ``benchmarks/choices_ab.py``
    forces so too."""
    from onednn_convt import lowering

    rules_choice = lowering.rule

    def rule(problem: Any, *, native: bool = False, phase: bool = False) -> str:
        chosen = _forced["name"]
        if chosen and not phase and chosen in lowering.candidates(problem, native=native):
            return chosen
        return rules_choice(problem, native=native, phase=phase)

    lowering.rule = rule  # type: ignore[assignment]  # every op object made below asks it
    return _forced


@dataclass
class Kernels:
    """The primitives one steady-state call ran: ``(kind, implementation, details, ms)``,
    the details being the propagation kind, memory formats and shape."""

    lines: list[tuple[str, str, str, float]]

    @property
    def limiting(self) -> tuple[str, str, int, float]:
        """The kernel other than a reorder that took the most time, summed over its calls (a
        polyphase call runs one per phase): ``(kind, implementation, calls, ms)``."""
        compute = [ln for ln in self.lines if ln[0] != "reorder"] or self.lines
        groups: dict[tuple[str, str], list[float]] = {}
        for kind, impl, _, ms in compute:
            groups.setdefault((kind, impl), []).append(ms)
        (kind, impl), times = max(groups.items(), key=lambda kv: sum(kv[1]))
        return kind, impl, len(times), sum(times)

    @property
    def reorder_ms(self) -> float:
        """The milliseconds of the call's reorders (layout conversions)."""
        return sum(ln[3] for ln in self.lines if ln[0] == "reorder")


#: steady-state calls whose primitives are timed (each primitive's median time is kept)
CALLS = 5


def _repeat(fn: Callable[[], Any]) -> None:
    for _ in range(CALLS):
        fn()


def _run(cfg: Any, name: Optional[str]) -> tuple[str, Optional[Kernels]]:
    """Run ``cfg`` as candidate ``name`` (None: the rules' choice); what it ran as, and its
    kernels (None where ``name`` cannot run it)."""
    _forced["name"] = name
    case = cfg.build()
    op, inputs = case.op, case.args
    _captured(lambda: (op(*inputs), op(*inputs)))  # compile, warm up
    ran = str(op.lowering)
    got = getattr(op.last_plan.lowering, "name", "")  # the candidate's name ("... in f32": emulated)
    if name and name.removesuffix(" in f32") != got and not ran.startswith(name):
        return ran, None
    return ran, _kernels(_captured(lambda: _repeat(lambda: op(*inputs))), CALLS)  # noqa: B023 - called here


def _kernels(text: str, calls: int = 1) -> Kernels:
    """The ``exec`` lines of oneDNN's verbose output: 3.2's (``onednn_verbose,exec,cpu,...``)
    and the newer form PyTorch's bundled oneDNN prints (``onednn_verbose,v1,primitive,exec,cpu,...``).
    ``text`` holds ``calls`` calls of the same primitives: each one's median time is kept (the
    last call's lines where the calls ran different primitives)."""
    lines = []
    for ln in _exec_lines(text):
        f = ln.split(",")
        i = f.index("exec")  # then cpu,<kind>,<impl>,<prop>,<mem formats>,<attrs>,<alg>,<shape>,<ms>
        lines.append((f[i + 2], f[i + 3], " | ".join(f[i + 4:i + 6] + f[i + 8:-1]), float(f[-1])))
    per_call = len(lines) // calls
    runs = [lines[c * per_call:(c + 1) * per_call] for c in range(calls)]
    if calls == 1 or per_call * calls != len(lines) or any([ln[:3] for ln in r] != [ln[:3] for ln in runs[0]] for r in runs):
        return Kernels(lines[-per_call:] if per_call else lines)
    return Kernels([(*ln[:3], statistics.median(r[j][3] for r in runs)) for j, ln in enumerate(runs[0])])


def _torch_kernels(cfg: Any) -> Optional[Kernels]:
    """The oneDNN kernels PyTorch's call of ``cfg`` runs (its bundled oneDNN), or None
    without PyTorch (or where it runs no oneDNN primitive: its own kernels)."""
    from onednn_convt.bench import peers

    call = peers.torch_call(cfg.build())
    if call is None:
        return None
    _captured(lambda: (call(), call()))
    k = _kernels(_captured(lambda: _repeat(call)), CALLS)
    return k if k.lines else None


def _show(k: Kernels) -> None:
    """Print ``k``'s primitives, one line each."""
    for kind, impl, details, ms in k.lines:
        print(f"  {kind} | {impl} | {details} | {ms:.3f}")


def _show_torch(cfg: Any) -> Optional[Kernels]:
    """Print the kernels of PyTorch's call of ``cfg`` (:func:`_torch_kernels`), and return them."""
    theirs = _torch_kernels(cfg)
    print("  PyTorch's:" + ("" if theirs else " no oneDNN primitive (its own kernels) or no PyTorch"))
    if theirs:
        _show(theirs)
    return theirs


def _limiting(k: Kernels) -> str:
    """``k``'s limiting kernel and its time, as two table cells."""
    kind, impl, calls, ms = k.limiting
    return f"{calls} x " * (calls > 1) + f"{kind} `{impl}` | {ms:.3g}"


def _tuned_name(lowering_text: str) -> Optional[str]:
    """The candidate an autotuned bench row ran (``"... (tuned: NAME)"``); None for a rules row."""
    mark = " (tuned: "
    return lowering_text[lowering_text.index(mark) + len(mark):-1] if mark in lowering_text else None


def _bench_rows(path: str, below: float) -> list[dict[str, Any]]:
    with open(path) as f:
        results = json.load(f)["results"]
    rows = [r for r in results if r.get("vs_torch") and r["vs_torch"] < below]
    return sorted(rows, key=lambda r: r["vs_torch"])


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("ONEDNN_VERBOSE", "1")  # before oneDNN (ours, and PyTorch's) loads
    from onednn_convt.bench import suites

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("keys", nargs="*", help="configuration keys suite/layer/op/dtype/format")
    p.add_argument("--suite", default=None)
    p.add_argument("--layers", default=None)
    p.add_argument("--ops", default=",".join(suites.OPS))
    p.add_argument("--dtypes", default="f32")
    p.add_argument("--formats", default=",".join(suites.FORMATS))
    p.add_argument("--lowering", default=None, help="run as this candidate, not the rules' choice")
    p.add_argument("--torch", action="store_true", help="and the kernels of PyTorch's call (its bundled oneDNN)")
    p.add_argument("--bench", default=None, help="a bench run's JSON: name the kernels of its slow rows")
    p.add_argument("--below", type=float, default=0.95, help="with --bench: rows below this speed ratio")
    p.add_argument("--layers-json", default=None,
                   help="the layers of keys custom/LAYER/...: a file of onednn-convt tune --layers-json")
    args = p.parse_args(argv)
    force_lowerings()

    def config(key: str) -> Any:
        suite, layer, op, dt, fmt = key.split("/")
        if suite == suites.CUSTOM:
            from onednn_convt.tune import layers_from_json

            mine = [x for x in layers_from_json(args.layers_json) if x.name == layer] if args.layers_json else []
            if not mine:
                p.error(f"{key}: give the file of its layer with --layers-json")
            return suites.Config(suite, mine[0], op, dt, fmt)
        return suites.configs(suite, [op], [dt], [fmt], layer_names=[layer])[0]

    if args.bench:
        summary = []
        for row in _bench_rows(args.bench, args.below):
            name = _tuned_name(row["lowering"])
            cfg = config(row["key"])
            ran, kernels = _run(cfg, name)
            print(f"== {row['key']} ({cfg.layer.describe()}): {row['vs_torch']:.2f}x PyTorch in the run "
                  f"({row['median_ms']:.3g} ms against {row['torch_ms']:.3g}), it ran {row['lowering']}; here {ran}")
            if kernels is None:
                print("  (cannot run it as that candidate here)")
                continue
            _show(kernels)
            summary.append((row, ran, kernels, _show_torch(cfg)))
        print("\n| row | speed | ours ms | PyTorch ms | ran as | limiting kernel | its ms | reorders ms "
              "| PyTorch's limiting kernel | its ms | its reorders ms |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for row, ran, k, theirs in summary:
            print(f"| {row['key']} | {row['vs_torch']:.2f} | {row['median_ms']:.3g} | {row['torch_ms']:.3g} | {ran} "
                  f"| {_limiting(k)} | {k.reorder_ms:.3g} "
                  f"| {f'{_limiting(theirs)} | {theirs.reorder_ms:.3g}' if theirs else '- | - | -'} |")
        return 0

    configs = []
    if args.suite:
        configs += suites.configs(args.suite, args.ops.split(","), args.dtypes.split(","),
                                  args.formats.split(","), layer_names=args.layers.split(",") if args.layers else None)
    configs += [config(key) for key in args.keys]
    if not configs:
        p.error("no configuration given")

    for cfg in configs:
        ran, kernels = _run(cfg, args.lowering)
        if kernels is None:
            print(f"== {cfg.key}: --lowering {args.lowering!r} cannot run it (it ran as {ran})")
            continue
        print(f"== {cfg.key} ({cfg.layer.describe()}), lowering {ran}")
        _show(kernels)
        if args.torch:
            _show_torch(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())

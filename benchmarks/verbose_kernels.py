"""Which oneDNN kernels and reorders one steady-state call runs, per benchmark configuration.

Usage::

    python benchmarks/verbose_kernels.py models/unet/bwd_d/f32/NXC [more keys...]
    python benchmarks/verbose_kernels.py --suite models --layers depthwise --dtypes f32
    python benchmarks/verbose_kernels.py models/unet/bwd_d/f32/NCX --lowering Convolution

It sets ONEDNN_VERBOSE=1 before oneDNN loads, runs each configuration three times (the
first call compiles) and prints the ``exec`` lines of the last call: primitive kind,
implementation, memory formats and milliseconds. ``reorder`` lines are layout conversions
that the compiled partition does on every call. ``--lowering NAME`` runs each configuration
as that candidate (one of ``onednn_convt.lowering.candidates``) instead of the rules' choice:
the kernels of the fastest candidate, where a layer is slow whatever runs it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any, Callable

os.environ.setdefault("ONEDNN_VERBOSE", "1")


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


def main(argv: list[str] | None = None) -> int:
    from onednn_convt.bench import suites

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("keys", nargs="*", help="configuration keys suite/layer/op/dtype/format")
    p.add_argument("--suite", default=None)
    p.add_argument("--layers", default=None)
    p.add_argument("--ops", default=",".join(suites.OPS))
    p.add_argument("--dtypes", default="f32")
    p.add_argument("--formats", default=",".join(suites.FORMATS))
    p.add_argument("--lowering", default=None, help="run as this candidate, not the rules' choice")
    args = p.parse_args(argv)
    if args.lowering:
        from onednn_convt import lowering

        chosen, rules_choice = args.lowering, lowering.rule

        def rule(problem: Any, *, native: bool = False) -> str:
            # the named candidate where it can run the problem; the parts of a plan (the
            # stride-1 phases of a polyphase one) keep the rules' choice
            if chosen in lowering.candidates(problem, native=native):
                return chosen
            return rules_choice(problem, native=native)

        lowering.rule = rule  # type: ignore[assignment]  # every op object made below asks it

    configs = []
    if args.suite:
        configs += suites.configs(args.suite, args.ops.split(","), args.dtypes.split(","),
                                  args.formats.split(","), layer_names=args.layers.split(",") if args.layers else None)
    for key in args.keys:
        suite, layer, op, dt, fmt = key.split("/")
        configs += [c for c in suites.configs(suite, [op], [dt], [fmt], layer_names=[layer])]
    if not configs:
        p.error("no configuration given")

    for cfg in configs:
        case = cfg.build()
        op, inputs = case.op, case.args
        _captured(lambda: (op(*inputs), op(*inputs)))  # noqa: B023 - compile, warm up
        if args.lowering and not str(op.lowering).startswith(args.lowering):
            print(f"== {cfg.key}: --lowering {args.lowering!r} cannot run it (it ran as {op.lowering})")
            continue
        text = _captured(lambda: op(*inputs))  # noqa: B023 - called right here
        print(f"== {cfg.key} ({cfg.layer.describe()}), lowering {case.op.lowering}")
        for ln in _exec_lines(text):
            f = ln.split(",")
            # onednn_verbose,exec,cpu,<kind>,<impl>,<prop>,<mem formats>,<attrs>,<alg>,<shape>,<ms>
            print("  " + " | ".join(f[3:7] + f[9:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run oneDNN's ConvTranspose ops from the command line: check them against oneDNN's own
graph test cases, see what runs on this machine, time them and tune them."""

# Each subcommand lives in a module of its own, with ``add_arguments(parser)`` and
# ``run(args) -> int``, imported only when that subcommand runs (``build_parser`` imports
# them all for the docs' CLI reference).

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Container, Sequence
from typing import NamedTuple


class Subcommand(NamedTuple):
    """A subcommand: the module that adds its options and runs it, its one-line help in
    ``onednn-convt --help`` and its description in ``onednn-convt NAME --help``."""

    module: str
    help: str
    description: str


SUBCOMMANDS = {
    "conformance": Subcommand(
        "onednn_convt.conformance.cli",
        "run oneDNN graph JSON cases and benchdnn-style harness files (default: the bundled suite)",
        "Run oneDNN graph JSON cases and harness files through onednn_convt and judge each "
        "against the NumPy reference.",
    ),
    "bench": Subcommand(
        "onednn_convt.bench.cli",
        "time the ops against the native loop, PyTorch and the NumPy reference",
        "Time the ops on a suite of layers against the native loop, PyTorch (if installed) and "
        "the NumPy reference; write the results as CSV, JSON, Markdown and (with matplotlib) a "
        "PNG chart.",
    ),
    "demo": Subcommand(
        "onednn_convt.demo",
        "run each op in each dtype on a small DCGAN-like layer, checked against the reference",
        "Run ConvTranspose, ConvTransposeBackwardData and ConvTransposeBackwardWeights in f32, "
        "bf16 and f16 on a DCGAN-like layer (N=4, 64 -> 32 channels, 8x8 -> 16x16, kernel 4, "
        "stride 2, NCX/IOX); print each result's error against the NumPy reference, the "
        "tolerance, whether oneDNN has a native kernel for the dtype here, and the median time "
        "of a call. Exit status 1 if any result is outside its tolerance.",
    ),
    "info": Subcommand(
        "onednn_convt.info",
        "package and oneDNN versions, CPU ISA, threads, dtype support, guards, rules, autotuning",
        "Print, as JSON: this package's version; oneDNN's version, commit and library file; the "
        "CPU ISA oneDNN dispatches to (ONEDNN_MAX_CPU_ISA honoured) and the thread count; per op "
        "and dtype, whether oneDNN has a native kernel here or the op is emulated through f32; "
        "the guards active on this ISA; which lowering rules are in use; whether autotuning is "
        "on and where its cache file is; the compiled-partition cache counters.",
    ),
    "tune": Subcommand(
        "onednn_convt.tune",
        "autotune a bench suite or your own layers ahead of time (cached across processes)",
        "Autotune a bench suite, or layers of your own (--layers-json), ahead of time: each "
        "configuration (layer x op x dtype x data format) is called once with autotuning on, so "
        "that its choice lands in the cache file that later processes read. Prints, per "
        "configuration, the rules' lowering, the tuned one, its speed-up and what tuning cost.",
    ),
}


class HelpFormatter(argparse.HelpFormatter):
    """Fills each paragraph of a description or epilog to the terminal's width, and keeps a
    paragraph with indented lines (a list of examples) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.strip("\n").split("\n\n"):
            lines = para.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(textwrap.fill(" ".join(lines), width, initial_indent=indent,
                                                subsequent_indent=indent))
        return "\n\n".join(paragraphs)


def _version() -> str:
    from . import native
    from ._version import __version__

    return f"onednn-convt {__version__} (oneDNN {native.onednn_version()})"


def build_parser(load: Container[str | None] | None = None) -> argparse.ArgumentParser:
    """The ``onednn-convt`` argument parser.

    Args:
        load: the subcommands whose options are added (their modules are imported); None:
            every subcommand's.
    """
    parser = argparse.ArgumentParser(
        prog="onednn-convt",
        description=__doc__,
        epilog="Run 'onednn-convt COMMAND --help' for a command's options.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the package's and oneDNN's versions and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.description,
                           formatter_class=HelpFormatter)
        if load is None or name in load:  # import only the module that runs
            module = importlib.import_module(command.module)
            module.add_arguments(p)
            p.set_defaults(module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and of ``python -m onednn_convt``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser({chosen})
    given_dashes = next((a for a in argv if a.startswith("--") and a.endswith("=--")), None)
    if given_dashes:  # argparse turns the value '--' into [] and calls no type (CPython's)
        parser.error(f"argument {given_dashes[:-3]}: expected a value, got '--'")
    args = parser.parse_args(argv)
    return int(args.module.run(args))


if __name__ == "__main__":
    sys.exit(main())

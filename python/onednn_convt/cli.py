"""The ``onednn-convt`` command.

Subcommands live in their own modules: each has ``add_arguments(parser)`` and
``run(args) -> int`` and is imported only when its subcommand runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


import importlib

#: subcommand -> (module, help)
SUBCOMMANDS = {
    "conformance": ("onednn_convt.conformance.cli", "run oneDNN graph JSON cases and harness files"),
    "bench": ("onednn_convt.bench.cli", "time the ops against the native loop, PyTorch and the reference"),
    "demo": ("onednn_convt.demo", "run each op in each dtype on a DCGAN layer, checked"),
    "info": ("onednn_convt.info", "oneDNN version, CPU, threads and dtype support"),
    "tune": ("onednn_convt.tune", "autotune a suite or your layers ahead of time (cached across processes)"),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the console script and of ``python -m onednn_convt``."""
    parser = argparse.ArgumentParser(prog="onednn-convt", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if name == chosen:  # import only the module that runs
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(module=module)
    args = parser.parse_args(argv)
    return int(args.module.run(args))


if __name__ == "__main__":
    sys.exit(main())

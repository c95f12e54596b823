"""`onednn-convt` with the bias rule of before 2026-11-26 (``old``: a forward's bias in the
library op unless a guard keeps it apart) or as shipped (``new``), for side-by-side runs:

    python benchmarks/bias_ab.py old bench --suite models,tiny --ops fwd --bias --name bias_old
    python benchmarks/bias_ab.py new bench --suite models,tiny --ops fwd --bias --name bias_new

See benchmarks/NOTES.md ("A bias apart from the library op")."""

from __future__ import annotations

import sys
from typing import Optional

from onednn_convt.cli import main
from onednn_convt.lowering import forward
from onednn_convt.problem import Problem


def old_rule(p: Problem) -> Optional[str]:
    """The bias in the library op, except where the strided-epilogue guard kept it apart."""
    return forward.STAGE if forward.bias_guarded(p) else None


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("old", "new"):
        sys.exit("usage: bias_ab.py old|new <onednn-convt arguments>")
    if sys.argv[1] == "old":
        forward.bias_apart = old_rule
    sys.exit(main(sys.argv[2:]))

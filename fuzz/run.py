"""Command line of the fuzzers: ``python fuzz/run.py NAME [--seed S] [--trials N] [--trial I]``.

See :mod:`harness` (this folder) for how trials run, and README.md here for each fuzzer."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

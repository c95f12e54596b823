"""The README's Python examples run as written, in a fresh interpreter (as a reader would
paste them: ``import onednn_convt as oc`` and nothing else imported before)."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_python_examples_run_in_a_fresh_interpreter():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) >= 2  # the quick start and the constant weights example
    if importlib.util.find_spec("torch") is None:  # the torch examples need torch
        blocks = [b for b in blocks if "import torch" not in b]
    code = "\n".join(blocks) + "\nimport numpy as np\nassert np.allclose(dst, expected, rtol=1e-4, atol=1e-4)\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr

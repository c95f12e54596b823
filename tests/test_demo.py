"""``onednn-convt demo``: each op in each dtype checked against the reference, and a clear
"not run" (exit 1) where the memory limit refuses the layer."""

from __future__ import annotations

from onednn_convt import demo, limits
from onednn_convt.cli import main


def test_demo_passes_every_op_and_dtype(capsys) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("9 passed, 0 failed")
    assert out.count("e-") >= 9 and "FAILED" not in out  # an error figure per row


def test_demo_under_a_tiny_memory_limit_says_not_run(monkeypatch, capsys) -> None:
    monkeypatch.setattr(limits, "_limit", 1024)
    assert demo.run() == 1
    out = capsys.readouterr().out
    assert out.rstrip().endswith("0 passed, 0 failed, 9 not run")
    assert out.count("not run: ") == 9 and "over the limit of 1.0 KiB" in out

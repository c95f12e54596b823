"""``pytest --conformance PATH``: cases as pytest items; inert without the option."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from test_conformance_harness import BASE

PLUGIN = "onednn_convt.conformance.pytest_plugin"

BROKEN_CONFTEST = """
import onednn_convt

class OffByOne(onednn_convt.ConvTranspose):
    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        out[(0,) * out.ndim] += 1
        return out

onednn_convt.ConvTranspose = OffByOne
"""


def pytest_run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in a clean directory (no project config), the plugin loaded explicitly."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_cases_become_items_named_by_their_line(tmp_path: Path) -> None:
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    (tmp_path / "harness_x").write_text(
        "--reset --case=fwd.json\n"
        "--reset --op-attrs=0:auto_pad:VALID,0:auto_pad:SAME_UPPER --case=fwd.json\n"
        "--reset --case=fwd.json\n"
        "--reset --op-attrs=0:no_such:1 --case=fwd.json\n"
    )
    (tmp_path / "test_unrelated.py").write_text("def test_a():\n    pass\n")
    junit = tmp_path / "junit.xml"
    proc = pytest_run(tmp_path, "--conformance", "harness_x", "-v", f"--junitxml={junit}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "harness_x::--reset --case=fwd.json PASSED" in out
    assert "harness_x::--reset --op-attrs=0:auto_pad:SAME_UPPER --case=fwd.json PASSED" in out
    assert (
        "harness_x::--reset --case=fwd.json (line 3) PASSED" in out
    )  # a repeated line stays distinct
    assert "INVALID: --op-attrs: no attribute 'no_such' in op 0" in out
    assert "test_unrelated" not in out  # only the cases: no test paths were given
    assert out.splitlines()[-1].startswith("=") and "1 failed, 4 passed" in out.splitlines()[-1]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "5" and suite.get("failures") == "1"


def test_failures_show_the_repro_command(tmp_path: Path) -> None:
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    (tmp_path / "conftest.py").write_text(BROKEN_CONFTEST)
    proc = pytest_run(tmp_path, "--conformance", "fwd.json", "-q")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED: 1 of 98 elements differ" in proc.stdout
    assert "repro: onednn-convt conformance --cases-root" in proc.stdout
    assert "1 failed" in proc.stdout.splitlines()[-1]


def test_inert_without_the_option_and_additive_with_test_paths(tmp_path: Path) -> None:
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    (tmp_path / "harness_y").write_text("--reset --case=fwd.json\n")
    (tmp_path / "test_unrelated.py").write_text("def test_a():\n    pass\n")
    proc = pytest_run(tmp_path, "-q")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("1 passed"), proc.stdout
    proc = pytest_run(tmp_path, "--conformance", "harness_y", "test_unrelated.py", "-q")
    assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("2 passed"), proc.stdout
    proc = pytest_run(tmp_path, "--conformance", "missing_dir", "-q")
    assert proc.returncode == 4 and "no such file or directory" in proc.stderr

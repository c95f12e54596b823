"""Shared test setup: say what oneDNN actually ran, so CI logs show it."""

from __future__ import annotations

import os

# oneDNN's OpenMP threads spin for a while after each op and starve the BLAS threads that
# the NumPy reference uses (the conformance cases ran 6x slower). Tests time nothing, so
# idle OpenMP threads sleep here. Must be set before libgomp loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import onednn_convt  # noqa: E402
import pytest  # noqa: E402


def pytest_report_header(config):  # noqa: ARG001 - pytest hook signature
    i = onednn_convt.info()
    return [
        f"onednn_convt: oneDNN {i['onednn_version']} ({i['onednn_commit'][:12]}) from {i['libdnnl']}",
        f"onednn_convt: cpu_isa={i['cpu_isa']} runtime={i['cpu_runtime']} threads={i['threads']} "
        f"dtypes={ {op: d for op, d in i['dtypes'].items()} }",
    ]


def pytest_terminal_summary(terminalreporter):
    """Which CPU ISA levels the ISA matrix (test_isa_matrix.py) covered in this run."""
    from isa_scan import COVERAGE, COVERAGE_FILES

    if COVERAGE or COVERAGE_FILES:
        terminalreporter.section("CPU ISA levels covered")
        for level, ran, native, failed in COVERAGE:
            terminalreporter.write_line(f"{level}: {ran} random problems ({native} on native kernels), {failed} failed")
        for level, summary in COVERAGE_FILES:
            terminalreporter.write_line(f"{level}: differential test files: {summary}")


@pytest.fixture
def hand_rules(monkeypatch):
    """The hand-written rules alone (rules.fallback), without the measured table (nor the
    measured rules of the lifted form and the depth taps, onednn_convt.lowering.lifted and
    onednn_convt.lowering.depth_taps).

    For the modules that check those rules' routes by name (which lowering a guard or a
    fallback rule sends a problem to) as well as their results: the table's choice for a
    problem class differs per ISA class and is re-generated from tuning runs. Every
    lowering the table may pick is checked against the reference by
    tests/test_lowering_candidates.py, and the table itself by tests/test_rules_table.py."""
    from onednn_convt import lowering
    from onednn_convt.lowering import depth_taps, rules_table

    for module in lowering.MEASURED_APART.values():  # measured too: the lifted form's and depth taps' rules
        monkeypatch.setattr(module, "MEASURED_ON", {})
        monkeypatch.setattr(module, "ELSEWHERE", None)
    monkeypatch.setattr(depth_taps, "CHANNELS_LAST_ON", {})  # and the channels-last depth taps'
    monkeypatch.setattr(rules_table, "TABLES", {})
    monkeypatch.setattr(rules_table, "DEFAULT", None)
    monkeypatch.setattr(rules_table, "_use_shipped_default", False)

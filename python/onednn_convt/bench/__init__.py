"""Benchmark harness of ``onednn-convt bench`` (issue 4).

Modules: :mod:`.suites` (what runs), :mod:`.timing` (how it is timed, memory),
:mod:`.peers` (native loop, PyTorch, NumPy reference), :mod:`.peak` (the machine's
matmul peak), :mod:`.runner` (one configuration), :mod:`.report` (table, CSV, JSON,
chart, targets, comparison) and :mod:`.cli` (the subcommand).
"""

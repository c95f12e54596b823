"""pytest plugin: ``pytest --conformance PATH`` runs conformance cases as pytest items.

Registered through the ``pytest11`` entry point, so it is loaded by every pytest run in an
environment where the package is installed; it does nothing unless ``--conformance`` is
given (and then imports the package only when collecting).

- ``--conformance PATH`` (repeatable): JSON files, harness files or directories, as for
  ``onednn-convt conformance``; ``--conformance`` with no value (or ``bundled``) is the
  bundled suite. Each case becomes one item named by its harness line, under a node for
  its file, so ``-k``, ``--junitxml`` and pytest-xdist's ``-n`` work unchanged.
- ``--conformance-cases-root DIR``, ``--conformance-strict-dtypes``,
  ``--conformance-fail-on-unsupported``: as the CLI's ``--cases-root``,
  ``--strict-dtypes`` and ``--fail-on-unsupported``.

FAILED, INVALID and ERROR cases fail (the report shows the message and the repro command);
SKIPPED and UNSUPPORTED cases are skipped. When ``--conformance`` is given and no test
paths are, only the conformance cases are collected (not the project's ``testpaths``);
otherwise the cases are collected along with the tests named.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import pytest

BUNDLED = "bundled"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``--conformance`` options."""
    group = parser.getgroup("onednn-convt conformance")
    group.addoption(
        "--conformance",
        action="append",
        nargs="?",
        const=BUNDLED,
        default=[],
        metavar="PATH",
        help="run oneDNN graph JSON cases / harness files (a file or directory; no value: the bundled suite)",
    )
    group.addoption(
        "--conformance-cases-root",
        default=None,
        metavar="DIR",
        help="where --case= paths are looked up when not next to the harness file",
    )
    group.addoption(
        "--conformance-strict-dtypes",
        action="store_true",
        default=False,
        help="no bf16/f16 emulation: cases without a native kernel are UNSUPPORTED",
    )
    group.addoption(
        "--conformance-fail-on-unsupported",
        action="store_true",
        default=False,
        help="fail UNSUPPORTED cases instead of skipping them",
    )


def _paths(config: pytest.Config) -> list[str]:
    from .collect import bundled_paths

    paths: list[str] = []
    for p in config.getoption("conformance", default=[]) or []:
        paths.extend(bundled_paths() if p == BUNDLED else [p])
    return [os.path.abspath(p) for p in paths]


def pytest_configure(config: pytest.Config) -> None:
    """Add the ``--conformance`` paths to the paths pytest collects.

    When the test paths came from ``testpaths`` (or the current directory) rather than the
    command line, they are replaced: ``pytest --conformance PATH`` runs only the cases.
    """
    paths = _paths(config) if config.getoption("conformance", default=None) else []
    if not paths:
        return
    for p in paths:
        if not os.path.exists(p):
            raise pytest.UsageError(f"--conformance: no such file or directory: {p}")
    source = getattr(config, "args_source", None)
    if source is not None and source != pytest.Config.ArgsSource.ARGS:
        config.args = []
    present = {os.path.abspath(a.split("::")[0]) for a in config.args}
    config.args = [*config.args, *(p for p in paths if p not in present)]


def _is_case_file(file_path: Path, config: pytest.Config) -> bool:
    paths = config.stash.get(_PATHS, None)
    if paths is None:
        paths = _paths(config) if config.getoption("conformance", default=None) else []
        config.stash[_PATHS] = paths
    full = str(file_path)
    for p in paths:
        if full == p:
            return True  # named directly: a JSON or a harness file of any name
        if full.startswith(p.rstrip(os.sep) + os.sep):
            name = file_path.name
            return name.endswith(".json") or name.startswith("harness")
    return False


_PATHS = pytest.StashKey[list[str]]()


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional[pytest.Collector]:
    """A collector for each JSON or harness file under a ``--conformance`` path."""
    if _is_case_file(file_path, parent.config):
        return ConformanceFile.from_parent(parent, path=file_path)
    return None


class ConformanceFailure(Exception):
    """A case that did not pass (FAILED, INVALID or ERROR)."""


class ConformanceFile(pytest.File):
    """The cases of one JSON or harness file, one item each, named by the harness line."""

    def collect(self) -> list[pytest.Item]:
        from .collect import collect

        config = self.config
        cases = collect([str(self.path)], cases_root=config.getoption("conformance_cases_root"))
        seen: dict[str, int] = {}
        items: list[pytest.Item] = []
        for case in cases:
            lineno = _line_of(case.location)
            seen[case.id] = seen.get(case.id, 0) + 1
            name = case.id if seen[case.id] == 1 else f"{case.id} (line {lineno})"
            items.append(ConformanceItem.from_parent(self, name=name, case=case, lineno=lineno))
        return items


class ConformanceItem(pytest.Item):
    """One case: runs it through :func:`onednn_convt.conformance.runner.run_case`."""

    def __init__(self, *, case: Any, lineno: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.lineno = lineno
        self.result: Any = None

    def runtest(self) -> None:
        """Run the case; fail unless it passed (skip SKIPPED and UNSUPPORTED)."""
        from .judge import PASSED, UNSUPPORTED
        from .runner import run_case

        config = self.config
        self.result = r = run_case(
            self.case, strict_dtypes=config.getoption("conformance_strict_dtypes")
        )
        if r.outcome == PASSED:
            return
        fail_unsupported = config.getoption("conformance_fail_on_unsupported")
        if r.outcome == "SKIPPED" or (r.outcome == UNSUPPORTED and not fail_unsupported):
            pytest.skip(f"{r.outcome}: {r.message}")
        raise ConformanceFailure(f"{r.outcome}: {r.message}\nrepro: {self.case.repro()}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """The case's location, line, message and repro command."""
        if isinstance(excinfo.value, ConformanceFailure):
            return f"{self.case.location}: {self.case.id}\n{excinfo.value}"
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, Optional[int], str]:
        """Where the case is defined."""
        return self.path, self.lineno - 1 if self.lineno else None, f"conformance: {self.case.id}"


def _line_of(location: str) -> int:
    _, sep, tail = location.rpartition(":")
    return int(tail) if sep and tail.isdigit() else 0

"""Reporting: terminal progress, per-case lines, JUnit XML, JSON and the summary line.

Counting (the summary line ``N passed, N failed, N skipped`` and, when there are any,
``, N errors``): PASSED is passed; FAILED is failed; SKIPPED and UNSUPPORTED are skipped
(UNSUPPORTED is failed with ``fail_on_unsupported``); INVALID and ERROR are errors (a case
that cannot be judged is never silently passed).

Case lines and messages come from the files read, whatever they hold: the JUnit XML writes
a character XML cannot hold (a control character) escaped, so the report always parses.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET
from typing import IO, Any, Optional, Sequence

from .model import ERROR, INVALID, SKIPPED
from .judge import FAILED, PASSED, UNSUPPORTED, Result


def category(result: Result, fail_on_unsupported: bool = False) -> str:
    """``passed``, ``failed``, ``skipped`` or ``errors`` for one result."""
    outcome = result.outcome
    if outcome == PASSED:
        return "passed"
    if outcome == FAILED or (outcome == UNSUPPORTED and fail_on_unsupported):
        return "failed"
    if outcome in (SKIPPED, UNSUPPORTED):
        return "skipped"
    return "errors"


def tally(results: Sequence[Result], fail_on_unsupported: bool = False) -> dict[str, int]:
    """Counts per category (see :func:`category`)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    for r in results:
        counts[category(r, fail_on_unsupported)] += 1
    return counts


def summary_line(counts: dict[str, int]) -> str:
    """``N passed, N failed, N skipped``, plus ``, N errors`` when there are errors."""
    line = f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
    return line + (f", {counts['errors']} errors" if counts["errors"] else "")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def describe(result: Result, verbose: bool = False) -> str:
    """The report lines of one result (one line, plus the message and a repro line when
    it did not pass)."""
    case = result.case
    head = f"{result.outcome:<11} {result.seconds:7.3f}s  {case.location}  {case.id}"
    lines = [head]
    if result.outcome != PASSED:
        if result.message:
            lines.append(_indent(result.message))
        if result.outcome in (FAILED, ERROR, INVALID):
            lines.append(f"    repro: {case.repro()}")
    elif verbose and result.details:
        facts = ", ".join(f"{k}={v}" for k, v in result.details.items())
        lines.append(f"    {case.label} {case.dtype} {facts}")
    return "\n".join(lines)


class Reporter:
    """Prints results as they come: a progress bar on a terminal, one line per case
    otherwise (failures, errors and, with ``verbose``, every case are always printed in
    full)."""

    def __init__(
        self,
        total: int,
        *,
        stream: Optional[IO[str]] = None,
        verbose: bool = False,
        fail_on_unsupported: bool = False,
        tty: Optional[bool] = None,
    ) -> None:
        self.stream = stream or sys.stdout
        self.total = total
        self.verbose = verbose
        self.fail_on_unsupported = fail_on_unsupported
        self.tty = self.stream.isatty() if tty is None else tty
        self.done: list[Result] = []
        self.counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
        self._bar_shown = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _bar(self) -> str:
        width = max(10, min(40, shutil.get_terminal_size((80, 20)).columns - 60))
        n = len(self.done)
        filled = width * n // max(1, self.total)
        c = self.counts
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {n}/{self.total}  "
            f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped, {c['errors']} errors"
        )

    def add(self, result: Result) -> None:
        """Report one finished case."""
        self.done.append(result)
        cat = category(result, self.fail_on_unsupported)
        self.counts[cat] += 1
        loud = cat in ("failed", "errors") or self.verbose
        if not self.tty:
            self._write(describe(result, self.verbose) + "\n")
            return
        text = ""
        if loud:
            text += "\r\033[K" + describe(result, self.verbose) + "\n"
        text += "\r\033[K" + self._bar()
        self._bar_shown = True
        self._write(text)

    def finish(self, seconds: float) -> dict[str, int]:
        """Print the closing lines; the last is exactly the summary line."""
        if self._bar_shown:
            self._write("\r\033[K")
        by_outcome: dict[str, int] = {}
        for r in self.done:
            by_outcome[r.outcome] = by_outcome.get(r.outcome, 0) + 1
        parts = ", ".join(f"{k} {v}" for k, v in sorted(by_outcome.items()))
        self._write(f"== {len(self.done)} cases in {seconds:.2f} s ({parts or 'none'})\n")
        self._write(summary_line(self.counts) + "\n")
        return dict(self.counts)


# -- files ---------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """What ran: oneDNN version, ISA, threads, dtype support, Python and host."""
    import onednn_convt

    try:
        info = onednn_convt.info()
    except Exception as e:  # noqa: BLE001 - the report must still be written
        info = {"error": str(e)}
    info.pop("cache", None)
    return {
        "onednn_convt": onednn_convt.__version__,
        **info,
        "python": platform.python_version(),
        "host": platform.node(),
    }


def _classname(result: Result) -> str:
    where = (
        result.case.location.rsplit(":", 1)[0]
        if ":" in result.case.location
        else result.case.location
    )
    where = os.path.splitext(where)[0] if where.endswith(".json") else where
    return where.replace(os.sep, ".").strip(".") or "conformance"


def junit_xml(
    results: Sequence[Result],
    seconds: float,
    *,
    fail_on_unsupported: bool = False,
    properties: Optional[dict[str, Any]] = None,
    name: str = "onednn-convt conformance",
) -> ET.ElementTree:
    """A JUnit XML tree: one ``testsuite``, one ``testcase`` per result, ``failure`` for
    failed, ``error`` for INVALID/ERROR, ``skipped`` for skipped."""
    counts = tally(results, fail_on_unsupported)
    attrs = {
        "name": name,
        "tests": str(len(results)),
        "failures": str(counts["failed"]),
        "errors": str(counts["errors"]),
        "skipped": str(counts["skipped"]),
        "time": f"{seconds:.3f}",
    }
    root = ET.Element("testsuites", attrs)
    suite = ET.SubElement(
        root,
        "testsuite",
        {**attrs, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "hostname": platform.node()},
    )
    if properties:
        props = ET.SubElement(suite, "properties")
        for k, v in properties.items():
            ET.SubElement(
                props,
                "property",
                {"name": str(k), "value": json.dumps(v) if not isinstance(v, str) else v},
            )
    for r in results:
        case = r.case
        tc = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": _classname(r),
                "name": case.id,
                "time": f"{r.seconds:.3f}",
                "file": case.location,
            },
        )
        cat = category(r, fail_on_unsupported)
        body = f"{r.message}\nrepro: {case.repro()}"
        first = r.message.splitlines()[0] if r.message else r.outcome
        if cat == "failed":
            ET.SubElement(tc, "failure", {"message": first, "type": r.outcome}).text = body
        elif cat == "errors":
            ET.SubElement(tc, "error", {"message": first, "type": r.outcome}).text = body
        elif cat == "skipped":
            ET.SubElement(tc, "skipped", {"message": f"{r.outcome}: {first}"})
        if r.details:
            ET.SubElement(tc, "system-out").text = json.dumps(r.details)
    for element in root.iter():  # case lines come from files: no character XML cannot hold
        element.text = _xml_safe(element.text) if element.text else element.text
        for key, value in element.attrib.items():
            element.set(key, _xml_safe(value))
    return ET.ElementTree(root)


#: Characters XML 1.0 cannot hold (control characters but tab and newlines, surrogates,
#: U+FFFE and U+FFFF).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(text: str) -> str:
    """``text`` with each character XML cannot hold written as ``\\xNN`` (``\\uNNNN``)."""
    return _NOT_XML.sub(lambda m: repr(m.group())[1:-1], text)


def write_junit(path: str, results: Sequence[Result], seconds: float, **kwargs: Any) -> None:
    """Write :func:`junit_xml` to ``path``."""
    tree = junit_xml(results, seconds, **kwargs)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def json_report(
    results: Sequence[Result],
    seconds: float,
    *,
    fail_on_unsupported: bool = False,
    env: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """The machine-readable report: summary, environment, one entry per case."""
    return {
        "summary": {
            **tally(results, fail_on_unsupported),
            "total": len(results),
            "seconds": round(seconds, 3),
        },
        "environment": env or {},
        "cases": [
            {
                "id": r.case.id,
                "location": r.case.location,
                "kind": r.case.kind,
                "pattern": r.case.pattern.label if r.case.pattern is not None else None,
                "dtype": r.case.dtype,
                "outcome": r.outcome,
                "category": category(r, fail_on_unsupported),
                "message": r.message,
                "seconds": round(r.seconds, 6),
                "repro": r.case.repro(),
                "details": r.details,
            }
            for r in results
        ],
    }


def write_json(path: str, results: Sequence[Result], seconds: float, **kwargs: Any) -> None:
    """Write :func:`json_report` to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(json_report(results, seconds, **kwargs), f, indent=2)
        f.write("\n")

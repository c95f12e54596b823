"""Collecting cases: :func:`collect` turns paths (JSON files, harness files, directories)
into cases, and the bundled suite's paths.

It never stops at a bad file: a file that cannot be read or is malformed is an INVALID case
naming it (:mod:`.graph_json` and :mod:`.harness` say what is refused), the rest are
collected; a file whose check raises what it should not is an ``ERROR`` case (a bug of this
package). The work is bounded (:class:`~.cases.Budget`): at most
:data:`~.cases.MAX_CASES` cases and :data:`~.cases.MAX_HARNESS_FILES` harness files per
collect, and :data:`~.cases.MAX_WORK` characters of case lines plus graph entries checked;
past a bound, reading stops with an INVALID case that says where.
"""

from __future__ import annotations

import os
import traceback
from typing import Iterable, Optional, Sequence

from . import cases
from .cases import Budget, Loader, build_case
from .graph_json import short
from .harness import parse_harness, parse_text
from .model import ERROR, INVALID, Case, Overrides


def bundled_suite() -> str:
    """Directory of the suite shipped in the package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "suite")


def bundled_paths() -> list[str]:
    """The harness files of the bundled suite (what runs when no path is given)."""
    d = bundled_suite()
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("harness"))


def _json_case(path: str, root: str, loader: Loader, location: str) -> Case:
    rel = os.path.relpath(path, root)
    line = f"--reset --case={rel}"
    return build_case(loader(path), Overrides(), id=line, location=location, root=root, path=path)


def _walk(directory: str) -> Iterable[tuple[str, str]]:
    """(kind, path) of the case files under a directory: ``*.json`` and ``harness*`` files."""
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if name.endswith(".json"):
                yield "json", full
            elif name.startswith("harness"):
                yield "harness", full


def collect(
    paths: Sequence[str] = (), *, cases_root: Optional[str] = None, lines: Sequence[str] = ()
) -> list[Case]:
    """Every case of the given paths, in order.

    Args:
        paths: JSON files, harness files (any other file) and directories (searched
            recursively for ``*.json`` and ``harness*`` files). No paths and no lines: the
            bundled suite's harness files.
        cases_root: where ``--case=`` paths are looked up when not found next to the harness
            file (and for ``lines``; default: the current directory).
        lines: harness lines given directly (``--reset --case=op/f32/deconv.json``).

    A bad file (unreadable, malformed, a harness that includes itself or expands past the
    :class:`Budget`) is one or more INVALID cases naming it, among the others; see the
    module docstring.

    Raises:
        FileNotFoundError: a path given that does not exist (a usage error).
    """
    loader = Loader()
    budget = Budget()
    cases: list[Case] = []
    if not paths and not lines:
        paths = bundled_paths()
    for p in paths:
        if not os.path.exists(p):
            raise FileNotFoundError(f"conformance: no such file or directory: {p}")
    for p in paths:
        if os.path.isdir(p):
            items: Iterable[tuple[str, str]] = _walk(p)
            base = p
        else:
            items = [("json" if p.endswith(".json") else "harness", p)]
            base = os.path.dirname(p) or "."
        for kind, full in items:
            shown = full if os.path.isdir(p) else p
            if budget.cases <= 0:
                cases.append(_not_read(shown, base, f"{shown} is not read"))
                break
            try:
                if kind == "json":
                    budget.cases -= 1
                    cases.append(_json_case(full, base, loader, shown))
                else:
                    cases.extend(
                        parse_harness(
                            full, cases_root=cases_root, loader=loader, shown=shown, budget=budget
                        )
                    )
            except Exception as e:  # noqa: BLE001 - a bug here: this file is an ERROR, the others run
                cases.append(
                    Case(
                        id=f"# {shown}",
                        location=shown,
                        root=base,
                        status=ERROR,
                        reason=f"reading {shown}: {type(e).__name__}: {short(str(e))}\n"
                        f"{traceback.format_exc(limit=-3)}",
                    )
                )
    for i, text in enumerate(lines):
        if budget.cases <= 0:
            cases.append(
                _not_read(f"--line[{i + 1}]", cases_root or ".", f"--line[{i + 1}] is not read")
            )
            break
        cases.extend(
            parse_text(
                text,
                f"--line[{i + 1}]",
                base_dir=cases_root or ".",
                cases_root=cases_root,
                loader=loader,
                budget=budget,
            )
        )
    return cases


def _not_read(shown: str, root: str, what: str) -> Case:
    """The INVALID case of a path left unread because the run already has MAX_CASES cases."""
    return Case(
        id=f"# {shown}",
        location=shown,
        root=root,
        status=INVALID,
        reason=f"{what} (nor what follows): the paths given already expand to {cases.MAX_CASES} cases, "
        "the most one run takes",
    )

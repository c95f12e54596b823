"""benchdnn graph-driver harness files: one problem per ``--case=`` (spec 9).

Options are read left to right and stay in force until ``--reset`` (as in benchdnn, where a
batch file is one long command line); ``--case=FILE`` runs the JSON with the settings
collected so far. Supported:

- ``--reset``: back to the defaults (no overrides).
- ``--case=FILE``: relative to the harness file's directory, else to ``--cases-root``.
- ``--op-attrs=ID:NAME:VAL[*NAME:VAL...][+ID:...][,...]``: ``*`` between attributes, ``+``
  between ops, ``,`` between sweep elements (an empty element = the unmodified JSON). VAL is
  read by the attribute's JSON type: ``s64[]``/``f32[]`` ``x``-separated, ``s64``/``f32``
  numbers, ``string`` verbatim, ``bool`` true/false.
- ``--in-shapes=ID:SHAPE[*TAG][+ID:...][,...]``: ``SHAPE`` ``x``-separated; ``TAG`` a memory
  tag (``acdb``), alone or after ``*``; ``-`` rank 0 and ``0`` shape [0] are read too.
- ``--dt=DT`` (every f32 tensor) or ``--dt=ID:DT[+ID:DT...]``; ``--mb=N`` (batch of the
  activation inputs; 0 keeps it); both also sweep with ``,``.
- ``--batch=FILE``: read another harness file here, with the same settings.
- ``#`` starts a comment; ``--graph`` and benchdnn's run options (``--engine=``,
  ``--mode=``, ``--attr-fpmath=``, ``--expected-n-partitions=``, ...) are accepted and kept
  in the case line, but change nothing here.

Sweeps combine as nested loops: ``--dt``, then ``--mb``, ``--in-shapes``, ``--op-attrs``.
An unknown option or a value that does not parse makes each following ``--case=`` (up to the
next ``--reset``) an INVALID case that says which token was wrong.

Hostile files: a harness file that is not a regular UTF-8 file of at most
:data:`MAX_HARNESS_BYTES` is one INVALID case naming it. A ``--batch`` file that cannot be
read, that is already being read (a file including itself, directly or through others:
the message gives the include chain) or that nests more than :data:`MAX_BATCH_DEPTH` deep is
an INVALID case at the ``--batch`` (the rest of the file is read). The expansion is bounded
by the :class:`~.cases.Budget` shared by one collect: cases, harness files read, and work
(the characters of the case lines and the entries of the graphs they check); a sweep whose
product is over what is left is refused before it is expanded. When the budget runs out,
reading stops with an INVALID case naming the file and the line.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .cases import MAX_CASES, MAX_HARNESS_FILES, MAX_WORK, Budget, Loader, build_case
from .model import INVALID, Case, Overrides
from .graph import Graph
from .graph_json import plain, read_text, short
from .harness_options import HarnessSyntaxError, parse_dt, parse_in_shapes, parse_int, parse_op_attrs

#: Options of benchdnn that do not change the problem (kept in the line, no effect here).
IGNORED_PREFIXES = (
    "--engine=",
    "--mode=",
    "--attr-fpmath=",
    "--expected-n-partitions=",
    "--max-ms-per-prb=",
    "--fix-times-per-prb=",
    "--repeats-per-prb=",
    "--allow-enum-tags-only=",
    "--verbose=",
    "--skip-impl=",
    "--impl=",
    "--memory-kind=",
    "--cold-cache=",
    "--execution-mode=",
    "--summary=",
    "--start=",
    "--ctx-init=",
    "--ctx-exe=",
    "--canonical=",
    "--mem-check=",
)


#: Most bytes of a harness file (benchdnn's are a few KiB).
MAX_HARNESS_BYTES = 1 << 20
#: Deepest chain of ``--batch`` files being read at once.
MAX_BATCH_DEPTH = 16


class _Exhausted(Exception):
    """The run's case or file budget (:class:`~.cases.Budget`) is spent: reading stops at
    ``where`` (file:line) for ``reason``."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(reason)
        self.where = where
        self.reason = reason


# -- the reader ---------------------------------------------------------------------------------


@dataclass
class _State:
    """The settings in force: each sweep as (text, parsed value) per element ("" = none)."""

    dt: list[tuple[str, Any]] = field(default_factory=lambda: [("", (None, ()))])
    mb: list[tuple[str, Any]] = field(default_factory=lambda: [("", 0)])
    in_shapes: list[tuple[str, Any]] = field(default_factory=lambda: [("", ())])
    op_attrs: list[tuple[str, Any]] = field(default_factory=lambda: [("", ())])
    extra: list[str] = field(default_factory=list)
    error: str = ""


_OPTION_TEXT = {"dt": "--dt", "mb": "--mb", "in_shapes": "--in-shapes", "op_attrs": "--op-attrs"}


def _parse_option(option: str, values: list[str]) -> list[tuple[str, Any]]:
    """Each element of a sweep of ``option`` as (its text in a case line, its value).

    Raises:
        HarnessSyntaxError: an element does not parse.
    """
    parsed: list[tuple[str, Any]] = []
    for v in values:
        if option == "dt":
            value: Any = parse_dt(v) if v else (None, ())
        elif option == "mb":
            value = parse_int(v, "--mb") if v else 0
        elif option == "in_shapes":
            value = parse_in_shapes(v)
        else:
            value = parse_op_attrs(v)
        parsed.append((f"{_OPTION_TEXT[option]}={v}" if v else "", value))
    return parsed


def _overrides(
    dt: tuple[str, Any],
    mb: tuple[str, Any],
    in_shapes: tuple[str, Any],
    op_attrs: tuple[str, Any],
    extra: Sequence[str],
) -> Overrides:
    texts = [t for t, _ in (dt, mb, in_shapes, op_attrs) if t]
    texts.extend(extra)
    dt_all, dt_ids = dt[1]
    return Overrides(
        in_shapes=in_shapes[1],
        op_attrs=op_attrs[1],
        dt=dt_all,
        dt_ids=dt_ids,
        mb=mb[1],
        texts=tuple(texts),
    )


class _Reader:
    def __init__(
        self, cases_root: Optional[str], loader: Callable[[str], Any], budget: Budget
    ) -> None:
        self.cases_root = cases_root
        self.loader = loader
        self.budget = budget
        self.cases: list[Case] = []
        self.state = _State()
        self.stack: list[str] = []  # real paths of the files being read, outermost first
        self.error_where = ""
        self.error_line = ""
        self.current_line = ""

    def add(self, case: Case) -> None:
        """Append a case, or raise _Exhausted when the run has MAX_CASES of them."""
        if self.budget.cases <= 0:
            raise _Exhausted(
                case.location,
                f"the cases expand to more than {MAX_CASES}, the most one run takes "
                "(sweeps or --batch files that multiply them?)",
            )
        self.budget.cases -= 1
        self.charge(len(case.id) + len(case.reason), case.location)
        self.cases.append(case)

    def charge(self, units: int, where: str) -> None:
        """Spend ``units`` of the work budget, or raise _Exhausted."""
        self.budget.work -= units
        if self.budget.work < 0:
            raise _Exhausted(
                where,
                f"the cases' lines and graphs add up to more than {MAX_WORK} characters and "
                "entries, the most one run reads (huge sweeps or overrides?)",
            )

    def resolve(self, case_path: str, base_dir: str) -> tuple[str, str, list[str]]:
        """(full path or '', root it was found under, directories tried)."""
        if os.path.isabs(case_path):
            return (
                (case_path if os.path.isfile(case_path) else ""),
                os.path.dirname(case_path),
                [case_path],
            )
        tried = []
        for root in (base_dir, self.cases_root):
            if root is None:
                continue
            full = os.path.join(root, case_path)
            tried.append(root)
            if os.path.isfile(full):
                return full, root, tried
        return "", base_dir, tried

    def run_case(self, case_path: str, where: str, base_dir: str) -> None:
        st = self.state
        if st.error:  # the line with the error, so that the repro shows it again
            line = self.error_line
            if not re.search(f"--case={re.escape(case_path)}(?:\\s|#|$)", line):
                line = f"{line} --case={case_path}"
            self.add(Case(id=line, location=where, root=base_dir, status=INVALID, reason=st.error))
            self.error_where = ""
            return
        full, root, tried = self.resolve(case_path, base_dir)
        if len(st.dt) * len(st.mb) * len(st.in_shapes) * len(st.op_attrs) > self.budget.cases:
            raise _Exhausted(
                where,
                f"the sweeps of --case={short(case_path)} expand to {len(st.dt)} x {len(st.mb)} x "
                f"{len(st.in_shapes)} x {len(st.op_attrs)} cases, more than the run may still take "
                f"(at most {MAX_CASES} in all)",
            )
        for dt, mb, shp, att in itertools.product(st.dt, st.mb, st.in_shapes, st.op_attrs):
            ov = _overrides(dt, mb, shp, att, st.extra)
            line = " ".join(["--reset", *ov.texts, f"--case={case_path}"])
            if not full:
                reason = f"case file {short(case_path)} not found (looked under {', '.join(map(short, tried))})"
                self.add(Case(id=line, location=where, root=root, status=INVALID, reason=reason))
                continue
            graph = self.loader(full)
            entries = graph.entries() if isinstance(graph, Graph) else 0
            self.charge(len(line) + entries, where)  # before the work of checking it
            self.add(build_case(graph, ov, id=line, location=where, root=root, path=full))

    def token(self, tok: str, where: str, base_dir: str) -> None:
        st = self.state
        option, eq, value = tok.partition("=")
        sweeps = {"--dt": "dt", "--mb": "mb", "--in-shapes": "in_shapes", "--op-attrs": "op_attrs"}
        if tok == "--reset":
            self.state = _State()
        elif option == "--case" and eq:
            self.run_case(value, where, base_dir)
        elif option in sweeps and eq:
            values = value.split(",")
            try:
                parsed = _parse_option(sweeps[option], values)
            except HarnessSyntaxError as e:
                self.fail(f"{where}: {e}", where)
                return
            setattr(st, sweeps[option], parsed)
        elif option == "--batch" and eq:
            self.batch(value, where, base_dir)
        elif (
            tok == "--graph"
            or tok.startswith(IGNORED_PREFIXES)
            or (tok.startswith("-v") and tok[2:].isdigit())
        ):
            if tok != "--graph":
                st.extra.append(tok)
        else:
            self.fail(f"{where}: unknown option {short(tok)}", where)

    def fail(self, reason: str, where: str) -> None:
        if not self.state.error:
            self.state.error, self.error_where = reason, where
            self.error_line = self.line()

    def line(self) -> str:
        """The line being read, without its comment (the id of a case it makes)."""
        return self.current_line.split("#", 1)[0].strip()

    def batch(self, path: str, where: str, base_dir: str) -> None:
        """Read ``--batch=path``, or add an INVALID case naming the file and why not."""
        full = path if os.path.isabs(path) else os.path.join(base_dir, path)
        try:
            real = os.path.realpath(full)
        except ValueError:  # an embedded NUL: read_text says why
            real = full
        reason = ""
        if real in self.stack:
            chain = " -> ".join(plain(p) for p in [*self.stack[self.stack.index(real) :], real])
            reason = (
                f"--batch={plain(path)}: {plain(full)} is already being read (include chain: "
                f"{chain}); a file may not include itself, directly or through others"
            )
        elif len(self.stack) >= MAX_BATCH_DEPTH:
            reason = f"--batch={plain(path)}: --batch files nest more than {MAX_BATCH_DEPTH} deep"
        elif self.budget.files <= 0:
            raise _Exhausted(
                where,
                f"--batch={plain(path)}: the harness files include more than {MAX_HARNESS_FILES} "
                "files, the most one run reads",
            )
        else:
            try:
                text = read_text(full, MAX_HARNESS_BYTES)
            except ValueError as e:  # FileTooLarge too: a harness file is small
                reason = f"--batch={plain(path)}: {e}"
        if reason:
            self.add(
                Case(
                    id=self.line(),
                    location=where,
                    root=base_dir,
                    status=INVALID,
                    reason=f"{where}: {reason}",
                )
            )
            return
        self.budget.files -= 1
        line = self.current_line
        self.stack.append(real)
        try:
            self.lines(text, full, os.path.dirname(full))
        finally:
            self.stack.pop()
            self.current_line = line

    def lines(self, text: str, shown: str, base_dir: str) -> None:
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{shown}:{lineno}"
            self.current_line = line
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:
                self.fail(f"{where}: {e}", where)
                continue
            for tok in tokens:
                self.token(tok, where, base_dir)

    def finish(self, base_dir: str) -> list[Case]:
        if self.state.error and self.error_where:  # an error no --case consumed
            self.cases.append(
                Case(
                    id=self.error_line,
                    location=self.error_where,
                    root=base_dir,
                    status=INVALID,
                    reason=self.state.error,
                )
            )
        return self.cases

    def read(self, text: str, shown: str, base_dir: str) -> list[Case]:
        """The cases of ``text``; when the budget runs out, the last case is INVALID and
        says where reading stopped."""
        try:
            self.lines(text, shown, base_dir)
        except _Exhausted as e:
            self.cases.append(
                Case(
                    id=self.line(),
                    location=e.where,
                    root=base_dir,
                    status=INVALID,
                    reason=f"{e.where}: reading {shown} stopped here: {e.reason}",
                )
            )
            return self.cases
        return self.finish(base_dir)


def parse_harness(
    path: str,
    *,
    cases_root: Optional[str] = None,
    loader: Optional[Callable[[str], Any]] = None,
    shown: Optional[str] = None,
    budget: Optional[Budget] = None,
) -> list[Case]:
    """The cases of a harness file.

    Args:
        path: the harness file.
        cases_root: where ``--case=`` files are looked up after the harness file's directory.
        loader: reads a graph JSON path (returns a Graph or the GraphJSONError); default:
            a new cache.
        shown: the name used in locations (default: ``path``).
        budget: the cases and harness files the run may still read (shared by the files of
            one :func:`~.collect.collect`; default: a new one).

    A file that cannot be read (not a regular file, not UTF-8, more than
    :data:`MAX_HARNESS_BYTES`) is one INVALID case naming it; so is a ``--batch`` file that
    cannot, or that is already being read (a file including itself, directly or not). When
    the budget runs out (:data:`~.cases.MAX_CASES` cases, :data:`~.cases.MAX_HARNESS_FILES`
    files) reading stops with an INVALID case saying where.
    """
    budget = budget if budget is not None else Budget()
    where = shown or path
    base = os.path.dirname(path) or "."
    try:
        if budget.files <= 0:
            raise ValueError(
                f"{where}: not read: the run already read {MAX_HARNESS_FILES} harness files"
            )
        budget.files -= 1
        text = read_text(path, MAX_HARNESS_BYTES)
    except ValueError as e:
        budget.cases -= 1
        return [
            Case(
                id=f"# {where}",
                location=where,
                root=base,
                status=INVALID,
                reason=f"cannot read harness file: {e}",
            )
        ]
    reader = _Reader(cases_root, loader or Loader(), budget)
    reader.stack.append(os.path.realpath(path))
    return reader.read(text, where, base)


def parse_text(
    text: str,
    name: str = "<text>",
    *,
    base_dir: str = ".",
    cases_root: Optional[str] = None,
    loader: Optional[Callable[[str], Any]] = None,
    budget: Optional[Budget] = None,
) -> list[Case]:
    """The cases of harness text given directly (``--line``), relative to ``base_dir``."""
    reader = _Reader(cases_root, loader or Loader(), budget if budget is not None else Budget())
    return reader.read(text, name, base_dir)

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
"""

from __future__ import annotations

import itertools
import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from .cases import INVALID, Case, Overrides, _Loader, build_case

#: dtypes ``--dt`` accepts (those of the graph format; the case check refuses non-float ones).
DT_NAMES = ("f32", "bf16", "f16", "s32", "s8", "u8", "f64", "boolean")

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


class HarnessSyntaxError(ValueError):
    """An option value that does not parse."""


# -- option values ----------------------------------------------------------------------------


def _int(text: str, what: str, minimum: int = 0) -> int:
    try:
        value = int(text)
    except ValueError:
        raise HarnessSyntaxError(f"{what}: expected an integer, got {text!r}") from None
    if value < minimum:
        raise HarnessSyntaxError(f"{what}: expected an integer >= {minimum}, got {value}")
    return value


def parse_in_shapes(text: str) -> tuple[tuple[int, Optional[tuple[int, ...]], Optional[str]], ...]:
    """One ``--in-shapes`` sweep element: ``ID:SHAPE[*TAG][+ID:...]``.

    Returns:
        (tensor id, shape or None, tag or None) per entry; () for an empty element.

    Raises:
        HarnessSyntaxError: a malformed entry.
    """
    if not text:
        return ()
    entries = []
    for entry in text.split("+"):
        tid_text, sep, spec = entry.partition(":")
        if not sep or not spec:
            raise HarnessSyntaxError(f"--in-shapes: entry {entry!r} expected ID:SHAPE")
        tid = _int(tid_text, f"--in-shapes entry {entry!r}: tensor id")
        shape_text, _, tag = spec.partition("*")
        shape: Optional[tuple[int, ...]]
        if shape_text == "-":
            shape = ()
        elif shape_text.isalpha() and not tag:
            shape, tag = None, shape_text
        else:
            shape = tuple(
                _int(d, f"--in-shapes entry {entry!r}: dim") for d in shape_text.split("x")
            )
        if tag and not tag.isalpha():
            raise HarnessSyntaxError(
                f"--in-shapes: entry {entry!r}: tag {tag!r} expected letters (e.g. acdb)"
            )
        entries.append((tid, shape, tag or None))
    return tuple(entries)


def parse_op_attrs(text: str) -> tuple[tuple[int, tuple[tuple[str, str], ...]], ...]:
    """One ``--op-attrs`` sweep element: ``ID:NAME:VAL[*NAME:VAL...][+ID:...]``.

    Returns:
        (op id, ((name, value text), ...)) per op; () for an empty element. A repeated
        attribute keeps its last value.

    Raises:
        HarnessSyntaxError: a malformed entry.
    """
    if not text:
        return ()
    ops = []
    for entry in text.split("+"):
        op_text, sep, rest = entry.partition(":")
        if not sep or not rest:
            raise HarnessSyntaxError(f"--op-attrs: entry {entry!r} expected ID:NAME:VALUE")
        op_id = _int(op_text, f"--op-attrs entry {entry!r}: op id")
        pairs: dict[str, str] = {}
        for item in rest.split("*"):
            name, sep, value = item.partition(":")
            if not sep or not name or not value:
                raise HarnessSyntaxError(f"--op-attrs: {item!r} in {entry!r} expected NAME:VALUE")
            pairs.pop(name, None)
            pairs[name] = value
        ops.append((op_id, tuple(pairs.items())))
    return tuple(ops)


def parse_dt(text: str) -> tuple[Optional[str], tuple[tuple[int, str], ...]]:
    """One ``--dt`` element: ``DT`` or ``ID:DT[+ID:DT...]``.

    Returns:
        (dtype for every f32 tensor or None, ((tensor id, dtype), ...)).

    Raises:
        HarnessSyntaxError: an unknown dtype or a malformed entry.
    """

    def check(dt: str) -> str:
        if dt not in DT_NAMES:
            raise HarnessSyntaxError(
                f"--dt: unknown data type {dt!r}; expected one of {', '.join(DT_NAMES)}"
            )
        return dt

    if ":" not in text:
        return check(text), ()
    entries = []
    for entry in text.split("+"):
        tid_text, _, dt = entry.partition(":")
        entries.append((_int(tid_text, f"--dt entry {entry!r}: tensor id"), check(dt)))
    return None, tuple(entries)


# -- the reader ---------------------------------------------------------------------------------


@dataclass
class _State:
    dt: list[str] = field(default_factory=lambda: [""])
    mb: list[str] = field(default_factory=lambda: [""])
    in_shapes: list[str] = field(default_factory=lambda: [""])
    op_attrs: list[str] = field(default_factory=lambda: [""])
    extra: list[str] = field(default_factory=list)
    error: str = ""


def _check_option(option: str, values: list[str]) -> None:
    """Raise HarnessSyntaxError if a sweep of ``option`` does not parse."""
    for v in values:
        if option == "dt":
            if v:
                parse_dt(v)
        elif option == "mb":
            if v:
                _int(v, "--mb")
        elif option == "in_shapes":
            parse_in_shapes(v)
        else:
            parse_op_attrs(v)


def _overrides(dt: str, mb: str, in_shapes: str, op_attrs: str, extra: Sequence[str]) -> Overrides:
    texts = []
    if dt:
        texts.append(f"--dt={dt}")
    if mb:
        texts.append(f"--mb={mb}")
    if in_shapes:
        texts.append(f"--in-shapes={in_shapes}")
    if op_attrs:
        texts.append(f"--op-attrs={op_attrs}")
    texts.extend(extra)
    dt_all, dt_ids = parse_dt(dt) if dt else (None, ())
    return Overrides(
        in_shapes=parse_in_shapes(in_shapes),
        op_attrs=parse_op_attrs(op_attrs),
        dt=dt_all,
        dt_ids=dt_ids,
        mb=int(mb) if mb else 0,
        texts=tuple(texts),
    )


class _Reader:
    def __init__(self, cases_root: Optional[str], loader: Callable[[str], Any]) -> None:
        self.cases_root = cases_root
        self.loader = loader
        self.cases: list[Case] = []
        self.state = _State()
        self.depth = 0
        self.error_where = ""
        self.error_line = ""
        self.current_line = ""

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
            if f"--case={case_path}" not in shlex.split(line, comments=True):
                line = f"{line} --case={case_path}"
            self.cases.append(
                Case(id=line, location=where, root=base_dir, status=INVALID, reason=st.error)
            )
            self.error_where = ""
            return
        full, root, tried = self.resolve(case_path, base_dir)
        for dt, mb, shp, att in itertools.product(st.dt, st.mb, st.in_shapes, st.op_attrs):
            ov = _overrides(dt, mb, shp, att, st.extra)
            line = " ".join(["--reset", *ov.texts, f"--case={case_path}"])
            if not full:
                reason = f"case file {case_path!r} not found (looked under {', '.join(map(repr, tried))})"
                self.cases.append(
                    Case(id=line, location=where, root=root, status=INVALID, reason=reason)
                )
                continue
            self.cases.append(
                build_case(self.loader(full), ov, id=line, location=where, root=root, path=full)
            )

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
                _check_option(sweeps[option], values)
            except HarnessSyntaxError as e:
                self.fail(f"{where}: {e}", where)
                return
            setattr(st, sweeps[option], values)
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
            self.fail(f"{where}: unknown option {tok!r}", where)

    def fail(self, reason: str, where: str) -> None:
        if not self.state.error:
            self.state.error, self.error_where = reason, where
            self.error_line = self.current_line.split("#", 1)[0].strip()

    def batch(self, path: str, where: str, base_dir: str) -> None:
        full = path if os.path.isabs(path) else os.path.join(base_dir, path)
        if self.depth >= 16 or not os.path.isfile(full):
            self.fail(f"{where}: --batch file {path!r} not found or nested too deep", where)
            return
        self.depth += 1
        with open(full, encoding="utf-8") as f:
            self.lines(f.read(), full, os.path.dirname(full))
        self.depth -= 1

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


def parse_harness(
    path: str,
    *,
    cases_root: Optional[str] = None,
    loader: Optional[Callable[[str], Any]] = None,
    shown: Optional[str] = None,
) -> list[Case]:
    """The cases of a harness file.

    Args:
        path: the harness file.
        cases_root: where ``--case=`` files are looked up after the harness file's directory.
        loader: reads a graph JSON path (returns a Graph or the GraphJSONError); default:
            a new cache.
        shown: the name used in locations (default: ``path``).
    """
    reader = _Reader(cases_root, loader or _Loader())
    base = os.path.dirname(path) or "."
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        where = shown or path
        return [
            Case(
                id=f"# {where}",
                location=where,
                root=base,
                status=INVALID,
                reason=f"cannot read harness file: {e}",
            )
        ]
    reader.lines(text, shown or path, base)
    return reader.finish(base)


def parse_text(
    text: str,
    name: str = "<text>",
    *,
    base_dir: str = ".",
    cases_root: Optional[str] = None,
    loader: Optional[Callable[[str], Any]] = None,
) -> list[Case]:
    """The cases of harness text given directly (``--line``), relative to ``base_dir``."""
    reader = _Reader(cases_root, loader or _Loader())
    reader.lines(text, name, base_dir)
    return reader.finish(base_dir)

"""argparse argument types and output-path checks the CLI's subcommands share (``bench``,
``tune``, ``conformance``)."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from . import schema


def comma_list(choices: Sequence[str], aliases: Optional[dict[str, str]] = None) -> Any:
    """A parser of "a,b,c" into the spellings of ``choices`` it names (any case; ``aliases``
    map other names to choices), each once, in the order given."""

    def parse(text: str) -> list[str]:
        items = []
        folded = {k.casefold(): v for k, v in (aliases or {}).items()}
        for given in text.replace(" ", "").split(","):
            item = schema.spelled(folded.get(given.casefold(), given), choices)
            if item is None:
                msg = f"expected a comma-separated list of {', '.join(choices)} (any case), got {given!r}"
                raise argparse.ArgumentTypeError(msg)
            if item not in items:
                items.append(item)
        return items

    return parse


def positive(kind: Any) -> Any:
    """A parser of a positive, finite ``kind`` (int or float)."""
    return _bounded(kind, "a positive", lambda v: v > 0)


def non_negative(kind: Any) -> Any:
    """A parser of a finite ``kind`` (int or float) of 0 or more."""
    return _bounded(kind, "a non-negative", lambda v: v >= 0)


def _bounded(kind: Any, what: str, ok: Any) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
            fits = math.isfinite(value) and ok(value)
        except (ValueError, OverflowError):  # not a number, or an int past any float
            fits = False
        if not fits:
            msg = f"expected {what} {kind.__name__}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; the CPU count without one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def up_to_cpus(what: str) -> Any:
    """A parser of a count of ``what`` (threads, worker processes): 1 to :func:`usable_cpus`
    (more than the CPUs only times the scheduler; 100,000 threads made OpenMP start that
    many)."""

    def parse(text: str) -> int:
        n = int(positive(int)(text))
        if n > usable_cpus():
            msg = f"expected {what} from 1 to {usable_cpus()} (the CPUs this process may use), got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return n

    return parse


#: the longest base name of result files (file systems take 255 bytes, with .json added)
MAX_STEM_BYTES = 200


def file_stem(text: str) -> str:
    """A parser of a base name for result files: no path separator, not empty, not '.' or '..'."""
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        msg = f"expected a file name without directories (results go to --out), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    if len(os.fsencode(text)) > MAX_STEM_BYTES:
        msg = f"expected a file name of at most {MAX_STEM_BYTES} bytes (with .json and the like added), got {len(os.fsencode(text))}"
        raise argparse.ArgumentTypeError(msg)
    return text


def make_writable_dir(option: str, directory: Path) -> str:
    """Create ``directory`` (and its parents) if needed; '' if it is a directory this process
    can write into, else a message naming ``option`` and why not (checked before a long
    run, so that its results are not lost at the end)."""
    try:
        if directory.exists() and not directory.is_dir():
            return f"{option} {directory}: not a directory"
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a name too long, a parent that is a file, no permission
        return f"{option} {directory}: cannot create this directory ({e.strerror or e})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{option} {directory}: this directory is not writable"
    return ""


def make_writable_file(option: str, given: str | Path) -> str:
    """Create the folder of file ``given`` (and its parents) if needed; '' if the file can then be
    written (it is no folder, and its folder is writable), else a message naming ``option``
    and why not (checked before a run, so that its results are not lost at the end)."""
    if not str(given):
        return f"{option}: expected a file name, got ''"
    file = Path(given)
    try:
        if file.is_dir():
            return f"{option} {file}: expected a file name, got a directory"
        if file.exists() and not os.access(file, os.W_OK):
            return f"{option} {file}: this file is not writable"
    except OSError as e:  # a name too long, a loop of links
        return f"{option} {file}: {e.strerror or e}"
    why = make_writable_dir(option, file.parent)
    if not why:
        try:
            longest = os.pathconf(file.parent, "PC_NAME_MAX")
        except (OSError, ValueError):
            longest = 255
        if len(os.fsencode(file.name)) > longest:
            why = f"{option} {file}: a file name longer than this folder takes ({longest} bytes)"
    return why


#: the largest JSON file an option reads (``bench --compare``, ``tune --layers-json``): a
#: bench run of every suite is a few MiB
MAX_JSON_BYTES = 64 << 20


def read_json_file(path: Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in file ``path``: read to at most ``max_bytes`` (a pipe, as from
    ``<(...)``, is read like a file; ``/dev/zero`` is refused at the size, not read forever).

    Raises:
        OSError: the file cannot be opened or read.
        ValueError: larger than ``max_bytes``, not UTF-8 or not JSON.
        RecursionError: JSON nested deeper than Python's parser follows.
    """
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    return json.loads(data.decode("utf-8"))

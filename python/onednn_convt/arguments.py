"""argparse argument types the CLI's subcommands share (``bench``, ``tune``)."""

from __future__ import annotations

import argparse
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
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not ok(value):
            msg = f"expected {what} {kind.__name__}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


def file_stem(text: str) -> str:
    """A parser of a base name for result files: no path separator, not empty, not '.' or '..'."""
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text:
        msg = f"expected a file name without directories (results go to --out), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return text


def make_writable_dir(option: str, directory: Path) -> str:
    """Create ``directory`` (and its parents) if needed; '' if it is a directory this process
    can write into, else a message naming ``option`` and why not (checked before a long
    run, so that its results are not lost at the end)."""
    if directory.exists() and not directory.is_dir():
        return f"{option} {directory}: not a directory"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"{option} {directory}: cannot create this directory ({e.strerror or e})"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"{option} {directory}: this directory is not writable"
    return ""

"""argparse argument types the CLI's subcommands share (``bench``, ``tune``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
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
    """A parser of a positive ``kind`` (int or float)."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value <= 0:
            msg = f"expected a positive {kind.__name__}, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    return parse


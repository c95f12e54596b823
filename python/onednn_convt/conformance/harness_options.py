"""The values of a harness line's options (benchdnn's syntax): ``--in-shapes``,
``--op-attrs`` and ``--dt`` parsed, or :class:`HarnessSyntaxError` saying what does not."""

from __future__ import annotations

from typing import Optional

from .graph_json import short

#: dtypes ``--dt`` accepts (those of the graph format; the case check refuses non-float ones).
DT_NAMES = ("f32", "bf16", "f16", "s32", "s8", "u8", "f64", "boolean")


class HarnessSyntaxError(ValueError):
    """An option value that does not parse."""



def parse_int(text: str, what: str, minimum: int = 0) -> int:
    """``text`` as an integer of at least ``minimum`` (``what`` names it in the error)."""
    try:
        value = int(text)
    except ValueError:
        raise HarnessSyntaxError(f"{what}: expected an integer, got {short(text)}") from None
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
            raise HarnessSyntaxError(f"--in-shapes: entry {short(entry)} expected ID:SHAPE")
        tid = parse_int(tid_text, f"--in-shapes entry {short(entry)}: tensor id")
        shape_text, _, tag = spec.partition("*")
        shape: Optional[tuple[int, ...]]
        if shape_text == "-":
            shape = ()
        elif shape_text.isalpha() and not tag:
            shape, tag = None, shape_text
        else:
            shape = tuple(
                parse_int(d, f"--in-shapes entry {short(entry)}: dim") for d in shape_text.split("x")
            )
        if tag and not tag.isalpha():
            raise HarnessSyntaxError(
                f"--in-shapes: entry {short(entry)}: tag {short(tag)} expected letters (e.g. acdb)"
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
            raise HarnessSyntaxError(f"--op-attrs: entry {short(entry)} expected ID:NAME:VALUE")
        op_id = parse_int(op_text, f"--op-attrs entry {short(entry)}: op id")
        pairs: dict[str, str] = {}
        for item in rest.split("*"):
            name, sep, value = item.partition(":")
            if not sep or not name or not value:
                raise HarnessSyntaxError(
                    f"--op-attrs: {short(item)} in {short(entry)} expected NAME:VALUE"
                )
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
                f"--dt: unknown data type {short(dt)}; expected one of {', '.join(DT_NAMES)}"
            )
        return dt

    if ":" not in text:
        return check(text), ()
    entries = []
    for entry in text.split("+"):
        tid_text, _, dt = entry.partition(":")
        entries.append((parse_int(tid_text, f"--dt entry {short(entry)}: tensor id"), check(dt)))
    return None, tuple(entries)

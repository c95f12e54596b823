"""The attribute schema: names, defaults and checks of every op's attributes (spec D1-D7).

Attribute names are the library's (D1). Values are checked here, once, when an op object
is built; what depends on the tensors (list lengths, channel counts) is checked in
:mod:`onednn_convt.shapes` at call time.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

IntList = Union[int, Sequence[int]]

#: Library spelling of each accepted auto_pad value, by its lower-case form (D2).
AUTO_PAD = {"none": "None", "same_upper": "SAME_UPPER", "same_lower": "SAME_LOWER", "valid": "VALID"}
DATA_FORMATS = ("NXC", "NCX")
WEIGHTS_FORMATS = ("XOI", "IOX")
#: Convolution weight formats that some doc pages list for these ops by mistake (D3).
CONVOLUTION_WEIGHTS_FORMATS = ("OIX", "XIO")
#: Largest value of the library's s64 attributes.
S64_MAX = 2**63 - 1


def spelled(value: str, spellings: Sequence[str]) -> Optional[str]:
    """The one of ``spellings`` that ``value`` names in any case (``"ncx"`` -> ``"NCX"``),
    or None. Every string value the package takes (formats, auto_pad, post-op kinds, qtype,
    int8 and float dtype codes) is matched this way."""
    folded = value.casefold()
    return next((s for s in spellings if s.casefold() == folded), None)


@dataclass(frozen=True)
class Attribute:
    """One attribute: its library type, default and lower bound.

    ``default`` None means "not given" (the op works without it).
    """

    name: str
    kind: str  # "s64[]", "s64" or "string"
    default: Any
    minimum: int = 0
    doc: str = ""


_LISTS = (
    Attribute("strides", "s64[]", 1, 1, "step of the kernel over dst, per spatial dim"),
    Attribute("pads_begin", "s64[]", 0, 0, "cropped from the start of dst, per spatial dim"),
    Attribute("pads_end", "s64[]", 0, 0, "cropped from the end of dst, per spatial dim"),
    Attribute("dilations", "s64[]", 1, 1, "kernel dilation per spatial dim (1 = none)"),
)
_COMMON = _LISTS + (
    Attribute("auto_pad", "string", "None", doc="None, SAME_UPPER, SAME_LOWER or VALID"),
    Attribute("groups", "s64", 1, 1, "channel groups; IC and OC divisible by it"),
    Attribute("data_format", "string", "NXC", doc="NXC or NCX, for the activation tensors"),
    Attribute("weights_format", "string", "XOI", doc="XOI or IOX"),
)

#: Attributes of each op, in the order the docs list them.
OP_ATTRIBUTES: dict[str, tuple[Attribute, ...]] = {
    "ConvTranspose": _COMMON
    + (Attribute("output_padding", "s64[]", 0, 0, "added to the end of dst, < stride"),),
    "ConvTransposeBackwardData": _COMMON
    + (Attribute("output_padding", "s64[]", None, 0, "checked only: the forward's value"),),
    "ConvTransposeBackwardWeights": _COMMON
    + (
        Attribute("output_padding", "s64[]", None, 0, "checked only: the forward's value"),
        Attribute("weights_shape", "s64[]", None, 1, "diff_weights shape in weights_format"),
    ),
}


def default(op: str, name: str) -> Any:
    """The default of attribute ``name`` of ``op`` (None: not given unless set)."""
    return next(a.default for a in OP_ATTRIBUTES[op] if a.name == name)


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to about ``limit`` characters (a huge int or string)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text)} characters)"


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_int_list(op: str, a: Attribute, value: Any) -> int | tuple[int, ...]:
    if _is_int(value):
        items: tuple[int, ...] = (int(value),)
        result: int | tuple[int, ...] = int(value)
    else:
        try:
            # keys / no order / characters or bytes (iterating b"NCX" gives ints): not a list
            if isinstance(value, (Mapping, set, frozenset, str, bytes, bytearray, memoryview)):
                raise TypeError
            items = tuple(value)
        except TypeError:
            msg = f"{op}: attribute '{a.name}' expected an int or a list of ints, got {short_repr(value)}"
            raise TypeError(msg) from None
        if not all(_is_int(x) for x in items):
            msg = f"{op}: attribute '{a.name}' expected a list of ints, got {short_repr(value)}"
            raise TypeError(msg)
        items = tuple(int(x) for x in items)
        if not 1 <= len(items) <= 3 and not (a.name == "weights_shape" and 3 <= len(items) <= 5):
            msg = f"{op}: attribute '{a.name}' expected 1 to 3 entries (one per spatial dim), got {list(items)}"
            raise ValueError(msg)
        result = items
    if any(x < a.minimum for x in items):
        bound = "positive" if a.minimum == 1 else "non-negative"
        msg = f"{op}: attribute '{a.name}' expected {bound} values, got {short_repr(value)}"
        raise ValueError(msg)
    if any(x > S64_MAX for x in items):
        msg = f"{op}: attribute '{a.name}' expected values that fit in s64 (<= 2**63-1), got {short_repr(value)}"
        raise ValueError(msg)
    return result


def _check_string(op: str, a: Attribute, value: Any) -> str:
    if not isinstance(value, str):
        msg = f"{op}: attribute '{a.name}' expected a string, got {short_repr(value)}"
        raise TypeError(msg)
    if a.name == "auto_pad":
        library = AUTO_PAD.get(value.lower())
        if library is None:
            msg = f"{op}: attribute 'auto_pad' expected one of None, SAME_UPPER, SAME_LOWER, VALID (any case), got {short_repr(value)}"
            raise ValueError(msg)
        return library
    allowed = DATA_FORMATS if a.name == "data_format" else WEIGHTS_FORMATS
    canonical = spelled(value, allowed)
    if canonical is None:
        hint = ""
        if a.name == "weights_format" and value.upper() in CONVOLUTION_WEIGHTS_FORMATS:
            hint = (
                f"; {value} is a Convolution weights format that some oneDNN pages list for "
                "ConvTranspose ops by mistake (IOX = (IC, OC/groups, X...), XOI = (X..., OC/groups, IC))"
            )
        msg = f"{op}: attribute '{a.name}' expected one of {', '.join(allowed)} (any case), got {short_repr(value)}{hint}"
        raise ValueError(msg)
    return canonical


def check_bool(where: str, name: str, value: Any) -> bool:
    """``value`` as a bool: True or False (NumPy's bools too). Anything else is a TypeError,
    not its truth value: ``strict="False"`` is a non-empty string, which ``bool()`` reads as
    True."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    msg = f"{where}: argument '{name}' expected a bool (True or False), got {short_repr(value)} ({type(value).__name__})"
    raise TypeError(msg)


def normalize(op: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Check the attributes given to ``op`` and fill in defaults.

    Args:
        op: library op name, e.g. ``"ConvTranspose"``.
        given: attribute name -> value as the user wrote it. A list attribute may be one int
            (broadcast to every spatial dim at call time) or a sequence of ints.

    Returns:
        Every attribute of ``op``: ints or tuples of ints for lists, library spellings for
        strings, None for an optional attribute not given.

    Raises:
        TypeError: an unknown attribute name, or a value of the wrong type.
        ValueError: a value out of range or not among the allowed strings.
    """
    schema = {a.name: a for a in OP_ATTRIBUTES[op]}
    unknown = sorted(set(given) - set(schema))
    if unknown:
        msg = f"{op}: unknown attribute(s) {', '.join(unknown)}; expected some of {', '.join(schema)}"
        raise TypeError(msg)
    attrs: dict[str, Any] = {}
    for name, a in schema.items():
        value = given.get(name)
        if value is None:
            attrs[name] = a.default
        elif a.kind == "string":
            attrs[name] = _check_string(op, a, value)
        elif a.kind == "s64":
            if not _is_int(value):
                msg = f"{op}: attribute '{name}' expected an int, got {short_repr(value)}"
                raise TypeError(msg)
            if not a.minimum <= value <= S64_MAX:
                msg = f"{op}: attribute '{name}' expected a positive int (s64), got {short_repr(value)}"
                raise ValueError(msg)
            attrs[name] = int(value)
        else:
            attrs[name] = _check_int_list(op, a, value)
    return attrs


def per_dim(op: str, name: str, value: Optional[IntList], spatial: int) -> tuple[int, ...]:
    """A normalized list attribute as one entry per spatial dim.

    Raises:
        ValueError: a list whose length is not ``spatial``.
    """
    if value is None:
        return (0,) * spatial
    if isinstance(value, int):
        return (value,) * spatial
    if len(value) != spatial:
        msg = f"{op}: attribute '{name}' expected {spatial} entries (one per spatial dim), got {list(value)}"
        raise ValueError(msg)
    return tuple(value)

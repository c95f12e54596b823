"""How a call's arrays were read, for the messages of shape errors.

Activations are read in the op's ``data_format`` (NCX: (N, C, X...); NXC: (N, X..., C)) and
weights in its ``weights_format`` (IOX: (I, O, X...); XOI: (X..., O, I), with I the input
channels and O the output channels per group). A channel or rank mismatch says how each
array was read and which other formats the shapes would fit: PyTorch's layout is NCX with
IOX weights, while the op defaults are the spec's NXC and XOI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from . import shapes

#: PyTorch's layout of ConvTranspose arrays, as (data_format, weights_format)
TORCH_LAYOUT = ("NCX", "IOX")


@dataclass(frozen=True)
class Read:
    """One array of a call: its argument name, shape and role.

    ``role``: ``"in"`` (src or diff_src: the forward's input channels), ``"out"`` (dst or
    diff_dst: the forward's output channels) or ``"weights"`` (weights or weights_shape).
    """

    name: str
    shape: tuple[int, ...]
    role: str

    def describe(self, data_format: str, weights_format: str) -> str:
        """``'src' (2, 8, 4, 4) read as NXC: N 2, spatial (8, 4), C 4``."""
        if self.role == "weights":
            i, o, kernel = shapes.split_weights(self.shape, weights_format)
            return f"'{self.name}' {self.shape} read as {weights_format}: kernel {kernel}, O {o}, I {i}"
        n, c, spatial = shapes.split_activation(self.shape, data_format)
        return f"'{self.name}' {self.shape} read as {data_format}: N {n}, spatial {spatial}, C {c}"

    def spatial_dims(self) -> int:
        return len(self.shape) - 2


def channels_agree(arrays: Sequence[Read], groups: int, data_format: str, weights_format: str) -> bool:
    """Whether the arrays' channel counts agree when read in these formats: the input
    activation's C is I, the output activation's C is O * groups, and I divides by groups."""
    weights = next(a for a in arrays if a.role == "weights")
    i, o, _ = shapes.split_weights(weights.shape, weights_format)
    if i % groups:
        return False
    for a in arrays:
        if a.role == "weights":
            continue
        c = shapes.split_activation(a.shape, data_format)[1]
        if c != (i if a.role == "in" else o * groups):
            return False
    return True


def describe(arrays: Sequence[Read], data_format: str, weights_format: str) -> str:
    """Each array as it was read, for a message."""
    return "; ".join(a.describe(data_format, weights_format) for a in arrays)


def other_fits(arrays: Sequence[Read], groups: int, data_format: str, weights_format: str) -> str:
    """A sentence naming the other formats the arrays' channels fit ("" where none does)."""
    fits = [(d, w) for d in ("NCX", "NXC") for w in ("IOX", "XOI")
            if (d, w) != (data_format, weights_format) and channels_agree(arrays, groups, d, w)]
    if not fits:
        return ""
    if TORCH_LAYOUT in fits:
        return ("; the shapes fit data_format='NCX', weights_format='IOX' (PyTorch's layout: "
                "(N, C, X...) and (IC, OC/groups, X...))")
    named = " or ".join(f"data_format='{d}', weights_format='{w}'" for d, w in fits)
    return f"; the shapes fit {named}"


def rank_mismatch(op: str, first: Read, second: Read, data_format: str, weights_format: str) -> str:
    """The message for two arrays whose spatial dims differ in number: the one with fewer
    dims is named as at fault (a missing dim; an activation's batch, most often)."""
    low, high = (first, second) if len(first.shape) < len(second.shape) else (second, first)
    missing = "its batch dim" if low.role != "weights" and len(low.shape) + 1 == len(high.shape) else "a dim"
    return (f"{op}: argument '{low.name}' has rank {len(low.shape)} but '{high.name}' has rank "
            f"{len(high.shape)}: every tensor needs the same spatial dims ({low.spatial_dims()} against "
            f"{high.spatial_dims()}: {describe([first, second], data_format, weights_format)}); is "
            f"'{low.name}' missing {missing}?")

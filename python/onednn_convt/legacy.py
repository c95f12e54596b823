"""``ConvTransposeBackpropFilters-1``: the older spec's name for ConvTransposeBackwardWeights (D14).

The library has no such op. Its filter layouts hold the same dims with the two channel axes
swapped: OIX = (OC/groups, IC, X...) is IOX with axes 0 and 1 swapped, XIO = (X..., IC,
OC/groups) is XOI with the last two swapped. This class computes with
ConvTransposeBackwardWeights and swaps the axes of the shape and of the result.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import ArrayLike

from .ops import ConvTransposeBackwardWeights
from .schema import IntList

#: filter_format -> (weights_format, the two axes it swaps)
_FORMATS = {"OIX": ("IOX", (0, 1)), "XIO": ("XOI", (-2, -1))}


def _swap(shape: Sequence[int], axes: tuple[int, int]) -> tuple[int, ...]:
    s = list(shape)
    s[axes[0]], s[axes[1]] = s[axes[1]], s[axes[0]]
    return tuple(s)


class ConvTransposeBackpropFilters:
    """Legacy gradient of ConvTranspose with respect to its filter (spec seed 002).

    Inputs are ``input_forward`` (the forward src), ``output_delta`` (diff_dst) and an
    optional ``filter_shape`` (1-D integers, wins over the attribute). Attributes as
    :class:`ConvTransposeBackwardWeights`, but ``filter_format`` is ``"XIO"`` (default,
    (X..., IC, OC/groups)) or ``"OIX"`` ((OC/groups, IC, X...)) and ``filter_shape`` is in
    that layout.
    """

    op_name = "ConvTransposeBackpropFilters"

    def __init__(
        self, *, strides: IntList = 1, pads_begin: IntList = 0, pads_end: IntList = 0,
        dilations: IntList = 1, auto_pad: str = "None", output_padding: Optional[IntList] = None,
        groups: int = 1, data_format: str = "NXC", filter_format: str = "XIO",
        filter_shape: Optional[Sequence[int]] = None, strict: bool = False,
    ) -> None:
        if filter_format not in _FORMATS:
            msg = f"{self.op_name}: attribute 'filter_format' expected XIO or OIX, got {filter_format!r}"
            raise ValueError(msg)
        weights_format, self._axes = _FORMATS[filter_format]
        weights_shape = None if filter_shape is None else _swap(list(filter_shape), self._axes)
        self.filter_format = filter_format
        self._op = ConvTransposeBackwardWeights(
            strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
            auto_pad=auto_pad, output_padding=output_padding, groups=groups,
            data_format=data_format, weights_format=weights_format, weights_shape=weights_shape,
            strict=strict,
        )

    def __call__(
        self, input_forward: ArrayLike, output_delta: ArrayLike,
        filter_shape: Optional[ArrayLike] = None, *, out: Optional[np.ndarray] = None,
    ) -> np.ndarray:
        """Run the op; returns filter_delta in ``filter_format``."""
        shape = None
        if filter_shape is not None:
            shape = np.asarray(filter_shape)
            if shape.ndim != 1 or len(shape) < 2:
                msg = f"{self.op_name}: argument 'filter_shape' expected a 1-D integer array, got shape {shape.shape}"
                raise ValueError(msg)
            shape = np.asarray(_swap(shape.tolist(), self._axes), dtype=shape.dtype)
        result = self._op(input_forward, output_delta, shape).swapaxes(*self._axes)
        if out is None:
            return np.ascontiguousarray(result)
        if out.shape != result.shape or out.dtype != result.dtype:
            msg = f"{self.op_name}: argument 'out' expected shape {result.shape} and dtype {result.dtype}, got {out.shape} {out.dtype}"
            raise ValueError(msg)
        np.copyto(out, result)
        return out

    def __repr__(self) -> str:
        return f"ConvTransposeBackpropFilters(filter_format={self.filter_format!r}, via {self._op!r})"

    @property
    def attrs(self) -> dict[str, Any]:
        """The attributes of the ConvTransposeBackwardWeights op that computes it."""
        return self._op.attrs

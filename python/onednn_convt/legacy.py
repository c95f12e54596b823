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

from . import schema
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
        spelled = schema.spelled(filter_format, tuple(_FORMATS)) if isinstance(filter_format, str) else None
        if spelled is None:
            msg = f"{self.op_name}: attribute 'filter_format' expected XIO or OIX (any case), got {filter_format!r}"
            raise (ValueError if isinstance(filter_format, str) else TypeError)(msg)
        weights_format, self._axes = _FORMATS[spelled]
        if filter_shape is not None and not (
            hasattr(filter_shape, "__len__") and 3 <= len(filter_shape) <= 5 and not isinstance(filter_shape, str)
        ):
            msg = f"{self.op_name}: attribute 'filter_shape' expected a list of 3 to 5 ints, got {filter_shape!r}"
            raise (ValueError if hasattr(filter_shape, "__len__") else TypeError)(msg)
        weights_shape = None if filter_shape is None else _swap(list(filter_shape), self._axes)
        self.filter_format = filter_format
        try:
            self._op = ConvTransposeBackwardWeights(
                strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                data_format=data_format, weights_format=weights_format, weights_shape=weights_shape,
                strict=strict,
            )
        except (ValueError, TypeError) as e:
            raise self._renamed(e) from e

    def _renamed(self, e: Exception) -> Exception:
        """``e`` of the ConvTransposeBackwardWeights that does the work, naming this op."""
        return type(e)(
            f"{self.op_name}: {e} (computed as ConvTransposeBackwardWeights: src = input_forward, "
            "diff_dst = output_delta, weights_shape = filter_shape with its channel axes swapped)"
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
        if out is not None and not isinstance(out, np.ndarray):
            msg = f"{self.op_name}: argument 'out' expected a NumPy array, got {type(out).__name__}"
            raise TypeError(msg)
        try:
            result = self._op(input_forward, output_delta, shape).swapaxes(*self._axes)
        except (ValueError, TypeError) as e:
            raise self._renamed(e) from e
        if out is None:
            return np.ascontiguousarray(result)
        if out.dtype != result.dtype:
            msg = f"{self.op_name}: argument 'out' expected dtype {result.dtype}, got {out.dtype}"
            raise TypeError(msg)
        if out.shape != result.shape or not out.flags.writeable:
            msg = f"{self.op_name}: argument 'out' expected a writeable array of shape {result.shape}, got {out.shape}"
            raise ValueError(msg)
        np.copyto(out, result)
        return out

    def __repr__(self) -> str:
        return f"ConvTransposeBackpropFilters(filter_format={self.filter_format!r}, via {self._op!r})"

    @property
    def attrs(self) -> dict[str, Any]:
        """The attributes of the ConvTransposeBackwardWeights op that computes it."""
        return self._op.attrs

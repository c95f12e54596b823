"""One-call functions: build the op (cached by attributes) and run it.

Each takes the op's inputs positionally and its attributes as keywords, exactly as the op
classes in :mod:`onednn_convt.ops` do.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np
from numpy.typing import ArrayLike

from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights, _Op


@functools.lru_cache(maxsize=128)
def _cached(cls: Any, items: tuple[tuple[str, Any], ...], types: Any) -> _Op:
    op: _Op = cls(**dict(items))  # cls: an op class (mypy does not see type[_Op] as Hashable)
    return op


def _types(v: Any) -> Any:
    """The types inside an attribute value: True == 1 == 1.0 must not share a cached op."""
    return tuple(_types(x) for x in v) if isinstance(v, (list, tuple)) else type(v)


def _op(cls: Any, attrs: dict[str, Any]) -> Any:
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    try:
        hash(items)
    except TypeError:  # an unhashable value: let the constructor report it
        return cls(**attrs)
    return _cached(cls, items, tuple((k, _types(v)) for k, v in items))


def conv_transpose(
    src: ArrayLike, weights: ArrayLike, bias: Optional[ArrayLike] = None, *,
    out: Optional[np.ndarray] = None, **attrs: Any,
) -> np.ndarray:
    """``ConvTranspose(**attrs)(src, weights, bias, out=out)``: see :class:`ConvTranspose`."""
    return _op(ConvTranspose, attrs)(src, weights, bias, out=out)  # type: ignore[no-any-return]


def conv_transpose_backward_data(
    diff_dst: ArrayLike, weights: ArrayLike, *, out: Optional[np.ndarray] = None, **attrs: Any
) -> np.ndarray:
    """``ConvTransposeBackwardData(**attrs)(diff_dst, weights, out=out)``."""
    return _op(ConvTransposeBackwardData, attrs)(diff_dst, weights, out=out)  # type: ignore[no-any-return]


def conv_transpose_backward_weights(
    src: ArrayLike, diff_dst: ArrayLike, weights_shape: Optional[ArrayLike] = None, /, *,
    out: Optional[np.ndarray] = None, **attrs: Any,
) -> np.ndarray:
    """``ConvTransposeBackwardWeights(**attrs)(src, diff_dst, weights_shape, out=out)``.

    ``weights_shape`` (positional) wins over a ``weights_shape=`` attribute; the inputs are
    positional-only so that both can be given.
    """
    return _op(ConvTransposeBackwardWeights, attrs)(src, diff_dst, weights_shape, out=out)  # type: ignore[no-any-return]

"""One-call functions: build the op (cached by attributes) and run it.

Each takes the op's inputs positionally and its attributes as keywords, exactly as the op
classes in :mod:`onednn_convt.ops` do.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, overload

import numpy as np
from numpy.typing import ArrayLike

from .interop import Array
from .op_base import Op
from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights


@functools.lru_cache(maxsize=128)
def _cached(cls: Any, items: tuple[tuple[str, Any], ...], types: Any) -> Op:
    op: Op = cls(**dict(items))  # cls: an op class (mypy does not see type[Op] as Hashable)
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


@overload
def conv_transpose(src: Array, weights: Array, bias: Optional[Array] = None, *,
                   out: Optional[Array] = None, **attrs: Any) -> Array: ...
@overload
def conv_transpose(src: ArrayLike, weights: ArrayLike, bias: Optional[ArrayLike] = None, *,
                   out: Optional[np.ndarray] = None, **attrs: Any) -> np.ndarray: ...
def conv_transpose(src: Any, weights: Any, bias: Any = None, *, out: Any = None, **attrs: Any) -> Any:
    """``ConvTranspose(**attrs)(src, weights, bias, out=out)``: see :class:`ConvTranspose`."""
    return _op(ConvTranspose, attrs)(src, weights, bias, out=out)


@overload
def conv_transpose_backward_data(diff_dst: Array, weights: Array, *, out: Optional[Array] = None,
                                 **attrs: Any) -> Array: ...
@overload
def conv_transpose_backward_data(diff_dst: ArrayLike, weights: ArrayLike, *,
                                 out: Optional[np.ndarray] = None, **attrs: Any) -> np.ndarray: ...
def conv_transpose_backward_data(diff_dst: Any, weights: Any, *, out: Any = None, **attrs: Any) -> Any:
    """``ConvTransposeBackwardData(**attrs)(diff_dst, weights, out=out)``."""
    return _op(ConvTransposeBackwardData, attrs)(diff_dst, weights, out=out)


@overload
def conv_transpose_backward_weights(src: Array, diff_dst: Array, weights_shape: Optional[ArrayLike] = None, /,
                                    *, out: Optional[Array] = None, **attrs: Any) -> Array: ...
@overload
def conv_transpose_backward_weights(src: ArrayLike, diff_dst: ArrayLike, weights_shape: Optional[ArrayLike] = None,
                                    /, *, out: Optional[np.ndarray] = None, **attrs: Any) -> np.ndarray: ...
def conv_transpose_backward_weights(
    src: Any, diff_dst: Any, weights_shape: Any = None, /, *, out: Any = None, **attrs: Any,
) -> Any:
    """``ConvTransposeBackwardWeights(**attrs)(src, diff_dst, weights_shape, out=out)``.

    ``weights_shape`` (positional) wins over a ``weights_shape=`` attribute; the inputs are
    positional-only so that both can be given.
    """
    return _op(ConvTransposeBackwardWeights, attrs)(src, diff_dst, weights_shape, out=out)

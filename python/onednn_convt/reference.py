"""NumPy float64 reference implementation (the oracle) of oneDNN Graph's ConvTranspose ops.

This module is the ground truth that every test and benchmark of ``onednn_convt`` compares
against. It is written directly from the mathematical definition of the three oneDNN Graph
operations

* ``ConvTranspose`` (:func:`conv_transpose`),
* ``ConvTransposeBackwardData`` (:func:`conv_transpose_backward_data`),
* ``ConvTransposeBackwardWeights`` (:func:`conv_transpose_backward_weights`),

with the post-ops and (de)quantization of a fused ConvTranspose
(:func:`fused_conv_transpose`, :func:`post_op`, :func:`quantize`, :func:`dequantize`),
and depends on nothing but NumPy and the standard library (in particular, not on oneDNN and
not on the rest of this package). All inputs are converted to ``float64`` and every result is
a ``float64`` array.

Layouts (``X`` stands for the spatial dims: ``W``, ``H, W`` or ``D, H, W``):

* ``data_format="NCX"``: activations are ``(N, C, X...)``; ``"NXC"``: ``(N, X..., C)``.
* ``weights_format="IOX"``: weights are ``(IC, OC/G, X...)`` (PyTorch's ConvTranspose layout);
  ``"XOI"``: ``(X..., OC/G, IC)``. ``IC`` is the full input channel count, ``OC/G`` the output
  channels per group. Weight ``W[i, o, k...]`` connects input channel ``i`` to output channel
  ``g * (OC/G) + o`` with ``g = i // (IC/G)``.

Per spatial dim, with stride ``s``, dilation ``d``, kernel ``k``, ``ek = d * (k - 1) + 1``,
pads ``pb``/``pe`` and output padding ``op``, the forward output size is
``s * (src - 1) + ek - pb - pe + op``: the input is scattered into a "full" buffer
(``full[s*i + j*d] += src[i] * W[j]``) which is then read at ``full[t + pb]`` with zeros outside.
The two backward ops are the exact adjoints of that map with respect to ``src`` and ``weights``:
sums over the taps that land inside ``diff_dst`` only (a tap in the pads or the cropped part
does not exist, so an Inf there meets no zero and makes no NaN).

Internally everything is computed channels-last with weights as ``(X..., IC, OC/G)``; the
computation is vectorised over batch, pixels and channels (one batched matmul per kernel
position), and Python only loops over kernel positions.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Union

import numpy as np
import numpy.typing as npt

__all__ = [
    "conv_transpose",
    "conv_transpose_backward_data",
    "conv_transpose_backward_weights",
    "dequantize",
    "dequantize_weights",
    "fused_conv_transpose",
    "post_op",
    "quantize",
    "resolve_pads",
]

IntOrInts = Union[int, Sequence[int]]
"""A single int (broadcast to every spatial dim) or one int per spatial dim."""

_F64 = npt.NDArray[np.float64]

_DATA_FORMATS = ("NCX", "NXC")
_WEIGHTS_FORMATS = ("IOX", "XOI")
_AUTO_PADS = {
    "none": "none",
    "same_upper": "same_upper",
    "same_lower": "same_lower",
    "valid": "valid",
}


# --------------------------------------------------------------------------------------------
# Attribute validation helpers
# --------------------------------------------------------------------------------------------


def _r(value: object) -> str:
    """``repr(value)`` for a message, cut to a readable length (a huge int or string)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:30]}...{text[-15:]} ({len(text)} characters)"


def _as_int(fn: str, name: str, value: object) -> int:
    """Converts ``value`` to a Python int, rejecting bools, floats and other non-integers."""
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{fn}: {name} must be an integer, got {_r(value)}")  # noqa: TRY004
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(f"{fn}: {name} must be an integer, got {_r(value)}") from None


def _int_list(fn: str, name: str, value: object, ndim: int, minimum: int) -> list[int]:
    """Broadcasts an int (or checks a sequence) to ``ndim`` ints, each ``>= minimum``."""
    if isinstance(value, (str, bytes)):
        msg = f"{fn}: {name} must be an int or a sequence of ints, got {_r(value)}"
        raise ValueError(msg)  # noqa: TRY004
    if isinstance(value, (Sequence, np.ndarray)) and np.ndim(value) != 0:  # a 0-d array is one int
        items = list(value)
        if len(items) != ndim:
            raise ValueError(
                f"{fn}: {name} must have {ndim} entries (one per spatial dim), "
                f"got {len(items)}: {_r(value)}"
            )
        result = [_as_int(fn, name, v) for v in items]
    else:
        result = [_as_int(fn, name, value)] * ndim
    for v in result:
        if v < minimum:
            raise ValueError(f"{fn}: every entry of {name} must be >= {minimum}, got {result}")
    return result


def _zeros(fn: str, shape: Sequence[int]) -> _F64:
    """A float64 buffer of zeros; MemoryError naming ``fn`` where it cannot be had (sizes
    from huge attributes: NumPy's own error names no function)."""
    try:
        return np.zeros(tuple(shape), dtype=np.float64)
    except (MemoryError, ValueError) as exc:
        raise MemoryError(f"{fn}: cannot allocate a float64 buffer of shape {tuple(shape)} ({exc})") from None


def _check_formats(fn: str, data_format: object, weights_format: object) -> tuple[str, str]:
    """``data_format`` as NCX/NXC and ``weights_format`` as IOX/XOI, given in any case."""
    if not isinstance(data_format, str) or data_format.upper() not in _DATA_FORMATS:
        raise ValueError(f"{fn}: data_format must be one of {_DATA_FORMATS} (any case), got {_r(data_format)}")
    if not isinstance(weights_format, str) or weights_format.upper() not in _WEIGHTS_FORMATS:
        raise ValueError(
            f"{fn}: weights_format must be one of {_WEIGHTS_FORMATS} (any case), got {_r(weights_format)}"
        )
    return data_format.upper(), weights_format.upper()


def _normalize_auto_pad(fn: str, auto_pad: object) -> str:
    """Returns the lower-case auto_pad mode, raising on unknown values."""
    key = auto_pad.lower() if isinstance(auto_pad, str) else None
    if key not in _AUTO_PADS:
        raise ValueError(
            f"{fn}: auto_pad must be one of 'None', 'SAME_UPPER', 'SAME_LOWER', 'VALID' "
            f"(case-insensitive), got {_r(auto_pad)}"
        )
    return _AUTO_PADS[key]


def _resolve_pads(
    fn: str,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str,
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
) -> tuple[list[int], list[int]]:
    """Applies the (already normalised) auto_pad rule to validated per-dim lists."""
    if auto_pad == "none":
        return list(pads_begin), list(pads_end)
    if auto_pad == "valid":
        return [0] * len(kernel), [0] * len(kernel)
    begin: list[int] = []
    end: list[int] = []
    for k, s, d in zip(kernel, strides, dilations):
        total = max(0, d * (k - 1) + 1 - s)
        pb = total // 2 if auto_pad == "same_upper" else (total + 1) // 2
        begin.append(pb)
        end.append(total - pb)
    return begin, end


def resolve_pads(
    kernel: IntOrInts,
    strides: IntOrInts,
    dilations: IntOrInts,
    auto_pad: str,
    pads_begin: IntOrInts,
    pads_end: IntOrInts,
) -> tuple[list[int], list[int]]:
    """Resolves the effective padding of a ConvTranspose op (shared by all three ops).

    The pads depend only on kernel size ``k``, dilation ``d`` and stride ``s`` (the forward
    ConvTranspose's rule). With ``ek = d * (k - 1) + 1`` and ``total = max(0, ek - s)``:
    ``SAME_UPPER`` gives ``pb = total // 2``, ``SAME_LOWER`` gives ``pb = ceil(total / 2)``,
    and ``pe = total - pb`` for both; ``VALID`` gives zeros; ``None`` returns the given pads.

    Args:
        kernel: Spatial kernel sizes, one per spatial dim (an int means one spatial dim).
        strides: Strides (>= 1), an int or one per spatial dim.
        dilations: Dilations (>= 1, 1 = none), an int or one per spatial dim.
        auto_pad: ``"None"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``"VALID"``
            (case-insensitive).
        pads_begin: Explicit leading pads (>= 0), used when ``auto_pad`` is ``"None"``.
        pads_end: Explicit trailing pads (>= 0), used when ``auto_pad`` is ``"None"``.

    Returns:
        ``(pads_begin, pads_end)`` as two lists with one int per spatial dim.

    Raises:
        ValueError: On unknown ``auto_pad``, list attributes of the wrong length, kernel sizes,
            strides or dilations < 1, or negative pads.
    """
    fn = "resolve_pads"
    if isinstance(kernel, (Sequence, np.ndarray)) and not isinstance(kernel, (str, bytes)):
        ndim = len(kernel)
    else:
        ndim = 1
    if ndim < 1:
        raise ValueError(f"{fn}: kernel must have at least one spatial dim, got {_r(kernel)}")
    return _resolve_pads(
        fn,
        _int_list(fn, "kernel", kernel, ndim, 1),
        _int_list(fn, "strides", strides, ndim, 1),
        _int_list(fn, "dilations", dilations, ndim, 1),
        _normalize_auto_pad(fn, auto_pad),
        _int_list(fn, "pads_begin", pads_begin, ndim, 0),
        _int_list(fn, "pads_end", pads_end, ndim, 0),
    )


# --------------------------------------------------------------------------------------------
# Tensor layout helpers
# --------------------------------------------------------------------------------------------


def _as_f64(fn: str, name: str, x: npt.ArrayLike) -> _F64:
    """Converts an array-like of real numbers to a float64 ndarray. Complex, structured,
    string, date and masked arrays are refused: converting them would drop the imaginary
    part, the fields or the mask without a word."""
    if isinstance(x, np.ma.MaskedArray):
        raise ValueError(f"{fn}: {name} is a masked array; masks are not supported (pass {name}.filled(value))")  # noqa: TRY004
    try:
        a = np.asarray(x)
        extension = a.dtype.kind == "V" and a.dtype.names is None and a.dtype.type.__module__ != "numpy"
        if a.dtype.kind not in "biufO" and not extension:  # ml_dtypes' bfloat16 is kind "V"
            raise TypeError(f"dtype {a.dtype} does not hold real numbers")
        return np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{fn}: {name} must be convertible to a float64 array ({exc})") from None


def _check_activation(fn: str, name: str, x: _F64, data_format: str) -> int:
    """Checks an activation tensor's rank (3..5) and spatial sizes; returns the spatial rank."""
    if not 3 <= x.ndim <= 5:
        raise ValueError(
            f"{fn}: {name} must have rank 3, 4 or 5 ({data_format} layout with 1 to 3 spatial "
            f"dims), got rank {x.ndim} with shape {x.shape}"
        )
    spatial = _spatial_shape(x.shape, data_format)
    if min(spatial) < 1:
        raise ValueError(f"{fn}: {name} spatial dims must all be >= 1, got shape {x.shape}")
    return x.ndim - 2


def _spatial_shape(shape: Sequence[int], data_format: str) -> list[int]:
    """Spatial dims of an activation shape in ``data_format``."""
    return list(shape[2:]) if data_format == "NCX" else list(shape[1:-1])


def _channels(shape: Sequence[int], data_format: str) -> int:
    """Channel dim of an activation shape in ``data_format``."""
    return int(shape[1]) if data_format == "NCX" else int(shape[-1])


def _to_channels_last(x: _F64, data_format: str) -> _F64:
    """``data_format`` activations -> ``(N, X..., C)``."""
    return np.moveaxis(x, 1, -1) if data_format == "NCX" else x


def _from_channels_last(x: _F64, data_format: str) -> _F64:
    """``(N, X..., C)`` -> ``data_format`` activations (contiguous)."""
    out = np.moveaxis(x, -1, 1) if data_format == "NCX" else x
    return np.ascontiguousarray(out)


def _weights_dims(shape: Sequence[int], weights_format: str) -> tuple[int, int, list[int]]:
    """Returns ``(IC, OC/G, kernel)`` of a weights shape in ``weights_format``."""
    if weights_format == "IOX":
        return int(shape[0]), int(shape[1]), [int(k) for k in shape[2:]]
    return int(shape[-1]), int(shape[-2]), [int(k) for k in shape[:-2]]


def _weights_to_kio(w: _F64, weights_format: str) -> _F64:
    """``weights_format`` weights -> ``(X..., IC, OC/G)``."""
    if weights_format == "IOX":
        return np.moveaxis(w, (0, 1), (-2, -1))
    return np.swapaxes(w, -1, -2)


def _weights_from_kio(w: _F64, weights_format: str) -> _F64:
    """``(X..., IC, OC/G)`` -> ``weights_format`` weights (contiguous)."""
    out = np.moveaxis(w, (-2, -1), (0, 1)) if weights_format == "IOX" else np.swapaxes(w, -1, -2)
    return np.ascontiguousarray(out)


def _check_weights_shape(
    fn: str, name: str, shape: Sequence[int], ndim: int, weights_format: str
) -> tuple[int, int, list[int]]:
    """Validates a weights shape against the spatial rank; returns ``(IC, OC/G, kernel)``."""
    if len(shape) != ndim + 2:
        raise ValueError(
            f"{fn}: {name} must have rank {ndim + 2} ({weights_format} layout for {ndim} spatial "
            f"dim(s), matching the activations), got rank {len(shape)} with shape {tuple(shape)}"
        )
    ic, o, kernel = _weights_dims(shape, weights_format)
    if ic < 1 or o < 1 or min(kernel) < 1:
        raise ValueError(
            f"{fn}: {name} dims must all be >= 1 ({weights_format} layout), got {tuple(shape)}"
        )
    return ic, o, kernel


def _check_groups(fn: str, groups: object, ic: int, ic_name: str) -> int:
    """Validates ``groups`` (>= 1, divides ``ic``)."""
    g = _as_int(fn, "groups", groups)
    if g < 1:
        raise ValueError(f"{fn}: groups must be >= 1, got {g}")
    if ic % g != 0:
        raise ValueError(f"{fn}: {ic_name} ({ic}) must be divisible by groups ({g})")
    return g


def _window(
    start: Sequence[int], count: Sequence[int], strides: Sequence[int]
) -> tuple[slice, ...]:
    """Index tuple selecting ``count`` positions ``start + s*i`` per spatial dim, channels-last."""
    spatial = tuple(slice(b, b + s * (c - 1) + 1, s) for b, c, s in zip(start, count, strides))
    return (slice(None), *spatial, slice(None))


def _taps_inside(
    start: Sequence[int], pads_begin: Sequence[int], lengths: Sequence[int],
    strides: Sequence[int], count: Sequence[int],
) -> tuple[tuple[slice, ...], tuple[slice, ...], list[int]] | None:
    """For one kernel position (offset ``start`` in the forward op's "full" buffer), the
    ``src`` positions ``i`` whose tap lands inside ``diff_dst`` (``0 <= start + s*i - pb <
    len``), as index tuples into channels-last ``src`` and ``diff_dst`` and their counts per
    dim; None when there are none. Taps outside ``diff_dst`` (in the pads, the output padding
    or past the end) do not exist: they are left out, not multiplied by zero (0 * Inf = NaN).
    """
    src_idx, dd_idx, counts = [], [], []
    for b, pb, t, st, c in zip(start, pads_begin, lengths, strides, count):
        lo = max(0, -((b - pb) // st))  # ceil((pb - b) / st)
        hi = min(c, (pb + t - 1 - b) // st + 1)
        if hi <= lo:
            return None
        src_idx.append(slice(lo, hi))
        first = b + st * lo - pb
        dd_idx.append(slice(first, first + st * (hi - lo - 1) + 1, st))
        counts.append(hi - lo)
    return (slice(None), *src_idx, slice(None)), (slice(None), *dd_idx, slice(None)), counts


class _Common:
    """Validated attributes shared by the three ops."""

    def __init__(
        self,
        fn: str,
        ndim: int,
        kernel: list[int],
        strides: object,
        pads_begin: object,
        pads_end: object,
        dilations: object,
        auto_pad: object,
    ) -> None:
        self.strides = _int_list(fn, "strides", strides, ndim, 1)
        self.dilations = _int_list(fn, "dilations", dilations, ndim, 1)
        begin = _int_list(fn, "pads_begin", pads_begin, ndim, 0)
        end = _int_list(fn, "pads_end", pads_end, ndim, 0)
        mode = _normalize_auto_pad(fn, auto_pad)
        self.kernel = kernel
        self.pads_begin, self.pads_end = _resolve_pads(
            fn, kernel, self.strides, self.dilations, mode, begin, end
        )
        self.ek = [d * (k - 1) + 1 for k, d in zip(kernel, self.dilations)]
        self.starts = [
            tuple(j * d for j, d in zip(kpos, self.dilations)) for kpos in np.ndindex(*kernel)
        ]
        self.kpositions = list(np.ndindex(*kernel))


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------


def conv_transpose(
    src: npt.ArrayLike,
    weights: npt.ArrayLike,
    bias: npt.ArrayLike | None = None,
    *,
    strides: IntOrInts = 1,
    pads_begin: IntOrInts = 0,
    pads_end: IntOrInts = 0,
    dilations: IntOrInts = 1,
    auto_pad: str = "None",
    output_padding: IntOrInts = 0,
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XOI",
) -> _F64:
    """Forward ConvTranspose (oneDNN Graph ``ConvTranspose``) in float64.

    Per spatial dim the output size is ``s * (src - 1) + ek - pb - pe + op`` and the output
    channel count is ``OC = (OC/G) * groups``. ``dst[t] = full[t + pb]`` where
    ``full[s*i + j*d] += src[i] * W[j]`` (summed over the group's input channels) and positions
    outside ``full`` read as zero; then ``bias`` is added per output channel.

    Args:
        src: Input activations, ``(N, IC, X...)`` for ``NCX`` or ``(N, X..., IC)`` for ``NXC``;
            1 to 3 spatial dims.
        weights: ``(IC, OC/G, X...)`` for ``IOX`` or ``(X..., OC/G, IC)`` for ``XOI``.
        bias: Optional 1-D array of length ``OC``.
        strides: Strides (>= 1), an int or one per spatial dim.
        pads_begin: Leading pads (>= 0), an int or one per spatial dim (ignored unless
            ``auto_pad`` is ``"None"``).
        pads_end: Trailing pads (>= 0); may exceed the kernel extent, which crops the output.
        dilations: Dilations (>= 1, 1 = none), an int or one per spatial dim.
        auto_pad: ``"None"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``"VALID"``
            (case-insensitive); see :func:`resolve_pads`.
        output_padding: Extra trailing output size (>= 0), an int or one per spatial dim.
        groups: Number of groups (>= 1), dividing ``IC``.
        data_format: ``"NCX"`` or ``"NXC"``, layout of ``src`` and of the result.
        weights_format: ``"IOX"`` or ``"XOI"``, layout of ``weights``.

    Returns:
        ``dst`` as float64 in ``data_format``: ``(N, OC, X'...)`` or ``(N, X'..., OC)``.

    Raises:
        ValueError: On bad ranks, inconsistent channel counts, invalid attributes, or an
            output size < 1.
    """
    fn = "conv_transpose"
    data_format, weights_format = _check_formats(fn, data_format, weights_format)
    x = _as_f64(fn, "src", src)
    w = _as_f64(fn, "weights", weights)
    ndim = _check_activation(fn, "src", x, data_format)
    ic_w, o, kernel = _check_weights_shape(fn, "weights", w.shape, ndim, weights_format)
    ic = _channels(x.shape, data_format)
    if ic != ic_w:
        raise ValueError(
            f"{fn}: src has {ic} channels but weights ({weights_format}) expect IC={ic_w}"
        )
    g = _check_groups(fn, groups, ic, "src channels IC")
    attrs = _Common(fn, ndim, kernel, strides, pads_begin, pads_end, dilations, auto_pad)
    op = _int_list(fn, "output_padding", output_padding, ndim, 0)
    oc = o * g

    b: _F64 | None = None
    if bias is not None:
        b = _as_f64(fn, "bias", bias)
        if b.shape != (oc,):
            raise ValueError(f"{fn}: bias must be 1-D of length OC={oc}, got shape {b.shape}")

    in_sp = _spatial_shape(x.shape, data_format)
    full_len = [s * (n - 1) + e for s, n, e in zip(attrs.strides, in_sp, attrs.ek)]
    out_sp = [
        f - pb - pe + p for f, pb, pe, p in zip(full_len, attrs.pads_begin, attrs.pads_end, op)
    ]
    if min(out_sp) < 1:
        raise ValueError(
            f"{fn}: computed output spatial size {out_sp} must be >= 1 "
            f"(src spatial {in_sp}, kernel {kernel}, pads {attrs.pads_begin}/{attrs.pads_end})"
        )

    n = x.shape[0]
    icg = ic // g
    m = n * math.prod(in_sp)
    xg = _to_channels_last(x, data_format).reshape(m, g, icg).transpose(1, 0, 2)  # (G, M, ICg)
    wk = _weights_to_kio(w, weights_format)  # (X..., IC, OC/G)

    buf_len = [max(f, pb + t) for f, pb, t in zip(full_len, attrs.pads_begin, out_sp)]
    full = _zeros(fn, (n, *buf_len, oc))
    for kpos, start in zip(attrs.kpositions, attrs.starts):
        contrib = np.matmul(xg, wk[kpos].reshape(g, icg, o))  # (G, M, O)
        contrib = contrib.transpose(1, 0, 2).reshape(n, *in_sp, oc)
        full[_window(start, in_sp, attrs.strides)] += contrib
    crop = tuple(slice(pb, pb + t) for pb, t in zip(attrs.pads_begin, out_sp))
    dst = full[(slice(None), *crop, slice(None))]
    if b is not None:
        dst = dst + b
    return _from_channels_last(dst, data_format)


def conv_transpose_backward_data(
    diff_dst: npt.ArrayLike,
    weights: npt.ArrayLike,
    *,
    strides: IntOrInts = 1,
    pads_begin: IntOrInts = 0,
    pads_end: IntOrInts = 0,
    dilations: IntOrInts = 1,
    auto_pad: str = "None",
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XOI",
) -> _F64:
    """ConvTranspose backward w.r.t. data (oneDNN Graph ``ConvTransposeBackwardData``).

    The exact adjoint of :func:`conv_transpose` (without bias) w.r.t. ``src``. Per spatial dim
    ``diff_src`` has size ``floor((diff_dst + pb + pe - ek) / s) + 1`` and
    ``diff_src[n, ic, i] = sum_{o, j} diff_dst[n, g*(OC/G) + o, s*i + j*d - pb] * W[ic, o, j]``
    over the taps whose ``diff_dst`` index is in range (the others do not exist: a non-finite
    weight there does not make NaN).

    Args:
        diff_dst: Output gradient, ``(N, OC, X...)`` for ``NCX`` or ``(N, X..., OC)`` for
            ``NXC``; 1 to 3 spatial dims.
        weights: ``(IC, OC/G, X...)`` for ``IOX`` or ``(X..., OC/G, IC)`` for ``XOI``.
        strides: Strides (>= 1), an int or one per spatial dim.
        pads_begin: Leading pads (>= 0) of the forward op.
        pads_end: Trailing pads (>= 0) of the forward op.
        dilations: Dilations (>= 1, 1 = none), an int or one per spatial dim.
        auto_pad: ``"None"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``"VALID"``
            (case-insensitive); see :func:`resolve_pads`.
        groups: Number of groups (>= 1), dividing ``IC``.
        data_format: ``"NCX"`` or ``"NXC"``, layout of ``diff_dst`` and of the result.
        weights_format: ``"IOX"`` or ``"XOI"``, layout of ``weights``.

    Returns:
        ``diff_src`` as float64 in ``data_format``: ``(N, IC, X...)`` or ``(N, X..., IC)``.

    Raises:
        ValueError: On bad ranks, inconsistent channel counts, invalid attributes, or a
            ``diff_src`` size < 1.
    """
    fn = "conv_transpose_backward_data"
    data_format, weights_format = _check_formats(fn, data_format, weights_format)
    dd = _as_f64(fn, "diff_dst", diff_dst)
    w = _as_f64(fn, "weights", weights)
    ndim = _check_activation(fn, "diff_dst", dd, data_format)
    ic, o, kernel = _check_weights_shape(fn, "weights", w.shape, ndim, weights_format)
    g = _check_groups(fn, groups, ic, "weights' IC")
    oc = _channels(dd.shape, data_format)
    if oc != o * g:
        raise ValueError(
            f"{fn}: diff_dst has {oc} channels but weights ({weights_format}) with OC/G={o} and "
            f"groups={g} expect OC={o * g}"
        )
    attrs = _Common(fn, ndim, kernel, strides, pads_begin, pads_end, dilations, auto_pad)

    out_sp = _spatial_shape(dd.shape, data_format)
    in_sp = [
        (t + pb + pe - e) // s + 1
        for t, pb, pe, e, s in zip(
            out_sp, attrs.pads_begin, attrs.pads_end, attrs.ek, attrs.strides
        )
    ]
    if min(in_sp) < 1:
        raise ValueError(
            f"{fn}: computed diff_src spatial size {in_sp} must be >= 1 "
            f"(diff_dst spatial {out_sp}, kernel {kernel}, "
            f"pads {attrs.pads_begin}/{attrs.pads_end})"
        )

    n = dd.shape[0]
    icg = ic // g
    dd_cl = _to_channels_last(dd, data_format)  # (N, Y..., OC)
    wk = _weights_to_kio(w, weights_format)  # (X..., IC, OC/G)

    acc = _zeros(fn, (n, *in_sp, g, icg))
    for kpos, start in zip(attrs.kpositions, attrs.starts):
        inside = _taps_inside(start, attrs.pads_begin, out_sp, attrs.strides, in_sp)
        if inside is None:
            continue
        src_idx, dd_idx, counts = inside
        m = n * math.prod(counts)
        slab = dd_cl[dd_idx].reshape(m, g, o).transpose(1, 0, 2)  # (G, M, O)
        contrib = np.matmul(slab, wk[kpos].reshape(g, icg, o).transpose(0, 2, 1))  # (G, M, ICg)
        acc[src_idx] += contrib.transpose(1, 0, 2).reshape(n, *counts, g, icg)
    diff_src = acc.reshape(n, *in_sp, ic)
    return _from_channels_last(diff_src, data_format)


def conv_transpose_backward_weights(
    src: npt.ArrayLike,
    diff_dst: npt.ArrayLike,
    weights_shape: Sequence[int],
    *,
    strides: IntOrInts = 1,
    pads_begin: IntOrInts = 0,
    pads_end: IntOrInts = 0,
    dilations: IntOrInts = 1,
    auto_pad: str = "None",
    groups: int = 1,
    data_format: str = "NXC",
    weights_format: str = "XOI",
) -> _F64:
    """ConvTranspose backward w.r.t. weights (oneDNN Graph ``ConvTransposeBackwardWeights``).

    The exact adjoint of :func:`conv_transpose` (without bias) w.r.t. ``weights``:
    ``diff_W[ic, o, j] = sum_{n, i} src[n, ic, i] * diff_dst[n, g*(OC/G) + o, s*i + j*d - pb]``
    over the taps whose ``diff_dst`` index is in range (the others do not exist: a non-finite
    weight there does not make NaN). The spatial sizes of ``src`` and
    ``diff_dst`` are not required to match the forward shape formula; the sum above is
    well-defined for any sizes.

    Args:
        src: Forward input, ``(N, IC, X...)`` for ``NCX`` or ``(N, X..., IC)`` for ``NXC``.
        diff_dst: Output gradient, ``(N, OC, X'...)`` for ``NCX`` or ``(N, X'..., OC)`` for
            ``NXC``.
        weights_shape: Shape of the weights in ``weights_format`` order:
            ``(IC, OC/G, X...)`` for ``IOX`` or ``(X..., OC/G, IC)`` for ``XOI``; the kernel
            sizes are taken from it.
        strides: Strides (>= 1), an int or one per spatial dim.
        pads_begin: Leading pads (>= 0) of the forward op.
        pads_end: Trailing pads (>= 0) of the forward op; validated, but the weights gradient
            depends on the resolved ``pads_begin`` alone.
        dilations: Dilations (>= 1, 1 = none), an int or one per spatial dim.
        auto_pad: ``"None"``, ``"SAME_UPPER"``, ``"SAME_LOWER"`` or ``"VALID"``
            (case-insensitive); see :func:`resolve_pads`.
        groups: Number of groups (>= 1), dividing ``IC``.
        data_format: ``"NCX"`` or ``"NXC"``, layout of ``src`` and ``diff_dst``.
        weights_format: ``"IOX"`` or ``"XOI"``, layout of ``weights_shape`` and of the result.

    Returns:
        ``diff_weights`` as float64 in ``weights_format`` with shape ``weights_shape``.

    Raises:
        ValueError: On bad ranks, mismatched batch sizes, inconsistent channel counts or
            invalid attributes.
    """
    fn = "conv_transpose_backward_weights"
    data_format, weights_format = _check_formats(fn, data_format, weights_format)
    x = _as_f64(fn, "src", src)
    dd = _as_f64(fn, "diff_dst", diff_dst)
    ndim = _check_activation(fn, "src", x, data_format)
    if dd.ndim != x.ndim:
        raise ValueError(
            f"{fn}: diff_dst must have the same rank as src ({x.ndim}), got rank {dd.ndim}"
        )
    _check_activation(fn, "diff_dst", dd, data_format)
    if dd.shape[0] != x.shape[0]:
        raise ValueError(
            f"{fn}: diff_dst batch size ({dd.shape[0]}) must equal src batch size ({x.shape[0]})"
        )
    if isinstance(weights_shape, (str, bytes)) or not isinstance(
        weights_shape, (Sequence, np.ndarray)
    ):
        msg = f"{fn}: weights_shape must be a sequence of ints, got {_r(weights_shape)}"
        raise ValueError(msg)  # noqa: TRY004
    w_shape = tuple(_as_int(fn, "weights_shape", v) for v in weights_shape)
    ic_w, o, kernel = _check_weights_shape(fn, "weights_shape", w_shape, ndim, weights_format)
    ic = _channels(x.shape, data_format)
    if ic != ic_w:
        raise ValueError(
            f"{fn}: src has {ic} channels but weights_shape ({weights_format}) has IC={ic_w}"
        )
    g = _check_groups(fn, groups, ic, "src channels IC")
    oc = _channels(dd.shape, data_format)
    if oc != o * g:
        raise ValueError(
            f"{fn}: diff_dst has {oc} channels but weights_shape ({weights_format}) with "
            f"OC/G={o} and groups={g} expects OC={o * g}"
        )
    attrs = _Common(fn, ndim, kernel, strides, pads_begin, pads_end, dilations, auto_pad)

    in_sp = _spatial_shape(x.shape, data_format)
    out_sp = _spatial_shape(dd.shape, data_format)
    n = x.shape[0]
    icg = ic // g
    x_cl = _to_channels_last(x, data_format)  # (N, X..., IC)
    dd_cl = _to_channels_last(dd, data_format)  # (N, Y..., OC)

    dw = _zeros(fn, (*kernel, ic, o))
    for kpos, start in zip(attrs.kpositions, attrs.starts):
        inside = _taps_inside(start, attrs.pads_begin, out_sp, attrs.strides, in_sp)
        if inside is None:
            continue  # this tap never lands inside diff_dst: its gradient is 0
        src_idx, dd_idx, counts = inside
        m = n * math.prod(counts)
        xg_t = x_cl[src_idx].reshape(m, g, icg).transpose(1, 2, 0)  # (G, ICg, M)
        slab = dd_cl[dd_idx].reshape(m, g, o).transpose(1, 0, 2)  # (G, M, O)
        dw[kpos] = np.matmul(xg_t, slab).reshape(ic, o)
    return _weights_from_kio(dw, weights_format)


# -- post-ops and (de)quantization of a fused ConvTranspose ---------------------------------
# The library's definitions (oneDNN Graph op pages, eltwise and binary primitives), in
# float64. onednn_convt.post_ops names these kinds and their attributes; the math is here.


def _erf(x: _F64) -> _F64:
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), np.float64)


def _softplus(x: _F64, beta: float) -> _F64:
    return np.asarray(np.logaddexp(0.0, beta * x) / beta)


_UNARY: dict[str, Callable[[_F64, Mapping[str, float]], _F64]] = {
    "Abs": lambda x, a: np.abs(x),
    "Clamp": lambda x, a: np.clip(x, a["min"], a["max"]),
    "Elu": lambda x, a: np.where(x > 0, x, a["alpha"] * np.expm1(np.minimum(x, 0))),
    "Exp": lambda x, a: np.exp(x),
    "GELU": lambda x, a: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),  # the erf form
    "HardSigmoid": lambda x, a: np.clip(a["alpha"] * x + a["beta"], 0.0, 1.0),
    "HardSwish": lambda x, a: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),
    "LeakyReLU": lambda x, a: np.where(x >= 0, x, a["alpha"] * x),
    "Log": lambda x, a: np.log(x),
    "Mish": lambda x, a: x * np.tanh(_softplus(x, 1.0)),
    "ReLU": lambda x, a: np.maximum(x, 0.0),
    "Round": lambda x, a: np.rint(x),  # half to even, as the library's nearbyint
    "Sigmoid": lambda x, a: 0.5 * (1.0 + np.tanh(0.5 * x)),
    "SoftPlus": lambda x, a: _softplus(x, a.get("beta", 1.0)),
    "Sqrt": lambda x, a: np.sqrt(x),
    "Square": lambda x, a: np.square(x),
    "Tanh": lambda x, a: np.tanh(x),
}
_BINARY: dict[str, Callable[[_F64, _F64], _F64]] = {
    "Add": np.add, "Subtract": np.subtract, "Multiply": np.multiply, "Divide": np.divide,
    "Maximum": np.maximum, "Minimum": np.minimum,
}
#: post-op kinds the reference computes, unary then binary
UNARY_KINDS = tuple(_UNARY)
BINARY_KINDS = tuple(_BINARY)
_INT_RANGES = {"u8": (0, 255), "s8": (-128, 127)}


def post_op(kind: str, x: npt.ArrayLike, other: npt.ArrayLike | None = None, **attrs: float) -> _F64:
    """One post-op (library name ``kind``) on ``x``, float64. Binary kinds take ``other``,
    broadcast NumPy-style; unary kinds their f32 attributes (``alpha``, ``beta``, ``min``,
    ``max``). Non-finite results (Log of a negative) are NaN or Inf, without warnings."""
    x64 = np.asarray(x, np.float64)
    with np.errstate(all="ignore"):
        if kind in _BINARY:
            if other is None:
                raise ValueError(f"reference.post_op: {kind} needs a second tensor")
            return np.asarray(_BINARY[kind](x64, np.asarray(other, np.float64)))
        if kind not in _UNARY:
            raise ValueError(f"reference.post_op: unknown kind {_r(kind)}")
        return np.asarray(_UNARY[kind](x64, attrs), np.float64)


def _along(values: Sequence[float], rank: int, axis: int, per_channel: bool) -> _F64:
    v = np.asarray(values, np.float64)
    if not per_channel:
        return v.reshape(())
    shape = [1] * rank
    shape[axis % rank] = v.size
    return v.reshape(shape)


def dequantize(x: npt.ArrayLike, scales: Sequence[float], zps: Sequence[int] | None = None,
               qtype: str = "per_tensor", axis: int = 1) -> _F64:
    """The library's Dequantize: ``(x - zps) * scales``, per tensor or along ``axis``."""
    x64 = np.asarray(x, np.float64)
    per = qtype == "per_channel"
    z = [0] * len(scales) if zps is None else zps
    return (x64 - _along(z, x64.ndim, axis, per)) * _along(scales, x64.ndim, axis, per)


def quantize(x: npt.ArrayLike, scales: Sequence[float], zps: Sequence[int] | None = None,
             dtype: str = "u8", qtype: str = "per_tensor", axis: int = 1) -> _F64:
    """The library's Quantize into ``dtype`` (``"u8"``/``"s8"``): round half to even of
    ``x / scales + zps``, saturated; float64 integers."""
    x64 = np.asarray(x, np.float64)
    per = qtype == "per_channel"
    z = [0] * len(scales) if zps is None else zps
    lo, hi = _INT_RANGES[dtype]
    with np.errstate(all="ignore"):
        return np.clip(np.rint(x64 / _along(scales, x64.ndim, axis, per) + _along(z, x64.ndim, axis, per)), lo, hi)


def dequantize_weights(w: npt.ArrayLike, scales: Sequence[float], groups: int = 1,
                       weights_format: str = "XOI") -> _F64:
    """float64 ConvTranspose weights from s8 ``w``: one scale (per tensor) or one per output
    channel, OC = O * groups, group-major (channel ``g * O + o``), as the library applies
    per-channel weight scales."""
    w64 = np.asarray(w, np.float64)
    if len(scales) == 1:
        return w64 * float(scales[0])
    rank = w64.ndim
    i_axis, o_axis = (0, 1) if weights_format == "IOX" else (rank - 1, rank - 2)
    ic, o = w64.shape[i_axis], w64.shape[o_axis]
    per_input = np.repeat(np.asarray(scales, np.float64).reshape(groups, o), ic // groups, axis=0)
    shape = [1] * rank
    shape[i_axis], shape[o_axis] = ic, o
    return w64 * (per_input.T if i_axis > o_axis else per_input).reshape(shape)


def fused_conv_transpose(
    src: npt.ArrayLike,
    weights: npt.ArrayLike,
    bias: npt.ArrayLike | None = None,
    post_inputs: Sequence[npt.ArrayLike] = (),
    *,
    post_ops: Sequence[object] = (),
    src_dequantize: object | None = None,
    weights_dequantize: object | None = None,
    dst_quantize: object | None = None,
    **attrs: object,
) -> _F64:
    """A fused ConvTranspose in float64: dequantize (int8), :func:`conv_transpose` with
    ``attrs``, the post-ops in order, quantize.

    ``post_ops`` are objects with ``kind``, ``attrs`` and ``dequantize`` (as
    ``onednn_convt.PostOp``); a binary one takes the next of ``post_inputs``. The
    quantization arguments have ``scales``, ``zps``, ``qtype``, ``axis`` (``dst_quantize``
    also ``dtype``), as ``onednn_convt.Dequantize`` / ``Quantize``; weights scales run over
    the output channels (:func:`dequantize_weights`). An int8 result is float64 integers.
    """

    def deq(q: object, x: npt.ArrayLike) -> _F64:
        return dequantize(x, q.scales, q.zps, q.qtype, q.axis)  # type: ignore[attr-defined]

    groups = int(attrs.get("groups", 1))  # type: ignore[call-overload]
    weights_format = str(attrs.get("weights_format", "XOI"))
    if src_dequantize is not None:
        src = deq(src_dequantize, src)
    if weights_dequantize is not None:
        weights = dequantize_weights(weights, weights_dequantize.scales, groups, weights_format)  # type: ignore[attr-defined]
    y = conv_transpose(src, weights, bias, **attrs)  # type: ignore[arg-type]
    operands = iter(post_inputs)
    for p in post_ops:
        kind = p.kind  # type: ignore[attr-defined]
        other = None
        if kind in _BINARY:
            other = next(operands)
            if getattr(p, "dequantize", None) is not None:
                other = deq(p.dequantize, other)  # type: ignore[attr-defined]
        y = post_op(kind, y, other, **dict(p.attrs))  # type: ignore[attr-defined]
    if dst_quantize is not None:
        q = dst_quantize
        y = quantize(y, q.scales, q.zps, q.dtype, q.qtype, q.axis)  # type: ignore[attr-defined]
    return y

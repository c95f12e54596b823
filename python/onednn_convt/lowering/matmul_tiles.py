"""ConvTranspose and its BackwardData with stride equal to the kernel, as one MatMul.

With stride = kernel in every spatial dim, no pads, no output_padding, dilation 1 and
groups 1 (the 2x2 stride-2 upsampling of U-Nets), each output element of the forward op
gets exactly one tap: dst's spatial grid is src's, each cell split into a kernel-sized
block. So (P = the src spatial positions, K = the kernel taps):

    forward:   tiles = src (N*P, IC) @ W (IC, OC*K), then dst = depth-to-space(tiles) + bias
    backward:  diff_src (N*P, IC) = space-to-depth(diff_dst) (N*P, OC*K) @ W^T

the same products as the convolution, no zero taps, no overlap. Guarded problems on AMX run
this way (guards.AMX_STRIDE_NOT_BELOW_KERNEL): oneDNN 3.2's AMX convolution kernels fail
with stride >= kernel, its MatMul does not (tests/test_guards.py, the ISA scan).

As in :mod:`onednn_convt.matmul_lowering`, the product is mostly oriented so that the
weights are read as stored: IOX weights are (IC, OC*K), taps inner; XOI weights are
(K*OC, IC), taps outer; the activations are laid out to match, in one permuting copy per
side. (Activations always as the rows, with the weights read through a transposed view,
measured 1.3-2.3x slower on the U-Net BackwardData layers of benchmarks/guards.py.) The
exception is the forward with XOI weights in NXC, which reads the (small) weights transposed
so that its result's channel axis is already innermost for dst (1.7x faster there).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import dtypes


def applies(
    kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
    pads_end: Sequence[int], groups: int, output_padding: Sequence[int] = (),
) -> bool:
    """Whether the op's taps tile its output: stride = kernel, no pads, dilation 1, groups 1."""
    return (
        groups == 1
        and tuple(strides) == tuple(kernel)
        and all(d == 1 for d in dilations)
        and not any(pads_begin) and not any(pads_end) and not any(output_padding)
    )


def _axes(r: int, ncx: bool) -> tuple[int, int, tuple[int, ...], tuple[int, ...]]:
    """Axis numbers of an activation split as (N, C, x1, k1, ..., xr, kr) for NCX or
    (N, x1, k1, ..., xr, kr, C) for NXC: (N, C, the x axes, the k axes)."""
    first = 2 if ncx else 1
    xs = tuple(first + 2 * i for i in range(r))
    return 0, (1 if ncx else 2 * r + 1), xs, tuple(x + 1 for x in xs)


def _split_shape(n: int, c: int, xs: Sequence[int], kernel: Sequence[int], ncx: bool) -> tuple[int, ...]:
    pairs = tuple(v for x, k in zip(xs, kernel) for v in (x, k))
    return (n, c, *pairs) if ncx else (n, *pairs, c)


def _permuted(a: np.ndarray, shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """``a`` reshaped to ``shape`` and its axes permuted, as a new C-contiguous array.

    One copy, of same-size unsigned integers (NumPy copies bf16 element by element). Where
    the last axis stays last, its elements travel together as one wider integer: NumPy's
    copy loops run per innermost row, and a kernel-sized innermost row (2 taps) made the
    copy 6x slower (6.3 ms against 1.0 ms for 2M elements).
    """
    size = a.dtype.itemsize
    src = a.view(f"u{size}").reshape(shape)
    target = [shape[i] for i in axes]
    width = size * shape[-1]
    if axes[-1] == len(shape) - 1 and width in (2, 4, 8) and src.strides[-1] == size and src.flags.aligned:
        src, axes = src.view(f"u{width}")[..., 0], axes[:-1]
    else:
        width = size
    out = np.empty(target[: len(axes)], f"u{width}")
    np.copyto(out.transpose(np.argsort(axes)), src)
    return out.view(f"u{size}").reshape(target).view(a.dtype)


def conv_transpose(
    src_shape: Sequence[int], kernel: Sequence[int], oc: int, data_format: str, weights_format: str
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for a forward call. A bias is the
    MatMul's, repeated over the taps of each output channel; in the one form whose result
    has the channels on its rows (XOI weights, NCX) it is added in the finishing step in
    f32, as the 1-D MatMul lowering does."""
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, xs = src_shape[0], tuple(src_shape[2:] if ncx else src_shape[1:-1])
    ic = src_shape[1] if ncx else src_shape[-1]
    r, p, k = len(kernel), math.prod(xs), math.prod(kernel)
    # the rows (N, P, IC) @ W form, except XOI weights with NCX activations: W (K*OC, IC) @
    # cols (N, IC, P). In NXC, XOI weights are read transposed (small: oneDNN reorders them)
    # so that the result's OC axis is already innermost for dst (NXC/XOI U-Net layer: 1.7x
    # faster than the cols form, whose permuting copy gathers OC from a P-strided axis).
    rows_form = iox or not ncx
    # the library's result: (N, x..., OC, k...) for IOX, (N, x..., k..., OC) for XOI rows,
    # (N, k..., OC, x...) for XOI cols
    if iox:
        tiles, x_at, k_at, c_at = (n, *xs, oc, *kernel), range(1, 1 + r), range(2 + r, 2 + 2 * r), 1 + r
    elif rows_form:
        tiles, x_at, k_at, c_at = (n, *xs, *kernel, oc), range(1, 1 + r), range(1 + r, 1 + 2 * r), 1 + 2 * r
    else:
        tiles, x_at, k_at, c_at = (n, *kernel, oc, *xs), range(2 + r, 2 + 2 * r), range(1, 1 + r), 1 + r
    pairs = tuple(v for x, t in zip(x_at, k_at) for v in (x, t))
    to_dst = (0, c_at, *pairs) if ncx else (0, *pairs, c_at)
    dst_shape = (n, oc, *(x * t for x, t in zip(xs, kernel))) if ncx else (n, *(x * t for x, t in zip(xs, kernel)), oc)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        if rows_form:  # rows (N, P, IC) @ W (IC, OC*K) or W^T (IC, K*OC), + the bias per column
            rows = src.reshape(n, ic, p).transpose(0, 2, 1) if ncx else src.reshape(n, p, ic)
            bias = [np.repeat(args[2], k) if iox else np.tile(args[2], k)] if len(args) > 2 else []
            return [rows, w.reshape(ic, oc * k) if iox else w.reshape(k * oc, ic).T, *bias]
        return [w.reshape(k * oc, ic), src.reshape(n, ic, p)]  # W (K*OC, IC) @ cols (N, IC, P)

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        dst = _permuted(out, tiles, to_dst).reshape(dst_shape)
        bias = arrays[2] if len(arrays) > 2 and not rows_form else None  # rows: the MatMul added it
        if bias is None:
            return dst
        shape = (1, oc, *(1,) * r) if ncx else (1,) * (r + 1) + (oc,)
        wide = dtypes.to_f32(dst)  # in C++ (NumPy widens bf16 element by element); dst is ours
        with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN data: as natively
            wide += dtypes.to_f32(np.asarray(bias)).reshape(shape)
        return wide

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (n, p, oc * k) if rows_form else (n, k * oc, p),
        "prepared_elems": 0,  # views only
        "weights_arg": 1 if rows_form else 0,
    }


def conv_transpose_backward_data(
    dd_shape: Sequence[int], kernel: Sequence[int], ic: int, data_format: str, weights_format: str
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for a BackwardData call."""
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, ys = dd_shape[0], tuple(dd_shape[2:] if ncx else dd_shape[1:-1])
    oc = dd_shape[1] if ncx else dd_shape[-1]
    xs = tuple(y // t for y, t in zip(ys, kernel))
    r, p, k = len(kernel), math.prod(xs), math.prod(kernel)
    split = _split_shape(n, oc, xs, kernel, ncx)
    nn, c, x_axes, k_axes = _axes(r, ncx)
    # frames (OC, k..., N, x...) for IOX, (N, x..., k..., OC) for XOI: one copy either way
    frames = (c, *k_axes, nn, *x_axes) if iox else (nn, *x_axes, *k_axes, c)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dd, w = args[0], args[1]
        f = _permuted(dd, split, frames)
        if iox:  # W (IC, OC*K) @ frames (OC*K, N*P)
            return [w.reshape(ic, oc * k), f.reshape(oc * k, n * p)]
        return [f.reshape(n, p, k * oc), w.reshape(k * oc, ic)]  # frames (N, P, K*OC) @ W (K*OC, IC)

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        if iox:  # (IC, N, P)
            return _permuted(out, (ic, n, p), (1, 0, 2) if ncx else (1, 2, 0)).reshape(
                (n, ic, *xs) if ncx else (n, *xs, ic)
            )
        if ncx:  # (N, P, IC)
            return _permuted(out, (n, p, ic), (0, 2, 1)).reshape(n, ic, *xs)
        return out.reshape(n, *xs, ic)

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (ic, n * p) if iox else (n, p, ic),
        "prepared_elems": n * p * oc * k,  # the frames
        "weights_arg": 0 if iox else 1,
    }

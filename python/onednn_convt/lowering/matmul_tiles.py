"""ConvTranspose and its BackwardData with stride equal to the kernel, as one MatMul.

With stride = kernel in every spatial dim, no pads, no output_padding, dilation 1 and
groups 1 (the 2x2 stride-2 upsampling of U-Nets), each output element of the forward op
gets exactly one tap: dst's spatial grid is src's, each cell split into a kernel-sized
block. So (P = the src spatial positions, K = the kernel taps):

    forward:   tiles = src (N*P, IC) @ W (IC, OC*K), then dst = depth-to-space(tiles) + bias
    backward:  diff_src (N*P, IC) = space-to-depth(diff_dst) (N*P, OC*K) @ W^T
    weights:   dW (K*OC, IC) = space-to-depth(diff_dst)^T (K*OC, N*P) @ src (N*P, IC)
               (or its transpose: see conv_transpose_backward_weights)

the same products as the convolution, no zero taps, no overlap. Guarded problems on AMX run
this way (guards.AMX_STRIDE_NOT_BELOW_KERNEL): oneDNN 3.2's AMX convolution kernels fail
with stride >= kernel, its MatMul does not (tests/test_guards.py, the ISA scan).

In NXC the forward writes dst itself: one MatMul whose batch dims broadcast src over the
taps of all but the last spatial dim and the weights over the positions
(:func:`_conv_transpose_nxc`). BackwardData writes diff_src itself too: per sample in NCX,
as rows in NXC, the weights copied transposed where their layout is the other one (small;
:func:`conv_transpose_backward_data`). The forward in NCX reads src as stored, IOX weights
copied into the product's order (:func:`conv_transpose`). BackwardWeights computes the
XOI weights' (K*OC, IC), and for IOX ones in NCX where diff_dst is large beside src,
transposing that small result; other IOX ones in their own (IC, OC*K)
(:func:`conv_transpose_backward_weights`). The activations are laid out to match, in one
permuting copy per side (:mod:`.permute`: oneDNN's Reorder over the thread pool). (Weights
read through a transposed view, rather than copied, measured 1.3-2.3x slower on the U-Net
BackwardData layers of benchmarks/guards.py.)
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from .. import dtypes, memory, shapes
from .permute import permuted


def applies(
    kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
    pads_end: Sequence[int], groups: int, output_padding: Sequence[int] = (), src: Sequence[int] = (),
) -> bool:
    """Whether the op's taps tile its output: stride = kernel, no pads, dilation 1, groups 1.
    Where ``src`` (the forward src's spatial sizes) is given, a dim of one position counts
    as tiled whatever its stride: its one tile is the output (DCGAN's first layer, z as
    1x1 -> 4x4, is one MatMul of the batch and the channels)."""
    one = tuple(x == 1 for x in src) if src else (False,) * len(kernel)
    return (
        groups == 1
        and all(s == k or single for s, k, single in zip(strides, kernel, one))
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


def conv_transpose(
    src_shape: Sequence[int], kernel: Sequence[int], oc: int, data_format: str, weights_format: str,
    bias_in_matmul: bool = True, bias: bool = False,
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for a forward call (``bias``: the
    call has one). A bias is the MatMul's, repeated over the taps of each output channel; in
    the form whose result has the channels on its rows (NCX, but for IOX weights with a bias
    the MatMul takes), and wherever ``bias_in_matmul`` is false, it is added in the
    finishing step in f32, as the 1-D MatMul lowering does.

    In NCX the product reads src as stored, W (K*OC, IC) @ cols (N, IC, P), IOX weights
    copied into that order (K*OC*IC elements, small). Reading src through a transposed view
    instead, rows (N, P, IC) @ W (IC, OC*K) with the weights as stored, took 1.25-1.44x the
    time on an AMD Zen4 (U-Net's and the 3-D k2 s2 layers, f32 and bf16, the same bits);
    it stays where it saves a step: one src position (its result is dst), and a bias the
    MatMul adds.

    ``bias_in_matmul`` false is for f16: oneDNN 3.2 runs an f16 MatMul that has a bias on
    its reference kernel (``ref:any``; the Graph API takes no f32 bias for it): on a
    Sapphire Rapids CPU (avx512_core_fp16 and AMX dispatch alike) the U-Net layer with a
    bias took 6.6 s, without one 3.6 ms."""
    if data_format == "NXC":
        return _conv_transpose_nxc(src_shape, kernel, oc, weights_format, bias_in_matmul)
    n, xs, ic = src_shape[0], tuple(src_shape[2:]), src_shape[1]
    r, p, k = len(kernel), math.prod(xs), math.prod(kernel)
    copied = weights_format == "IOX" and not (p == 1 or bias and bias_in_matmul)
    iox = weights_format == "IOX" and not copied
    # rows: rows (N, P, IC) @ W (IC, OC*K), the library's result (N, x..., OC, k...);
    # else: W (K*OC, IC) @ cols (N, IC, P), the library's result (N, k..., OC, x...)
    if iox:
        tiles, x_at, k_at, c_at = (n, *xs, oc, *kernel), range(1, 1 + r), range(2 + r, 2 + 2 * r), 1 + r
    else:
        tiles, x_at, k_at, c_at = (n, *kernel, oc, *xs), range(2 + r, 2 + 2 * r), range(1, 1 + r), 1 + r
    to_dst = (0, c_at, *(v for x, t in zip(x_at, k_at) for v in (x, t)))
    dst_shape = (n, oc, *(x * t for x, t in zip(xs, kernel)))

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        if iox:  # rows (N, P, IC) @ W (IC, OC*K), + the bias per column
            bias = [np.repeat(args[2], k)] if len(args) > 2 and bias_in_matmul else []
            return [src.reshape(n, ic, p).transpose(0, 2, 1), w.reshape(ic, oc * k), *bias]
        if copied:  # (IC, OC, k...) -> (k..., OC, IC)
            w = np.ascontiguousarray(w.transpose(*range(2, 2 + r), 1, 0))
        return [w.reshape(k * oc, ic), src.reshape(n, ic, p)]  # W (K*OC, IC) @ cols (N, IC, P)

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        dst = permuted(out, tiles, to_dst).reshape(dst_shape)
        bias = arrays[2] if len(arrays) > 2 and not (iox and bias_in_matmul) else None  # else the MatMul's
        return _add_bias(dst, bias, oc, 1)

    one_tile = p == 1 and iox and bias_in_matmul  # the MatMul's result (N, 1, OC*K) is dst
    return {
        "attrs": {},
        "prepare": prepare,
        **({} if one_tile else {"finish": finish}),
        "library_shape": (n, p, oc * k) if iox else (n, k * oc, p),
        "prepared_elems": k * oc * ic if copied else 0,  # the weights copied, else views only
        # the permuting copy into dst, and an f32 one with a bias added here
        "finish_elems": math.prod(dst_shape) * (1 if iox and bias_in_matmul else 2),
        "weights_arg": 1 if iox else 0,
    }


def _add_bias(dst: np.ndarray, bias: Any, oc: int, axis: int) -> np.ndarray:
    """dst, or dst + the bias along the channel ``axis`` in f32 (None: no bias)."""
    if bias is None:
        return dst
    wide = dtypes.to_f32(dst)  # in C++ (NumPy widens bf16 element by element); dst is ours
    shape = [1] * dst.ndim
    shape[axis] = oc
    with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN data: as natively
        wide += dtypes.to_f32(np.asarray(bias)).reshape(shape)
    return wide


def _conv_transpose_nxc(
    src_shape: Sequence[int], kernel: Sequence[int], oc: int, weights_format: str, bias_in_matmul: bool
) -> dict[str, Any]:
    """The forward in NXC as one MatMul that writes dst itself, with no permuting copy.

    dst (N, x1, k1, ..., xr, kr, OC) is, per batch index (n*x1, k1, x2, k2, ..., k(r-1)),
    the product src[n, x1, ..., x(r-1)] (xr, IC) @ W[k1, ..., k(r-1)] (IC, kr*OC): src is
    broadcast over the taps' batch dims and the weights over the positions'. XOI weights
    are read in place (a transposed view); IOX weights are copied into that order (small).
    On a Sapphire Rapids CPU (AMX, bf16) the U-Net layer took 0.92 ms against 1.25 ms for
    the 2-D MatMul and its permuting copy into dst."""
    n, xs, ic = src_shape[0], tuple(src_shape[1:-1]), src_shape[-1]
    r, k = len(kernel), math.prod(kernel)
    outer, last = kernel[:-1], kernel[-1]
    if all(x == 1 for x in xs):
        # one src position: dst (N, k..., OC) is src (N, IC) @ W (IC, K*OC), one 2-D MatMul
        # (the batched form below would multiply one row at a time: DCGAN's z layer, f32,
        # 4.6 ms against 0.44 ms for this form in NCX, AMD Zen5)
        outer, last = (), k
        lead: tuple[int, ...] = ()
        pos: tuple[int, ...] = (n,)
        taps: tuple[int, ...] = ()
        dst: tuple[int, ...] = ()
        library_shape: tuple[int, ...] = (n, k * oc)
    else:
        # batch dims: (n*x1, k1) then (x_d, k_d) for 1 < d < r; 1-D: n alone
        lead = (n * xs[0], *xs[1:-1])
        pos = tuple(v for x in lead for v in (x, 1)) if r > 1 else (n,)
        taps = tuple(v for t in outer for v in (1, t))
        dst = tuple(v for x, t in zip(lead, outer) for v in (x, t)) if r > 1 else (n,)
        library_shape = (*dst, xs[-1], last * oc)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        if weights_format == "XOI":  # (k..., OC, IC): (k(r-1)..., kr*OC, IC), transposed
            wt = w.reshape(*outer, last * oc, ic).swapaxes(-1, -2)
        elif outer:  # (IC, OC, k...) -> (k(r-1)..., IC, kr, OC), copied
            order = (*range(2, 1 + r), 0, 1 + r, 1)
            wt = np.ascontiguousarray(w.transpose(order)).reshape(*outer, ic, last * oc)
        else:  # one position: (IC, OC, K) -> (IC, K, OC), copied
            wt = np.ascontiguousarray(w.reshape(ic, oc, k).swapaxes(1, 2))
        bias = [np.tile(args[2], last)] if len(args) > 2 and bias_in_matmul else []
        rows = src.reshape(n, ic) if not lead else src.reshape(*pos, xs[-1], ic)
        return [rows, wt.reshape(*taps, ic, last * oc), *bias]

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:  # the bias, not the MatMul's
        dst = out.reshape(n, *(x * t for x, t in zip(xs, kernel)), oc)
        return _add_bias(dst, arrays[2] if len(arrays) > 2 else None, oc, r + 1)

    return {
        "attrs": {},
        "prepare": prepare,
        **({} if bias_in_matmul else {"finish": finish}),
        "library_shape": library_shape,
        "prepared_elems": 0 if weights_format == "XOI" else k * oc * ic,
        "finish_elems": math.prod(library_shape),  # dst widened to f32 to add the bias
        "weights_arg": 1,
    }


def conv_transpose_backward_data(
    dd_shape: Sequence[int], kernel: Sequence[int], ic: int, data_format: str, weights_format: str
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for a BackwardData call.

    The MatMul writes diff_src as laid out, with no finishing copy: in NCX, per sample,
    diff_src (IC, P) = W (IC, OC*K) @ frames (OC*K, P), the weights broadcast over the batch;
    in NXC diff_src (N*P, IC) = frames (N*P, OC*K) @ W (OC*K, IC). The frames are diff_dst
    permuted by one copy (:mod:`.permute`), their taps in the weights' order; where the
    weights' layout is the other one (NCX with XOI, NXC with IOX) they are copied
    transposed (K*OC*IC elements, small)."""
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, ys = dd_shape[0], tuple(dd_shape[2:] if ncx else dd_shape[1:-1])
    oc = dd_shape[1] if ncx else dd_shape[-1]
    xs = tuple(y // t for y, t in zip(ys, kernel))
    r, p, k = len(kernel), math.prod(xs), math.prod(kernel)
    split = _split_shape(n, oc, xs, kernel, ncx)
    nn, c, x_axes, k_axes = _axes(r, ncx)
    taps = (c, *k_axes) if iox else (*k_axes, c)  # a frame's (OC*K) order: the weights'
    frames = (nn, *taps, *x_axes) if ncx else (nn, *x_axes, *taps)
    moved = ncx != iox  # the weights copied transposed

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dd, w = args[0], args[1]
        f = permuted(dd, split, frames)
        if ncx:  # W (1, IC, OC*K) @ frames (N, OC*K, P)
            wt = w.reshape(ic, oc * k) if iox else memory.contiguous(w.reshape(k * oc, ic).T)
            return [wt.reshape(1, ic, oc * k), f.reshape(n, oc * k, p)]
        wt = w.reshape(k * oc, ic) if not iox else memory.contiguous(w.reshape(ic, oc * k).T)
        return [f.reshape(n * p, oc * k), wt]  # frames (N*P, OC*K) @ W (OC*K, IC)

    return {
        "attrs": {},
        "prepare": prepare,
        "library_shape": (n, ic, p) if ncx else (n * p, ic),
        "prepared_elems": n * p * oc * k + (k * oc * ic if moved else 0),  # the frames, the weights moved
        "weights_arg": 0 if ncx else 1,
    }


#: IOX weights in NCX are computed by rows (see :func:`conv_transpose_backward_weights`)
#: where diff_dst has at least this many times src's elements (OC*K >= this * IC) and src
#: more than one position
ROWS_FROM = 4


def conv_transpose_backward_weights(
    src_shape: Sequence[int], dd_shape: Sequence[int], kernel: Sequence[int], data_format: str, weights_format: str,
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for a BackwardWeights call: one
    MatMul over the N*P src positions. Each (position, tap) pair reads one element of
    diff_dst, so the frames are diff_dst permuted (no zeros: an Inf or NaN meets exactly
    the terms the op has). Two orientations:

    - by rows: frames (taps*OC, N*P) @ src (N*P, IC), the frames' rows in the weights'
      order: (K*OC) for XOI, whose memory the result is; (OC*K) for IOX, whose (IC, OC*K)
      memory is the result transposed by a finishing copy (the weights: small). The frames'
      copy keeps each (channel, tap) plane of diff_dst together; src is copied to (N*P, IC)
      in NCX (where IC and P both exceed 1), never in NXC.
    - by columns, for IOX weights in NXC, and in NCX where diff_dst has fewer than
      :data:`ROWS_FROM` times src's elements or src one position: src^T (IC, N*P) @
      frames (N*P, OC*K), the result the weights' memory; src read through a transposed
      view in NXC, as stored in NCX at batch 1 (else copied whole planes at a time); the
      frames' copy puts the taps innermost, reading one element from each channel's plane
      in turn (with one src position, the frames are diff_dst as stored: by rows DCGAN's
      z layer took 1.6-1.8x the time).

    Why by rows for IOX in NCX at all: there the frames' copy by columns is slow, the more
    so where the planes lie a multiple of 4 KiB apart (each read evicts a line the next
    rows need): on an AMD Zen4 (2 threads, medians of 11) 0.55-0.83 ns an element in bf16
    with 128x128 and 192x192 planes, 0.10-0.31 without, against 0.09-0.21 by rows. By rows
    src takes a transposing copy instead, so the trade follows the two sizes. Over 30
    random k2 s2 layers (batch 1-16, 16-512 channels, 2-D and 3-D, f32 and bf16; rows'
    time / columns', geomean and range): 0.62 (0.45-0.97) where diff_dst had 8 or more
    times src's elements, 0.92 (0.61-1.10) at 4-8 times, 1.27 (0.95-1.81) below; on 25
    more drawn to check, 0.89 (0.65-1.23) over the configurations sent by rows; 30 more
    (``benchmarks/tiles_orientation.py --seed 3``): 0.69, 0.92 and 1.16. U-Net's k2 s2
    layer of the models suite (4x128x64x64, twice src's elements) ran 0.80-0.87x by rows,
    an exception to its class: it keeps columns with it. In NXC, where columns read src
    through a transposed view, rows took 0.85-1.55x the time on seven k2 s2 layers (the
    suites' and ERFNet's, f32 and bf16; 1.0-1.2x on most): IOX stays by columns there."""
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, ic, xs = shapes.split_activation(src_shape, data_format)
    oc = dd_shape[1] if ncx else dd_shape[-1]
    r, p, k = len(kernel), math.prod(xs), math.prod(kernel)
    split = _split_shape(n, oc, xs, kernel, ncx)
    nn, c, x_axes, k_axes = _axes(r, ncx)
    by_columns = iox and (not ncx or p == 1 or oc * k < ROWS_FROM * ic)
    if by_columns:
        frames = (nn, *x_axes, c, *k_axes)
        moved_src = ncx and n > 1
    else:
        frames = (c, *k_axes, nn, *x_axes) if iox else (*k_axes, c, nn, *x_axes)  # rows in the weights' order
        moved_src = ncx and ic > 1 and p > 1

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, dd = args[0], args[1]
        f = permuted(dd, split, frames)
        if by_columns:  # src^T (IC, N*P) @ frames (N*P, OC*K)
            if not ncx:
                rows = src.reshape(n * p, ic).T
            else:
                rows = permuted(src, (n, ic, p), (1, 0, 2)) if moved_src else src
            return [rows.reshape(ic, n * p), f.reshape(n * p, oc * k)]
        cols = permuted(src, (n, ic, p), (0, 2, 1)) if moved_src else src
        return [f.reshape(k * oc, n * p), cols.reshape(n * p, ic)]  # frames (taps*OC, N*P) @ src (N*P, IC)

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:  # by rows, IOX: (OC*K, IC) -> (IC, OC*K)
        return permuted(out, out.shape, (1, 0)).reshape(ic, oc, *kernel)

    transposed = iox and not by_columns
    return {
        "attrs": {},
        "prepare": prepare,
        **({"finish": finish} if transposed else {}),
        "library_shape": (ic, oc * k) if by_columns else (k * oc, ic),
        "prepared_elems": n * p * oc * k + (n * p * ic if moved_src else 0),  # the frames, src moved
        "finish_elems": k * oc * ic if transposed else 0,  # the transposed weights
    }

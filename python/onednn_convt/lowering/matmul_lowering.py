"""ConvTranspose with a large 1-D kernel, run as a MatMul followed by an overlap-add.

oneDNN 3.2 lowers every ConvTranspose onto its deconvolution kernels, whose JIT code
generation grows with the kernel: an inverse-STFT-like layer (kernel 1024, stride 256)
takes about 100 s to compile and 0.6 s per call. The same op is a matrix product and a
sum of shifted slices, which compiles in milliseconds and runs at MatMul speed.

For src (N, L, IC) and weights W (IC, OC, k), with k padded with zeros to k' = r*s:

    cols = src @ W.reshape(IC, OC*k')                     (N, L, OC, r, s)   oneDNN MatMul
    full[n, (i+q)*s + t, oc] = sum_q cols[n, i, oc, q, t]                    overlap-add
    dst = full[:, pads_begin : pads_begin + dst_size, :]   (zeros past the end) + bias

In NCX with a long src (:func:`reads_src_as_stored`) the product takes src as stored, the
taps on the left (:func:`_conv_transpose_ncx`): cols (N, OC, r, s, L) = W' (OC*k', IC) @
src[n] (IC, L), the batch broadcast.

BackwardData of such an op is a MatMul over frames of diff_dst (the gradient of the
overlap-add is framing), with the frames' taps outside diff_dst left out:

    frames[n, i, oc, j] = diff_dst[n, s*i + j - pads_begin, oc]   (0 outside: padding)
    diff_src[n, i, :] = W.reshape(IC, OC*k) @ frames[n, i].reshape(OC*k)      oneDNN MatMul

The product is oriented so that the weights are read as stored, never through a transposed
view (oneDNN 3.2 reorders a transposed f32 weights matrix with a slow generic kernel: 2.2 ms
of the 4.4 ms of the inverse-STFT layer, against 2.4 ms in all this way): IOX weights are
the left matrix (IC, OC*k) and the frames are laid out (OC*k, N*L); XOI weights are the
right matrix (k*OC, IC) and the frames (N, L, k*OC). Copied from diff_dst as (N, L, OC),
each IOX frame row walks its channel with a stride of s*OC elements: that one NumPy copy
took 357 ms (NCX) and 306 ms (NXC) for HiFi-GAN's 8x256x8192 k16 s8 diff_dst (f32, an AMD
Zen4, best of 3). So NCX diff_dst is padded as it lies, (N, OC, extent), each frame row read
along its own channel (26 ms), and NXC's frames are copied as they lie, (N, L, k*OC), then
permuted to (OC, k, N, L) by oneDNN's Reorder over the thread pool (43 ms).

The rule (documented in docs/performance.md): 1 spatial dim, groups 1, dilation 1, kernel >= 128;
for BackwardData also kernel <= 8 * stride, so that the frames stay within 8 times diff_dst,
and it also takes smaller kernels in f32 NXC/XOI calls with OC*k >= 2048, where the
library's f32 backward data is slower than the MatMul (:func:`applies_backward_data`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .. import memory
from .permute import permuted

#: the smallest kernel for which ConvTranspose runs as MatMul + overlap-add
MIN_KERNEL = 128


#: BackwardData: the largest kernel / stride ratio (the frames' size over diff_dst's)
MAX_OVERLAP = 8


def applies(kernel: Sequence[int], groups: int, dilations: Sequence[int]) -> bool:
    """Whether a ConvTranspose with these parameters takes the MatMul lowering."""
    return len(kernel) == 1 and groups == 1 and dilations[0] == 1 and kernel[0] >= MIN_KERNEL


#: BackwardData in f32, NXC with XOI weights: the smallest OC*k (the MatMul's reduction)
#: for which kernels below MIN_KERNEL take the MatMul lowering too
MIN_F32_REDUCTION = 2048


def applies_backward_data(
    kernel: Sequence[int], groups: int, dilations: Sequence[int], strides: Sequence[int],
    *, oc: int, f32: bool, data_format: str, weights_format: str,
) -> bool:
    """Whether a ConvTransposeBackwardData with these parameters takes the MatMul lowering.

    Besides the large kernels of :func:`applies`, an f32 call in NXC with XOI weights whose
    frames hold at least MIN_F32_REDUCTION values (OC*k): there the frames are (N, L, k*OC)
    rows read straight into the MatMul, which ran 0.64-0.95x the library's time (f32
    gemm-based backward data, 94-156 GFLOP/s) on 1-D layers with OC*k 2048-16384, 1.02-1.9x
    below that; in bf16, whose library kernels run at 300+ GFLOP/s, 0.9-1.6x either way.
    """
    if len(kernel) != 1 or groups != 1 or dilations[0] != 1 or kernel[0] > MAX_OVERLAP * strides[0]:
        return False
    if kernel[0] >= MIN_KERNEL:
        return True
    return f32 and data_format == "NXC" and weights_format == "XOI" and oc * kernel[0] >= MIN_F32_REDUCTION


def conv_transpose(
    src_shape: Sequence[int], kernel: int, stride: int, pad_begin: int, dst_size: int,
    oc: int, data_format: str, weights_format: str,
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for one forward call.

    Returns:
        keyword arguments ``attrs``, ``prepare``, ``finish``, ``library_shape``,
        ``prepared_elems``.
    """
    ncx = data_format == "NCX"
    if ncx and reads_src_as_stored(src_shape[1], src_shape[2]):
        return _conv_transpose_ncx(src_shape, kernel, stride, pad_begin, dst_size, oc, weights_format)
    n, length = src_shape[0], (src_shape[2] if ncx else src_shape[1])
    r = -(-kernel // stride)  # taps per output block
    padded = r * stride

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        rows = src.transpose(0, 2, 1) if ncx else src  # (N, L, IC), a view
        w3 = w if weights_format == "IOX" else w.transpose(2, 1, 0)  # (IC, OC, k)
        if padded != kernel:
            w3 = np.concatenate(
                [w3, np.zeros((*w3.shape[:2], padded - kernel), w3.dtype)], axis=2
            )
        return [rows, w3.reshape(w3.shape[0], oc * padded)]

    def finish(cols: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        blocks = cols.astype(np.float32, copy=False).reshape(n, length, oc, r, stride)
        if padded != kernel:  # the zero taps give 0 * Inf = NaN for non-finite src: not real taps
            blocks[:, :, :, r - 1, kernel - (r - 1) * stride :] = 0
        full = memory.zeros((n, length + r - 1, stride, oc), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN data: no warnings, as natively
            for q in range(r):
                full[:, q : q + length] += blocks[:, :, :, q, :].transpose(0, 1, 3, 2)
        rows = full.reshape(n, (length + r - 1) * stride, oc)
        dst = memory.zeros((n, dst_size, oc), np.float32)
        take = max(0, min(dst_size, rows.shape[1] - pad_begin))
        dst[:, :take] = rows[:, pad_begin : pad_begin + take]
        bias = arrays[2] if len(arrays) > 2 else None
        if bias is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                dst += np.asarray(bias, dtype=np.float32)
        return memory.contiguous(dst.transpose(0, 2, 1)) if ncx else dst

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (n, length, oc * padded),
        # the zero-padded weights copy (when the kernel is not a multiple of the stride)
        "prepared_elems": (src_shape[1] if ncx else src_shape[2]) * oc * padded if padded != kernel else 0,
        "weights_arg": 1,
    }


#: NCX forward: the least src length and channels for which the MatMul reads src as stored
NCX_AS_STORED_FROM_LENGTH = 512
NCX_AS_STORED_FROM_CHANNELS = 16


def reads_src_as_stored(ic: int, length: int) -> bool:
    """Whether an NCX forward's MatMul reads src as stored (:func:`_conv_transpose_ncx`)
    rather than as (N, L, IC) rows, which oneDNN reorders first.

    The reorder costs in proportion to src; the batched product of the other form runs N
    small products of (OC*k', IC) by (IC, L), slow where L or IC is small. On 29 random 1-D
    layers on an AVX2 Zen3 (f32, three tuning passes), the as-stored form ran 1.08-3.9x
    faster with L >= 512 and IC >= 16, and down to 0.08x (L = 8) outside.
    """
    return length >= NCX_AS_STORED_FROM_LENGTH and ic >= NCX_AS_STORED_FROM_CHANNELS


def _conv_transpose_ncx(
    src_shape: Sequence[int], kernel: int, stride: int, pad_begin: int, dst_size: int,
    oc: int, weights_format: str,
) -> dict[str, Any]:
    """The forward in NCX, with src read as stored: the taps are the left matrix.

    For src (N, IC, L) the product is ``Wt (OC*k', IC) @ src[n] (IC, L)`` for each n, into
    cols (N, OC, r, s, L); the overlap-add sums ``cols[:, :, q, t, i]`` into output block
    i + q, position t. Read as (N, L, IC) rows, src would be transposed by a oneDNN reorder
    first: on WaveGAN's k25 s4 layer (64x64x4096, f32) that reorder took 22 ms of a 45 ms
    call (the MatMul 17).
    """
    n, ic, length = src_shape[0], src_shape[1], src_shape[2]
    r = -(-kernel // stride)
    padded = r * stride

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        w3 = w if weights_format == "IOX" else w.transpose(2, 1, 0)  # (IC, OC, k)
        taps = memory.zeros((oc, padded, ic), w3.dtype)  # (OC, k', IC): zeros past the kernel
        taps[:, :kernel] = w3.transpose(1, 2, 0)
        return [taps.reshape(1, oc * padded, ic), src]

    def finish(cols: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        blocks = cols.astype(np.float32, copy=False).reshape(n, oc, r, stride, length)
        if padded != kernel:  # the zero taps give 0 * Inf = NaN for non-finite src: not real taps
            blocks[:, :, r - 1, kernel - (r - 1) * stride :] = 0
        # block j of the output, position t, at [:, :, t, j]: each tap row q adds contiguously
        full = memory.zeros((n, oc, stride, length + r - 1), np.float32)
        with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN data: no warnings, as natively
            for q in range(r):
                full[:, :, :, q : q + length] += blocks[:, :, q]
        rows = memory.empty((n, oc, length + r - 1, stride), np.float32)
        np.copyto(rows, full.transpose(0, 1, 3, 2))
        rows = rows.reshape(n, oc, (length + r - 1) * stride)
        dst = memory.zeros((n, oc, dst_size), np.float32)
        take = max(0, min(dst_size, rows.shape[2] - pad_begin))
        dst[:, :, :take] = rows[:, :, pad_begin : pad_begin + take]
        bias = arrays[2] if len(arrays) > 2 else None
        if bias is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                dst += np.asarray(bias, dtype=np.float32)[:, None]
        return dst

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (n, oc * padded, length),
        "prepared_elems": oc * padded * ic,  # the taps, transposed (and zero-padded)
        "weights_arg": 0,
    }


def conv_transpose_backward_data(
    dd_shape: Sequence[int], kernel: int, stride: int, pad_begin: int, src_size: int,
    ic: int, data_format: str, weights_format: str,
) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.ops.Lowering` for one BackwardData call.

    Returns:
        keyword arguments ``attrs``, ``prepare``, ``finish``, ``library_shape``,
        ``prepared_elems``.
    """
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    n, oc, length = (dd_shape[0], dd_shape[1], dd_shape[2]) if ncx else (dd_shape[0], dd_shape[2], dd_shape[1])
    extent = stride * (src_size - 1) + kernel  # the forward op's full output, pads included
    # rows whose frame has taps outside diff_dst: [0, first) and [last, src_size)
    first = min(src_size, -(-pad_begin // stride))
    last = max(first, min(src_size, (length + pad_begin - kernel) // stride + 1))

    def padded(dd: np.ndarray, channels_first: bool = False) -> np.ndarray:
        """(N, extent, OC): diff_dst placed within the forward's full output, zeros around;
        ``channels_first``: (N, OC, extent), from NCX diff_dst as it lies."""
        take = max(0, min(length, extent - pad_begin))
        if channels_first:
            full = memory.zeros((n, oc, extent), dd.dtype)
            full[:, :, pad_begin : pad_begin + take] = dd[:, :, :take]
            return full
        rows = dd.transpose(0, 2, 1) if ncx else dd  # (N, length, OC), a view
        full = memory.zeros((n, extent, oc), dd.dtype)
        full[:, pad_begin : pad_begin + take] = rows[:, :take]
        return full

    def taps(w: np.ndarray) -> np.ndarray:
        """W as (IC, OC, k), a view."""
        return w if iox else w.transpose(2, 1, 0)

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dd, w = args[0], args[1]
        # frame i holds full[n, s*i + j, oc] for the k taps j: a view of full whose frames
        # overlap, which oneDNN cannot take (it refuses overlapping strides), so it is copied
        # once, into kept memory (:mod:`onednn_convt.memory`: no fresh pages per call)
        if iox and ncx:  # W (IC, OC*k) @ frames (OC*k, N*L), each read along its channel's row
            full = padded(dd, channels_first=True)
            st = full.strides
            view = np.lib.stride_tricks.as_strided(
                full, (oc, kernel, n, src_size), (st[1], st[2], st[0], stride * st[2]), writeable=False)
            return [w.reshape(ic, oc * kernel), memory.contiguous(view).reshape(oc * kernel, n * src_size)]
        full = padded(dd)
        item, n_step = full.itemsize, full.strides[0]
        lying = np.lib.stride_tricks.as_strided(  # the frames as they lie: (N, L, k*OC)
            full, (n, src_size, kernel * oc), (n_step, stride * oc * item, item), writeable=False)
        if iox:  # NXC: those frames permuted to (OC, k, N, L) by oneDNN's Reorder (module docstring)
            frames = permuted(memory.contiguous(lying), (n, src_size, kernel, oc), (3, 2, 0, 1))
            return [w.reshape(ic, oc * kernel), frames.reshape(oc * kernel, n * src_size)]
        # frames (N, L, k*OC) @ W (k*OC, IC): frame i is the k*OC values of full from row s*i on
        return [memory.contiguous(lying), w.reshape(kernel * oc, ic)]

    def finish(out: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        result = out.astype(np.float32, copy=False)
        rows = result.reshape(ic, n, src_size).transpose(1, 2, 0) if iox else result  # (N, L, IC) view
        if not np.isfinite(rows[:, :first]).all() or not np.isfinite(rows[:, last:]).all():
            # a non-finite weight met the padding's zeros (0 * Inf = NaN) in an edge row:
            # those taps do not exist, so redo the edge rows from the real taps only
            dd = np.asarray(arrays[0], np.float32)
            w = taps(np.asarray(arrays[1], np.float32))
            dd_rows = dd.transpose(0, 2, 1) if ncx else dd
            with np.errstate(invalid="ignore", over="ignore"):
                for i in [*range(first), *range(last, src_size)]:
                    lo, hi = max(0, stride * i - pad_begin), min(length, stride * i - pad_begin + kernel)
                    tap = slice(lo - (stride * i - pad_begin), hi - (stride * i - pad_begin))
                    rows[:, i] = np.einsum("nto,cot->nc", dd_rows[:, lo:hi], w[:, :, tap]) if hi > lo else 0
        return memory.contiguous(rows.transpose(0, 2, 1) if ncx else rows)

    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (ic, n * src_size) if iox else (n, src_size, ic),
        "prepared_elems": n * extent * oc + n * src_size * oc * kernel,  # zero-padded rows, frames
        "finish_elems": 2 * n * src_size * ic,  # the output widened to f32, and a transposing copy
        "weights_arg": 0 if iox else 1,  # see prepare
    }


"""A 2-D or 3-D ConvTranspose with few output channels, as a MatMul into columns and their sum.

oneDNN 3.2's deconvolution kernels (and its convolution forms of the op) block the output
channels by 16: a layer with one or three of them runs at about 6% of the f32 peak. FSRCNN's
x3 up-sampler (1x56x170x170 -> 1 channel, k9 s3) took 19.2-20.3 ms on every candidate on an
AMD Zen4 (PyTorch 20.3 ms), where ONNX Runtime's MLAS, a matrix product into columns and
then their sum into the output (col2im), took 2.8 ms. This is that form, the N-D sibling of
:mod:`.matmul_lowering`'s 1-D overlap-add.

With each kernel dim padded with zero taps to k'_d = r_d * s_d (r_d taps per output block)::

    cols = taps (OC * k'_1 * ... * k'_d, IC) @ src[n] (IC, L_1 * ... * L_d)     oneDNN MatMul
    full[n, oc, (i_d + q_d) * s_d + t_d] += cols[n, oc, q_d, t_d, i_d]          for each q: the sum
    dst = full cropped by the pads (zeros past its end) + bias

NXC's src is read through a transposed view, (N, IC, L) with strides (L*IC, 1, IC), so the
columns run along the positions in both layouts. The sum adds prod(r_d) strided slices of
the columns, each the size of dst, and each slice's rows are runs of L_d contiguous
elements. The two permuting copies after it (the phases interleaved into rows; NXC's
channels moved last) are oneDNN Reorders (:mod:`.permute`). Before, NXC's columns came out
as (N, L, OC*K') and the sum ran over runs of OC*s_d elements (6 for three channels at
stride 2), element by element in NumPy: on an AMD Zen4 (2 threads, medians of 10-call
batches in alternated processes) DCGAN's 16x64x32x32 -> 3 channels k4 s2 forward took
2.6-3.9 ms in NXC f32 (now 1.9-2.5), 2.3-3.7 in NXC bf16 (now 1.4-2.3); FSRCNN's x3 layer
in NXC f32 9.2-10.7 ms (now 4.6-5.7). NCX, where only the rows' copy changed, measured the
same within the host's noise.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import numpy as np

from .. import memory
from . import permute

#: the most output channels (per group: the lowering takes groups 1 only) for which the
#: columns are a candidate: where the library's kernels fill a fraction of their lanes
MAX_OC = 8
#: the most slices the sum adds (prod(r_d)): the columns are that many times dst
MAX_OVERLAP = 27


def applies(kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], groups: int, oc: int) -> bool:
    """Whether a ConvTranspose with these parameters has the columns as a candidate: 2-D or
    3-D, groups 1, no dilation, a stride above 1, at most :data:`MAX_OC` output channels and
    :data:`MAX_OVERLAP` slices to add."""
    overlap = math.prod(-(-k // s) for k, s in zip(kernel, strides))
    return (len(kernel) in (2, 3) and groups == 1 and all(d == 1 for d in dilations)
            and max(strides) > 1 and oc <= MAX_OC and overlap <= MAX_OVERLAP)


def conv_transpose(src_shape: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                   pads_begin: Sequence[int], dst_spatial: Sequence[int], oc: int, data_format: str,
                   weights_format: str) -> dict[str, Any]:
    """The pieces of a :class:`onednn_convt.lowering.base.Lowering` for one forward call
    (``attrs``, ``prepare``, ``finish``, ``library_shape``, ``prepared_elems``,
    ``weights_arg``), as :func:`onednn_convt.lowering.matmul_lowering.conv_transpose`."""
    ncx, iox = data_format == "NCX", weights_format == "IOX"
    d = len(kernel)
    n = src_shape[0]
    ic = src_shape[1] if ncx else src_shape[-1]
    spatial = tuple(src_shape[2:] if ncx else src_shape[1:-1])
    r = tuple(-(-k // s) for k, s in zip(kernel, strides))
    padded = tuple(q * s for q, s in zip(r, strides))
    taps = math.prod(padded)
    positions = math.prod(spatial)

    def weights_ok(w: np.ndarray) -> np.ndarray:
        """The weights as (OC, k_1, ..., k_d, IC), a view."""
        return w.transpose(1, *range(2, 2 + d), 0) if iox else w.transpose(d, *range(d), d + 1)

    def padded_taps(w: np.ndarray) -> np.ndarray:
        """(OC, k'_1, ..., k'_d, IC): the weights, zeros past the kernel."""
        out = memory.zeros((oc, *padded, ic), w.dtype)
        out[(slice(None), *(slice(0, k) for k in kernel))] = weights_ok(w)
        return out

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        src, w = args[0], args[1]
        t = padded_taps(w)
        # taps (OC*K', IC) @ src[n] (IC, P), the batch broadcast; NXC's src read through a
        # transposed view, so that each column runs along the positions either way
        rows = src.reshape(n, ic, positions) if ncx else src.reshape(n, positions, ic).transpose(0, 2, 1)
        return [t.reshape(1, oc * taps, ic), rows]

    def finish(cols: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
        c = cols.astype(np.float32, copy=False)
        # blocks: (N, OC, r_1, s_1, ..., r_d, s_d, L_1, ..., L_d), in both layouts
        split = tuple(x for q, s in zip(r, strides) for x in (q, s))
        blocks = c.reshape(n, oc, *split, *spatial)
        for i, (k, p) in enumerate(zip(kernel, padded)):
            if p != k:  # the zero taps give 0 * Inf = NaN for non-finite src: not real taps
                last: list[Any] = [slice(None)] * blocks.ndim
                last[2 + 2 * i] = r[i] - 1
                last[3 + 2 * i] = slice(k - (r[i] - 1) * strides[i], None)
                blocks[tuple(last)] = 0
        # full (N, OC, s_1, ..., s_d, M_1, ..., M_d), M_i = L_i + r_i - 1: each q adds a slice;
        # the first (q = 0) is copied in and only the rest of full zeroed, one pass fewer
        full = memory.empty((n, oc, *strides, *(length + q - 1 for length, q in zip(spatial, r))), np.float32)
        lead = (slice(None),) * (2 + d)
        for i in range(d):  # past the first slice along dim i (within it along the dims before)
            full[(*lead, *(slice(0, length) for length in spatial[:i]), slice(spatial[i], None))] = 0
        with np.errstate(invalid="ignore", over="ignore"):  # Inf/NaN data: no warnings, as natively
            for q in itertools.product(*(range(x) for x in r)):
                index = (*lead, *(slice(qi, qi + length) for qi, length in zip(q, spatial)))
                piece = blocks[(slice(None), slice(None), *(x for qi in q for x in (qi, slice(None))))]
                if any(q):
                    full[index] += piece
                else:
                    full[index] = piece
        # rows (N, OC, M_1, s_1, ..., M_d, s_d) -> the full output, then the pads cropped
        order = (0, 1, *(x for i in range(d) for x in (2 + d + i, 2 + i)))
        rows = permute.permuted(full, full.shape, order)
        whole = rows.reshape(n, oc, *((length + q - 1) * s for length, q, s in zip(spatial, r, strides)))
        dst = memory.zeros((n, oc, *dst_spatial), np.float32)
        takes = [max(0, min(size, extent - p)) for size, extent, p in zip(dst_spatial, whole.shape[2:], pads_begin)]
        dst[(slice(None), slice(None), *(slice(0, t) for t in takes))] = whole[
            (slice(None), slice(None), *(slice(p, p + t) for p, t in zip(pads_begin, takes)))]
        bias = arrays[2] if len(arrays) > 2 else None
        if bias is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                dst += np.asarray(bias, dtype=np.float32).reshape(oc, *(1,) * d)
        return dst if ncx else permute.permuted(dst, dst.shape, (0, *range(2, 2 + d), 1))

    full_elems = n * oc * math.prod(s * (length + q - 1) for s, length, q in zip(strides, spatial, r))
    out_elems = n * oc * math.prod(dst_spatial)
    return {
        "attrs": {},
        "prepare": prepare,
        "finish": finish,
        "library_shape": (n, oc * taps, positions),
        "prepared_elems": oc * taps * ic,  # the taps, reordered and zero-padded
        # the sum and its transposed copy, dst (and NXC's channels-last copy), the columns
        # widened to f32 (counted in f32 calls too, where no copy is made)
        "finish_elems": 2 * full_elems + out_elems * (1 if ncx else 2) + n * oc * taps * positions,
        "weights_arg": 0,
    }

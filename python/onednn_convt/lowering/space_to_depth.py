"""BackwardData with few diff_dst channels as a stride-1 op over diff_dst's blocks along
its last spatial dim (space-to-depth).

BackwardData is a strided convolution of diff_dst. Along a dim of stride ``s``, pads_begin
``pb`` and kernel ``k`` (dilation 1): ``diff_src[i] = sum_t w[t] diff_dst[s*i + t - pb]``.
With ``P``, diff_dst with ``pb`` zeros in front, that is ``P[s*i + t]``; with ``t = s*q + r``
(``q < Q = ceil(k/s)``, ``r < s``, the weights zero from ``t = k`` on) it is
``P[s*(i + q) + r]``: element ``r`` of block ``i + q``. Taking ``P``'s blocks of ``s`` as the
positions and each block's ``s`` elements as channels, diff_src is the stride-1
BackwardData over ``Q`` taps of the blocked ``P``, with ``s`` times the channels and the
weights ``w'[q, (r, o)] = w[s*q + r]``.

In NXC, along the last spatial dim, the blocked ``P`` is a reshape of ``P`` (each block's
``s`` positions of ``C`` channels lie together): the lowering's one copy is ``P`` itself,
the size of diff_dst. The other dims keep their stride and pads. The library's
convolution with 1-3 input channels is weak where this one has ``s`` times as many.
Measured on an AMD Zen4 (bf16, NXC, 2 threads, medians of 15 alternated rounds, against
the library op the rules chose and PyTorch 2.13): FSRCNN's x3 layer (56 -> 1 channel, k9
s3, 170x170) 0.99 ms against 1.41 and PyTorch's 1.10; its x2 layer (k9 s2) 1.88 against
3.19 and 2.22; pix2pix's output layer (128 -> 3, k4 s2) 0.53 against 0.65 and 0.66. In
f32 it was slower than the library op on five of six such layers: bf16 only (f16 runs
natively only on CPUs with AVX512-FP16, where it was not measured).

The zeros it multiplies are diff_dst's padding, as the library's own ops multiply theirs
(where a NaN or Inf meets only the pads the result may hold a NaN that the exact sum has
not, as theirs may: docs/deviations.md), and the weights' taps from ``k`` on, which meet
real diff_dst elements: an Inf there makes a NaN that the library's op does not. A native
bf16 result holding an Inf or NaN is redone in f32 by ``exact``, the library's own op
(``Plan._guarded``), so the lowering applies only where bf16 runs natively.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import numpy as np

from .. import guards, memory
from ..problem import BACKWARD_DATA, Problem
from .base import SPACE_TO_DEPTH, Lowering

#: the most diff_dst channels (forward OC) it applies to
MAX_CHANNELS = 8
#: the most multiply-adds it may add, as a ratio (zero taps where the stride does not
#: divide the kernel: k9 s2 computes 10 taps for 9)
MAX_GROWTH = 1.5


def applies(p: Problem) -> bool:
    """Whether ``p`` has a space-to-depth form: BackwardData in NXC, groups 1, no dilation,
    a stride above 1 along the last spatial dim, at most :data:`MAX_CHANNELS` diff_dst
    channels, zero taps within :data:`MAX_GROWTH`, and native bf16 (see the module doc)."""
    if p.op != BACKWARD_DATA or p.data_format != "NXC" or p.groups != 1 or p.oc > MAX_CHANNELS:
        return False
    g = p.geometry
    s, k = g.strides[-1], p.kernel[-1]
    native = p.dtype == "bf16" and guards.dispatch_isa() in guards.BF16_NATIVE
    return native and s > 1 and all(d == 1 for d in g.dilations) and s * -(-k // s) <= MAX_GROWTH * k


def blocked_problem(p: Problem) -> Problem:
    """The stride-1 (along the last dim) BackwardData over the blocked diff_dst."""
    g = p.geometry
    s, k, i = g.strides[-1], p.kernel[-1], p.src[-1]
    taps = -(-k // s)
    geometry = replace(g, strides=(*g.strides[:-1], 1), pads_begin=(*g.pads_begin[:-1], 0),
                       pads_end=(*g.pads_end[:-1], 0))
    return replace(p, oc=p.oc * s, kernel=(*p.kernel[:-1], taps), dst=(*p.dst[:-1], i - 1 + taps),
                   geometry=geometry).with_call_shapes()


def build(p: Problem, inner: Lowering, exact: Lowering) -> Lowering:
    """The space-to-depth lowering of ``p`` (:func:`applies`) around ``inner``, a lowering of
    :func:`blocked_problem` that is one library op on its arrays; ``exact``: the lowering that
    redoes a call whose result holds an Inf or NaN (the library's own op, in f32)."""
    assert applies(p), p.key()
    q = blocked_problem(p)
    s, pb, k = p.geometry.strides[-1], p.geometry.pads_begin[-1], p.kernel[-1]
    padded_k = q.kernel[-1] * s
    blocks = q.dst[-1]
    dd_shape = p.input_shapes[0]
    length = dd_shape[-2]
    take = max(0, min(length, s * blocks - pb))  # diff_dst past that meets no tap
    padded_shape = (*dd_shape[:-2], s * blocks, dd_shape[-1])
    before = inner.prepare

    def prepare(args: list[np.ndarray]) -> list[np.ndarray]:
        dd, w = args[0], args[1]
        padded = memory.empty(padded_shape, dd.dtype)
        memory.fill_zeros(padded[..., :pb, :])
        memory.fill_zeros(padded[..., pb + take :, :])
        size = f"u{dd.itemsize}"  # (NumPy copies bf16 element by element, its integers in bulk)
        np.copyto(padded.view(size)[..., pb : pb + take, :], dd.view(size)[..., :take, :])
        blocked = [padded.reshape(q.input_shapes[0]), _blocked_weights(w, p.weights_format, k, padded_k, s)]
        return before(blocked) if before is not None else blocked

    weights_elems = math.prod(q.weights_shape)
    return replace(
        inner, out_shape=p.out_shape, prepare=prepare, prepared_elems=inner.prepared_elems + math.prod(padded_shape)
        + weights_elems, exact=exact, name=SPACE_TO_DEPTH,
    )


def _blocked_weights(w: np.ndarray, weights_format: str, k: int, padded_k: int, s: int) -> np.ndarray:
    """``w`` (XOI or IOX) with its last spatial dim's taps grown to ``padded_k`` by zeros and
    split into ``padded_k / s`` taps of ``s`` channels each: ``w'[q, (r, o)] = w[s*q + r]``."""
    iox = weights_format == "IOX"
    last = w.ndim - 1 if iox else w.ndim - 3
    grown: Optional[np.ndarray] = None
    if padded_k != k:
        shape = list(w.shape)
        shape[last] = padded_k
        grown = np.zeros(shape, w.dtype)
        grown[(slice(None),) * last + (slice(0, k),)] = w
    full = w if grown is None else grown
    if not iox:  # (X..., Q*s, O, I) -> (X..., Q, s*O, I): a reshape, channels (r, o)
        return full.reshape(*full.shape[:-3], padded_k // s, s * full.shape[-2], full.shape[-1])
    # (I, O, X..., Q*s) -> (I, s, O, X..., Q) -> (I, s*O, X..., Q)
    split = full.reshape(*full.shape[:-1], padded_k // s, s)
    moved = np.moveaxis(split, -1, 1)
    return np.ascontiguousarray(moved).reshape(full.shape[0], s * full.shape[1], *full.shape[2:-1], padded_k // s)

"""The polyphase (sub-pixel) lowering: a strided op as stride-1 ops on strided views.

Along one spatial dim, a ConvTranspose of stride ``s`` (dilation 1) writes output ``o`` from
src ``i`` through tap ``t`` where ``o + pb = s*i + t``. The outputs of one phase
``phi = (o + pb) mod s`` take only the taps ``t = phi + s*m``: they are a stride-1
ConvTranspose of src with the sub-kernel ``w[phi::s]`` (``M = ceil((k - phi) / s)`` taps),
written to ``dst[o0::s]``. Over ``d`` dims that is ``s^d`` stride-1 ops, each on a strided
view of the weights and writing a strided view of dst: no copies, and oneDNN's stride-1
kernels (its most tuned; oneDNN 3.2's strided deconvolution kernels are weak on depthwise
and grouped layers, and wrong with a fused bias on some: the guard
``strided_deconvolution_epilogue``) instead of the strided one. A phase with no taps
(``M = 0``: kernel below the stride) or outputs past the last tap's reach (output_padding)
holds the bias there (or zeros): the view is filled first.

A forward's bias (:func:`onednn_convt.lowering.forward.bias_apart`): in a small f32 result
each phase's op runs without it and the core adds it to the phase's view; otherwise no phase
takes it (oneDNN 3.2's stride-1 deconvolution with a bias is slow, in bf16 by 9 ns an output
element) and one BiasAdd partition adds it over the whole of dst after the phases
(``Lowering.bias_stage``), the bias-only views filled with zeros; unless every phase runs as
a forward Convolution, which takes it. Measured on an AMD Zen5 against the bias in the
phases' library ops (k4 s2 p1 layers of the models suite, out= calls): bf16 0.15-0.50x the
time, f32 0.44-1.03x.

BackwardWeights has the matching form: phase ``phi`` of diff_weights (``dw[phi::s]``) is the
stride-1 BackwardWeights of src and the phase's view of diff_dst ``dd[o0::s]``.

BackwardData is the adjoint, a stride-``s`` convolution of diff_dst: each phase's
stride-1 op gives a part of every diff_src element, so the phases are summed (the first
writes diff_src, each other one writes scratch memory added into it).

:func:`phases` computes each dim's phases; :func:`build` the :class:`.base.Lowering` whose
``phases`` the op compiles and runs in turn (:class:`onednn_convt.plan.PhasedPlan`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Geometry, Problem
from . import base, forward
from .base import Lowering, Phase

#: the most phases (s^d) a problem may split into (each is a library call). 64 takes in a
#: 2-D stride 8 and a 3-D stride 4: FCN-8s' k16 s8 up-sampler (21 channels, 64x64 -> 520x520,
#: f32) ran its forward in 21.9 ms as 64 phases against 41.6 ms for the library op in NXC, and
#: 29.9 against 37.9 in NCX, its BackwardWeights NXC in 23.7 against 30.4 for the fastest other
#: candidate (an AMD Zen3, the tuner's side-by-side times); its 64 phases compiled in 92 ms in
#: all. The tuner and the measured tables decide where it runs.
MAX_PHASES = 64


@dataclass(frozen=True)
class DimPhase:
    """One phase along one spatial dim.

    Attributes:
        phase: ``phi`` in ``[0, s)``: the taps ``phi, phi + s, ...``.
        taps: ``M``, how many (0: none).
        first: the first output (dst index) of the phase, ``o0``.
        count: the phase's outputs in dst (``dst[o0::s][:count]``).
        pads_begin: the stride-1 op's pads_begin.
        reach: how many of the phase's outputs the taps reach (the rest hold the bias).
        pads_end: the stride-1 op's pads_end over ``reach`` outputs.
    """

    phase: int
    taps: int
    first: int
    count: int
    pads_begin: int
    reach: int
    pads_end: int


def phases(src: int, kernel: int, stride: int, pads_begin: int, dst: int) -> list[DimPhase]:
    """The phases of one spatial dim of a dilation-1 ConvTranspose (see the module doc)."""
    out = []
    for phi in range(stride):
        taps = len(range(phi, kernel, stride))
        q0 = -((phi - pads_begin) // stride)  # the first phase index whose output is >= 0
        first = stride * q0 + phi - pads_begin
        count = max(0, -(-(dst - first) // stride))
        reach = max(0, min(count, src - 1 + taps - q0)) if taps else 0
        out.append(DimPhase(phi, taps, first, count, q0, reach, src - 1 + taps - q0 - reach))
    return out


def fits(p: Problem) -> bool:
    """Whether ``p`` has a polyphase form worth running: a stride above 1, every dilation 1,
    at most :data:`MAX_PHASES` phases (any dtype), and not a grouped 3-D problem that oneDNN
    3.2 runs on its gemm convolution (:attr:`Problem.gemm_grouped`), where each stride-1
    phase costs about as much as the whole strided op.

    Measured on an AMD Zen3 (avx2), 2 threads, k4 s2 p1 f32, against the library op (median
    of three calls each): a depthwise 8x128x6x6x6 forward NXC took 88 ms as polyphase
    against 17 (201 ms with a bias, which the phases' gemm kernels add slowly: the rules'
    choice then; at stride 4, 64 phases, 2.6 s against 0.10), NCX 38 against 17,
    BackwardData 31-109 against 14-17, BackwardWeights 29-36 against 15-16. A k4 s2
    forward of 2x48, 2x64 or 2x96 channels on 6x8x8 with 2, 4, 6 and 12 channels per group
    took 1.3-7.2x the library op's time as polyphase; with 8 per group 0.37-0.69x, with 16
    1.1-1.4x (JIT kernels: the rules and the tuner decide there)."""
    g = p.geometry
    return not all(s == 1 for s in g.strides) and all(d == 1 for d in g.dilations) and \
        math.prod(g.strides) <= MAX_PHASES and not p.gemm_grouped


def applies(p: Problem) -> bool:
    """Whether ``p`` has the polyphase lowering in its own dtype: :func:`fits`, and a dtype
    the library runs natively here (f32; bf16 on AVX-512 CPUs): the phases would each
    convert their inputs otherwise. A bf16/f16 problem also has it in f32 wherever it fits
    (:func:`applies_in_f32`)."""
    if not fits(p):
        return False
    if p.op == BACKWARD_DATA:  # its phases are summed: in f32 only (bf16 would round each part)
        return p.dtype == "f32"
    return base.parts_native(p.dtype)


def applies_in_f32(p: Problem) -> bool:
    """Whether ``p`` has the polyphase lowering computed in f32: a bf16/f16 problem that
    :func:`fits`. Its inputs are converted to f32 once, the f32 problem's phases run on
    them into an f32 result, and that is rounded once (:class:`onednn_convt.plan.PhasedPlan`;
    BackwardData's phases are summed in f32). Where the library has no native kernel for the
    dtype (bf16 on AVX2, f16 without AVX512-FP16) this is the polyphase form there is
    (:func:`onednn_convt.lowering.build` makes it: the f32 problem's lowering, marked
    ``f32_only``)."""
    return p.dtype in ("bf16", "f16") and fits(p)


def _sub_problem(p: Problem, dims: Sequence[DimPhase], op: str, bias: bool = False) -> Problem:
    """The stride-1 problem of one phase (reach outputs per dim)."""
    n_dims = len(dims)
    geometry = Geometry((1,) * n_dims, (1,) * n_dims, tuple(d.pads_begin for d in dims), tuple(d.pads_end for d in dims))
    return replace(p, op=op, dst=tuple(d.reach for d in dims), kernel=tuple(d.taps for d in dims), geometry=geometry,
                   output_padding=(0,) * n_dims, bias=bias and op == FORWARD).with_call_shapes()


def _spatial_axes(p: Problem, tensor: str) -> list[int]:
    """The axes of a call tensor's spatial dims: activations by data format, weights by
    weights format."""
    rank = p.rank
    if tensor == "weights":
        return list(range(2, 2 + rank)) if p.weights_format == "IOX" else list(range(rank))
    return list(range(2, 2 + rank)) if p.data_format == "NCX" else list(range(1, 1 + rank))


def _index(ndim: int, axes: Sequence[int], slices: Sequence[slice]) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    for a, s in zip(axes, slices):
        index[a] = s
    return tuple(index)


def _every(first: int, count: int, step: int) -> slice:
    """``count`` elements from ``first``, ``step`` apart."""
    return slice(first, first + (count - 1) * step + 1, step)


Chooser = Callable[[Problem], Lowering]


def build(p: Problem, choose: Chooser) -> Lowering:
    """The polyphase lowering of ``p`` (:func:`applies`); ``choose`` gives each phase's
    stride-1 problem its lowering (the rules' choice)."""
    # a forward's bias: in each phase (the core adds it to a small f32 result), or in one
    # BiasAdd over dst after them (see the module's docstring), except where every phase
    # runs as a forward Convolution, whose kernels add it at no cost (a depthwise NXC layer:
    # 2.5 ms with it in the phases, 3.5 with the BiasAdd after them; AMD Zen5, f32)
    after = p.op == FORWARD and forward.bias_apart(p) == forward.STAGE
    parts = _parts(p, choose, p.op == FORWARD and p.bias and not after)
    if after and all(ph.lowering is None or ph.lowering.kind == base.CONVOLUTION for ph in parts):
        parts, after = _parts(p, choose, True), False
    return Lowering(base.POLYPHASE, {}, tuple(range(len(p.input_shapes))), p.out_shape, name=base.POLYPHASE,
                    phases=tuple(parts), bias_stage=after)


def _parts(p: Problem, choose: Chooser, in_phases: bool) -> list[Phase]:
    """The phases of ``p``; ``in_phases``: a forward's phases take its bias."""
    g = p.geometry
    s = g.strides
    per_dim = [phases(x, k, st, pb, y) for x, k, st, pb, y in zip(p.src, p.kernel, s, g.pads_begin, p.dst)]
    w_axes, a_axes = _spatial_axes(p, "weights"), _spatial_axes(p, "activation")
    ndim = p.rank + 2
    parts = []
    for dims in itertools.product(*per_dim):
        w_view = _index(ndim, w_axes, [slice(d.phase, None, st) for d, st in zip(dims, s)])
        reached = all(d.taps and d.reach for d in dims)
        reach = _index(ndim, a_axes, [_every(d.first, d.reach, st) for d, st in zip(dims, s)]) if reached else ()
        if p.op == FORWARD:
            if any(d.count == 0 for d in dims):
                continue  # no outputs in this phase
            whole = _index(ndim, a_axes, [_every(d.first, d.count, st) for d, st in zip(dims, s)])
            fill = whole if not reached or any(d.reach < d.count for d in dims) else None
            if not reached:  # the bias (or zeros) alone
                parts.append(Phase(None, (), whole, fill))
                continue
            inputs = ((0, ()), (1, w_view)) + (((2, ()),) if in_phases else ())
            parts.append(Phase(choose(_sub_problem(p, dims, FORWARD, in_phases)), inputs, reach, fill))
        elif p.op == BACKWARD_WEIGHTS:
            if any(d.taps == 0 for d in dims):
                continue  # no taps: an empty view of diff_weights
            if not reached:  # taps that reach no diff_dst: their gradient is 0
                parts.append(Phase(None, (), w_view, w_view))
                continue
            parts.append(Phase(choose(_sub_problem(p, dims, BACKWARD_WEIGHTS)), ((0, ()), (1, reach)), w_view, None))
        elif reached:  # BackwardData: every phase adds to all of diff_src
            first = not parts
            sub = choose(_sub_problem(p, dims, BACKWARD_DATA))
            parts.append(Phase(sub, ((0, reach), (1, w_view)), (), None, accumulate=not first))
    if p.op == BACKWARD_DATA and not parts:  # no tap reaches diff_dst: diff_src is 0
        parts.append(Phase(None, (), (), ()))
    return parts

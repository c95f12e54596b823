"""A 3-D depthwise BackwardData as 2-D ones, one per depth tap, on plane views.

oneDNN 3.2 has no 3-D depthwise kernel: such a call runs its gemm convolution
(``x64:gemm:jit``) whatever it is lowered to (:attr:`onednn_convt.problem.Problem.gemm_grouped`),
while its 2-D depthwise calls run ``brdgmm_dw`` (AVX2 and up). BackwardData computes
diff_src plane ``i`` (depth) as a sum over the depth taps ``t``: the 2-D BackwardData of
diff_dst's plane ``o = s*i + t*d - pb`` (stride ``s``, dilation ``d``, pads_begin ``pb`` in
depth) with the weights' tap-``t`` slice (IOX ``w[:, :, t]``, XOI ``w[t]``), the 2-D
attributes being the 3-D ones' last two dims. For one tap the planes ``i`` it reaches are a
run ``i0 .. i0 + count`` and their diff_dst planes a run of step ``s``: one 2-D op per sample
(its batch: those planes; NCX's view swaps the channel and plane axes) or one per plane (its
batch: the samples), whichever takes fewer ops. Each writes a view of diff_src: the ops of
one tap that reaches every plane write it, the others add to it (:class:`.base.Phase`; where
no tap reaches every plane, diff_src is zeroed first). No copies: views of the call's arrays.

Summing parts, it runs in f32 alone (as polyphase BackwardData does). Measured with a
prototype through the public API on an AMD Zen3 (avx2), 2 threads, f32 NXC, against the
library op and PyTorch's ``conv3d`` (medians of 15 alternated blocks): 16x128 channels on
2x2x2, k4 s2 p1, 2.41 ms as the library op, 0.43 by taps, PyTorch 0.21; 8x32 on 10^3 k2 s2
4.95 against 1.11 (PyTorch 0.57); 1x32 on 16^3 k4 s2 8.15 against 1.13 (0.54); 4x128 on 12^3
k3 s2 28.1 against 4.9 (3.8). The rules choose it on the dispatch ISAs where it was
measured (:func:`choice`); the tuner times it for every problem it applies to.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional, Sequence

from .. import guards
from ..problem import BACKWARD_DATA, Geometry, Problem
from . import base
from .base import Lowering, Phase, View

#: the most 2-D ops (each a library call) a problem may split into
MAX_PARTS = 128

#: the dispatch ISAs on which the rules choose it (an AMD Zen3); elsewhere the tuner may
MEASURED_ON = frozenset({"avx2"})

Chooser = Callable[[Problem], Lowering]


def _reach(p: Problem) -> list[tuple[int, int, int, int]]:
    """Per depth tap that reaches diff_dst: (tap, first plane ``i0``, planes ``count``, the
    first diff_dst plane)."""
    g = p.geometry
    s, d, pb = g.strides[0], g.dilations[0], g.pads_begin[0]
    out = []
    for t in range(p.kernel[0]):
        planes = [i for i in range(p.src[0]) if 0 <= s * i + t * d - pb < p.dst[0]]
        if planes:
            out.append((t, planes[0], len(planes), s * planes[0] + t * d - pb))
    return out


def _per_sample(p: Problem, reach: Sequence[tuple[int, int, int, int]]) -> bool:
    """One 2-D op per sample and tap (else per plane and tap): whichever is fewer."""
    return p.n * len(reach) <= sum(count for _, _, count, _ in reach)


def parts(p: Problem) -> int:
    """How many 2-D ops :func:`build` splits ``p`` into."""
    reach = _reach(p)
    return p.n * len(reach) if _per_sample(p, reach) else sum(count for _, _, count, _ in reach)


def fits(p: Problem) -> bool:
    """Whether ``p`` splits so: a 3-D depthwise BackwardData, in at most :data:`MAX_PARTS`
    2-D ops."""
    return (p.op == BACKWARD_DATA and p.rank == 3 and p.groups > 1 and p.depthwise
            and 0 < parts(p) <= MAX_PARTS)


def applies(p: Problem) -> bool:
    """Whether ``p`` has the depth-taps lowering in its own dtype: :func:`fits`, in f32 (the
    parts are summed, which bf16 would round each time)."""
    return p.dtype == "f32" and fits(p)


def applies_in_f32(p: Problem) -> bool:
    """Whether ``p`` has it computed in f32: a bf16/f16 problem that :func:`fits` (its inputs
    converted to f32 once, the f32 parts summed, the result rounded once, as
    ``"Polyphase in f32"`` is)."""
    return p.dtype in ("bf16", "f16") and fits(p)


def choice(p: Problem, names: Sequence[str]) -> Optional[str]:
    """The rules' lowering of ``p`` where the depth taps decide it (one of ``names``: the
    lowering, or in f32 that of a bf16/f16 problem), else None: on a dispatch ISA where they
    were measured (:data:`MEASURED_ON`)."""
    if guards.dispatch_isa() not in MEASURED_ON:
        return None
    return next((n for n in names if n.startswith(base.DEPTH_TAPS)), None)


def plane_problem(p: Problem, batch: int) -> Problem:
    """The 2-D BackwardData of one tap over ``batch`` planes or samples."""
    g = p.geometry
    geometry = Geometry(g.strides[1:], g.dilations[1:], g.pads_begin[1:], g.pads_end[1:])
    src, dst, kernel = p.src[1:], p.dst[1:], p.kernel[1:]
    o = p.oc // p.groups
    wshape = (p.ic, o, *kernel) if p.weights_format == "IOX" else (*kernel, o, p.ic)

    def act(c: int, sp: tuple[int, ...]) -> tuple[int, ...]:
        return (batch, c, *sp) if p.data_format == "NCX" else (batch, *sp, c)

    return replace(p, n=batch, src=src, dst=dst, kernel=kernel, geometry=geometry,
                   output_padding=p.output_padding[1:], input_shapes=(act(p.oc, dst), wshape),
                   out_shape=act(p.ic, src))


def build(p: Problem, choose: Chooser) -> Lowering:
    """The depth-taps lowering of ``p`` (:func:`applies`); ``choose`` gives each 2-D problem
    its lowering (the rules' choice)."""
    reach = _reach(p)
    per_sample = _per_sample(p, reach)
    ncx = p.data_format == "NCX"
    depth = 2 if ncx else 1  # an activation's depth axis
    s = p.geometry.strides[0]
    whole = next((r for r in reach if r[2] == p.src[0]), None)  # a tap that reaches every plane
    ordered = ([whole] if whole else []) + [r for r in reach if r is not whole]
    lowered: dict[int, Lowering] = {}

    def lowering_of(batch: int) -> Lowering:
        if batch not in lowered:
            lowered[batch] = choose(plane_problem(p, batch))
        return lowered[batch]

    def taps(t: int) -> View:
        return View((slice(None), slice(None), t) if p.weights_format == "IOX" else (t,))

    phases = [] if whole else [Phase(None, (), (), ())]  # diff_src zeroed first
    for t, i0, count, o0 in ordered:
        write = whole is not None and t == whole[0]
        planes_in, planes_out = slice(o0, o0 + s * (count - 1) + 1, s), slice(i0, i0 + count)
        if per_sample:  # batch: the tap's planes of one sample
            swap = (1, 0, 2, 3) if ncx else None
            for n in range(p.n):
                dd = View((n, slice(None), planes_in) if ncx else (n, planes_in), swap)
                ds = View((n, slice(None), planes_out) if ncx else (n, planes_out), swap)
                phases.append(Phase(lowering_of(count), ((0, dd), (1, taps(t))), ds, None, accumulate=not write))
        else:  # batch: the samples, one plane
            for j in range(count):
                dd = View((slice(None),) * depth + (o0 + s * j,))
                ds = View((slice(None),) * depth + (i0 + j,))
                phases.append(Phase(lowering_of(p.n), ((0, dd), (1, taps(t))), ds, None, accumulate=not write))
    return Lowering(base.DEPTH_TAPS, {}, (0, 1), p.out_shape, name=base.DEPTH_TAPS, phases=tuple(phases))

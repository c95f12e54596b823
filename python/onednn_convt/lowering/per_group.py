"""The per-group lowering: a grouped op as one ungrouped op per group, on channel slices.

Group ``g`` of a grouped ConvTranspose reads src channels ``g*IC/G ... (g+1)*IC/G``, the
weights' rows of those input channels (IOX: ``w[g*IC/G:(g+1)*IC/G]``; XOI: the last axis),
and writes dst channels ``g*OC/G ... (g+1)*OC/G``; its bias, the same slice of the bias.
Those slices are views (a channel slice of NXC activations is strided), so each group runs
as an ungrouped op of the library on views of the call's arrays, writing a view of the
result: no copies, and the library's dense kernels instead of its grouped ones, which
oneDNN 3.2 runs slowly for few groups of few channels. BackwardData and BackwardWeights
split alike (diff_dst's and diff_src's channel slices; the weights' rows of the group).

Measured with a prototype through the public API on an AMD Zen3 (avx2), 2 threads, f32
(medians of 7 alternated calls, ``benchmarks/NOTES.md``): a 4-group k3 s1 forward of 16 to
32 channels on 32x34x136, NXC 37.2 ms grouped against 16.4 per group, NCX 25.1 against
7.4; an 8-group 1-D k7 s1 forward NCX 48.7 against 8.9; but 32 groups of 8 to 16 channels,
k4 s2, NXC 16.2 against 23.3. A candidate of the tuner and the rules for at most
:data:`MAX_GROUPS` groups; the rules choose it where a measured table says so (the Zen3
table: its grouped layers tuned with it, ``benchmarks/NOTES.md``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Problem
from . import base
from .base import Lowering, Phase

#: the most groups a problem may split into (each is a library call)
MAX_GROUPS = 8

Chooser = Callable[[Problem], Lowering]


def applies(p: Problem) -> bool:
    """Whether ``p`` has the per-group lowering: 2 to :data:`MAX_GROUPS` groups, in a dtype
    the library runs natively here (f32; bf16 on AVX-512 CPUs: each group would convert its
    inputs to f32 otherwise)."""
    if not 2 <= p.groups <= MAX_GROUPS:
        return False
    return base.parts_native(p.dtype)


def sub_problem(p: Problem) -> Problem:
    """The ungrouped problem of one group."""
    return replace(p, groups=1, ic=p.ic // p.groups, oc=p.oc // p.groups).with_call_shapes()


def build(p: Problem, choose: Chooser) -> Lowering:
    """The per-group lowering of ``p`` (:func:`applies`); ``choose`` gives the ungrouped
    problem its lowering (the rules' choice), the same for every group."""
    sub = choose(sub_problem(p))
    icg, ocg = p.ic // p.groups, p.oc // p.groups
    rank = p.rank
    channel_axis = 1 if p.data_format == "NCX" else rank + 1
    rows_axis = 0 if p.weights_format == "IOX" else rank + 1

    def view(ndim: int, axis: int, width: int, g: int) -> tuple[slice, ...]:
        index = [slice(None)] * ndim
        index[axis] = slice(g * width, (g + 1) * width)
        return tuple(index)

    nd = rank + 2
    parts = []
    for g in range(p.groups):
        src_in, src_out = view(nd, channel_axis, icg, g), view(nd, channel_axis, ocg, g)
        rows = view(nd, rows_axis, icg, g)
        if p.op == FORWARD:
            inputs = ((0, src_in), (1, rows)) + (((2, view(1, 0, ocg, g)),) if p.bias else ())
            parts.append(Phase(sub, inputs, src_out, None))
        elif p.op == BACKWARD_DATA:
            parts.append(Phase(sub, ((0, src_out), (1, rows)), src_in, None))
        else:
            assert p.op == BACKWARD_WEIGHTS
            parts.append(Phase(sub, ((0, src_in), (1, src_out)), rows, None))
    return Lowering(base.PER_GROUP, {}, tuple(range(len(p.input_shapes))), p.out_shape, name=base.PER_GROUP,
                    phases=tuple(parts))

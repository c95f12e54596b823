"""A 3-D depthwise call as 2-D ones, one per depth tap, on plane views.

oneDNN 3.2 has no 3-D depthwise kernel: such a call runs its gemm convolution
(``x64:gemm:jit``; :attr:`onednn_convt.problem.Problem.gemm_grouped`), or on AVX-512 as a
Convolution its general ``jit:avx512_core`` one (an AMD Zen4, by ONEDNN_VERBOSE), while its
2-D depthwise calls run ``brdgmm_dw`` (AVX2 and up). Along depth, src plane ``i``
meets dst plane ``o = s*i + t*d - pb`` through tap ``t`` (stride ``s``, dilation ``d``,
pads_begin ``pb`` in depth), and that pair is a 2-D problem of the op with the weights'
tap-``t`` slice (IOX ``w[:, :, t]``, XOI ``w[t]``), the 2-D attributes being the 3-D ones'
last two dims. For one tap the src planes it reaches are a run ``i0 .. i0 + count`` and their
dst planes a run of step ``s``. In NXC, where dst has ``s`` planes per src plane, a tap's
planes of every sample are one run of the activations with the sample and depth axes merged:
its ops take that run, in pieces of :data:`MERGED_BYTES` (:func:`_merges`). Otherwise one
2-D op per sample (its batch: those planes; NCX's views swap the channel and plane axes) or
one per plane (its batch: the samples), whichever takes fewer ops, weighed by
:data:`PER_SAMPLE_OPS`. Each reads and writes views of the call's arrays
(:class:`.base.Phase`), no copies:

- BackwardData: each op gives diff_src planes a part; the ops of a tap that reaches every
  plane write them, the others add (where no tap reaches every plane, diff_src is zeroed
  first);
- the forward, strided in depth: each tap writes the dst planes it meets first and adds to
  those an earlier tap wrote, the planes no tap meets are zeroed and the bias is added after
  the ops (:func:`_forward_order`); at a depth stride of 1, dst is filled with the bias (or
  zeros) and every op adds to its planes;
- BackwardWeights: each tap's op gives a part of that tap's weights gradient; the first
  writes it, the others add (a tap that reaches no plane is zero).

Summing parts, it runs in f32 (as polyphase BackwardData does; bf16/f16 as ``"Depth taps in
f32"``). Measured with a prototype through the public API on an AMD Zen3 (avx2), 2 threads,
f32 NXC BackwardData, against the library op and PyTorch's ``conv3d`` (medians of 15
alternated blocks): 16x128 channels on 2x2x2, k4 s2 p1, 2.41 ms as the library op, 0.43 by
taps, PyTorch 0.21; 8x32 on 10^3 k2 s2 4.95 against 1.11 (PyTorch 0.57); 1x32 on 16^3 k4 s2
8.15 against 1.13 (0.54); 4x128 on 12^3 k3 s2 28.1 against 4.9 (3.8). The rules choose it
for the problems where it ran faster on the CPU at hand (:data:`MEASURED_ON`, keyed as the
tables are), and on a CPU where it was not measured, for those where it ran faster on every
CPU that was (:func:`faster_everywhere`); the tuner times it for every problem it applies to.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Optional, Sequence

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Geometry, Problem
from . import base, channels_last, rules
from .base import Lowering, Phase, View

#: the most 2-D ops (each a library call) a problem may split into
MAX_PARTS = 128

#: the fewest src planes of a BackwardWeights the rules run so on an AMD Zen3
#: (:func:`faster_on_zen3`)
MIN_WEIGHTS_PLANES = 4

Chooser = Callable[[Problem], Lowering]


#: a tap of :func:`_reach`: (tap, its first src plane, how many src planes, the first's dst plane)
Tap = tuple[int, int, int, int]


def _reach(p: Problem) -> list[Tap]:
    """Per depth tap that reaches dst: (tap, its first src plane ``i0``, how many src planes
    it reaches, the first one's dst plane)."""
    g = p.geometry
    s, d, pb = g.strides[0], g.dilations[0], g.pads_begin[0]
    out = []
    for t in range(p.kernel[0]):
        first = max(0, -((t * d - pb) // s))  # the least i with s*i + t*d - pb >= 0
        last = min(p.src[0] - 1, (p.dst[0] - 1 - t * d + pb) // s)  # the greatest inside dst
        if last >= first:
            out.append((t, first, last - first + 1, s * first + t * d - pb))
    return out


#: per data format, how many times as many 2-D ops per sample as per plane a problem still
#: runs per sample. In NXC a sample's planes are a dense batch, which oneDNN reads as it is,
#: where a plane's samples are strided and copied first (12 us for 256 KB); in NCX a sample's
#: view swaps the channel and plane axes, which the 2-D kernels handle worse. Measured on an
#: AMD Zen4 (2 threads, f32, the 30 3-D depthwise layers, every op, each way forced,
#: alternated): NXC per sample 1.0-2.6x faster at 1.05-1.17 times the ops, slower from 1.45;
#: NCX per plane 0.82-1.08x at 0.74-0.86, 1.08-1.67x slower at 0.62
PER_SAMPLE_OPS = {"NXC": 1.25, "NCX": 0.7}


#: the most bytes (in f32) of src or dst planes one merged op takes (:func:`_merges`): a
#: longer run goes in pieces. Measured on an AMD Zen4 (2 threads; the 23 NXC layers of the
#: 30 3-D depthwise ones where taps merge, f32 and bf16, every op, each form alternated with
#: the unmerged one in one process, medians of 7): runs of at most 2 MiB took BackwardData
#: 1.14-1.19x less time (geomean; min 0.74), BackwardWeights 1.03-1.20x, a stride-1 forward
#: 1.22x; runs of 8 MiB 1.06x over all (a run past the caches makes its copy of strided
#: planes, and its sum, slower than the ops it saves); 0.5 MiB 0.75-0.93x
MERGED_BYTES = 2 << 20


def _merges(p: Problem, r: tuple[int, int, int, int]) -> bool:
    """Whether tap ``r`` of :func:`_reach` runs as ops over every sample's planes: in NXC,
    where dst has ``s`` planes per src plane, a tap's (sample, plane) pairs are one strided
    run of the activations with their sample and depth axes merged (in pieces of at most
    :data:`MERGED_BYTES`, :func:`_runs`). A BackwardData or forward op over that run also
    meets, at each sample's edge, a neighbouring sample's planes; those planes of its result
    are zeroed before it is added (``Phase.zero``). A weights gradient sums over the run, so
    BackwardWeights merges only the taps that reach every plane, which meet no neighbour. A
    forward merges at a depth stride of 1 only: strided, each op adds its result to every
    ``s``-th dst plane, and the larger runs ran slower (0.62-0.97x on 8 of 10 strided layers
    on an AMD Zen4; :data:`MERGED_BYTES`)."""
    return merged_runs(p) and (p.op != BACKWARD_WEIGHTS or r[2] == p.src[0])


def merged_runs(p: Problem) -> bool:
    """Whether ``p``'s taps run over every sample's planes at once (:func:`_merges`): NXC,
    ``s`` dst planes per src plane, a forward at a depth stride of 1 only."""
    s = p.geometry.strides[0]
    return p.data_format == "NXC" and p.dst[0] == s * p.src[0] and not (p.op == FORWARD and s > 1)


def _runs(p: Problem, r: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """A merged tap's run (:func:`_merges`): ``(b0, b1, step)``, its src planes ``b0 .. b1``
    of the merged samples and planes (dst plane ``s*b + offset`` for src plane ``b``), in
    pieces of ``step`` planes."""
    t, i0, count, o0 = r
    s = p.geometry.strides[0]
    off, planes = o0 - s * i0, p.n * p.src[0]
    b0, b1 = max(0, -(off // s)), min(planes, (p.n * p.dst[0] - 1 - off) // s + 1)
    plane_bytes = 4 * max(p.ic * math.prod(p.src[1:]), p.oc * math.prod(p.dst[1:]))
    return b0, b1, max(1, MERGED_BYTES // plane_bytes)


def _per_sample(p: Problem, reach: Sequence[tuple[int, int, int, int]]) -> bool:
    """One 2-D op per sample and tap (else per plane and tap) for the taps that do not
    merge (:func:`_merges`): per sample where that takes at most :data:`PER_SAMPLE_OPS`
    times as many ops."""
    return p.n * len(reach) <= PER_SAMPLE_OPS[p.data_format] * sum(count for _, _, count, _ in reach)


def parts(p: Problem) -> int:
    """How many 2-D ops :func:`build` splits ``p`` into."""
    reach = _reach(p)
    merged = [_runs(p, r) for r in reach if _merges(p, r)]
    apart = [r for r in reach if not _merges(p, r)]
    split = p.n * len(apart) if _per_sample(p, apart) else sum(count for _, _, count, _ in apart)
    return sum(-(-(b1 - b0) // step) for b0, b1, step in merged) + split


def fits(p: Problem) -> bool:
    """Whether ``p`` splits so: a 3-D depthwise problem, in at most :data:`MAX_PARTS` 2-D
    ops."""
    return p.rank == 3 and p.groups > 1 and p.depthwise and 0 < parts(p) <= MAX_PARTS


def applies(p: Problem) -> bool:
    """Whether ``p`` has the depth-taps lowering in its own dtype: :func:`fits`, in f32 (the
    parts are summed, which bf16 would round each time)."""
    return p.dtype == "f32" and fits(p)


def applies_in_f32(p: Problem) -> bool:
    """Whether ``p`` has it computed in f32: a bf16/f16 problem that :func:`fits` (its inputs
    converted to f32 once, the f32 parts summed, the result rounded once, as
    ``"Polyphase in f32"`` is)."""
    return p.dtype in ("bf16", "f16") and fits(p)


def _fits_channels_last(p: Problem) -> bool:
    """Whether NCX ``p``'s NXC problem splits so, its taps over every sample's planes."""
    if not channels_last.applies(p):
        return False
    q = channels_last.nxc_problem(p)
    return fits(q) and merged_runs(q)


def applies_channels_last(p: Problem) -> bool:
    """Whether ``p`` has the depth taps of its NXC problem between reorders of its
    activations (:data:`.base.DEPTH_TAPS_CHANNELS_LAST`): an f32 NCX problem whose NXC
    problem's taps run over every sample's planes (:func:`merged_runs`). The NCX taps run
    one op per sample or plane, their 2-D kernels on views with swapped axes, and oneDNN 3.2
    adds no sum in place there (:class:`onednn_convt.plan.SumPlan`)."""
    return p.dtype == "f32" and _fits_channels_last(p)


def applies_channels_last_in_f32(p: Problem) -> bool:
    """Whether ``p`` has them computed in f32: a bf16/f16 problem that
    :func:`applies_channels_last` would take in f32."""
    return p.dtype in ("bf16", "f16") and _fits_channels_last(p)


def faster_on_zen3(p: Problem) -> bool:
    """Where the depth taps ran faster than the rules' other choices on an AMD Zen3 (avx2, 2
    threads, f32 and bf16 computed in f32, the 30 3-D depthwise layers of the random suites,
    alternated in one process; ``benchmarks/NOTES.md``): every BackwardData (f32 2.99x, min
    0.96); the forward in NXC (2.74x, min 1.02) and in NCX where the depth kernel is longer
    than its stride (NCX with stride >= kernel lost, 0.49-0.88x); BackwardWeights in NXC
    where the depth kernel is longer than its stride and src has at least
    :data:`MIN_WEIGHTS_PLANES` planes (a 2-plane layer lost, 0.29x, and tiled ones
    0.55-0.92x; NCX mixed, 0.35-11x)."""
    overlap = p.geometry.strides[0] < p.kernel[0]
    if p.op == BACKWARD_DATA:
        return True
    if p.op == FORWARD:
        return p.data_format == "NXC" or overlap
    return p.data_format == "NXC" and overlap and p.src[0] >= MIN_WEIGHTS_PLANES


#: the fewest channels of a strided bf16 NXC forward that the Zen4's rule runs by depth taps
#: where its depth kernel is not a multiple of its stride (:func:`faster_on_zen4`)
MIN_BF16_CHANNELS = 16


def faster_on_zen4(p: Problem) -> bool:
    """Where the depth taps ran faster than the rules' other choices on an AMD Zen4
    (avx512_core_bf16, 2 threads, the same 30 layers, every op, f32 and bf16, the rules taking
    every problem, alternated; ``benchmarks/results/zen4/ab-depth-taps-*.json``):
    BackwardData in NXC (f32 geomean 3.97x, bf16 2.79x) or where the depth kernel is longer
    than its stride (NCX: 2.65x, 2.08x; NCX with stride >= kernel lost, 0.21-1.29x); the
    forward with a depth stride of 1 (3.2-6.7x, min 1.69), in NXC in f32 (strided: 1.42x,
    min 0.52; NCX 0.31-3.03x), and in bf16 where the depth kernel is a multiple of its stride
    (5.5-5.9x, min 1.56: the library's native bf16 op took up to 92 ms where the taps took
    10; the k3 s2 layers lost, 0.47-0.92x in NCX); BackwardWeights in NXC where the depth
    kernel is longer than its stride (f32 2.97x, bf16 2.49x, min 0.86; NCX 0.22-12x, no clear
    line). Over all 180 configurations per dtype: f32 2.05x, bf16 2.16x. Since NXC taps merge
    their samples' planes (:func:`_merges`; ``ab-depth-taps-nxc-merged-*.json``, the 90 NXC
    configurations per dtype again: f32 3.96x, bf16 3.12x), BackwardWeights in NXC at depth
    k2 s2 too (f32 2.25-5.59x, bf16 0.92-2.87x over 5 layers; k4 s4 still lost, 0.59-1.09x).
    Since a strided forward's taps write the planes no earlier tap met (:func:`_forward_order`;
    ``ab-depth-taps-forward-writes-*.json``, the 19 strided layers, two runs each): in NCX f32
    where the depth kernel is a multiple of its stride and longer (k4 s2: 1.14-3.71x on 4
    layers; k2 s2 lost on one of 5, 0.59-0.75x; k3 s2 and k4 s4 mixed, 0.70-1.56x), and in
    NXC bf16 with at least :data:`MIN_BF16_CHANNELS` channels at any stride (k3 s2:
    1.49-2.86x on 5 layers, 0.98x on a 6^3 one; an 8-channel layer lost, 0.63-0.67x; NCX
    bf16 k3 s2 0.41-1.71x from run to run)."""
    overlap = p.geometry.strides[0] < p.kernel[0]
    if p.op == BACKWARD_DATA:
        return p.data_format == "NXC" or overlap
    if p.op == FORWARD:
        s, k = p.geometry.strides[0], p.kernel[0]
        if s == 1:
            return True
        if p.dtype == "bf16":
            return k % s == 0 or (p.data_format == "NXC" and p.ic >= MIN_BF16_CHANNELS)
        return p.data_format == "NXC" or (overlap and k % s == 0)
    return p.data_format == "NXC" and (overlap or p.kernel[0] == p.geometry.strides[0] == 2)


def faster_everywhere(p: Problem) -> bool:
    """Where the depth taps ran faster on every CPU they were measured on
    (:func:`faster_on_zen3` and :func:`faster_on_zen4`), by a margin: BackwardData, the
    forward at a depth stride of 1, and BackwardWeights in NXC as on the Zen3 (on the Zen4:
    geomean 2.1-6.7x in each op, dtype and format, min 0.68; on the Zen3, f32, BackwardData
    2.99x, BackwardWeights 3.72x, the forward in NXC 3.05x): the
    rules' choice on a CPU not in :data:`MEASURED_ON`."""
    return faster_on_zen3(p) and faster_on_zen4(p) and (p.op != FORWARD or p.geometry.strides[0] == 1)


#: where the rules take the depth taps, by the CPU on which that was measured (keyed by
#: :func:`.rules.this_cpu`, as the measured tables are)
MEASURED_ON: dict[tuple[str, str], rules.MeasuredRule] = {
    ("zen3", "avx2"): faster_on_zen3,
    ("zen4", "avx512_core_bf16"): faster_on_zen4,
}

#: the rule of a CPU not in :data:`MEASURED_ON` (None: the tables decide there)
ELSEWHERE: Optional[rules.MeasuredRule] = faster_everywhere


def channels_last_faster_on_zen4(p: Problem) -> bool:
    """Where the channels-last depth taps ran faster than the rules' other choices on an
    AMD Zen4 (2 threads; the NCX configurations of the 30 3-D depthwise layers where they
    apply, f32 and bf16, every op, alternated; ``benchmarks/lowering_ab.py --without
    "Channels-last depth taps"``, ``results/zen4/ab-channels-last-depth-taps-*.json``): at a
    depth stride of 1, f32 2.24x (33 configurations, min 1.07: the forward 1.91x,
    BackwardData 1.95x, BackwardWeights 3.01x), bf16 2.24x (min 1.24). Strided, they lost
    (f32 0.82x over 24, bf16 0.77x; k4 s4 and k2 s2 0.20-0.72x): the rules keep the NCX
    choices there."""
    return p.geometry.strides[0] == 1


#: where the rules take the channels-last depth taps (:func:`applies_channels_last`), by the
#: CPU on which that was measured; on any other CPU they do not (the tuner times them)
CHANNELS_LAST_ON: dict[tuple[str, str], rules.MeasuredRule] = {
    ("zen4", "avx512_core_bf16"): channels_last_faster_on_zen4,
}


def choice(p: Problem, names: Sequence[str]) -> Optional[str]:
    """The rules' lowering of ``p`` where the depth taps decide it (one of ``names``: the
    lowering, or in f32 that of a bf16/f16 problem), else None: the channels-last taps where
    they ran faster on this CPU (:data:`CHANNELS_LAST_ON`), else the taps for the problems
    where they ran faster on this CPU (:data:`MEASURED_ON`, else :data:`ELSEWHERE`)."""
    reordered = next((n for n in names if n.startswith(base.DEPTH_TAPS_CHANNELS_LAST)), None)
    if reordered is not None and rules.measured_here(CHANNELS_LAST_ON, None, p):
        return reordered
    name = next((n for n in names if n.startswith(base.DEPTH_TAPS)), None)
    return name if name is not None and rules.measured_here(MEASURED_ON, ELSEWHERE, p) else None


def plane_problem(p: Problem, batch: int) -> Problem:
    """The 2-D problem of ``p``'s op for one tap over ``batch`` planes or samples (a
    forward's without its bias, which fills dst first)."""
    g = p.geometry
    geometry = Geometry(g.strides[1:], g.dilations[1:], g.pads_begin[1:], g.pads_end[1:])
    return replace(p, n=batch, src=p.src[1:], dst=p.dst[1:], kernel=p.kernel[1:], geometry=geometry, bias=False,
                   output_padding=p.output_padding[1:]).with_call_shapes()


def _planes(r: Tap, s: int) -> set[int]:
    """The dst planes (of each sample) tap ``r`` meets, at depth stride ``s``."""
    _, _, count, o0 = r
    return set(range(o0, o0 + s * count, s))


def _forward_order(p: Problem, reach: Sequence[Tap]) -> Optional[list[tuple[Tap, bool]]]:
    """The forward's taps in the order they run, each with whether its ops add to dst (else
    they write their planes), where each tap meets either only planes no earlier tap met
    (it writes them) or only planes earlier taps met (it adds); the taps that meet the most
    planes first (a k4 s2 layer's taps 1 and 2 write the even and the odd planes, taps 0 and
    3 add). None where that does not hold, or at a depth stride of 1 (where the ops run over
    every sample's planes, :func:`_merges`): then dst is filled first and every op adds. A
    strided forward's ops take one sample's or one plane's planes, so a write reaches no
    neighbouring sample's. Writing rather than adding saves the fill and the sums
    (NumPy's, where oneDNN 3.2 fuses none: the strided 2-D deconvolution writes a blocked
    layout), and a forward whose taps tile dst (k2 s2, k4 s4) becomes one library op per
    part with no sum, which the phased executor runs. Measured on an AMD Zen4 (2 threads, the
    3-D depthwise layers of ``benchmarks/random_layers_3d_depthwise.json``, every forward the
    rules run by depth taps, f32 and bf16, alternated in one process;
    ``benchmarks/forward_taps_ab.py``, ``results/zen4/forward-taps-writes-*.json``): strided
    in depth, 43 configurations, fill-and-add /
    writes 1.45x (geomean; min 1.02, max 2.05, the tiling k2 s2 and k4 s4 layers 1.5-2.05x
    with the executor); at a depth stride of 1 (the whole tap writing, merged), 44
    configurations, 1.03x, min 0.69: not taken there."""
    s = p.geometry.strides[0]
    if s == 1:
        return None
    met: set[int] = set()
    order = []
    for r in sorted(reach, key=lambda r: -r[2]):
        planes = _planes(r, s)
        if planes.isdisjoint(met):
            order.append((r, False))
            met |= planes
        elif planes <= met:
            order.append((r, True))
        else:
            return None
    return order


def _unreached(p: Problem, reach: Sequence[Tap]) -> list[tuple[int, int]]:
    """The runs ``(a, b)`` of dst planes (the same in each sample) that no tap meets."""
    met = set().union(*(_planes(r, p.geometry.strides[0]) for r in reach))
    runs: list[tuple[int, int]] = []
    for plane in range(p.dst[0]):
        if plane in met:
            continue
        if runs and runs[-1][1] == plane:
            runs[-1] = (runs[-1][0], plane + 1)
        else:
            runs.append((plane, plane + 1))
    return runs


def build(p: Problem, choose: Chooser) -> Lowering:
    """The depth-taps lowering of ``p`` (:func:`applies`); ``choose`` gives each 2-D problem
    its lowering (the rules' choice)."""
    reach = _reach(p)
    per_sample = _per_sample(p, [r for r in reach if not _merges(p, r)])
    ncx = p.data_format == "NCX"
    depth = 2 if ncx else 1  # an activation's depth axis
    s = p.geometry.strides[0]
    lowered: dict[int, Lowering] = {}

    def lowering_of(batch: int) -> Lowering:
        if batch not in lowered:
            lowered[batch] = choose(plane_problem(p, batch))
        return lowered[batch]

    def tap(t: int) -> View:
        """The weights' slice of tap ``t``."""
        return View((slice(None), slice(None), t) if p.weights_format == "IOX" else (t,))

    def ops_of(t: int, i0: int, count: int, o0: int) -> list[tuple[int, View, View, tuple[int, ...]]]:
        """Each 2-D op of tap ``t``: (batch, its src planes, its dst planes, the planes of
        its result to zero)."""
        if _merges(p, (t, i0, count, o0)):  # batch: a piece of the run of (sample, plane) pairs
            off = o0 - s * i0  # merged src plane b meets merged dst plane s*b + off
            b0, b1, step = _runs(p, (t, i0, count, o0))
            pieces = []
            for c in range(b0, b1, step):
                e = min(b1, c + step)  # this piece: merged src planes c .. e
                neighbours = tuple(b - c for b in range(c, e) if not i0 <= b % p.src[0] < i0 + count)
                pieces.append((e - c, View((slice(c, e),), merged=True),
                               View((slice(s * c + off, s * (e - 1) + off + 1, s),), merged=True), neighbours))
            return pieces
        if per_sample:  # batch: the tap's planes of one sample
            swap = (1, 0, 2, 3) if ncx else None
            src_planes, dst_planes = slice(i0, i0 + count), slice(o0, o0 + s * (count - 1) + 1, s)
            return [(count, View((n, slice(None), src_planes) if ncx else (n, src_planes), swap),
                     View((n, slice(None), dst_planes) if ncx else (n, dst_planes), swap), ()) for n in range(p.n)]
        every = (slice(None),) * depth  # batch: the samples, one plane
        return [(p.n, View(every + (i0 + j,)), View(every + (o0 + s * j,)), ()) for j in range(count)]

    phases: list[Phase] = []
    bias_after = False  # a forward's bias added after the ops (Lowering.bias_stage), not filled first
    if p.op == BACKWARD_DATA:  # diff_src planes: written by a tap that reaches them all, else zeroed
        whole = next((r for r in reach if r[2] == p.src[0]), None)
        if whole is None:
            phases.append(Phase(None, (), (), ()))
        for r in ([whole] if whole else []) + [r for r in reach if r is not whole]:
            for batch, src, dst, zero in ops_of(*r):
                phases.append(Phase(lowering_of(batch), ((0, dst), (1, tap(r[0]))), src, None,
                                    accumulate=r is not whole, zero=zero))
    elif p.op == FORWARD:
        order = _forward_order(p, reach)
        if order is None:  # dst filled with the bias (or zeros) first, every op adds to it
            phases.append(Phase(None, (), (), ()))
            order = [(r, True) for r in reach]
        else:  # the planes no tap meets zeroed; the bias added after the ops (bias_stage)
            every = (slice(None),) * depth
            phases += [Phase(None, (), (), View(every + (slice(a, b),))) for a, b in _unreached(p, reach)]
            bias_after = p.bias
        for r, adds in order:
            for batch, src, dst, zero in ops_of(*r):
                phases.append(Phase(lowering_of(batch), ((0, src), (1, tap(r[0]))), dst, None,
                                    accumulate=adds, zero=zero))
    else:  # each tap's weights gradient: its first op writes it, the others add (none: zeros)
        reached = {r[0] for r in reach}
        phases += [Phase(None, (), tap(t), tap(t)) for t in range(p.kernel[0]) if t not in reached]
        for r in reach:
            for k, (batch, src, dst, _) in enumerate(ops_of(*r)):
                phases.append(Phase(lowering_of(batch), ((0, src), (1, dst)), tap(r[0]), None, accumulate=k > 0))
    return Lowering(base.DEPTH_TAPS, {}, tuple(range(len(p.input_shapes))), p.out_shape, name=base.DEPTH_TAPS,
                    phases=tuple(phases), bias_stage=bias_after)

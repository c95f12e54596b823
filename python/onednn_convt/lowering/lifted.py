"""A 1-D call computed as its 2-D problem of height 1: the same memory, one more axis.

oneDNN 3.2 has no 1-D form of some of its kernels. On an AVX2 CPU a 1-D depthwise
ConvTranspose runs its gemm kernel (``x64:gemm:jit``) between reorders of NXC
activations to NCX and back, where the same layer as a 2-D one of height 1 runs its
depthwise JIT kernel (``jit_dw:avx2``), as PyTorch's call does (it lifts every 1-D
convolution so). Inserting an axis of size 1 is a view of any array: src (N, C, L) is
(N, C, 1, L) in NCX and (N, L, C) is (N, 1, L, C) in NXC; weights (IC, O, k) are
(IC, O, 1, k) in IOX and (k, O, IC) are (1, k, O, IC) in XOI; the result, written dense,
is the 1-D result's memory. The attributes gain a first spatial dim of stride 1,
dilation 1 and no padding.

Measured on an AMD Zen3 (avx2), 2 threads, f32, each form autotuned and alternated
(``benchmarks/NOTES.md``): two held-out 1-D depthwise layers (k8 s4 of 64 channels over
8191, k4 s2 of 32 channels over 8192) ran 1.4-11x faster lifted in five of their six
configurations each (NXC BackwardData 47.5 -> 4.3 ms), the same in the sixth; dense and
grouped 1-D layers ran the same either way, or slower (their MatMul lowerings have no
2-D form). The lowering (:data:`onednn_convt.lowering.base.LIFTED`) wraps a lowering of
the 2-D problem that is one library op on the arrays (as :mod:`.channels_last` does),
chosen by the rules; the rules choose it for a 1-D depthwise problem where it ran faster
on the CPU at hand, or on every CPU measured (:func:`choice`), and the tuner times it for
every 1-D problem.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional, Sequence

import numpy as np

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Geometry, Problem
from . import base, rules
from .base import Lowering



#: the library's own ops (one of which a 1-D problem must have among its own candidates)
LIBRARY_OPS = frozenset({
    base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA, base.FLIPPED_CONVOLUTION, base.CONVOLUTION,
    base.CONV_TRANSPOSE_BACKWARD_DATA, base.CONV_TRANSPOSE_BACKWARD_WEIGHTS, base.CONVOLUTION_BACKWARD_WEIGHTS,
})


def applies(p: Problem, own: Sequence[str]) -> bool:
    """Whether ``p`` has a lifted form: one spatial dim, and a library op among its own
    candidates ``own``. Not where it has a guard's route alone (which the guards chose for
    the 1-D problem), nor the MatMul alone of a kernel of 128 or more, which the library's
    ops would take minutes to compile (:mod:`.matmul_lowering`)."""
    return p.rank == 1 and any(n in LIBRARY_OPS for n in own)


def faster_on_zen3(p: Problem) -> bool:
    """Where a 1-D depthwise problem ran faster lifted on an AMD Zen3 (avx2, 2 threads, 15
    random layers, f32 and bf16 computed in f32; ``benchmarks/NOTES.md``): everywhere (f32
    2.84x, bf16 2.49x, min 0.72)."""
    return True


def faster_on_zen4(p: Problem) -> bool:
    """Where a 1-D depthwise problem ran faster lifted on an AMD Zen4 (avx512_core_bf16, 2
    threads, the same 15 layers, every op, the rules taking every problem, alternated;
    ``benchmarks/results/zen4/ab-lifted-1d-depthwise.json``). f32 (and f16, computed in f32
    here) everywhere but BackwardData in NCX with the stride at least the kernel (0.39-1.55x;
    elsewhere geomean 1.3-22x per op, format and kind of stride). Native bf16: the forward at
    stride 1 (2.4x NCX, 9.9x NXC; strided 0.36-0.88x where the kernel is longer than the
    stride), BackwardData in NXC (9.0-10.9x) or with the kernel longer than the stride (NCX
    1.9-3.1x; else 0.44-0.70x), BackwardWeights in NXC at stride 1 or with the kernel longer
    than the stride (strided, 3.0x as polyphase with all its phases lifted; at stride 1, as
    those phases are, 1.00x, min 0.51; with stride >= kernel 0.70-3.7x; in NCX 0.34-2.3x)."""
    s, k = p.geometry.strides[0], p.kernel[0]
    if p.dtype != "bf16":
        return not (p.op == BACKWARD_DATA and p.data_format == "NCX" and s >= k)
    if p.op == FORWARD:
        return s == 1
    if p.op == BACKWARD_DATA:
        return p.data_format == "NXC" or s < k
    return p.data_format == "NXC" and (s == 1 or s < k)


def faster_everywhere(p: Problem) -> bool:
    """Where it ran faster on every CPU it was measured on (:func:`faster_on_zen3` and
    :func:`faster_on_zen4`): the rules' choice on a CPU not in :data:`MEASURED_ON`."""
    return faster_on_zen3(p) and faster_on_zen4(p)


#: where the rules lift a 1-D depthwise problem, by the CPU on which that was measured
#: (keyed by :func:`.rules.this_cpu`, as the measured tables are)
MEASURED_ON: dict[tuple[str, str], rules.MeasuredRule] = {
    ("zen3", "avx2"): faster_on_zen3,
    ("zen4", "avx512_core_bf16"): faster_on_zen4,
}

#: the rule of a CPU not in :data:`MEASURED_ON` (None: the tables decide there)
ELSEWHERE: Optional[rules.MeasuredRule] = faster_everywhere


def choice(p: Problem, names: Sequence[str]) -> Optional[str]:
    """The rules' lowering of ``p`` (one of ``names``) where the lifted form decides it,
    else None: a 1-D depthwise problem runs lifted where it ran faster so on this CPU
    (:data:`MEASURED_ON`, else :data:`ELSEWHERE`); a strided BackwardWeights whose kernel is
    longer than its stride, as the polyphase lowering (in f32 where the dtype is computed in
    f32 here), whose stride-1 phases (1-D depthwise problems again) run lifted. oneDNN 3.2's
    strided depthwise weights-gradient kernels are slow in 2-D too (``benchmarks/NOTES.md``)."""
    if not (base.LIFTED in names and p.groups > 1 and p.depthwise and rules.measured_here(MEASURED_ON, ELSEWHERE, p)):
        return None
    if p.op == BACKWARD_WEIGHTS and 1 < p.geometry.strides[0] < p.kernel[0]:
        # "Polyphase", or "Polyphase in f32" where the dtype is computed in f32 here
        polyphase = [n for n in names if n.startswith(base.POLYPHASE)]
        if polyphase:
            return polyphase[0]
    return base.LIFTED


def _activation_axis(data_format: str) -> int:
    """Where the unit axis goes in an activation: before the length (NCX) or as the first
    spatial dim (NXC)."""
    return 2 if data_format == "NCX" else 1


def _weights_axis(weights_format: str) -> int:
    return 2 if weights_format == "IOX" else 0


def _lift(shape: tuple[int, ...], axis: int) -> tuple[int, ...]:
    return (*shape[:axis], 1, *shape[axis:])


def axes(p: Problem) -> tuple[tuple[int, ...], int]:
    """Where each of ``p``'s inputs gains its unit axis (-1: none, the bias), and where its
    result does."""
    act, wei = _activation_axis(p.data_format), _weights_axis(p.weights_format)
    if p.op == FORWARD:
        return (act, wei, -1)[: len(p.input_shapes)], act
    if p.op == BACKWARD_DATA:
        return (act, wei), act
    assert p.op == BACKWARD_WEIGHTS
    return (act, act), wei


def plane_problem(p: Problem) -> Problem:
    """``p`` (1-D) as a 2-D problem of height 1."""
    assert p.rank == 1, p.rank
    g = p.geometry
    inputs, out = axes(p)
    lifted = tuple(s if a < 0 else _lift(s, a) for s, a in zip(p.input_shapes, inputs))
    geometry = Geometry((1, *g.strides), (1, *g.dilations), (0, *g.pads_begin), (0, *g.pads_end))
    return replace(p, src=(1, *p.src), dst=(1, *p.dst), kernel=(1, *p.kernel), geometry=geometry,
                   output_padding=(0, *p.output_padding), input_shapes=lifted, out_shape=_lift(p.out_shape, out))


def build(p: Problem, inner: Lowering) -> Lowering:
    """The lifted lowering of ``p`` (:func:`applies`) around ``inner``, a lowering of
    :func:`plane_problem` that :func:`~onednn_convt.lowering.base.one_library_op` accepts.
    The library writes the 2-D result (``library_shape``), a reshape of the 1-D one."""
    assert p.rank == 1 and base.one_library_op(inner), (p.rank, inner.name)
    inputs, _ = axes(p)
    at = [inputs[i] for i in inner.inputs]  # each library input's unit axis
    before = inner.prepare

    def lift(args: list[np.ndarray]) -> list[np.ndarray]:
        args = [a if axis < 0 else np.expand_dims(a, axis) for a, axis in zip(args, at)]
        return before(args) if before is not None else args

    exact = None if inner.exact is None else build(p, inner.exact)
    return replace(inner, out_shape=p.out_shape, prepare=lift, library_shape=inner.out_shape, exact=exact,
                   name=base.LIFTED, unit_views=before is None)

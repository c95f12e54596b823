"""Which lowering runs a problem when autotuning is off.

:func:`onednn_convt.lowering.rule` decides, in this order:

1. the measured table of this CPU (:mod:`onednn_convt.cpu`) at its dispatch ISA class
   (:func:`isa_class`), or the conservative default where none was measured on it
   (:func:`table`, :mod:`onednn_convt.lowering.rules_table`: JSON data made by
   ``benchmarks/make_rules.py`` from ``onednn-convt tune`` runs): of the lowerings that can
   run the problem, the one that ran fastest on the measured layers nearest to it (same op,
   dtype and data format; the default table: the entry of the problem's
   :func:`onednn_convt.problem.shape_class`);
2. otherwise :func:`fallback`, the rules below: where no tuning run covers the ISA class
   (SSE4.1, AVX) or the configuration, and for the routes a guard forces (those leave one
   candidate, so the table never sees them).

Every choice below computes the same op; they differ in the kernels and reorders oneDNN 3.2
picks for them. The figures below were measured side by side on the models suite (by a
script since replaced by ``onednn-convt tune --retune --json FILE``, which times every
candidate of each configuration the same way, on the CPU at hand):

- ConvTranspose with groups 1 and no bias runs as the library's ``ConvolutionBackwardData``
  (:func:`forward_kind`): the backward data of the convolution it transposes, on the same
  weights memory (IOX read as OIX, XOI as XIO) with ``dst_shape`` giving the output size
  (output_padding included). oneDNN 3.2 runs the same kernels either way (bit-identical
  results); its ConvTranspose wraps them in a deconvolution and costs about 2 us more per
  call (native loop on ``tiny``: 4.5 against 6.8 us). Our out= call took 0.76-0.82x the
  ConvTranspose time on ``tiny`` (f32, bf16; NCX, NXC) and 0.73-1.13x on the models and
  sweep suites (geometric mean 0.99 over 76 configurations, within noise). That
  op has no bias input, and with groups oneDNN 3.2 rejects it (``invalid_shape``), so those
  keep ``ConvTranspose``.
- Otherwise ConvTranspose runs as the library's ``ConvTranspose`` (or as ``MatMul`` +
  overlap-add for large 1-D kernels, :mod:`onednn_convt.matmul_lowering`), except a depthwise
  one (one input and one output channel per group) with every stride 1: that is a forward
  ``Convolution`` over the spatially flipped weights with pads ``d*(k-1) - pb`` and
  ``d*(k-1) - pe``, which oneDNN 3.2 runs on its depthwise convolution kernels where its
  ConvTranspose takes a generic deconvolution path. On the models suite's depthwise layer
  (8x128x32x32, k3 s1 p1), library execute time, Sapphire Rapids, 2 threads, under every
  ``ONEDNN_MAX_CPU_ISA`` from AVX2 to AMX: NXC 0.08-0.13x (f32) and 0.015-0.04x (bf16) of
  the ConvTranspose time, NCX 0.31-0.35x (f32) and 0.035-0.06x (bf16); with a fused
  post-op the ConvTranspose kernel slows a further 2-10x (19-29 ms) while the Convolution's
  does not (:mod:`onednn_convt.fusion` builds its graph on the same Convolution). An
  earlier measurement on a Zen4 CPU (avx512_core_bf16) had found NCX 1.2-2x slower this
  way, NXC 0.37x (f32) and 0.50x (bf16); it predates the per-ISA measurement and is not
  re-checked there. The flipped weights are copied each call into
  an array kept per thread and plan (small: one input and one output channel per group), so
  calls with out= allocate nothing. Dense and grouped stride-1 layers measured
  0.6-1.4x either way (Zen4), so they keep the rules above.
- ConvTransposeBackwardData runs as ``MatMul`` over frames of diff_dst for large 1-D kernels
  (:mod:`onednn_convt.matmul_lowering`); otherwise as the library's forward ``Convolution`` over the same
  weights memory (IOX read as OIX, XOI as XIO; spec D9), which handles dilations, except
  where :func:`backward_data_kind` picks the library's own ``ConvTransposeBackwardData``:
  every dilation 1 (oneDNN 3.2 drops dilations there) and either one spatial dim or NCX.
  Measured side by side on the models suite (AVX-512 machine, 2 threads, f32 and bf16), the
  library's op took 0.24-0.38x the Convolution lowering's time in 1-D (gemm-based kernels)
  and 0.42-1.07x in 2-D/3-D NCX (geometric mean 0.83x: no activation reorders); in 2-D/3-D
  NXC it took 0.88-2.8x, so there the Convolution lowering stays (its kernels read NXC).
- ConvTransposeBackwardWeights runs as the library's ``ConvTransposeBackwardWeights``, except
  in 2-D and 3-D NXC (:func:`backward_weights_kind`), where it runs as the backward-weights of
  the convolution that BackwardData is (spec D9): ``ConvolutionBackwardWeights`` with src =
  diff_dst, diff_dst = src and the weights read as OIX (IOX) or XIO (XOI). oneDNN 3.2 runs
  that on NXC activations directly (ConvTransposeBackwardWeights reorders both to blocked
  layouts): on the models suite 0.16-0.26x the time on the depthwise layer, 0.38-0.74x on the
  3-D layer, 0.53-1.0x on the DCGAN layers, 0.86x on U-Net bf16, but 1.6x on U-Net f32
  (geometric mean over the ten 2-D/3-D NXC configurations 0.62x). In NCX it measured
  1.0-2.3x slower, in 1-D 0.84-1.7x, so those keep the library's op.
"""

from __future__ import annotations

from typing import Sequence

from .. import cpu, guards
from ..problem import BACKWARD_DATA, FORWARD, Problem, depthwise
from . import base, forward, matmul_backward_weights, matmul_lowering, matmul_tiles, rules_table, weights

#: the ISA classes of the measured table: each dispatch ISA (:func:`guards.dispatch_isa`) and
#: the class whose tuning run stands for it (the kernels oneDNN 3.2 dispatches change with
#: these levels; VNNI only adds int8 kernels)
ISA_CLASSES = {
    "avx2": "avx2", "avx2_vnni": "avx2", "avx2_vnni_2": "avx2",
    "avx512_core": "avx512_core", "avx512_core_vnni": "avx512_core",
    "avx512_core_bf16": "avx512_core_bf16", "avx512_core_fp16": "avx512_core_fp16",
    "avx512_core_amx": "avx512_core_amx", "avx512_core_amx_fp16": "avx512_core_amx",
}


def isa_class(isa: str) -> str | None:
    """The measured table's class of a dispatch ISA (None: none, e.g. SSE4.1)."""
    return ISA_CLASSES.get(isa)


def table() -> tuple[rules_table.Table | None, str]:
    """The measured table that applies on this CPU at its dispatch ISA
    (:func:`onednn_convt.lowering.rules_table.select`), and why."""
    return rules_table.select(cpu.detect().microarchitecture, isa_class(guards.dispatch_isa()))


def report() -> dict[str, str | None]:
    """What picks the lowerings on this CPU (``info()["rules"]``): ``cpu``, this CPU as the
    tables key it (:mod:`onednn_convt.cpu`; ``ONEDNN_CONVT_CPU`` overrides it); ``table``, the
    measured table in use (None: the hand-written rules decide everything); ``why``;
    ``fallback_measured_on``, :data:`RULES_MEASURED_ON`."""
    chosen, why = table()
    me = cpu.detect()
    return {"cpu": me.name + (" (ONEDNN_CONVT_CPU)" if me.overridden else ""),
            "table": None if chosen is None else chosen.name, "why": why,
            "fallback_measured_on": RULES_MEASURED_ON}


def measured(p: Problem, names: Sequence[str]) -> str | None:
    """The measured table's choice for ``p`` on this CPU among ``names`` (the lowerings that
    can run it; :meth:`onednn_convt.lowering.rules_table.Table.choose`), or None where it
    has none."""
    chosen, _ = table()
    if chosen is None:
        return None
    return chosen.choose(p, names)


#: the dispatch ISA on which the fallback rules below were measured (an AMD Zen4, 2 threads): on
#: another ISA they still compute the same results (tests/test_isa_matrix.py checks every
#: level), but which lowering is fastest there has not been measured; info() reports it.
#: The depthwise stride-1 forward rule alone was re-measured on a Sapphire Rapids CPU under
#: every ONEDNN_MAX_CPU_ISA level (module docstring), where it disagrees with Zen4 in NCX;
#: f16_backward_weights_in_f32 was measured there (avx512_core_amx), by the autotuner
#: (benchmarks/results/tune_*.json, which also hold every other rule's alternatives there)
RULES_MEASURED_ON = "avx512_core_bf16"



def fallback(p: Problem) -> str:
    """The name of the lowering the hand-written rules pick for ``p`` (one of its
    candidates): the guards' routes, and the measured rules where the table has none."""
    if p.op == FORWARD:
        return _forward(p)
    if p.op == BACKWARD_DATA:
        return _backward_data(p)
    return _backward_weights(p)


def _forward(p: Problem) -> str:
    g = p.geometry
    if matmul_lowering.applies(p.kernel, p.groups, g.dilations):
        return base.OVERLAP_ADD
    kind = forward_kind(p.kernel, *g.astuple(), p.groups, p.ic, p.oc, bias=p.bias and not forward.bias_stage(p))
    if kind == base.CONVOLUTION:
        return base.FLIPPED_CONVOLUTION
    # oneDNN's AMX backward-data kernel, which both library lowerings run, fails where a
    # stride reaches its kernel: where the taps tile the output, a MatMul over them
    if guards.stride_not_below_kernel(p.dtype, p.kernel, g.strides) and matmul_tiles.applies(
        p.kernel, *g.astuple(), p.groups, p.output_padding
    ):
        return base.TILES
    return kind


def _backward_data(p: Problem) -> str:
    g = p.geometry
    if matmul_lowering.applies_backward_data(
        p.kernel, p.groups, g.dilations, g.strides, oc=p.oc, f32=p.dtype == "f32",
        data_format=p.data_format, weights_format=p.weights_format,
    ):
        return base.FRAMES
    if guards.padding_only_outputs(p.dtype, p.src, p.dst, p.kernel, *g.astuple()[:3]):
        return backward_data_kind(g.dilations, p.data_format)  # in f32: the AMX kernel crashes
    dims = guards.stride_not_below_kernel(p.dtype, p.kernel, g.strides)
    if dims:  # both library lowerings reach the AMX kernels that fail here
        if all(p.kernel[d] == 1 and g.pads_begin[d] == 0 for d in dims):
            return base.SUBSAMPLED
        if matmul_tiles.applies(p.kernel, *g.astuple(), p.groups) and all(
            y == x * k for x, y, k in zip(p.src, p.dst, p.kernel)
        ):
            return base.TILES
        return base.ZERO_PADDED_TAPS
    return backward_data_kind(g.dilations, p.data_format)


def _backward_weights(p: Problem) -> str:
    if backward_weights_f32_only(p) and matmul_backward_weights.applies(
        p.input_shapes[0], p.input_shapes[1], p.kernel, p.groups, p.data_format
    ):
        return base.FRAMES
    return backward_weights_kind(p.rank, p.data_format)


#: a problem of at most this many flops (2 x multiply-adds) compiles for one thread
SINGLE_THREAD_FLOPS = 2**19


def single_threaded(p: Problem) -> bool:
    """Whether ``p`` is small enough that one thread runs it faster than the thread pool
    (:func:`onednn_convt.omp.one_thread`): forking and joining the pool costs a few us.

    Measured on a Sapphire Rapids CPU (avx512_core_amx), 2 threads, f32 NCX, k3 s1, out=
    calls, each op compiled for 1 and for 2 threads: at 0.01-0.29 MFLOP one thread took
    0.45-0.96x the time of two (the models suite's ``tiny`` forward: 3.2 against 7.1 us),
    at 1.2 MFLOP 0.84-1.16x, from 4.7 MFLOP 1.04-2.0x (work that two threads halve)."""
    return p.flops <= SINGLE_THREAD_FLOPS


#: dispatch ISAs on which oneDNN 3.2's native f16 BackwardWeights kernels are slow (f16 runs
#: natively from avx512_core_fp16 on)
SLOW_F16_BACKWARD_WEIGHTS = frozenset({"avx512_core_fp16"}) | guards.AMX


def f16_backward_weights_in_f32(p: Problem) -> bool:
    """Whether an f16 BackwardWeights call computes in f32 because the library's native f16
    kernels are far slower than its f32 ones on this ISA.

    Measured on a Sapphire Rapids CPU (AVX512-FP16, AMX), 2 threads, ``onednn-convt tune
    --suite models`` (benchmarks/results/tune_default.json as of commit 7ddc821): both library ops in native f16
    took 90-1,090x the time of the same op computed in f32 on each of the six models layers
    (15 s against 14 ms a call on the DCGAN 16x16 layer), in NCX and NXC. Not a wrong
    result: a speed rule, so ``op.guard`` stays None. Under ``ONEDNN_MAX_CPU_ISA=
    AVX512_CORE_FP16`` see docs/guide/autotuning.md; below that f16 is emulated
    anyway."""
    return p.dtype == "f16" and guards.dispatch_isa() in SLOW_F16_BACKWARD_WEIGHTS


def backward_weights_f32_only(p: Problem) -> bool:
    """Whether a BackwardWeights call must compute in f32 (the library's low-precision
    kernels are wrong on it: :func:`onednn_convt.lowering.weights.backward_weights_needs_f32`)."""
    return guards.active(guards.BF16_BACKWARD_WEIGHTS_SHORT_SRC, p.dtype) and weights.backward_weights_needs_f32(
        p.src, p.kernel, p.geometry.dilations
    )


def forward_kind(
    kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
    pads_end: Sequence[int], groups: int, ic: int, oc: int, *, bias: bool,
) -> str:
    """The library op kind that runs a ConvTranspose call (outside the MatMul lowering)."""
    if depthwise(groups, ic, oc) and all(s == 1 for s in strides):
        begin, end = weights.convolution_pads(kernel, dilations, pads_begin, pads_end)
        if min(begin + end) >= 0:
            return base.CONVOLUTION
    if groups == 1 and not bias:
        return base.CONVOLUTION_BACKWARD_DATA
    return base.CONV_TRANSPOSE


def backward_data_kind(dilations: Sequence[int], data_format: str) -> str:
    """The library op kind that runs a ConvTransposeBackwardData call."""
    if all(d == 1 for d in dilations) and (len(dilations) == 1 or data_format == "NCX"):
        return base.CONV_TRANSPOSE_BACKWARD_DATA
    return base.CONVOLUTION


def backward_weights_kind(rank: int, data_format: str) -> str:
    """The library op kind that runs a ConvTransposeBackwardWeights call."""
    if rank >= 2 and data_format == "NXC":
        return base.CONVOLUTION_BACKWARD_WEIGHTS
    return base.CONV_TRANSPOSE_BACKWARD_WEIGHTS

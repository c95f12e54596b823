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

Every choice computes the same op; they differ in the kernels and reorders oneDNN 3.2 picks
for them. The fallback rules, in short (the measurements behind each are in
``benchmarks/NOTES.md``, "The fallback rules"):

- ConvTranspose with groups 1 and no bias runs as the library's ``ConvolutionBackwardData``
  (:func:`forward_kind`) on the same weights memory: the same kernels, one wrapper less.
  With a bias or groups (which that op lacks or rejects) it stays ``ConvTranspose``; large
  1-D kernels run as ``MatMul`` + overlap-add (:mod:`.matmul_lowering`).
- A depthwise ConvTranspose with every stride 1 runs as a forward ``Convolution`` over the
  spatially flipped weights, on oneDNN's depthwise convolution kernels.
- ConvTransposeBackwardData runs as ``MatMul`` over frames for large 1-D kernels, else as the
  library's forward ``Convolution`` on the same weights memory (spec D9), except where
  :func:`backward_data_kind` keeps the library's own op (no dilation, and 1-D or NCX).
- ConvTransposeBackwardWeights runs as the library's op, except in 2-D and 3-D NXC
  (:func:`backward_weights_kind`): ``ConvolutionBackwardWeights`` of the convolution that
  BackwardData is, which reads NXC activations without reorders.
- A grouped 3-D problem that oneDNN 3.2 runs on its gemm convolution
  (:attr:`onednn_convt.problem.Problem.gemm_grouped`: channels per group not a multiple of
  8) runs the library's own op, in any data format. Every lowering runs gemm kernels there;
  the op's own ran fastest in 26 of the 27 configurations with another candidate measured on
  an AMD Zen3 (avx2, 2 threads, f32, batch 8, polyphase apart: depthwise k4 s2, k4 s4 and k3
  s1, 2 channels per group k4 s2 and k3 s1; the three ops in NCX and NXC). The 2-D rules
  above lost up to 4.8x there in NXC: the flipped Convolution forward 29 ms against 7.3,
  BackwardData's Convolution 22.9 against 4.8, ConvolutionBackwardWeights 1.14-1.75x; the
  exception, a k4 s2 BackwardWeights NCX with 2 channels per group, ran 1.5x faster
  channels-last. A depthwise one's BackwardData has a way out of them, its depth taps as
  2-D ops (:mod:`.depth_taps`), which :func:`onednn_convt.lowering.rule` takes on AVX2
  before the tables (as it takes the lifted form of a 1-D depthwise problem).
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

from .. import cpu, guards
from ..problem import BACKWARD_DATA, FORWARD, Problem, depthwise
from . import base, matmul_backward_weights, matmul_lowering, matmul_tiles, rules_table, weights

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


def this_cpu() -> tuple[str, str]:
    """This CPU as the measured tables key it: its microarchitecture
    (:attr:`onednn_convt.cpu.Cpu.microarchitecture`) and the class of its dispatch ISA
    (``""`` where it has none)."""
    return cpu.detect().microarchitecture, isa_class(guards.dispatch_isa()) or ""


#: where a lowering measured apart from the tables ran faster than the rules' other choices
MeasuredRule = Callable[[Problem], bool]


def measured_here(measured: Mapping[tuple[str, str], MeasuredRule], elsewhere: Optional[MeasuredRule],
                  p: Problem) -> bool:
    """Whether the rules take a lowering measured apart from the tables for ``p``: the rule
    measured on this CPU (``measured``, keyed by :func:`this_cpu`), else ``elsewhere``
    (where it ran faster on every CPU measured; None: nowhere else)."""
    faster = measured.get(this_cpu(), elsewhere)
    return faster is not None and faster(p)


def table() -> tuple[rules_table.Table | None, str]:
    """The measured table that applies on this CPU at its dispatch ISA
    (:func:`onednn_convt.lowering.rules_table.select`), and why."""
    arch, isa = this_cpu()
    return rules_table.select(arch, isa or None)


def report() -> dict[str, str | None]:
    """What picks the lowerings on this CPU (``info()["rules"]``): ``cpu``, this CPU as the
    tables key it (:mod:`onednn_convt.cpu`; ``ONEDNN_CONVT_CPU`` overrides it); ``table``, the
    measured table in use (None: the hand-written rules decide everything); ``table_sha256``,
    the SHA-256 of its file (None where it was made in memory, by a test); ``why``;
    ``small_calls``, how the table chooses for calls of at most
    :data:`~onednn_convt.lowering.rules_table.SMALL_CALL_FLOPS` (None without a table);
    ``fallback_measured_on``, :data:`RULES_MEASURED_ON`."""
    chosen, why = table()
    me = cpu.detect()
    return {"cpu": me.name + (" (ONEDNN_CONVT_CPU)" if me.overridden else ""),
            "table": None if chosen is None else chosen.name,
            "table_sha256": None if chosen is None else chosen.digest or None, "why": why,
            "small_calls": None if chosen is None else chosen.small_calls(),
            "fallback_measured_on": RULES_MEASURED_ON}


def result_record() -> dict[str, str | None]:
    """The measured table a result file ran with, as ``bench`` and ``tune --json`` record
    it: :func:`report`'s ``table``, ``table_sha256`` and ``why``."""
    report_ = report()
    return {k: report_[k] for k in ("table", "table_sha256", "why")}


def measured(p: Problem, names: Sequence[str], *, phase: bool = False) -> str | None:
    """The measured table's choice for ``p`` on this CPU among ``names`` (the lowerings that
    can run it; :meth:`onednn_convt.lowering.rules_table.Table.choose`; ``phase``: ``p`` is
    a polyphase phase), or None where it has none."""
    chosen, _ = table()
    if chosen is None:
        return None
    return chosen.choose(p, names, phase=phase)


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
    # the library op never takes the bias (lowering.forward.bias_apart)
    kind = forward_kind(p.kernel, *g.astuple(), p.groups, p.ic, p.oc, bias=False)
    if p.gemm_grouped:
        kind = base.CONV_TRANSPOSE
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
    if p.gemm_grouped and all(d == 1 for d in g.dilations):
        return base.CONV_TRANSPOSE_BACKWARD_DATA
    return backward_data_kind(g.dilations, p.data_format)


def _backward_weights(p: Problem) -> str:
    if backward_weights_f32_only(p) and matmul_backward_weights.applies(
        p.input_shapes[0], p.input_shapes[1], p.kernel, p.groups, p.data_format
    ):
        return base.FRAMES
    if p.gemm_grouped:
        return base.CONV_TRANSPOSE_BACKWARD_WEIGHTS
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

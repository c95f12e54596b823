"""Compiled plans: a lowering compiled for one call signature, and how it runs.

A :class:`Plan` is one library op (or a staged chain of them) compiled for arrays laid out
as the call gives them, with what runs around it (the lowering's preparation and finishing
steps, f32 emulation of bf16/f16, the C++ executor of later calls); a :class:`PhasedPlan`
runs a polyphase lowering's phases in turn. :func:`plan_for` makes either for a
:class:`Target`, the op a plan serves. Also here: how arrays are presented to oneDNN
(strides in elements; copies of what it cannot describe) and which (library op, dtype) pairs
the library compiles natively on this CPU.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from . import dtypes, limits, memory, native, omp, shapes
from . import strides as strides_
from .errors import OneDNNError, UnsupportedError
from .lowering import base

if TYPE_CHECKING:
    from .lowering.autotune import Tuning
    from .lowering.base import Lowering


@dataclass(frozen=True)
class Target:
    """The op a plan is made for, as planning needs it.

    Attributes:
        op_name, output_name: for messages ("ConvTranspose", "dst").
        strict: refuse to compute a bf16/f16 call in f32 (UnsupportedError instead).
        constant_weights: compile with the weights input marked constant (a ConstantWeights' op).
        bias_format: a ConvTranspose's data_format, where a polyphase plan puts the bias; None
            for the other ops.
        check_out: the op's check of an ``out=`` array (arrays, out, shape, dtype), which
            raises ValueError/TypeError.
    """

    op_name: str
    output_name: str
    strict: bool
    constant_weights: bool
    bias_format: Optional[str]
    check_out: Callable[[Sequence[Any], Any, tuple[int, ...], np.dtype[Any]], None]

    def plan(self, lowering: Lowering, arrays: Sequence[Any], out: Optional[np.ndarray], code: str) -> Any:
        """:func:`plan_for` this target."""
        return plan_for(self, lowering, arrays, out, code)


#: (library op kind, dtype code) -> whether the library compiles it natively here.
_NATIVE: dict[tuple[str, str], bool] = {}


@dataclass
class Plan:
    """A compiled call for one input signature."""

    compiled: Any
    lowering: Lowering
    dtype: np.dtype[Any]
    emulated: bool
    fixers: list[Optional[Callable[[np.ndarray], np.ndarray]]] = field(default_factory=list)
    #: the C++ fast path for arrays that match this plan exactly (direct plans whose inputs
    #: go to the library as given, and emulated plans of dense arrays: no prepare step)
    executor: Any = None
    #: a C++ executor for the address path only (``Executor.run_pointers``, which
    #: :mod:`onednn_convt.torch_run` calls): the library reads views of the call's own memory
    #: (a prepare step of reshapes and transposes) and writes the dense result's memory in
    #: another shape (``library_shape``), so that arrays never match it but addresses do
    pointer_executor: Any = None
    #: native bf16/f16 plans: makes the f32-emulated plan that redoes a call whose result
    #: holds an Inf or NaN (see _guarded)
    make_fallback: Optional[Callable[[Sequence[Any]], Plan]] = None
    fallback: Optional[Plan] = None
    #: how autotuning chose the lowering (None: the rules chose it)
    tuning: Optional[Tuning] = None

    @property
    def direct(self) -> bool:
        """Whether the library writes the result itself (no emulation, no finishing step)."""
        return not self.emulated and self.lowering.finish is None

    def library_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        """The library op's inputs for the call's ``arrays``: the lowering's (in f32 where
        emulated), each as oneDNN can read it (``fixers``)."""
        args = self.lowering.library_args(arrays, self.emulated)
        return [f(a) if f else a for f, a in zip(self.fixers, args)] if self.fixers else args

    def run(self, arrays: Sequence[Any], out: Optional[np.ndarray], guarded: bool = True) -> np.ndarray:
        """The call's result (in ``out`` where given). ``guarded=False`` skips the check of
        a native bf16/f16 result for Inf and NaN (``_guarded``): a polyphase op checks its
        whole dst once instead of each phase's strided view."""
        low = self.lowering
        args = self.library_inputs(arrays)
        fill = limits.debug_fill()  # debug mode: outputs start as NaN, so unwritten elements show
        if self.direct:
            if out is None:
                out = limits.nan_filled(low.out_shape, self.dtype) if fill else memory.empty(low.out_shape, self.dtype)
            elif fill:
                out[...] = np.nan
            target = _reshaped(out, low.library_shape) if low.library_shape else out
            if target is not None and strides_.writable(target):  # else a dense result, copied
                self.compiled.execute(args, target)
                return self._guarded(out, arrays, out) if guarded else out
        compute = np.dtype(np.float32) if self.emulated else self.dtype
        shape = low.library_out_shape
        result = limits.nan_filled(shape, compute) if fill else memory.empty(shape, compute)
        if fill and out is not None:
            out[...] = np.nan
        self.compiled.execute(args, result)
        if low.finish is not None:
            result = low.finish(result, arrays)
        else:
            result = result.reshape(low.out_shape)
        if result.dtype == self.dtype:  # a finish that only reshaped the library's result
            if out is not None:
                np.copyto(out, result)
                result = out
            return self._guarded(result, arrays, out) if guarded else result
        rounded = dtypes.round_f32(result, self.dtype, out)
        return self._guarded(rounded, arrays, out) if guarded else rounded

    def _guarded(self, result: np.ndarray, arrays: Sequence[Any], out: Optional[np.ndarray]) -> np.ndarray:
        """``result``, or for a native bf16/f16 plan the call redone in f32 when it holds an
        Inf or a NaN (:func:`finite_or_redone`)."""
        make = self.make_fallback
        if make is None:
            return result
        return finite_or_redone(result, self, lambda: make(arrays), arrays, out)


def finite_or_redone(result: np.ndarray, holder: Any, make: Callable[[], Any], arrays: Sequence[Any],
                     out: Optional[np.ndarray]) -> np.ndarray:
    """``result`` when it holds no Inf and no NaN; else the call run again by
    ``holder.fallback``, an f32 plan made once by ``make``. oneDNN 3.2's native
    low-precision kernels (AVX-512) compute padded channel blocks and other groups together,
    so one non-finite input can turn outputs it does not reach into NaN; the f32 kernels keep
    them apart (docs/deviations.md). Serves plain plans (:class:`Plan`) and fused ones
    (:class:`onednn_convt.fused_plan.FusedPlan`)."""
    if dtypes.all_finite(result):
        return result
    if holder.fallback is None:
        holder.fallback = make()
    return holder.fallback.run(arrays, out)  # type: ignore[no-any-return]


@dataclass
class PhasedPlan:
    """A compiled polyphase call (:mod:`onednn_convt.lowering.polyphase`): one plan per phase,
    each compiled for its views of the call's arrays and of the result, run in turn."""

    lowering: Lowering
    dtype: np.dtype[Any]
    plans: list[Optional[Plan]]
    #: a forward's bias axis in dst (the channel axis): the phases that hold the bias alone
    #: fill it, or (``lowering.bias_stage``) ``bias_add`` adds it over dst after the phases;
    #: None: no bias
    bias_axis: Optional[int] = None
    emulated: bool = False
    executor: Any = None
    tuning: Optional[Tuning] = None
    #: BiasAdd over a C-contiguous dst, in place (``lowering.bias_stage``); None: NumPy adds it
    bias_add: Any = None
    #: the phases run into a fresh result, copied into ``out`` after: an ``out`` whose
    #: windows would not be views of it (:func:`_staged`)
    staged: bool = False
    #: per phase, the plan that adds its op's result to its window in the library
    #: (:class:`SumPlan`); None: a fresh part, added by NumPy
    sums: list[Optional[SumPlan]] = field(default_factory=list)

    def run(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> np.ndarray:
        """The phases run in turn into ``out`` (or a new array). A native bf16/f16 phase's
        result is checked for Inf and NaN once, over the whole of dst, rather than per
        phase: a phase's strided view is checked far slower than the dense dst (16 views of
        a 1M-element bf16 dst: 56 ms against 2 ms). Where dst holds one, the phases run
        again, each checked and redone in f32 where it needs to be (``Plan._guarded``).
        An emulated plan (``"Polyphase in f32"``) converts the inputs to f32 once, runs
        its f32 phases into a fresh dense f32 result and rounds that once into ``out``. A
        channels-last one (the lowering's ``prepare``: :mod:`.lowering.channels_last`) runs
        them on the reordered activations, and reorders a result that is one back."""
        low = self.lowering
        if low.prepare is None:
            return self._run(arrays, out)
        moved = low.prepare(list(arrays))
        if low.finish is None:  # BackwardWeights: the weights gradient, as the call's
            return self._run(moved, out)
        result = low.finish(self._run(moved, None), moved)
        if out is None:
            return result
        np.copyto(out, result)
        return out

    def _run(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> np.ndarray:
        if self.emulated:
            f32 = [dtypes.to_f32(a) if _low_precision(a) else a for a in arrays]
            return dtypes.round_f32(self._run_phases(f32, None, guarded=False), self.dtype, out)
        result = self._run_phases(arrays, None if self.staged else out, guarded=False)
        if any(p is not None and p.make_fallback is not None for p in self.plans) and \
                not dtypes.all_finite(result):
            result = self._run_phases(arrays, result, guarded=True)
        if self.staged and out is not None:
            np.copyto(out, result)
            return out
        return result

    def _run_phases(self, arrays: Sequence[Any], out: Optional[np.ndarray], guarded: bool) -> np.ndarray:
        compute = np.dtype(np.float32) if self.emulated else self.dtype
        result = memory.empty(self.lowering.library_out_shape, compute) if out is None else out
        bias = arrays[2] if self.bias_axis is not None else None
        after = bias is not None and self.lowering.bias_stage
        with np.errstate(invalid="ignore", over="ignore"):  # parts summed as IEEE sums (Inf - Inf: NaN)
            for i, (phase, plan) in enumerate(zip(self.lowering.phases, self.plans)):
                if phase.fill is not None:
                    view = base.window(result, phase.fill)
                    if bias is not None and not after:
                        view[...] = np.reshape(bias, self._bias_shape(result))
                    else:
                        view[...] = 0
                if plan is None:
                    continue
                args = phase.args(arrays)
                view = base.window(result, phase.out)
                adds = self.sums[i] if self.sums and not guarded else None  # only phases that accumulate
                if adds is not None:
                    adds.run(args, view, phase.zero)
                elif phase.accumulate:
                    part = plan.run(args, None, guarded)
                    if phase.zero:
                        part[list(phase.zero)] = 0
                    np.add(view, part, out=view)
                elif strides_.writable(view):
                    plan.run(args, view, guarded)
                else:  # strides oneDNN refuses (a weights phase) or writes wrongly (strides_.writable)
                    np.copyto(view, plan.run(args, None, guarded))
        if after and bias is not None:
            if self.bias_add is not None and result.flags.c_contiguous:
                self.bias_add.execute([result, _aligned_copy(bias)], result)  # in place: elementwise
            else:  # an out= of other strides, or no kernel in this dtype: in f32, rounded
                added = np.asarray(result, np.float32) + np.reshape(np.asarray(bias, np.float32),
                                                                    self._bias_shape(result))
                np.copyto(result, added.astype(compute))
        return result

    def _bias_shape(self, result: np.ndarray) -> list[int]:
        shape = [1] * result.ndim
        shape[self.bias_axis or 0] = -1
        return shape


@dataclass
class SumPlan:
    """A phase's op whose result the library adds to the phase's window of the result, in
    place (a phase that accumulates, ``Phase.accumulate``): the op and an Add of the window
    compiled as one partition, which oneDNN runs as the op's kernel with a sum post-op,
    reading and writing the window's memory (:func:`sum_plan`). It spares the phase a fresh
    part and NumPy's add of it (one thread). The sum is NumPy's to an ulp: where the
    kernel adds the window's values after its own sum (AVX-512's brdgmm_dw, by
    ONEDNN_VERBOSE) bit for bit, where it starts its sum from them (AVX2's jit_dw) one ulp
    apart in places. Measured on an AMD Zen4 (2 threads; the same plans with fused sums
    and with NumPy's parts, alternated: ``benchmarks/sums_ab.py``): 80 NXC 3-D depthwise
    configurations as depth taps 1.20x less time (geomean; min 1.01), DCGAN's k4 s2 NXC
    BackwardData as polyphase 1.06x."""

    compiled: Any
    #: the phase's own plan (its op alone), whose inputs this one takes
    plan: Plan

    def run(self, arrays: Sequence[Any], view: np.ndarray, keep: tuple[int, ...] = ()) -> None:
        """Add the op's result on ``arrays`` to ``view``; the indices ``keep`` along its first
        axis keep their values (``Phase.zero``: planes the op's result must not reach)."""
        args = self.plan.library_inputs(arrays)
        kept = view[list(keep)] if keep else None  # a copy (an index list)
        self.compiled.execute(args + [view], view)
        if kept is not None:
            view[list(keep)] = kept


#: the library op kinds oneDNN 3.2 fuses with an Add after them into one partition: its
#: backward-data and backward-weights ops fuse nothing (2 partitions, measured)
SUM_FUSING_KINDS = (base.CONVOLUTION, base.CONV_TRANSPOSE, base.MATMUL)


def sum_plan(plan: Any, arrays: Sequence[Any], view: np.ndarray, code: str, constant_weights: bool = False,
             ) -> Optional[SumPlan]:
    """The :class:`SumPlan` of a phase whose op (``plan``, on ``arrays``) adds to ``view``,
    where the library runs it so: ``plan`` is one library op that writes its result itself
    (not emulated, no finishing step, no bias of its own), oneDNN can describe ``view`` as
    it is, and the op and an Add compile to one partition that may write the Add's input in
    place. Else None: NumPy adds a fresh part (:data:`SUM_FUSING_KINDS`; an op whose
    kernel writes a blocked layout, which reads no window in place)."""
    low = plan.lowering if isinstance(plan, Plan) else None
    if low is None or low.kind not in SUM_FUSING_KINDS or not plan.direct or low.library_shape \
            or low.bias_stage or low.host_bias is not None or not strides_.writable(view):
        return None
    fixed = plan.library_inputs(arrays)
    window = describe(view, code)
    n = len(fixed)
    nodes = [(low.kind, low.attrs, list(range(n)), window), ("Add", {}, [-1, n], window)]
    at = low.weights_arg
    try:
        with omp.one_thread() if low.single_thread else contextlib.nullcontext():
            compiled = native.compile(f"{low.kind}+Add", {}, [describe(a, code) for a in fixed] + [window], window,
                                      constant=[at] if constant_weights and at is not None else [], nodes=nodes)
    except OneDNNError:
        return None
    if compiled.partitions != 1 or n not in compiled.inplace_inputs:
        return None
    return SumPlan(compiled, plan)


def phase_output(phase: base.Phase, view: np.ndarray) -> Optional[np.ndarray]:
    """The array a phase's plan is compiled to write (the benchmark's native loop, which
    rebuilds a phased plan's outputs, reads it too): its window of the result, where the
    library writes that window as given (a phase that is not a sum, at strides
    :func:`onednn_convt.strides.writable` allows); else None, a dense result added or
    copied into the window."""
    return view if not phase.accumulate and strides_.writable(view) else None


def _reshaped(a: np.ndarray, shape: tuple[int, ...]) -> Optional[np.ndarray]:
    """``a`` viewed with ``shape`` (same elements, C order), or None where ``a`` is not
    C-contiguous (a reshape would copy)."""
    return a.reshape(shape) if a.flags.c_contiguous else None


def _aligned_copy(a: np.ndarray) -> np.ndarray:
    """``a`` as an aligned C-contiguous array (``ascontiguousarray`` keeps misaligned data)."""
    return np.require(a, requirements=("C", "A"))


def fixed_view(a: np.ndarray) -> Optional[Callable[[np.ndarray], np.ndarray]]:
    """How to present ``a`` to oneDNN: None as it is, or a function giving a usable array.

    Arrays oneDNN cannot describe (:func:`onednn_convt.strides.needs_copy`) are copied into
    an aligned C-contiguous array; any stride on a size-1 dim is fine
    (:func:`onednn_convt.strides.library_strides`).
    """
    return _aligned_copy if strides_.needs_copy(a) else None


def describe(a: np.ndarray, code: str) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """The library's description of ``a``: (shape, strides in elements, dtype code)."""
    strides = strides_.element_strides(a)
    assert strides is not None
    return tuple(a.shape), strides_.library_strides(a.shape, strides), code


def plan_for(target: Target, lowering: Lowering, arrays: Sequence[Any], out: Optional[np.ndarray], code: str) -> Any:
    """Compile ``lowering`` for these arrays (and ``out``, or a fresh result) of dtype
    ``code``: natively where the library can, else in f32 (a :class:`Plan`, or for a
    polyphase lowering a :class:`PhasedPlan` of them).

    Raises:
        ValueError, TypeError: ``out`` does not fit, or the result is too large to address.
        UnsupportedError: no native kernel for a ``strict`` target; the library's refusal of
            an f32 op.
        MemoryError: the call would pass the memory limit (:mod:`onednn_convt.limits`).
    """
    if lowering.phases:
        return _phased_plan(target, lowering, arrays, out, code)
    _check_addressable(target, lowering)
    dtype = dtypes.FLOAT_DTYPES[code]
    if out is not None:
        target.check_out(arrays, out, lowering.out_shape, dtype)
    key = (lowering.kind, code)
    natively = _NATIVE.get(key) is not False and not (lowering.f32_only and code != "f32")
    limits.check_plan(target.op_name, lowering, arrays, out, dtype, emulated=not natively)
    constant = target.constant_weights
    if natively:
        try:
            plan = compile_lowering(lowering, arrays, out, dtype, code, emulated=False, constant_weights=constant)
        except UnsupportedError:
            if code == "f32":
                raise
            _NATIVE[key] = False
        else:
            _NATIVE[key] = True
            return plan
    if target.strict and not lowering.f32_only:
        msg = (
            f"{target.op_name}: oneDNN has no {code} kernel for this op on this CPU "
            "(strict=True; with strict=False it is computed in f32 and rounded)"
        )
        raise UnsupportedError(msg, 3)
    limits.check_memory(target.op_name, lowering, arrays, out, dtype, emulated=True)
    return compile_lowering(lowering, arrays, out, dtype, "f32", emulated=True, constant_weights=constant)

def _check_addressable(target: Target, lowering: Lowering) -> None:
    """ValueError where the result, or the library's view of it, is too large to address."""
    limits.check_addressable(target.op_name, target.output_name, lowering.out_shape, lowering.library_shape)


def _phased_plan(target: Target, lowering: Lowering, arrays: Sequence[Any], out: Optional[np.ndarray], code: str) -> PhasedPlan:
    """Each phase's plan, for its views of these arrays and of the result (as ``out``, or
    as a fresh C-contiguous result is laid out). A lowering computed in f32 (``f32_only``)
    of a bf16/f16 call: the f32 plan of f32 copies of the arrays (dense, as
    :meth:`PhasedPlan.run` makes them) and a fresh f32 result, marked emulated."""
    dtype = dtypes.FLOAT_DTYPES[code]
    if out is not None:
        target.check_out(arrays, out, lowering.out_shape, dtype)
    if lowering.prepare is not None:  # channels-last: the NXC problem's phases on reordered arrays
        _check_addressable(target, lowering)
        limits.check_memory(target.op_name, lowering, arrays, out, dtype, emulated=lowering.f32_only and code != "f32")
        inner = replace(lowering, prepare=None, finish=None, library_shape=(), out_shape=lowering.library_out_shape)
        nxc = replace(target, bias_format="NXC" if target.bias_format else None)
        written = out if lowering.finish is None else None  # a weights gradient, as the call's
        # (its executor, if any, would skip the reorders: none)
        return replace(_phased_plan(nxc, inner, lowering.prepare(list(arrays)), written, code), lowering=lowering,
                       executor=None)
    if lowering.f32_only and code != "f32":
        _check_addressable(target, lowering)
        limits.check_memory(target.op_name, lowering, arrays, out, dtype, emulated=True)
        # placeholders laid out as run's copies are (zeros: pages untouched until written)
        f32 = [np.zeros(a.shape, np.float32) if _low_precision(a) else a for a in arrays]
        phases_in_f32 = _phased_plan(target, lowering, f32, None, "f32")
        return replace(phases_in_f32, dtype=dtype, emulated=True,
                       executor=_emulating(phases_in_f32.executor, arrays, out, lowering.out_shape, dtype, code))
    phase_args = [None if phase.lowering is None else phase.args(arrays) for phase in lowering.phases]
    staged = out is not None and _staged(lowering, out)
    if out is None or staged:
        # the checks each phase's plan makes, before the result they plan views of is
        # allocated (a result past the memory, or the address space, is never allocated)
        for phase, args in zip(lowering.phases, phase_args):
            if phase.lowering is not None and args is not None:
                limits.check_library_range(target.op_name, phase.lowering, args)
        _check_addressable(target, lowering)
        limits.check_memory(target.op_name, lowering, arrays, None, dtype, emulated=False)  # the result
    result = out if out is not None and not staged else memory.empty(lowering.out_shape, dtype)
    plans: list[Optional[Plan]] = []
    sums: list[Optional[SumPlan]] = []
    for phase, args in zip(lowering.phases, phase_args):
        if phase.lowering is None or args is None:
            plans.append(None)
            sums.append(None)
            continue
        view = base.window(result, phase.out)
        plans.append(plan_for(target, phase.lowering, args, phase_output(phase, view), code))
        sums.append(sum_plan(plans[-1], args, view, code, target.constant_weights) if phase.accumulate else None)
    bias_axis = bias_add = None
    if target.bias_format is not None and len(arrays) > 2 and arrays[2] is not None:
        bias_axis = 1 if target.bias_format == "NCX" else len(lowering.out_shape) - 1
        if lowering.bias_stage:
            bias_add = _bias_add(target.bias_format, lowering.out_shape, code)
    plan = PhasedPlan(lowering, dtype, plans, bias_axis, bias_add=bias_add, staged=staged,
                      sums=sums if any(sums) else [])
    plan.executor = _phased_executor(plan, arrays, result, code)
    return plan


def _phased_executor(plan: PhasedPlan, arrays: Sequence[Any], result: np.ndarray, code: str) -> Any:
    """The C++ executor of a phased plan (``native.PhasedExecutor``): each phase's compiled
    op with the byte offsets of its views in the call's arrays and in the result, run in
    turn with no Python between them; a phase's zero fill, a sum's kept planes
    (``Phase.zero``, saved and put back) and a forward's bias added over dst after the
    phases (``Lowering.bias_stage``: the BiasAdd partition, on a C-contiguous result) run
    there too. None where a phase needs more than that: a fill with the bias (the bias in
    the phases), a part NumPy adds, a copy of a view, a prepare or finishing step. (An
    emulated plan's executor is its f32 phases' one, made to convert the call's arrays:
    :func:`_emulating`.)

    Measured on an AMD Zen4 (2 threads, f32 NXC BackwardData of 3-D depthwise layers as
    depth taps): Python took 8-20 us per phase around the library's own calls, 18-29% of
    the call (t21r00, 12 ops: 325 us against 231 us of library calls)."""
    low = plan.lowering
    if plan.emulated or low.prepare is not None or low.finish is not None or plan.staged:
        return None
    biased = plan.bias_axis is not None
    if biased and not (low.bias_stage and plan.bias_add is not None and result.flags.c_contiguous):
        return None  # the bias in the phases, or added by NumPy
    calls = list(itertools.takewhile(lambda a: isinstance(a, np.ndarray), arrays))
    if any(isinstance(a, np.ndarray) for a in arrays[len(calls):]) or \
            not all(_plain_layout(a) for a in [*calls, result]) or (biased and not calls[-1].flags.c_contiguous):
        return None
    guarded = False
    steps: list[tuple[Any, ...]] = []
    for i, (phase, sub) in enumerate(zip(low.phases, plan.plans)):
        if phase.fill is not None:  # zeros (with a bias, the bias stage adds it after)
            filled = base.window(result, phase.fill)
            if not np.may_share_memory(filled, result) and filled.size:
                return None
            steps.append((filled.ctypes.data - result.ctypes.data, filled.shape, filled.strides))
        if sub is None:
            continue
        if not isinstance(sub, Plan) or not sub.direct or sub.fixers:
            return None
        inner = sub.lowering
        if inner.prepare is not None or inner.library_shape or inner.bias_stage or inner.host_bias is not None:
            return None
        guarded = guarded or sub.make_fallback is not None
        args = sub.library_inputs(phase.args(arrays))
        sources = [phase.inputs[j][0] for j in inner.inputs]
        view = base.window(result, phase.out)
        if phase.accumulate:  # the library adds the op's result to the window
            adds = plan.sums[i] if plan.sums else None
            if adds is None:
                return None
            compiled, args, sources = adds.compiled, [*args, view], [*sources, -1]
        elif strides_.writable(view):
            compiled = sub.compiled
        else:
            return None
        offsets = []
        for a, j in zip(args, sources):
            owner = result if j < 0 else calls[j] if j < len(calls) else None
            if owner is None or not np.may_share_memory(a, owner):  # a copy: not a view of the call
                return None
            offsets.append(a.ctypes.data - owner.ctypes.data)
        if not np.may_share_memory(view, result):
            return None
        steps.append((compiled, sources, offsets, view.ctypes.data - result.ctypes.data,
                      list(phase.zero) if phase.accumulate else []))
    if biased:  # BiasAdd over the whole result, in place
        steps.append((plan.bias_add, [-1, len(calls) - 1], [0, 0], 0, []))
    layouts = [(a.dtype, a.shape, a.strides) for a in calls]
    try:
        return native.PhasedExecutor(steps, layouts, (result.dtype, result.shape, result.strides),
                                     code if guarded else "")
    except ValueError:  # a layout the executor does not take (the checks above hold the rest)
        return None


def _emulating(f32: Any, arrays: Sequence[Any], out: Optional[np.ndarray], shape: tuple[int, ...],
               dtype: np.dtype[Any], code: str) -> Any:
    """The executor of an emulated phased plan (f32 phases of a bf16/f16 call): ``f32``, the
    executor of its f32 phases on dense f32 arrays, run on the call's 16-bit arrays
    converted into staging memory, its result rounded into a dense one
    (``PhasedExecutor.emulating``); None where there is none, or an array or ``out`` it
    cannot take (not aligned, a negative stride; ``out`` not C-contiguous)."""
    calls = list(itertools.takewhile(lambda a: isinstance(a, np.ndarray), arrays))
    if f32 is None or not native.fast_conversion or (out is not None and not out.flags.c_contiguous) or \
            not all(_low_precision(a) and _convertible(a) for a in calls):
        return None
    result = (dtype, shape, tuple(s * dtype.itemsize for s in shapes.dense_strides(shape)))
    try:
        return f32.emulating([(a.dtype, a.shape, a.strides) for a in calls], result, code)
    except ValueError:
        return None


def _plain_layout(a: np.ndarray) -> bool:
    """Whether the phased executor takes ``a``'s layout: non-empty, aligned, no negative stride."""
    return a.size > 0 and bool(a.flags.aligned) and all(s >= 0 for s in a.strides)


def _staged(lowering: Lowering, out: np.ndarray) -> bool:
    """Whether a phased call runs into a fresh result rather than ``out``: a phase writes a
    window that merges ``out``'s first two axes, and those do not merge in its memory (the
    window would be a copy)."""
    windows = [w for phase in lowering.phases for w in (phase.out, phase.fill)]
    return any(isinstance(w, base.View) and w.merged for w in windows) and not base.merges(out)


def _low_precision(a: Any) -> bool:
    """Whether a call's input is a bf16/f16 array (not None, nor a weights_shape)."""
    return isinstance(a, np.ndarray) and dtypes.code_of(a.dtype) in ("bf16", "f16")


def _bias_add(data_format: str, shape: tuple[int, ...], code: str) -> Any:
    """A BiasAdd (one partition) over a C-contiguous dst of ``shape`` and a dense bias, to run
    in place after a polyphase call's phases; None where the library has no kernel for
    ``code`` here."""
    dst = (list(shape), list(shapes.dense_strides(shape)), code)
    channels = shape[1] if data_format == "NCX" else shape[-1]
    attrs: dict[str, Any] = {"data_format": data_format}
    node = ("BiasAdd", attrs, [0, 1], dst)
    try:
        return native.compile("BiasAdd", {}, [dst, ([channels], [1], code)], dst, nodes=[node])
    except UnsupportedError:
        return None

def compile_lowering(
    lowering: Lowering, arrays: Sequence[Any], out: Optional[np.ndarray],
    dtype: np.dtype[Any], code: str, emulated: bool, constant_weights: bool = False,
) -> Plan:
    """Compile the library op for these arrays, described as they will be passed;
    with ``constant_weights``, privately and with the weights input marked constant."""
    args = lowering.library_args(arrays, emulated)
    fixers = [fixed_view(a) for a in args]
    fixed = [f(a) if f else a for f, a in zip(fixers, args)]
    direct = not emulated and lowering.finish is None
    shape = lowering.library_out_shape
    # out's own strides where the library writes it as given; a reshaped result, dense
    # (plan.run writes it into out where out is C-contiguous, else copies it there)
    as_given = direct and out is not None and not lowering.library_shape and strides_.writable(out)
    out_desc = describe(out, code) if as_given and out is not None else (shape, shapes.dense_strides(shape), code)
    at = lowering.weights_arg
    kind, attrs = lowering.kind, lowering.attrs
    staged: dict[str, Any] = {}
    if lowering.bias_stage:  # the op, then BiasAdd in dst: two partitions
        kind = f"{lowering.kind}+BiasAdd"
        bias_add = {"data_format": attrs["data_format"]}
        staged = dict(nodes=[(lowering.kind, attrs, [0, 1], out_desc), ("BiasAdd", bias_add, [-1, 2], out_desc)],
                      stages=[1])
        attrs = {}
    with omp.one_thread() if lowering.single_thread else contextlib.nullcontext():
        compiled = native.compile(
            kind, attrs, [describe(a, code) for a in fixed], out_desc,
            constant=[at] if constant_weights and at is not None else [], **staged,
            bias_axis=-1 if lowering.host_bias is None else lowering.host_bias,
        )
    plan = Plan(compiled, lowering, dtype, emulated, fixers if any(fixers) else [])
    guard = "" if emulated or code == "f32" else code
    if guard:
        def make_fallback(arrays: Sequence[Any]) -> Plan:
            return compile_lowering(lowering.exact or lowering, arrays, None, dtype, "f32", True, constant_weights)

        plan.make_fallback = make_fallback
    # the executor passes the call's arrays and out as given (a lifted call's with their
    # unit axes: the library's tensors are the same memory, told their shapes)
    as_called = lowering.prepare is None and not lowering.library_shape
    call_arrays = [arrays[i] for i in lowering.inputs]
    unit_shapes = _unit_shapes(lowering, call_arrays) if lowering.unit_views else {}
    fast_ok = plan.direct and not plan.fixers and (as_called or lowering.unit_views)
    if fast_ok and (not guard or out_desc[1] == shapes.dense_strides(shape)):
        # with a guard the executor checks the result for Inf/NaN too (a dense one only)
        # the executor takes the call's arrays, so it is told the library's order of them
        plan.executor = native.Executor(compiled, [dtype] * len(args), dtype, guard, list(lowering.inputs), **unit_shapes)
    elif plan.direct and not plan.fixers and lowering.prepare is not None and _views_of_the_call(arrays, lowering, args) \
            and out_desc[1] == shapes.dense_strides(shape):
        # DCGAN's z layer (1x1 -> 4x4) as one MatMul over the call's memory, reshaped
        plan.pointer_executor = native.Executor(compiled, [dtype] * len(args), dtype, guard, list(lowering.inputs))
    elif emulated and native.fast_conversion and (as_called or lowering.unit_views) and lowering.finish is None:
        # C++ converts the bf16/f16 arrays, of any non-negative strides (channels-last
        # weights), into per-thread f32 staging memory, runs the f32 op and rounds back:
        # no Python and no fresh f32 buffers per call. The out= arrays this cannot match
        # (not C-contiguous) take plan.run. Strides are those of the library's tensors.
        views = lowering.prepare(call_arrays) if lowering.unit_views and lowering.prepare else call_arrays
        if all(_convertible(a) for a in views) and (out is None or out.flags.c_contiguous):
            strides = [[] if a.flags.c_contiguous else [s // a.itemsize for s in a.strides] for a in views]
            plan.executor = native.Executor(
                compiled, [dtype] * len(args), dtype, "", list(lowering.inputs), dtypes.resolve(dtype),
                call_strides=strides, **unit_shapes,
            )
    return plan


def _unit_shapes(lowering: Lowering, call_arrays: Sequence[Any]) -> dict[str, Any]:
    """The executor's ``call_shapes`` and ``call_out_shape`` of a lowering whose library
    tensors are the call's arrays and result with axes of size 1 inserted
    (``Lowering.unit_views``)."""
    return {"call_shapes": [list(a.shape) for a in call_arrays], "call_out_shape": list(lowering.out_shape)}


def _views_of_the_call(arrays: Sequence[Any], lowering: Lowering, args: Sequence[Any]) -> bool:
    """Whether each prepared library input starts at its call array's address: a view of
    it (a copy lives elsewhere), made so for any arrays of the same shapes and strides."""
    return len(args) == len(lowering.inputs) and all(
        isinstance(a, np.ndarray) and isinstance(arrays[i], np.ndarray) and a.ctypes.data == arrays[i].ctypes.data
        for a, i in zip(args, lowering.inputs))


def _convertible(a: np.ndarray) -> bool:
    """Whether the executor's converter reads ``a`` as it is: aligned, every stride a
    non-negative multiple of the item size."""
    return bool(a.flags.aligned) and all(s >= 0 and s % a.itemsize == 0 for s in a.strides)


def native_support(kind: str, code: str) -> Optional[bool]:
    """Whether the library op ``kind`` compiled natively in ``code`` so far (None: not tried)."""
    return _NATIVE.get((kind, code))

"""The call path every op shares (:class:`Op`): an op object holds checked attributes
(from :mod:`onednn_convt.schema`); a call checks the arrays, describes the call as a
:class:`~onednn_convt.problem.Problem`, chooses its lowering (:mod:`onednn_convt.lowering`:
the rules, or the autotuner), compiles a plan once per input signature (shapes, strides,
dtypes; :mod:`onednn_convt.plan`) and executes it on the arrays' memory. A repeated call
with the same signature goes straight to the plan's C++ executor.

The op classes themselves (the spec of each) are in :mod:`onednn_convt.ops`.
"""


from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence

import numpy as np
from numpy.typing import ArrayLike

from . import dtypes, interop, layouts, limits, lowering, native, schema, shapes
from .lowering import autotune
from .lowering.base import Lowering
from .plan import PhasedPlan, Plan, Target
from .strides import element_strides, non_overlapping
from .problem import Geometry, Problem
from .constant_weights import ConstantWeights
from .errors import OneDNNError

class Op:
    """Shared machinery of the three ops; subclasses give the spec of each."""

    op_name: ClassVar[str]
    input_names: tuple[str, ...]  # per class; a fused ConvTranspose adds its post-op tensors
    output_name: ClassVar[str]
    _PLAN_SLOTS: ClassVar[int] = 16
    #: set on the private op of a ConstantWeights: compile with the weights input constant
    _constant_weights: bool = False

    def __init__(self, attrs: dict[str, Any], strict: bool) -> None:
        self.attrs = schema.normalize(self.op_name, attrs)
        self.strict = schema.check_bool(self.op_name, "strict", strict)
        self._plans: dict[Any, Any] = {}
        self.last_plan: Optional[Any] = None  # a Plan, or a fused_plan.FusedPlan
        # the last plan's (executor, signature), one attribute so that a thread reads the two
        # together (see _executor_inputs); None where that plan has no executor
        self._fast: Any = None
        self._generation = native.fork_generation  # of the plans above (see _call)

    @property
    def lowering(self) -> Optional[str]:
        """How the last call ran: the library op kind, ``"+BiasAdd: 2 partitions"`` or
        ``"+bias (core)"`` where a second partition or the core adds the bias
        (:func:`onednn_convt.lowering.forward.bias_apart`), ``" (f32 emulation)"`` when a
        bf16/f16 call ran in f32, and ``" (tuned: <lowering>)"`` when autotuning chose it
        (:mod:`onednn_convt.lowering.autotune`; the name tells lowerings of one kind apart).
        None before the first call. A fused ConvTranspose's says its graph and ``"1 fused
        partition"``, or how it ran where the library did not fuse it."""
        plan = self.last_plan
        if plan is None:
            return None
        low = plan.lowering
        staged = getattr(low, "bias_stage", False)
        if isinstance(plan, PhasedPlan):  # the phases, then a BiasAdd over dst where staged
            kinds = sorted({p.lowering.kind + ("+bias (core)" if p.lowering.host_bias is not None else "")
                            + (" " + _wrapper_note(p.lowering.name)).rstrip() for p in plan.plans if p is not None})
            parts = {lowering.base.PER_GROUP: "groups", lowering.base.DEPTH_TAPS: "2-D ops"}.get(low.kind, "phases, stride 1")
            # a depth-taps lowering's fills (zeros, the bias) are no ops of its own
            count = sum(p.lowering is not None for p in low.phases) if low.kind == lowering.base.DEPTH_TAPS \
                else len(low.phases)
            text = (f"{low.kind}{'+BiasAdd' if staged and plan.bias_axis is not None else ''} "
                    f"({count} {parts}: {', '.join(kinds) or 'the bias alone'})")
            if low.prepare is not None:  # channels-last depth taps: its phases in NXC
                text += f" ({_wrapper_note(lowering.base.CHANNELS_LAST)})"
        else:
            text = str(low.kind) + ("+BiasAdd: 2 partitions" if staged else "")
            text += "+bias (core)" if getattr(low, "host_bias", None) is not None else ""
            note = _wrapper_note(getattr(low, "name", ""))
            text += f" ({note})" if note else ""
        text += " (f32 emulation)" if plan.emulated else ""
        tuning = getattr(plan, "tuning", None)
        return text if tuning is None else f"{text} (tuned: {tuning.name})"

    @property
    def tuning(self) -> Optional[autotune.Tuning]:
        """How autotuning chose the last call's lowering: the candidates' times, whether
        they came from the cache. None when the rules chose it (autotuning off, or a fused
        call), and before the first call."""
        plan = self.last_plan
        return None if plan is None else getattr(plan, "tuning", None)

    @property
    def partitions(self) -> Optional[int]:
        """How many library partitions the last call ran (1 for a fused call the library
        fused; a call the library did not fuse ran 1 and then NumPy; a fused call whose plain
        op ran first, ``"the plain op, then ..."``, counts that op as one). None before the
        first call."""
        plan = self.last_plan
        if plan is None:
            return None
        low = plan.lowering
        if isinstance(plan, PhasedPlan):  # one partition a phase, and the BiasAdd after them
            return sum(p is not None for p in plan.plans) + (plan.bias_add is not None)
        return 2 if getattr(low, "bias_stage", False) else int(getattr(low, "partitions", 1))

    @property
    def fused(self) -> Optional[bool]:
        """Whether the last call of an op with post-ops or int8 quantization ran as one fused
        library partition (None for a plain op, or before the first call)."""
        plan = self.last_plan
        fused = getattr(plan.lowering, "fused", None) if plan is not None else None
        return None if fused is None else bool(fused)

    @property
    def guard(self) -> Optional[str]:
        """The guard (:mod:`onednn_convt.guards`) that chose the last call's lowering to keep
        it away from a known-bad oneDNN kernel, or None (also before the first call)."""
        plan = self.last_plan
        return None if plan is None else plan.lowering.guard

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.attrs.items() if v is not None)
        return f"{type(self).__name__}({given})"

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the attributes only: compiled plans belong to this process, and another
        process (multiprocessing's spawn and forkserver, a Pool's arguments) compiles again."""
        state = dict(self.__dict__)
        state.update(_plans={}, last_plan=None, _fast=None)
        if "_plain_op" in state:
            state["_plain_op"] = None
        return state

    # -- the call -------------------------------------------------------------------------
    def _signature(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> Any:
        # alignment too: a misaligned array needs a plan that copies it (see plan.fixed_view),
        # and a misaligned out is refused when a plan is made (_check_out)
        sig = tuple(None if a is None else (a.shape, a.strides, a.dtype, a.flags.aligned) for a in arrays)
        return sig, None if out is None else (out.shape, out.strides, out.dtype, out.flags.aligned)

    def _call(self, inputs: tuple[Any, ...], out: Any) -> Any:
        if self._generation != native.fork_generation:
            # new, unpickled, or in a forked child whose plans were compiled for the parent's
            # OpenMP threads (see onednn_convt.native): those plans are dropped
            self._plans = {}
            self._fast = None
            self._generation = native.fork_generation
        fast = self._fast
        # the lean path: C++ checks the arrays match the last plan (off in debug-fill mode).
        # Plain ndarrays only: torch, DLPack and ndarray subclasses take the checks below (C++
        # would take a masked array's values and ignore its mask)
        if fast is not None and not limits.filling and (out is None or type(out) is np.ndarray):
            for x in inputs:
                if x is not None and type(x) is not np.ndarray:
                    break
            else:
                executor, made_for = fast
                lean = self._executor_inputs(inputs, made_for)
                if lean is not None:
                    try:
                        return executor.run(lean, out)
                    except native.SignatureMismatch:
                        pass
        if interop.foreign(inputs, out):  # torch, DLPack, ndarray subclasses: NumPy views, then back
            arrays_in, out_array, wrap = interop.adapt(self.op_name, self.input_names, inputs, out)
            return wrap(self._call(arrays_in, out_array))
        arrays = [self._as_array(name, x) for name, x in zip(self.input_names, inputs)]
        if out is not None and not isinstance(out, np.ndarray):
            msg = f"{self.op_name}: argument 'out' expected a NumPy array, got {type(out).__name__}"
            raise TypeError(msg)
        key = self._signature(arrays, out)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._make_plan(arrays, out)
            if len(self._plans) >= self._PLAN_SLOTS:
                try:  # drop the oldest; another thread may be doing the same
                    del self._plans[next(iter(self._plans))]
                except (KeyError, RuntimeError, StopIteration):
                    pass
            self._plans[key] = plan
        elif out is not None:
            if not out.flags.writeable:
                msg = f"{self.op_name}: argument 'out' is read-only"
                raise ValueError(msg)
            self._check_aliasing(arrays, out)
        self.last_plan = plan
        self._fast = None if plan.executor is None else (plan.executor, key)
        return plan.run(arrays, out)

    def _executor_inputs(self, inputs: tuple[Any, ...], made_for: Any) -> Optional[tuple[Any, ...]]:
        """The arrays the last plan's executor takes for a call of these plain arrays (it
        checks their shapes, strides and dtypes itself), or None where more than those
        decides whether that plan fits (``made_for``: its signature, :meth:`_signature`): a
        trailing None (no bias) is left out."""
        return inputs if inputs[-1] is not None else inputs[:-1]

    def executor_for(self, arrays: Sequence[Optional[np.ndarray]]) -> Any:
        """The C++ executor of the plan a call of these plain NumPy arrays made (None for
        the missing optional inputs, as the call took them), or None: no plan yet, or one
        with no executor. For :mod:`onednn_convt.torch_run`, which keeps it per signature
        of its own and runs it on tensors' addresses (``Executor.run_pointers``)."""
        plan = self._plans.get(self._signature(arrays, None))
        if plan is None:
            return None
        return plan.executor if plan.executor is not None else getattr(plan, "pointer_executor", None)

    def _as_array(self, name: str, x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return interop.plain(self.op_name, name, x)  # a subclass (np.memmap): its memory
        if x is None and name in self.input_names[2:]:
            return x  # None: an optional input (bias, weights_shape) not given
        if hasattr(x, "__dlpack__"):
            return interop.to_numpy(self.op_name, name, x)
        if x is None or isinstance(x, (str, bytes, dict, set)) or not hasattr(x, "__len__") and not hasattr(
            x, "__array__"
        ):
            msg = f"{self.op_name}: argument '{name}' expected a NumPy array, got {type(x).__name__}"
            raise TypeError(msg)
        try:
            a = np.asarray(x)
        except (ValueError, TypeError) as e:  # e.g. a ragged nested list
            msg = f"{self.op_name}: argument '{name}' expected a NumPy array, got a {type(x).__name__} NumPy cannot convert ({e})"
            raise TypeError(msg) from None
        if name != "weights_shape" and dtypes.code_of(a.dtype) is None and not hasattr(x, "__array__"):
            # a list of Python floats is float64 to NumPy: say what was given, and how to pass it
            msg = (f"{self.op_name}: argument '{name}' expected a NumPy array of {dtypes.expected_names()}, got a "
                   f"{type(x).__name__} (NumPy reads it as {a.dtype}; pass numpy.asarray(..., numpy.float32))")
            raise TypeError(msg)
        return a

    # -- planning -------------------------------------------------------------------------
    def _make_plan(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> Plan | PhasedPlan:
        code = self._check_dtypes(arrays)
        problem = self._problem(arrays, code)
        limits.check_problem_range(self.op_name, self.output_name, problem)
        tuned = autotune.choice(self._target(), problem) if autotune.enabled() else None
        chosen = lowering.build(
            problem, tuned.name if tuned is not None else lowering.rule(problem, native=self.strict)
        )
        try:
            plan: Plan | PhasedPlan = self._target().plan(chosen, arrays, out, code)
        except MemoryError as too_large:
            leaner = self._leaner(problem, chosen, arrays, out, code)
            if leaner is None:
                raise
            try:
                plan, tuned = self._target().plan(leaner, arrays, out, code), None  # (or its own MemoryError)
            except OneDNNError:  # the library refuses the leaner one here: the chosen one's error stands
                raise too_large from None
        plan.tuning = tuned
        return plan

    def _leaner(self, problem: Problem, chosen: Lowering, arrays: Sequence[Any], out: Optional[np.ndarray],
                code: str) -> Optional[Lowering]:
        """The candidate of ``problem`` that allocates least (:func:`onednn_convt.limits.estimate`),
        where that is less than ``chosen``, whose plan would pass the memory limit; else None.
        The rules and the tuner choose for speed: a MatMul's columns or a padded copy may take
        ten times the result's memory where the library's own op takes none (the address-space
        fuzzer, seed 4030: a one-channel 3-D forward of a 76 MiB result, refused at 2.2 GiB
        under a 2 GiB limit as ``MatMul (columns)``)."""
        dtype = dtypes.FLOAT_DTYPES[code]

        def need(low: Lowering) -> int:
            return sum(limits.estimate(low, arrays, out, dtype, low.f32_only and code != "f32").values())

        built = []
        for name in lowering.candidates(problem, native=self.strict):
            try:
                built.append(lowering.build(problem, name))
            except ValueError:  # a name this problem has no form of
                continue
        sized = [(need(low), i) for i, low in enumerate(built)]  # (the first of equal needs wins)
        least, at = min(sized, default=(None, -1))
        return built[at] if least is not None and least < need(chosen) else None

    def _target(self) -> Target:
        """What planning needs of this op (:mod:`onednn_convt.plan`)."""
        return Target(self.op_name, self.output_name, self.strict, self._constant_weights,
                      self.attrs["data_format"] if self.op_name == "ConvTranspose" else None, self._check_out)

    def _lower(self, arrays: Sequence[Any]) -> Lowering:
        """The hand-written rules' lowering of a call (checked as a call is): a fused call's
        default core (the depthwise Convolution over flipped weights, which takes the chain
        fused); where the measured rules run the plain call on the library's deconvolution,
        or on a lowering no graph can head, the fused call follows them instead
        (:func:`onednn_convt.fused_plan.make_plan`)."""
        problem = self._problem(arrays, dtypes.code_of(arrays[0].dtype) or "")
        limits.check_problem_range(self.op_name, self.output_name, problem)
        return lowering.build(problem, lowering.rules.fallback(problem))

    def _check_dtypes(self, arrays: Sequence[Any]) -> str:
        named = [(n, a) for n, a in zip(self.input_names, arrays) if n != "weights_shape"]
        return dtypes.common_code(self.op_name, named, "every float tensor of a call must have one dtype")

    def _check_out(
        self, arrays: Sequence[Any], out: Any, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> None:
        name = f"{self.op_name}: argument 'out'"
        if not isinstance(out, np.ndarray):
            msg = f"{name} expected a NumPy array, got {type(out).__name__}"
            raise TypeError(msg)
        if out.dtype != dtype:
            msg = f"{name} expected dtype {dtype}, got {out.dtype}"
            raise TypeError(msg)
        if out.shape != shape:
            msg = f"{name} expected shape {shape}, got {out.shape}"
            raise ValueError(msg)
        if not out.flags.writeable:
            msg = f"{name} is read-only"
            raise ValueError(msg)
        strides = element_strides(out)
        if strides is None or any(s <= 0 and n > 1 for s, n in zip(strides, shape)) or not non_overlapping(out):
            msg = f"{name} expected positive, aligned, non-overlapping strides, got {out.strides} bytes"
            raise ValueError(msg)
        self._check_aliasing(arrays, out)

    def _check_aliasing(self, arrays: Sequence[Any], out: np.ndarray) -> None:
        for name, a in zip(self.input_names, arrays):
            if a is not None and np.may_share_memory(a, out):
                msg = f"{self.op_name}: argument 'out' shares memory with input '{name}'"
                raise ValueError(msg)

    # -- shared checks --------------------------------------------------------------------
    def _check_rank(self, name: str, a: np.ndarray) -> None:
        if not 3 <= a.ndim <= 5:
            msg = f"{self.op_name}: argument '{name}' expected rank 3, 4 or 5 (1 to 3 spatial dims), got shape {a.shape}"
            raise ValueError(msg)
        if 0 in a.shape:
            msg = f"{self.op_name}: argument '{name}' expected no empty dimension, got shape {a.shape}"
            raise ValueError(msg)

    def _check_same_rank(self, first: layouts.Read, second: layouts.Read) -> None:
        if len(first.shape) != len(second.shape):
            a = self.attrs
            raise ValueError(layouts.rank_mismatch(self.op_name, first, second, a["data_format"], a["weights_format"]))

    def _geometry(self, spatial: int, kernel: Sequence[int]) -> Geometry:
        """Strides, dilations and pads per spatial dim, auto_pad resolved, and dilation 1
        along a kernel of size 1: there it changes nothing (the dilated kernel is one tap
        either way), and passed on it made oneDNN 3.2 choose its ``jit_bf16_1x1`` backward-
        data kernel for a strided 1x1 ConvolutionBackwardData, wrong at some sizes (bf16,
        src 5x6, stride 1x2, output_padding 0x1: every other output wrong by up to 5x; see
        docs/deviations.md); without it the library runs ``brgconv_strided``, right."""
        a, op = self.attrs, self.op_name
        s = schema.per_dim(op, "strides", a["strides"], spatial)
        d = schema.per_dim(op, "dilations", a["dilations"], spatial)
        pb = schema.per_dim(op, "pads_begin", a["pads_begin"], spatial)
        pe = schema.per_dim(op, "pads_end", a["pads_end"], spatial)
        pb, pe = shapes.resolve_pads(kernel, s, d, a["auto_pad"], pb, pe)
        for i, dd in enumerate(d):  # out of the library's range even where it is not passed on
            if dd > limits.INT32_MAX:
                msg = (f"{op}: attribute 'dilations' expected values below 2**31 (oneDNN computes them in "
                       f"32-bit integers), got dilation {dd} in spatial dim {i}")
                raise ValueError(msg)
        return Geometry(tuple(s), tuple(1 if k == 1 else dd for k, dd in zip(kernel, d)), tuple(pb), tuple(pe))

    def _check_channels(
        self, ic: int, i: int, oc: int, o: int, ic_name: str, oc_name: str, w_name: str,
        arrays: Sequence[layouts.Read],
    ) -> None:
        """The channel counts agree (``arrays``: the call's arrays, for the message)."""
        g, op = self.attrs["groups"], self.op_name
        df, wf = self.attrs["data_format"], self.attrs["weights_format"]
        if ic != i:
            msg = f"{op}: '{w_name}' has I = {i} ({wf}), expected the channel count of '{ic_name}', {ic}"
        elif ic % g:
            msg = f"{op}: channel count {ic} of '{ic_name}' expected divisible by groups={g}"
        elif oc != o * g:
            msg = f"{op}: '{oc_name}' has {oc} channels, expected O * groups = {o} * {g} = {o * g} from '{w_name}' ({wf})"
        else:
            return
        raise ValueError(f"{msg} ({layouts.describe(arrays, df, wf)}){layouts.other_fits(arrays, g, df, wf)}")

    def _check_forward_extent(
        self, src: Sequence[int], dst: Sequence[int], kernel: Sequence[int], geometry: Any,
        src_name: str, dst_name: str,
    ) -> None:
        """dst must be the forward size of src plus an output_padding in [0, stride)."""
        s, d, pb, pe = geometry.astuple()
        given = self.attrs["output_padding"]
        op_list = None if given is None else schema.per_dim(self.op_name, "output_padding", given, len(s))
        for i, (x, y, k) in enumerate(zip(src, dst, kernel)):
            full = shapes.conv_transpose_full(x, k, s[i], d[i], pb[i], pe[i])
            residual = y - full
            want = f"{full + op_list[i]}" if op_list is not None else f"{full} to {full + s[i] - 1}"
            if not 0 <= residual < s[i] or (op_list is not None and residual != op_list[i]):
                msg = (
                    f"{self.op_name}: spatial dim {i} of '{dst_name}' is {y}, expected {want} for "
                    f"'{src_name}' size {x} (kernel {k}, stride {s[i]}, dilation {d[i]}, pads {pb[i]}/{pe[i]})"
                )
                raise ValueError(msg)

    def _problem(self, arrays: Sequence[Any], code: str) -> Problem:
        """Check a call's arrays against the attributes and describe it (dtype ``code``)."""
        raise NotImplementedError


def _wrapper_note(name: str) -> str:
    """How a wrapping lowering ran its library op ("" for the others)."""
    return {lowering.base.CHANNELS_LAST: "in NXC, reordered", lowering.base.LIFTED: "as 2-D",
            lowering.base.SPACE_TO_DEPTH: "space-to-depth"}.get(name, "")


class WeightsOp(Op):
    """The ops with a weights input (ConvTranspose, ConvTransposeBackwardData)."""

    def with_constant_weights(self, weights: ArrayLike) -> ConstantWeights:
        """This op with ``weights`` bound and marked constant: the library reorders them on
        the first call only (:mod:`onednn_convt.constant_weights`). ``weights`` is copied.
        """
        return ConstantWeights(self, weights)



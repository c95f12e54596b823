"""What our call is measured against: the native loop, PyTorch and the NumPy reference.

* Native loop: ``CompiledOp.time_loop`` runs the compiled oneDNN partition of the op's last
  plan in a C++ loop with no Python between calls. Our call time minus this time is the
  binding's overhead per call. Two cases time less than the whole op, and the report says
  so in its ``native`` note: for emulated dtypes (bf16/f16 without native kernels) the
  loop times the f32 kernel only, without the conversions to and from f32; for the MatMul
  lowering of large 1-D kernels it times the MatMul only, without the overlap-add.
* PyTorch (optional): ``torch.nn.functional.conv_transpose{1,2,3}d`` for ``fwd`` and
  ``torch.ops.aten.convolution_backward`` (transposed=True) for the gradients, in the same
  dtype, with the same thread count. NXC is PyTorch's channels_last (channels_last_3d in
  3-D; in 1-D, which has no channels_last format, a channels-last strided view), and the
  weights are converted to the same memory format, as ``module.to(memory_format=...)`` does.
* NumPy reference (:mod:`onednn_convt.reference`, float64): on small shapes only; it also
  gives the error of our result.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Optional

import numpy as np

from .. import dtypes, reference
from ..lowering.base import window
from ..plan import phase_output
from .suites import Case, Config
from .timing import BatchRunner

#: the reference runs on configurations with at most this many FLOPs
REF_MAX_FLOPS = 1e8


# -- native loop --------------------------------------------------------------------------
def native_runner(case: Case) -> tuple[BatchRunner, str]:
    """A batch runner over the compiled partitions of ``case.op``'s last plan, and a note.

    The op must have been called on ``case.args`` before. A polyphase plan's loop runs each
    phase's partition in turn, on that phase's views of the arrays (phases without taps,
    filled with zeros or the bias, are left out and the note says so; one computed in f32
    runs its f32 phases on f32 copies made once).
    """
    plan = case.op.last_plan
    if plan is None:
        msg = "bench: the op has not run yet, so it has no compiled partition to loop over"
        raise ValueError(msg)
    arrays = list(case.args) + [None] * (len(case.op.input_names) - len(case.args))
    phases = getattr(plan.lowering, "phases", None)
    if not phases:
        return _plan_runner(plan, arrays)
    runners, notes = [], {"phases only (no fills, NumPy sums or final BiasAdd)"}
    if plan.lowering.prepare is not None:  # channels-last depth taps: the phases on reordered arrays
        arrays = plan.lowering.prepare(arrays)
        notes.add("no reorders")
    result = np.empty(plan.lowering.library_out_shape, np.float32 if plan.emulated else plan.dtype)
    if plan.emulated:  # the f32 phases on f32 copies
        arrays = [dtypes.to_f32(a) if isinstance(a, np.ndarray) and a.dtype == plan.dtype else a for a in arrays]
        notes.add("f32 kernels only (no conversions)")
    sums = plan.sums or [None] * len(phases)
    for phase, sub, adds in zip(phases, plan.plans, sums):
        if sub is None:
            continue
        view = window(result, phase.out)
        if adds is not None:  # the op with its sum into the view, one partition
            run, note = _sum_runner(adds, phase.args(arrays), view)
        else:
            run, note = _plan_runner(sub, phase.args(arrays), phase_output(phase, view))
        runners.append(run)
        notes.update(filter(None, note.split("; ")))

    def run_all(k: int) -> float:
        return sum(r(k) for r in runners)

    return run_all, "; ".join(sorted(notes))


def _plan_runner(plan: Any, arrays: list[Any], target: Optional[np.ndarray] = None) -> tuple[BatchRunner, str]:
    """The loop over one plan's partition, writing ``target`` where the plan was compiled
    for it (a phase's view of the result), else a dense buffer."""
    low = plan.lowering
    args = plan.library_inputs(arrays)
    if target is not None and plan.direct and not low.library_shape:
        out = target
    else:
        out = np.empty(low.library_out_shape, np.float32 if plan.emulated else plan.dtype)
    compiled = plan.compiled
    notes = []
    if plan.emulated:
        notes.append("f32 kernel only (no conversions)")
    if low.finish is not None:
        notes.append(f"{low.kind} only (no finishing step)")

    def run(k: int) -> float:
        return float(compiled.time_loop(args, out, k))

    return run, "; ".join(notes)


def _sum_runner(adds: Any, arrays: list[Any], view: np.ndarray) -> tuple[BatchRunner, str]:
    """The loop over a phase's op fused with its sum into ``view`` (a SumPlan)."""
    args = adds.plan.library_inputs(arrays)
    compiled = adds.compiled

    def run(k: int) -> float:
        return float(compiled.time_loop(args + [view], view, k))

    return run, ""


# -- PyTorch ------------------------------------------------------------------------------
@functools.cache
def torch_module() -> Any:
    """The ``torch`` module, or None if it is not installed."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def torch_versions() -> dict[str, Optional[str]]:
    """PyTorch's version and the oneDNN version it bundles (None when not installed)."""
    torch = torch_module()
    if torch is None:
        return {"torch": None, "torch_onednn": None}
    m = re.search(r"MKL-DNN v([0-9.]+)", torch.__config__.show())
    return {"torch": torch.__version__, "torch_onednn": m.group(1) if m else None}


def torch_set_threads(n: int) -> None:
    """Set PyTorch's intra-op thread count, if PyTorch is installed."""
    torch = torch_module()
    if torch is not None:
        torch.set_num_threads(n)


def _torch_dtype(torch: Any, code: str) -> Any:
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[code]


def torch_call(case: Case) -> Optional[Callable[[], Any]]:
    """A callable running the configuration in PyTorch (returning a tensor; see
    :func:`torch_to_numpy`), or None if PyTorch is not installed."""
    torch = torch_module()
    if torch is None:
        return None
    cfg: Config = case.config
    lay = cfg.layer
    rank = len(lay.spatial)
    dt = _torch_dtype(torch, cfg.dtype)
    nxc = cfg.data_format == "NXC"
    from ..torch_run import channels_last_format  # torch is imported: so may this be

    fmt = channels_last_format(rank)

    def activation(a: np.ndarray) -> Any:
        t = torch.from_numpy(np.asarray(a, dtype=np.float32)).to(dt)
        if not nxc:
            return t.contiguous()
        t = t.movedim(-1, 1)  # a channels-last strided view, (N, C, X...)
        return t.contiguous(memory_format=fmt) if fmt is not None else t

    def weights(a: np.ndarray) -> Any:
        w = np.asarray(a, dtype=np.float32)
        if cfg.weights_format == "XOI":  # (X..., O, I) -> (I, O, X...)
            w = np.moveaxis(w, (-1, -2), (0, 1))
        t = torch.from_numpy(np.ascontiguousarray(w)).to(dt)
        return t.contiguous(memory_format=fmt) if nxc and fmt is not None else t

    # torch pads symmetrically: asymmetric pads run with the smaller one, the output cropped
    # (a view) or diff_dst given zero rows back before timing (the same products)
    pb, pe = lay.pads
    pad_sym = min(pb, pe)
    stride, pad = [lay.stride] * rank, [pad_sym] * rank
    dilation, out_pad = [lay.dilation] * rank, [lay.output_padding] * rank
    extra = (pb - pad_sym, pe - pad_sym)
    crop = (slice(None), slice(None)) + (slice(extra[0], -extra[1] if extra[1] else None),) * rank
    conv = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
            3: torch.nn.functional.conv_transpose3d}[rank]
    backward = torch.ops.aten.convolution_backward

    def full_diff_dst(a: np.ndarray) -> np.ndarray:
        """diff_dst with the rows the extra pads crop back, as zeros (channels last or first)."""
        if extra == (0, 0):
            return a
        widths = [(0, 0)] * a.ndim
        for axis in (range(1, 1 + rank) if nxc else range(2, 2 + rank)):
            widths[axis] = extra
        return np.pad(np.asarray(a, np.float32), widths)

    src_shape = cfg.activation_shape(lay.ic, lay.spatial)
    if cfg.op == "fwd":
        x, w = activation(case.args[0]), weights(case.args[1])
        b = torch.from_numpy(np.asarray(case.args[2], np.float32)).to(dt) if cfg.bias else None

        def call() -> Any:
            y = conv(x, w, b, stride, pad, out_pad, lay.groups, dilation)
            return y if extra == (0, 0) else y[crop]

    elif cfg.op == "bwd_d":
        dd, w = activation(full_diff_dst(case.args[0])), weights(case.args[1])
        x = activation(np.zeros(src_shape, np.float32))  # only its shape and format are read

        def call() -> Any:
            return backward(dd, x, w, None, stride, pad, dilation, True, out_pad, lay.groups,
                            [True, False, False])[0]

    else:
        x, dd = activation(case.args[0]), activation(full_diff_dst(case.args[1]))
        w = weights(np.zeros(cfg.weights_shape, np.float32))

        def call() -> Any:
            return backward(dd, x, w, None, stride, pad, dilation, True, out_pad, lay.groups,
                            [False, True, False])[1]

    def run() -> Any:
        with torch.inference_mode():
            return call()

    return run


def torch_to_numpy(case: Case, result: Any) -> np.ndarray:
    """A PyTorch result of :func:`torch_call` as float32 NumPy in the config's layouts."""
    cfg = case.config
    r = result.float().contiguous().numpy()
    if cfg.op == "bwd_w":
        return np.moveaxis(r, (0, 1), (-1, -2)) if cfg.weights_format == "XOI" else r
    return np.moveaxis(r, 1, -1) if cfg.data_format == "NXC" else r


# -- NumPy reference ----------------------------------------------------------------------
def reference_call(case: Case) -> Optional[Callable[[], np.ndarray]]:
    """A callable computing the configuration with :mod:`onednn_convt.reference` (float64),
    or None when the configuration is larger than :data:`REF_MAX_FLOPS`."""
    cfg = case.config
    if cfg.flops > REF_MAX_FLOPS:
        return None
    args = case.f32_args()
    attrs = cfg.attrs()
    if cfg.op != "fwd":  # the gradients' shapes carry the forward's output_padding (D6)
        attrs.pop("output_padding", None)
    if cfg.op == "fwd":
        return lambda: reference.conv_transpose(args[0], args[1], args[2] if cfg.bias else None, **attrs)
    if cfg.op == "bwd_d":
        return lambda: reference.conv_transpose_backward_data(args[0], args[1], **attrs)
    return lambda: reference.conv_transpose_backward_weights(args[0], args[1], cfg.weights_shape, **attrs)


def relative_error(result: np.ndarray, expected: np.ndarray) -> float:
    """max |result - expected| / max |expected| (0 when both are all zero)."""
    r = np.asarray(result, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    diff = float(np.max(np.abs(r - e))) if e.size else 0.0
    return diff / scale if scale else diff

"""Drop-in PyTorch modules and functions running on onednn_convt, autograd included.

Change one import and a model's transposed convolutions run the package's ops::

    from onednn_convt.torch import ConvTranspose2d      # was: from torch.nn import ...

``ConvTranspose1d/2d/3d`` subclass ``torch.nn.ConvTranspose1d/2d/3d``: same constructor,
parameters, initialization and state_dict (checkpoints load either way), and ``isinstance``
checks still hold. Their forward, and ``conv_transpose1d/2d/3d`` (the signature of
``torch.nn.functional``), run :class:`~onednn_convt.ConvTranspose`; autograd runs
:class:`~onednn_convt.ConvTransposeBackwardData` for the input's gradient,
:class:`~onednn_convt.ConvTransposeBackwardWeights` for the weight's, and a sum for the
bias's. Tensors are shared with the ops, never copied: a channels_last input runs as NXC
(its memory as it is) and gives a channels_last output, as torch's own does.

Layouts: torch's weight, (in_channels, out_channels/groups, k...), is the ops' IOX;
``padding`` p crops p from both ends of each spatial dim (``pads_begin = pads_end = p``).
CPU tensors of float32, bfloat16 and float16 only; ``padding_mode`` must be "zeros" (torch
says the same of its own ConvTranspose). Gradients of any order run on the package's
ops: each op's gradients are the other two. torch.func transforms (vmap, grad, jacrev,
jacfwd, hessian, jvp) and forward-mode AD run on them too (:mod:`onednn_convt.torch_func`);
the custom ops that torch.compile traces refuse forward-mode AD, whose tangents torch drops.

Importing this module imports torch; the rest of the package never does.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn
from torch.autograd import forward_ad

from . import shapes, torch_func
from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights
from .torch_run import Geometry, IntOrTuple, cached_geometry, channels_last, from_nxc, memory_format, run

__all__ = [
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "swap_modules",
]

#: torch's dtypes for the package's f32, bf16 and f16
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _autocast(input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """The tensors as CPU autocast runs a transposed convolution: inside
    ``torch.autocast("cpu", dtype=torch.bfloat16)`` (or float16) every floating tensor but a
    float64 one is cast to that dtype, as torch's own layer does (a float16 one too under
    bfloat16, and the other way round), and the result comes out in it. The casts are
    autograd ops: the gradients reach the parameters in their own dtype."""
    low = torch.get_autocast_dtype("cpu")
    if low not in (torch.bfloat16, torch.float16):
        return input, weight, bias

    def cast(t: Tensor) -> Tensor:
        return t.to(low) if t.is_floating_point() and t.dtype not in (low, torch.float64) else t

    return cast(input), cast(weight), None if bias is None else cast(bias)


# Three autograd Functions, one per op; the gradients of each are the other two
# (_forward_grads and its siblings below), its forward-mode derivative and batching rule
# the ops again (onednn_convt.torch_func). The forward takes no ctx and setup_context saves
# what the gradients read, as torch.func's transforms require.
class _Forward(torch.autograd.Function):
    """dst = ConvTranspose(src, weights) + bias."""

    @staticmethod
    def forward(src: Tensor, weight: Tensor, bias: Optional[Tensor], geometry: Geometry) -> Tensor:
        return run(ConvTranspose, geometry, src, weight, bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        src, weight, _bias, geometry = inputs
        _save(ctx, src, weight, geometry)
        ctx.dst_shape = output.shape

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        return (*_forward_grads(_Calls(ctx.geometry, traced=False), ctx, grad), None)

    @staticmethod
    def jvp(ctx: Any, d_src: Optional[Tensor], d_weight: Optional[Tensor], d_bias: Optional[Tensor],
            _: None) -> Optional[Tensor]:
        src, weight = ctx.saved_tensors
        return torch_func.forward_tangent(_Calls(ctx.geometry, traced=False), src, weight, ctx.dst_shape,
                                          d_src, d_weight, d_bias)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], src: Tensor, weight: Tensor, bias: Optional[Tensor],
             geometry: Geometry) -> tuple[Tensor, Optional[int]]:
        return torch_func.forward_vmap(_Calls(geometry, traced=False), info.batch_size, in_dims, src, weight, bias)


class _BackwardData(torch.autograd.Function):
    """diff_src = ConvTransposeBackwardData(diff_dst, weights)."""

    @staticmethod
    def forward(diff_dst: Tensor, weight: Tensor, geometry: Geometry) -> Tensor:
        return run(ConvTransposeBackwardData, geometry, diff_dst, weight)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        diff_dst, weight, geometry = inputs
        _save(ctx, diff_dst, weight, geometry)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        return (*_backward_data_grads(_Calls(ctx.geometry, traced=False), ctx, grad), None)

    @staticmethod
    def jvp(ctx: Any, d_diff_dst: Optional[Tensor], d_weight: Optional[Tensor], _: None) -> Optional[Tensor]:
        diff_dst, weight = ctx.saved_tensors
        return torch_func.backward_data_tangent(_Calls(ctx.geometry, traced=False), diff_dst, weight,
                                                d_diff_dst, d_weight)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], diff_dst: Tensor, weight: Tensor,
             geometry: Geometry) -> tuple[Tensor, Optional[int]]:
        return torch_func.backward_data_vmap(_Calls(geometry, traced=False), info.batch_size, in_dims,
                                             diff_dst, weight)


class _BackwardWeights(torch.autograd.Function):
    """diff_weights = ConvTransposeBackwardWeights(src, diff_dst), IOX."""

    @staticmethod
    def forward(src: Tensor, diff_dst: Tensor, geometry: Geometry, shape: tuple[int, ...]) -> Tensor:
        return run(ConvTransposeBackwardWeights, geometry, src, diff_dst, weights_shape=shape)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        src, diff_dst, geometry, ctx.shape = inputs
        _save(ctx, src, diff_dst, geometry)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
        return (*_backward_weights_grads(_Calls(ctx.geometry, traced=False), ctx, grad), None, None)

    @staticmethod
    def jvp(ctx: Any, d_src: Optional[Tensor], d_diff_dst: Optional[Tensor], _: None, __: None) -> Optional[Tensor]:
        src, diff_dst = ctx.saved_tensors
        return torch_func.backward_weights_tangent(_Calls(ctx.geometry, traced=False), src, diff_dst, ctx.shape,
                                                   d_src, d_diff_dst)

    @staticmethod
    def vmap(info: Any, in_dims: tuple[Any, ...], src: Tensor, diff_dst: Tensor, geometry: Geometry,
             shape: tuple[int, ...]) -> tuple[Tensor, Optional[int]]:
        return torch_func.backward_weights_vmap(_Calls(geometry, traced=False), info.batch_size, in_dims,
                                                src, diff_dst, shape)


def _save(ctx: Any, first: Tensor, second: Tensor, geometry: Geometry) -> None:
    """What a Function's backward and jvp read: its two tensor inputs and its geometry. The
    jvp's copy only where a forward-mode level is open (torch.func.jvp opens one too)."""
    ctx.save_for_backward(first, second)
    if forward_ad._current_level >= 0:
        ctx.save_for_forward(first, second)
    ctx.geometry = geometry


# torch's C apply (``torch._C._FunctionBase.apply``), which ``Function.apply`` calls after
# two steps in Python: binding default arguments (a Function with a setup_context; these three
# are given every argument) and, where no functorch transform is active, unwrapping tensors that
# outlived their transform. ``_apply`` takes the second step itself, with torch's own C
# unwrap, and calls the C apply: a recorded call of the tiny layer took 8.1 us against 8.8
# (on an AMD Zen5). Under an active functorch transform, or on a torch that lacks one of
# these pieces, it calls ``Function.apply``.
_C_APPLY: Any = getattr(torch._C, "_FunctionBase", object).__dict__.get("apply")
_UNWRAP: Any = getattr(getattr(torch._C, "_functorch", None), "unwrap_if_dead", None)
_TRANSFORMS_ACTIVE: Any = getattr(torch._C, "_are_functorch_transforms_active", None)
_DIRECT: dict[type[torch.autograd.Function], Any] = (
    {fn: _C_APPLY.__get__(None, fn) for fn in (_Forward, _BackwardData, _BackwardWeights)}
    if _C_APPLY is not None and _UNWRAP is not None and _TRANSFORMS_ACTIVE is not None else {})
if _TRANSFORMS_ACTIVE is None:  # a torch without functorch: no transform is ever active
    _TRANSFORMS_ACTIVE = bool


def _apply(fn: type[torch.autograd.Function], first: Tensor, second: Tensor, third: Any, *rest: Any) -> Tensor:
    """``fn.apply(first, second, third, *rest)``, as torch runs it, with less Python on the
    way (see above). Of ``third`` and ``rest`` only ``third`` may be a tensor: the forward's
    bias."""
    direct = _DIRECT.get(fn)
    if direct is not None and not _TRANSFORMS_ACTIVE():
        if isinstance(third, Tensor):
            third = _UNWRAP(third)
        result: Tensor = direct(_UNWRAP(first), _UNWRAP(second), third, *rest)
        return result
    apply: Any = fn.apply  # untyped in torch
    applied: Tensor = apply(first, second, third, *rest)
    return applied


class _Calls:
    """How the gradient formulas below call the three ops: as the autograd Functions above
    (eager), or as the custom ops below (traced by torch.compile). Either is differentiable
    again, so gradients of any order run on the package."""

    def __init__(self, geometry: Geometry, traced: bool) -> None:
        self.geometry = geometry
        self.traced = traced

    def with_geometry(self, geometry: Geometry) -> "_Calls":
        return _Calls(geometry, self.traced)

    def ct(self, x: Tensor, w: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        if self.traced:
            out: Tensor = conv_transpose_op(x, w, bias, *self.geometry.lists())
            return out
        if not _records(x, w, bias):
            return run(ConvTranspose, self.geometry, x, w, bias)
        return _apply(_Forward, x, w, bias, self.geometry)

    def bd(self, g: Tensor, w: Tensor) -> Tensor:
        if self.traced:
            out: Tensor = backward_data_op(g, w, *self.geometry.lists())
            return out
        if not _records(g, w):
            return run(ConvTransposeBackwardData, self.geometry, g, w)
        return _apply(_BackwardData, g, w, self.geometry)

    def bw(self, x: Tensor, g: Tensor, shape: Sequence[int]) -> Tensor:
        if self.traced:
            out: Tensor = backward_weights_op(x, g, list(shape), *self.geometry.lists())
            return out
        if not _records(x, g):
            return run(ConvTransposeBackwardWeights, self.geometry, x, g, weights_shape=tuple(shape))
        return _apply(_BackwardWeights, x, g, self.geometry, tuple(shape))


def _records(first: Tensor, second: Tensor, third: Optional[Tensor] = None) -> bool:
    """Whether a call of an op on these tensors goes through its autograd Function: a
    gradient to record (grad mode on and an input that requires one), or what only the
    Function handles though nothing requires a gradient: a forward-mode AD level (dual
    tensors, torch.func.jvp) or a torch.func transform (vmap, grad...). Otherwise the op
    runs directly (:func:`~onednn_convt.torch_run.run`): a backward pass (grad mode off,
    unless ``create_graph``) computes its gradients so, saving two autograd Functions'
    work per layer (about 10 us each, AMD Zen3)."""
    return (torch.is_grad_enabled() and (first.requires_grad or second.requires_grad
                                         or (third is not None and third.requires_grad))
            or forward_ad._current_level >= 0 or _TRANSFORMS_ACTIVE())


# The gradients of each op, from its saved inputs (ctx.saved_tensors) and ctx.needs_input_grad:
# with CT the forward, BD ConvTransposeBackwardData and BW ConvTransposeBackwardWeights,
# <h, BD(g, w)> = <CT(h, w), g> and <H, BW(x, g)> = <CT(x, H), g>.
def _forward_grads(calls: _Calls, ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    """d src, d weight, d bias of dst = CT(src, weight) + bias."""
    src, weight = ctx.saved_tensors
    need_src, need_weight, need_bias = ctx.needs_input_grad[:3]
    # d dst and d src laid out as the forward ran (see _forward_format)
    fmt = _forward_format(src, weight)
    grad = grad.contiguous(memory_format=fmt)
    return (calls.bd(grad, weight).contiguous(memory_format=fmt) if need_src else None,
            calls.bw(src, grad, weight.shape) if need_weight else None,
            grad.sum(dim=(0, *range(2, grad.dim()))) if need_bias else None)  # False without a bias


def _forward_format(src: Tensor, weight: Tensor) -> torch.memory_format:
    """The memory format the forward ran in: channels-last on a channels-last ``src``
    (:func:`~onednn_convt.torch_run.channels_last`), else contiguous. Its backward takes d dst
    in it and gives d src in it, whatever the layout of the gradient that reaches it, as
    torch's own layer does (its backward makes grad_output contiguous in the forward's memory
    format). A loss's gradient is contiguous: in a channels_last DCGAN generator the output
    layer's d src came back NCHW beside a channels_last ReLU output, and the ReLU's backward
    over the two layouts took 0.76 ms a call against 0.10 (AMD Zen4, f32, batch 16). A d dst
    dense in both layouts (one output channel) runs its BackwardData in the layout its own
    strides say, so d src is brought to the forward's layout after it (a copy there only)."""
    return memory_format(src.dim() - 2) if channels_last(src, weight) else torch.contiguous_format


def _backward_data_grads(calls: _Calls, ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    """d diff_dst, d weight of diff_src = BD(diff_dst, weight)."""
    diff_dst, weight = ctx.saved_tensors
    need_dd, need_weight = ctx.needs_input_grad[:2]
    return (calls.ct(grad, weight) if need_dd else None,
            calls.bw(grad, diff_dst, weight.shape) if need_weight else None)


def _backward_weights_grads(calls: _Calls, ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    """d src, d diff_dst of diff_weights = BW(src, diff_dst)."""
    src, diff_dst = ctx.saved_tensors
    need_src, need_dd = ctx.needs_input_grad[:2]
    return (calls.bd(diff_dst, grad) if need_src else None,
            calls.ct(src, grad) if need_dd else None)


# The same three ops registered with torch.library, for torch.compile: a traced model keeps
# each call whole in its graph (no graph break), with a fake (meta) kernel for the output's
# shape and strides and the same gradients as the Functions above. Eager calls take the
# Functions, which cost less per call than the dispatcher's custom-op path.
_Ints = list[int]


@torch.library.custom_op("onednn_convt::conv_transpose", mutates_args=())
def conv_transpose_op(src: Tensor, weight: Tensor, bias: Optional[Tensor], stride: _Ints, padding: _Ints,
                      output_padding: _Ints, groups: int, dilation: _Ints) -> Tensor:
    """``torch.ops.onednn_convt.conv_transpose``: :class:`~onednn_convt.ConvTranspose` on
    src (N, C_in, X...) NCX or channels_last, weight (C_in, C_out/groups, k...) and an
    optional bias (C_out,); the result (N, C_out, X'...) laid out as src."""
    _refuse_forward_ad("conv_transpose")
    g = _geometry(stride, padding, output_padding, groups, dilation, "conv_transpose")
    return run(ConvTranspose, g, src, weight, bias)


@torch.library.custom_op("onednn_convt::conv_transpose_backward_data", mutates_args=())
def backward_data_op(diff_dst: Tensor, weight: Tensor, stride: _Ints, padding: _Ints, output_padding: _Ints,
                     groups: int, dilation: _Ints) -> Tensor:
    """``torch.ops.onednn_convt.conv_transpose_backward_data``:
    :class:`~onednn_convt.ConvTransposeBackwardData`, the gradient of the input (N, C_in, X...)
    from diff_dst (N, C_out, X'...), laid out as diff_dst."""
    _refuse_forward_ad("conv_transpose_backward_data")
    g = _geometry(stride, padding, output_padding, groups, dilation, "conv_transpose_backward_data")
    return run(ConvTransposeBackwardData, g, diff_dst, weight)


@torch.library.custom_op("onednn_convt::conv_transpose_backward_weights", mutates_args=())
def backward_weights_op(src: Tensor, diff_dst: Tensor, weight_shape: _Ints, stride: _Ints, padding: _Ints,
                        output_padding: _Ints, groups: int, dilation: _Ints) -> Tensor:
    """``torch.ops.onednn_convt.conv_transpose_backward_weights``:
    :class:`~onednn_convt.ConvTransposeBackwardWeights`, the weight gradient
    (C_in, C_out/groups, k...), contiguous."""
    _refuse_forward_ad("conv_transpose_backward_weights")
    g = _geometry(stride, padding, output_padding, groups, dilation, "conv_transpose_backward_weights")
    return run(ConvTransposeBackwardWeights, g, src, diff_dst, weights_shape=tuple(weight_shape))


def _geometry(stride: _Ints, padding: _Ints, output_padding: _Ints, groups: int, dilation: _Ints,
              fn: str = "conv_transpose") -> Geometry:
    """The Geometry of a custom op's list arguments (``fn`` names the op in its errors)."""
    return Geometry(len(stride), stride, padding, output_padding, groups, dilation, fn)


def _refuse_forward_ad(op: str) -> None:
    """Raise where a forward-mode AD level is open (torch.func.jvp, jacfwd, dual tensors of
    torch.autograd.forward_ad): torch does not carry tangents through custom ops (it runs
    their kernel and drops them), so the result's tangent would be silently wrong. The
    functions and modules of this module carry them in eager mode."""
    if forward_ad._current_level >= 0:
        msg = (f"torch.ops.onednn_convt.{op}: forward-mode AD (torch.func.jvp, jacfwd, "
               "torch.autograd.forward_ad) does not reach torch custom ops, whose tangents torch drops; "
               "call onednn_convt.torch's conv_transpose1d/2d/3d or modules outside torch.compile instead")
        raise RuntimeError(msg)


def _like(activation: Tensor, weight: Tensor, shape: Sequence[Any]) -> Tensor:
    """An empty tensor of ``shape`` laid out as :func:`~onednn_convt.torch_run.run` lays out a result computed from
    ``activation`` and ``weight``: channels_last where :func:`~onednn_convt.torch_run.channels_last` says so, else
    contiguous."""
    if channels_last(activation, weight):
        return from_nxc(activation.new_empty((shape[0], *shape[2:], shape[1])))
    return activation.new_empty(tuple(shape))


@conv_transpose_op.register_fake
def _(src: Tensor, weight: Tensor, bias: Optional[Tensor], stride: _Ints, padding: _Ints,
      output_padding: _Ints, groups: int, dilation: _Ints) -> Tensor:
    g = _geometry(stride, padding, output_padding, groups, dilation, "conv_transpose")
    x = shapes.conv_transpose_output(src.shape[2:], weight.shape[2:], g.strides, g.dilations, g.pads, g.pads_end,
                                     g.op_output_padding)
    return _like(src, weight, [src.shape[0], weight.shape[1] * groups, *x])


@backward_data_op.register_fake
def _(diff_dst: Tensor, weight: Tensor, stride: _Ints, padding: _Ints, output_padding: _Ints,
      groups: int, dilation: _Ints) -> Tensor:
    # the op's pads_end and output_padding (Geometry._ends): where torch's output_padding reaches
    # the stride (below the dilation) it is less pads_end, which the op's diff_src size counts
    g = _geometry(stride, padding, output_padding, groups, dilation, "conv_transpose_backward_data")
    x = shapes.backward_data_output(diff_dst.shape[2:], weight.shape[2:], g.strides, g.dilations, g.pads, g.pads_end)
    return _like(diff_dst, weight, [diff_dst.shape[0], weight.shape[0], *x])


@backward_weights_op.register_fake
def _(src: Tensor, diff_dst: Tensor, weight_shape: _Ints, stride: _Ints, padding: _Ints,
      output_padding: _Ints, groups: int, dilation: _Ints) -> Tensor:
    return src.new_empty(tuple(weight_shape))


def _setup(ctx: Any, first: Tensor, second: Tensor, geometry: Sequence[Any]) -> None:
    """What each custom op's backward reads: its two tensor inputs and its geometry
    (stride, padding, output_padding, groups, dilation)."""
    stride, padding, output_padding, groups, dilation = geometry
    _save(ctx, first, second, _geometry(stride, padding, output_padding, groups, dilation))


def _forward_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    src, weight, _bias, *geometry = inputs  # a bias's gradient needs none of it
    _setup(ctx, src, weight, geometry)


def _backward_data_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    diff_dst, weight, *geometry = inputs
    _setup(ctx, diff_dst, weight, geometry)


def _backward_weights_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    src, diff_dst, _shape, *geometry = inputs
    _setup(ctx, src, diff_dst, geometry)


def _forward_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    return (*_forward_grads(_Calls(ctx.geometry, traced=True), ctx, grad), None, None, None, None, None)


def _backward_data_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    return (*_backward_data_grads(_Calls(ctx.geometry, traced=True), ctx, grad), None, None, None, None, None)


def _backward_weights_backward(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    return (*_backward_weights_grads(_Calls(ctx.geometry, traced=True), ctx, grad),
            None, None, None, None, None, None)


conv_transpose_op.register_autograd(_forward_backward, setup_context=_forward_setup)
backward_data_op.register_autograd(_backward_data_backward, setup_context=_backward_data_setup)
backward_weights_op.register_autograd(_backward_weights_backward, setup_context=_backward_weights_setup)


def _traced(stride: _Ints, padding: _Ints, output_padding: _Ints, groups: int, dilation: _Ints) -> _Calls:
    return _Calls(_geometry(stride, padding, output_padding, groups, dilation), traced=True)


# torch.vmap of the custom ops: the batching rules of the Functions (onednn_convt.torch_func)
@conv_transpose_op.register_vmap
def _(info: Any, in_dims: tuple[Any, ...], src: Tensor, weight: Tensor, bias: Optional[Tensor], stride: _Ints,
      padding: _Ints, output_padding: _Ints, groups: int, dilation: _Ints) -> tuple[Tensor, Optional[int]]:
    calls = _traced(stride, padding, output_padding, groups, dilation)
    return torch_func.forward_vmap(calls, info.batch_size, in_dims, src, weight, bias)


@backward_data_op.register_vmap
def _(info: Any, in_dims: tuple[Any, ...], diff_dst: Tensor, weight: Tensor, stride: _Ints, padding: _Ints,
      output_padding: _Ints, groups: int, dilation: _Ints) -> tuple[Tensor, Optional[int]]:
    calls = _traced(stride, padding, output_padding, groups, dilation)
    return torch_func.backward_data_vmap(calls, info.batch_size, in_dims, diff_dst, weight)


@backward_weights_op.register_vmap
def _(info: Any, in_dims: tuple[Any, ...], src: Tensor, diff_dst: Tensor, weight_shape: _Ints, stride: _Ints,
      padding: _Ints, output_padding: _Ints, groups: int, dilation: _Ints) -> tuple[Tensor, Optional[int]]:
    calls = _traced(stride, padding, output_padding, groups, dilation)
    return torch_func.backward_weights_vmap(calls, info.batch_size, in_dims, src, diff_dst, weight_shape)


def _conv_transpose(
    rank: int, fn: str, input: Tensor, weight: Tensor, bias: Optional[Tensor], stride: IntOrTuple,
    padding: IntOrTuple, output_padding: IntOrTuple, groups: int, dilation: IntOrTuple,
) -> Tensor:
    if not (isinstance(input, Tensor) and input.is_cpu and input.layout == torch.strided
            and isinstance(weight, Tensor) and weight.is_cpu and weight.layout == torch.strided
            and (bias is None or isinstance(bias, Tensor) and bias.is_cpu and bias.layout == torch.strided)):
        _tensor_error(fn, input, weight, bias)
    if torch.is_autocast_enabled("cpu"):
        input, weight, bias = _autocast(input, weight, bias)
    dtype = input.dtype
    if dtype not in _DTYPES or weight.dtype != dtype or (bias is not None and bias.dtype != dtype):
        _dtype_error(fn, input, weight, bias)
    compiling = torch.compiler.is_compiling()
    if compiling:
        # traced by torch.compile: the registered custom op, which the graph keeps whole
        geometry = Geometry(rank, stride, padding, output_padding, groups, dilation, fn)
    else:
        try:
            geometry = cached_geometry(rank, stride, padding, output_padding, groups, dilation, fn)
        except TypeError:  # a list argument: not hashable, so not cached
            geometry = Geometry(rank, stride, padding, output_padding, groups, dilation, fn)
    dims = input.dim()
    if dims == rank + 1:  # unbatched (C, X...), as torch allows
        out = _conv_transpose(rank, fn, input.unsqueeze(0), weight, bias, stride, padding,
                              output_padding, groups, dilation)
        return out.squeeze(0)
    if dims != rank + 2:
        msg = f"{fn}: argument 'input' expected {rank + 1}-D or {rank + 2}-D, got shape {tuple(input.shape)}"
        raise ValueError(msg)
    if input.numel() == 0:  # nothing to compute: torch gives the empty result's shape
        torch_fn = getattr(torch.nn.functional, fn)
        result: Tensor = torch_fn(input, weight, bias, stride, padding, output_padding, groups, dilation)
        return result
    if compiling:
        traced: Tensor = conv_transpose_op(input, weight, bias, *geometry.lists())
        return traced
    if _records(input, weight, bias):
        return _apply(_Forward, input, weight, bias, geometry)
    return run(ConvTranspose, geometry, input, weight, bias)  # nothing to record: no Function


def _tensor_error(fn: str, input: Any, weight: Any, bias: Any) -> None:
    """Raise the TypeError of an argument that is not a dense CPU tensor."""
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, Tensor):
            msg = f"{fn}: argument '{name}' expected a torch.Tensor, got {type(t).__name__}"
            raise TypeError(msg)
        if not t.is_cpu:
            msg = f"{fn}: argument '{name}' is on device {t.device}; onednn_convt runs on the CPU only"
            raise TypeError(msg)
        if t.layout != torch.strided:
            msg = f"{fn}: argument '{name}' expected a dense (torch.strided) tensor, got layout {t.layout}"
            raise TypeError(msg)


def _dtype_error(fn: str, input: Tensor, weight: Tensor, bias: Optional[Tensor]) -> None:
    """Raise the TypeError of tensors that are not of one dtype among float32, bfloat16 and float16."""
    tensors = {"input": input, "weight": weight, **({} if bias is None else {"bias": bias})}
    for name, t in tensors.items():
        if t.dtype not in _DTYPES:
            msg = f"{fn}: argument '{name}' expected dtype torch.float32, torch.bfloat16 or torch.float16, got {t.dtype}"
            raise TypeError(msg)
    got = ", ".join(f"{n}={t.dtype}" for n, t in tensors.items())
    msg = f"{fn}: input, weight and bias must have one dtype, got {got}"
    raise TypeError(msg)


def conv_transpose1d(
    input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrTuple = 1,
    padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1, dilation: IntOrTuple = 1,
) -> Tensor:
    """``torch.nn.functional.conv_transpose1d`` on onednn_convt: input (N, C_in, L) or
    (C_in, L), weight (C_in, C_out/groups, kL), bias (C_out,)."""
    return _conv_transpose(1, "conv_transpose1d", input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


def conv_transpose2d(
    input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrTuple = 1,
    padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1, dilation: IntOrTuple = 1,
) -> Tensor:
    """``torch.nn.functional.conv_transpose2d`` on onednn_convt: input (N, C_in, H, W) or
    (C_in, H, W), NCHW or channels_last; weight (C_in, C_out/groups, kH, kW)."""
    return _conv_transpose(2, "conv_transpose2d", input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


def conv_transpose3d(
    input: Tensor, weight: Tensor, bias: Optional[Tensor] = None, stride: IntOrTuple = 1,
    padding: IntOrTuple = 0, output_padding: IntOrTuple = 0, groups: int = 1, dilation: IntOrTuple = 1,
) -> Tensor:
    """``torch.nn.functional.conv_transpose3d`` on onednn_convt: input (N, C_in, D, H, W) or
    (C_in, D, H, W), NCDHW or channels_last_3d; weight (C_in, C_out/groups, kD, kH, kW)."""
    return _conv_transpose(3, "conv_transpose3d", input, weight, bias, stride, padding, output_padding,
                           groups, dilation)


_FUNCTIONS = {1: conv_transpose1d, 2: conv_transpose2d, 3: conv_transpose3d}


class _ModuleForward:
    """The forward of the three modules: torch's own output_size handling, then ours."""

    _rank: int

    def forward(self, input: Tensor, output_size: Optional[Sequence[int]] = None) -> Tensor:
        m: Any = self
        if m.padding_mode != "zeros":  # the constructor refuses it too; a later assignment
            msg = f'{type(self).__name__}: only padding_mode "zeros" is supported, got {m.padding_mode!r}'
            raise ValueError(msg)
        output_padding = m._output_padding(input, output_size, m.stride, m.padding, m.kernel_size,
                                           self._rank, m.dilation)
        return _FUNCTIONS[self._rank](input, m.weight, m.bias, m.stride, m.padding, output_padding,
                                      m.groups, m.dilation)


class ConvTranspose1d(_ModuleForward, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` running on onednn_convt (see the module docstring)."""

    _rank = 1


class ConvTranspose2d(_ModuleForward, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` running on onednn_convt (see the module docstring)."""

    _rank = 2


class ConvTranspose3d(_ModuleForward, nn.ConvTranspose3d):
    """``torch.nn.ConvTranspose3d`` running on onednn_convt (see the module docstring)."""

    _rank = 3


_SWAPS: dict[type[nn.Module], type[nn.Module]] = {
    nn.ConvTranspose1d: ConvTranspose1d,
    nn.ConvTranspose2d: ConvTranspose2d,
    nn.ConvTranspose3d: ConvTranspose3d,
}


def swap_modules(model: nn.Module) -> nn.Module:
    """Make every ``torch.nn.ConvTranspose{1,2,3}d`` in ``model`` (itself included) run on
    onednn_convt, in place, keeping its parameters (the same tensors) and hooks; returns
    ``model``. Subclasses of torch's modules other than these three are left alone."""
    for module in model.modules():
        cls = _SWAPS.get(type(module))
        if cls is not None:
            module.__class__ = cls
    return model

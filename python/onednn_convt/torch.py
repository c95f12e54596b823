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
says the same of its own ConvTranspose). Double backward is not supported.

Importing this module imports torch; the rest of the package never does.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights, _Op

__all__ = [
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "swap_modules",
]

IntOrTuple = Union[int, Sequence[int]]


def _tuple(name: str, value: IntOrTuple, rank: int, fn: str) -> tuple[int, ...]:
    values = (value,) * rank if isinstance(value, int) else tuple(value)
    if len(values) != rank or not all(isinstance(v, int) for v in values):
        msg = f"{fn}: argument '{name}' expected an int or {rank} ints, got {value!r}"
        raise ValueError(msg)
    return values


@functools.lru_cache(maxsize=256)
def _op(cls: type[_Op], **attrs: Any) -> Any:
    """The op object for these attributes, shared by every call (it keeps the compiled plans)."""
    return cls(**attrs)


def _channels_last(t: Tensor) -> bool:
    """Whether t, (N, C, X...), is laid out channels-last (dense (N, X..., C)) and not NCX."""
    perm = (0, *range(2, t.dim()), 1)
    return t.permute(perm).is_contiguous() and not t.is_contiguous()


def _to_nxc(t: Tensor) -> Tensor:
    return t.permute(0, *range(2, t.dim()), 1)


def _from_nxc(t: Tensor) -> Tensor:
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


class _Geometry:
    """The attributes of one call, as the ops take them (hashable, for the op cache)."""

    def __init__(self, rank: int, stride: IntOrTuple, padding: IntOrTuple, output_padding: IntOrTuple,
                 groups: int, dilation: IntOrTuple, fn: str) -> None:
        self.rank = rank
        self.strides = _tuple("stride", stride, rank, fn)
        self.pads = _tuple("padding", padding, rank, fn)
        self.output_padding = _tuple("output_padding", output_padding, rank, fn)
        self.dilations = _tuple("dilation", dilation, rank, fn)
        self.groups = int(groups)
        for o, s, d in zip(self.output_padding, self.strides, self.dilations):
            if not (o < s or o < d):  # torch's own rule, stricter than the spec's
                msg = (
                    f"{fn}: argument 'output_padding' expected values smaller than either stride "
                    f"or dilation (as torch requires), got output_padding={self.output_padding}, "
                    f"stride={self.strides}, dilation={self.dilations}"
                )
                raise ValueError(msg)

    def attrs(self, data_format: str) -> dict[str, Any]:
        return dict(strides=self.strides, pads_begin=self.pads, pads_end=self.pads,
                    dilations=self.dilations, output_padding=self.output_padding,
                    groups=self.groups, data_format=data_format, weights_format="IOX")


class _ConvTransposeFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, input: Tensor, weight: Tensor, bias: Optional[Tensor], geometry: _Geometry) -> Tensor:
        nxc = _channels_last(input)
        fmt = "NXC" if nxc else "NCX"
        x = _to_nxc(input) if nxc else input
        op = _op(ConvTranspose, **geometry.attrs(fmt))
        b = None if bias is None else bias.detach()
        y: Tensor = op(x.detach(), weight.detach(), b)
        ctx.save_for_backward(input, weight)
        ctx.geometry = geometry
        ctx.has_bias = bias is not None
        return _from_nxc(y) if nxc else y

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Optional[Tensor], ...]:
        input, weight = (t.detach() for t in ctx.saved_tensors)
        geometry: _Geometry = ctx.geometry
        need_input, need_weight, need_bias, _ = ctx.needs_input_grad
        grad_input = grad_weight = grad_bias = None
        nxc = _channels_last(input)
        fmt = "NXC" if nxc else "NCX"
        if nxc:
            dd = _to_nxc(grad_output if _channels_last(grad_output)
                         else grad_output.contiguous(memory_format=_memory_format(geometry.rank)))
        else:
            dd = grad_output
        dd = dd.detach()
        if need_input:
            op = _op(ConvTransposeBackwardData, **geometry.attrs(fmt))
            dx: Tensor = op(dd, weight)
            grad_input = _from_nxc(dx) if nxc else dx
        if need_weight:
            op = _op(ConvTransposeBackwardWeights, weights_shape=tuple(weight.shape), **geometry.attrs(fmt))
            grad_weight = op(_to_nxc(input) if nxc else input, dd)
        if need_bias and ctx.has_bias:
            grad_bias = grad_output.sum(dim=(0, *range(2, grad_output.dim())))
        return grad_input, grad_weight, grad_bias, None


def _memory_format(rank: int) -> torch.memory_format:
    return {2: torch.channels_last, 3: torch.channels_last_3d}.get(rank, torch.contiguous_format)


def _conv_transpose(
    rank: int, fn: str, input: Tensor, weight: Tensor, bias: Optional[Tensor], stride: IntOrTuple,
    padding: IntOrTuple, output_padding: IntOrTuple, groups: int, dilation: IntOrTuple,
) -> Tensor:
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is None:
            continue
        if not isinstance(t, Tensor):
            msg = f"{fn}: argument '{name}' expected a torch.Tensor, got {type(t).__name__}"
            raise TypeError(msg)
        if t.device.type != "cpu":
            msg = f"{fn}: argument '{name}' is on device {t.device}; onednn_convt runs on the CPU only"
            raise TypeError(msg)
    geometry = _Geometry(rank, stride, padding, output_padding, groups, dilation, fn)
    if input.dim() == rank + 1:  # unbatched (C, X...), as torch allows
        out = _conv_transpose(rank, fn, input.unsqueeze(0), weight, bias, stride, padding,
                              output_padding, groups, dilation)
        return out.squeeze(0)
    if input.dim() != rank + 2:
        msg = f"{fn}: argument 'input' expected {rank + 1}-D or {rank + 2}-D, got shape {tuple(input.shape)}"
        raise ValueError(msg)
    if input.numel() == 0:  # nothing to compute: torch gives the empty result's shape
        torch_fn = getattr(torch.nn.functional, fn)
        result: Tensor = torch_fn(input, weight, bias, stride, padding, output_padding, groups, dilation)
        return result
    apply: Any = _ConvTransposeFunction.apply  # untyped in torch
    result = apply(input, weight, bias, geometry)
    return result


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


class _Forward:
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


class ConvTranspose1d(_Forward, nn.ConvTranspose1d):
    """``torch.nn.ConvTranspose1d`` running on onednn_convt (see the module docstring)."""

    _rank = 1


class ConvTranspose2d(_Forward, nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` running on onednn_convt (see the module docstring)."""

    _rank = 2


class ConvTranspose3d(_Forward, nn.ConvTranspose3d):
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

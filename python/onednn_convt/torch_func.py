"""torch.func support for :mod:`onednn_convt.torch`: batching rules (``torch.vmap``) and
forward-mode derivatives (``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``)
of the three ops, written as calls of the ops themselves.

With CT the forward, BD ConvTransposeBackwardData and BW ConvTransposeBackwardWeights, each
op is bilinear in its two tensors, so its tangent is the op on each input's tangent in turn:

- d CT(x, w) + b = CT(dx, w) + CT(x, dw) + db
- d BD(g, w) = BD(dg, w) + BD(g, dw)
- d BW(x, g) = BW(dx, g) + BW(x, dg)

A vmapped dim (size B) goes into the batch, N, where the weights are the same for every
sample; where they differ it goes into the groups: B problems of ``groups`` groups side by
side are one problem of ``B * groups`` groups, the activations' channels laid out (B, C) and
the weights (B * C_in, C_out/groups, k...). Imported by :mod:`onednn_convt.torch` only.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from torch import Tensor

from .torch_run import Geometry

#: ``in_dims``/``out_dims`` entries: the vmapped dim of a tensor, or None where it has none
Dim = Optional[int]


class Calls(Protocol):
    """The three ops on tensors of one :class:`Geometry` (``calls.geometry``), and a way to
    get the same calls for another one (the batching rules change the groups)."""

    geometry: Geometry

    def ct(self, x: Tensor, w: Tensor, bias: Optional[Tensor] = None) -> Tensor: ...

    def bd(self, g: Tensor, w: Tensor) -> Tensor: ...

    def bw(self, x: Tensor, g: Tensor, shape: Sequence[int]) -> Tensor: ...

    def with_geometry(self, geometry: Geometry) -> "Calls": ...


def _plus(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    return b if a is None else a if b is None else a + b


def forward_tangent(calls: Calls, src: Tensor, weight: Tensor, dst_shape: Sequence[int], d_src: Optional[Tensor],
                    d_weight: Optional[Tensor], d_bias: Optional[Tensor]) -> Optional[Tensor]:
    """The tangent of dst = CT(src, weight) + bias, of ``dst_shape``; None where no input
    has one."""
    out = _plus(None if d_src is None else calls.ct(d_src, weight),
                None if d_weight is None else calls.ct(src, d_weight))
    if d_bias is not None:
        bias = d_bias.view(-1, *(1,) * calls.geometry.rank)
        out = bias.expand(*dst_shape) if out is None else out + bias
    return out


def backward_data_tangent(calls: Calls, diff_dst: Tensor, weight: Tensor, d_diff_dst: Optional[Tensor],
                          d_weight: Optional[Tensor]) -> Optional[Tensor]:
    """The tangent of diff_src = BD(diff_dst, weight)."""
    return _plus(None if d_diff_dst is None else calls.bd(d_diff_dst, weight),
                 None if d_weight is None else calls.bd(diff_dst, d_weight))


def backward_weights_tangent(calls: Calls, src: Tensor, diff_dst: Tensor, shape: Sequence[int],
                             d_src: Optional[Tensor], d_diff_dst: Optional[Tensor]) -> Optional[Tensor]:
    """The tangent of diff_weights = BW(src, diff_dst), of ``shape``."""
    return _plus(None if d_src is None else calls.bw(d_src, diff_dst, shape),
                 None if d_diff_dst is None else calls.bw(src, d_diff_dst, shape))


def _split(t: Tensor, dim: int, size: int) -> Tensor:
    """``t`` with dim ``dim`` split into (size, the rest): the vmapped dim taken out again."""
    return t.reshape(*t.shape[:dim], size, -1, *t.shape[dim + 1:])


def _into_batch(t: Tensor, dim: int) -> Tensor:
    """(N, C, X...) vmapped at ``dim``, as (B * N, C, X...)."""
    return t.movedim(dim, 0).flatten(0, 1)


def _into_channels(t: Tensor, dim: Dim, size: int) -> Tensor:
    """(N, C, X...) vmapped at ``dim`` (or the same for all ``size`` samples where None), as
    (N, B * C, X...), the channels laid out (B, C)."""
    if dim is None:
        t = t.unsqueeze(1).expand(t.shape[0], size, *t.shape[1:])
    else:
        t = t.movedim(dim, 1)
    return t.flatten(1, 2)


def _weights_into_groups(w: Tensor, dim: int) -> Tensor:
    """Weights (C_in, C_out/groups, k...) vmapped at ``dim``, as (B * C_in, C_out/groups, k...)."""
    return w.movedim(dim, 0).flatten(0, 1)


def _grouped(calls: Calls, size: int) -> Calls:
    return calls.with_geometry(calls.geometry.with_groups(calls.geometry.groups * size))


def forward_vmap(calls: Calls, size: int, in_dims: Sequence[Dim], src: Tensor, weight: Tensor,
                 bias: Optional[Tensor]) -> tuple[Tensor, Dim]:
    """dst = CT(src, weight) + bias over ``size`` samples: the result and its vmapped dim."""
    sd, wd, bd = in_dims[:3]
    rank = calls.geometry.rank
    if wd is None:
        if sd is None:
            out = calls.ct(src, weight, bias if bd is None else None)
        else:
            out = calls.ct(_into_batch(src, sd), weight, bias if bd is None else None)
            out = _split(out, 0, size)
        if bias is not None and bd is not None:
            b = bias.movedim(bd, 0).reshape(size, 1, -1, *(1,) * rank)
            out = (out if sd is not None else out.unsqueeze(0)) + b
            return out, 0
        return out, (0 if sd is not None else None)
    x = _into_channels(src, sd, size)
    w = _weights_into_groups(weight, wd)
    grouped_bias = None
    if bias is not None:
        grouped_bias = bias.movedim(bd, 0).flatten() if bd is not None else bias.repeat(size)
    out = _grouped(calls, size).ct(x, w, grouped_bias)
    return _split(out, 1, size), 1


def backward_data_vmap(calls: Calls, size: int, in_dims: Sequence[Dim], diff_dst: Tensor,
                       weight: Tensor) -> tuple[Tensor, Dim]:
    """diff_src = BD(diff_dst, weight) over ``size`` samples."""
    gd, wd = in_dims[:2]
    if wd is None:
        if gd is None:
            return calls.bd(diff_dst, weight), None
        out = calls.bd(_into_batch(diff_dst, gd), weight)
        return _split(out, 0, size), 0
    out = _grouped(calls, size).bd(_into_channels(diff_dst, gd, size), _weights_into_groups(weight, wd))
    return _split(out, 1, size), 1


def backward_weights_vmap(calls: Calls, size: int, in_dims: Sequence[Dim], src: Tensor, diff_dst: Tensor,
                          shape: Sequence[int]) -> tuple[Tensor, Dim]:
    """diff_weights = BW(src, diff_dst), of ``shape``, over ``size`` samples: each sample's
    weights are their own group(s)."""
    sd, gd = in_dims[:2]
    out = _grouped(calls, size).bw(_into_channels(src, sd, size), _into_channels(diff_dst, gd, size),
                                   (size * shape[0], *shape[1:]))
    return _split(out, 0, size), 0

"""An NCX call computed in NXC: its activations reordered to channels-last, the NXC
problem's library op, its result reordered back.

oneDNN 3.2's kernels for a plain NCX tensor are its blocked ones (``nCw16c`` and the like,
with the library's own reorders around them) or, for some shapes, slow: HiFi-GAN's
16x64x4096 k4 s2 1-D up-sampler's BackwardData took 13 ms in NCX (Convolution) against 2.2 ms
for the same op in NXC (``brgconv``) on an AMD Zen5, where the two reorders (oneDNN's
``Reorder`` over the thread pool, :mod:`.permute`) cost about 0.8 and 1.1 ms. Handing the
library the NCX memory as an NXC tensor with permuted strides is no faster: it reorders the
strided tensor inside the partition, slowly (13.5 ms).

The lowering (:data:`onednn_convt.lowering.base.CHANNELS_LAST`) wraps a library-op lowering
of the NXC problem: one the rules choose among those that are a single library op on the
arrays (no polyphase, no MatMul with a finishing step), whose own preparation (a weights
flip, a guard's copy) runs on the reordered arrays. The weights keep their format; the
bias, and a host bias, their meaning (the library's result is NXC). Its speed is the
autotuner's to measure against the others (:mod:`.autotune`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import shapes
from ..problem import BACKWARD_WEIGHTS, Problem
from . import base, permute
from .base import Lowering


def applies(p: Problem) -> bool:
    """Whether ``p`` has a channels-last form: NCX activations."""
    return p.data_format == "NCX"


def to_nxc(shape: Sequence[int]) -> tuple[int, ...]:
    """An NCX shape (N, C, X...) as NXC (N, X..., C)."""
    return shapes.join_activation(*shapes.split_activation(shape, "NCX"), "NXC")


def _axes_to_nxc(ndim: int) -> tuple[int, ...]:
    return (0, *range(2, ndim), 1)


def _axes_to_ncx(ndim: int) -> tuple[int, ...]:
    return (0, ndim - 1, *range(1, ndim - 1))


def activations(p: Problem) -> tuple[int, ...]:
    """The positions of ``p``'s activation inputs (src, diff_dst) among the call's inputs."""
    return (0, 1) if p.op == BACKWARD_WEIGHTS else (0,)


def nxc_problem(p: Problem) -> Problem:
    """``p`` with NXC activations (the same weights, in their format)."""
    moved = activations(p)
    inputs = tuple(to_nxc(s) if i in moved else s for i, s in enumerate(p.input_shapes))
    out = p.out_shape if p.op == BACKWARD_WEIGHTS else to_nxc(p.out_shape)
    return replace(p, data_format="NXC", input_shapes=inputs, out_shape=out)


def build(p: Problem, inner: Lowering) -> Lowering:
    """The channels-last lowering of ``p`` (:func:`applies`) around ``inner``, a lowering of
    :func:`nxc_problem` that :func:`~onednn_convt.lowering.base.one_library_op` accepts,
    or one made of phases (:data:`~onednn_convt.lowering.base.DEPTH_TAPS_CHANNELS_LAST`),
    whose plan runs them on the reordered arrays (:class:`onednn_convt.plan.PhasedPlan`)."""
    assert applies(p) and (base.one_library_op(inner) or inner.phases), (p.data_format, inner.name)
    moved = activations(p)
    at = [j for j, i in enumerate(inner.inputs) if i in moved]  # the activations among the library's inputs
    copied = [p.input_shapes[inner.inputs[j]] for j in at]
    before = inner.prepare

    def reorder(args: list[np.ndarray]) -> list[np.ndarray]:
        args = list(args)
        for j in at:
            a = args[j]
            args[j] = permute.permuted(a, a.shape, _axes_to_nxc(a.ndim))
        return before(args) if before is not None else args

    finish: Optional[Callable[[np.ndarray, Sequence[Any]], np.ndarray]] = None
    library_shape: tuple[int, ...] = ()
    finish_elems = 0
    if p.op != BACKWARD_WEIGHTS:  # the result is an activation: reordered back to NCX
        library_shape = inner.out_shape

        def finish(result: np.ndarray, arrays: Sequence[Any]) -> np.ndarray:
            return permute.permuted(result, result.shape, _axes_to_ncx(result.ndim))

        finish_elems = math.prod(p.out_shape)  # that copy

    exact = None if inner.exact is None else build(p, inner.exact)
    return replace(
        inner, out_shape=p.out_shape, prepare=reorder, finish=finish, library_shape=library_shape,
        prepared_elems=inner.prepared_elems + sum(math.prod(s) for s in copied), finish_elems=finish_elems, exact=exact,
        name=base.CHANNELS_LAST,
    )

"""Ops whose weights stay fixed across calls: the library reorders them once, not per call.

oneDNN's kernels read weights in blocked layouts of their own, so a call with plain weights
starts by reordering them: on the DCGAN layer 512->256 4x4 (weights 8 MB in f32) that reorder
takes 1.2 of the call's 6.4 ms. ``op.with_constant_weights(weights)`` returns a
:class:`ConstantWeights`, a callable that keeps a private read-only copy of the weights and
compiles its partitions with the weights input marked constant (graph API constant
tensors). Its first call for each input signature reorders the weights into the library's
constant tensor cache; later calls skip the reorder. For inference, or any loop where the
weights do not change between calls.

Each compiled signature holds its own reordered copy of the weights (up to 16 signatures per
object, as for any op). They are freed with the object. To use other weights, make another
object: the copy taken here means later changes to the caller's array have no effect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from . import dtypes, interop, limits

if TYPE_CHECKING:
    from .op_base import WeightsOp


class ConstantWeights:
    """An op with its weights bound: call it with the op's other inputs.

    Made by :meth:`ConvTranspose.with_constant_weights` (call as ``f(src, bias=None,
    out=None)``) and :meth:`ConvTransposeBackwardData.with_constant_weights` (call as
    ``f(diff_dst, out=None)``). Inputs, layouts, dtypes and results are those of the op;
    src and bias must have the weights' dtype.

    Attributes:
        op: a private copy of the op (same attributes), compiled with constant weights.
        weights: the bound weights, a read-only C-contiguous copy of those given.
    """

    def __init__(self, op: WeightsOp, weights: ArrayLike) -> None:
        name = f"{op.op_name}.with_constant_weights"
        w = op._as_array("weights", weights)
        if dtypes.code_of(w.dtype) is None:
            msg = f"{name}: argument 'weights' expected dtype {dtypes.expected_names()}, got {w.dtype}"
            raise TypeError(msg)
        op._check_rank("weights", w)
        limit = limits.memory_limit()
        if limit is not None and w.nbytes > limit:  # a huge broadcast view: its copy would not fit
            msg = (f"{name}: copying the weights {w.shape} takes {limits.format_bytes(w.nbytes)}, over the "
                   f"memory limit of {limits.format_bytes(limit)} (onednn_convt.set_memory_limit)")
            raise MemoryError(msg)
        try:
            copy = np.empty(w.shape, w.dtype)  # C-contiguous and aligned: the fast path takes it
        except MemoryError:
            msg = f"{name}: copying the weights {w.shape} takes {limits.format_bytes(w.nbytes)}: out of memory"
            raise MemoryError(msg) from None
        copy[...] = w
        copy.flags.writeable = False
        private = object.__new__(type(op))
        private.__dict__.update(op.__getstate__())  # the attributes, no compiled plans
        private._constant_weights = True
        self.op = private
        self.weights = copy
        self._others = tuple(n for n in op.input_names if n != "weights")

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        """Run the op on ``inputs`` (the op's inputs without the weights, in its order).

        Returns:
            the op's result (dst or diff_src), in the inputs' dtype.
        """
        names = self._others
        if not 1 <= len(inputs) <= len(names):
            msg = (
                f"{self.op.op_name} with constant weights: expected the inputs {', '.join(names)} "
                f"(the weights are bound), got {len(inputs)} arguments"
            )
            raise TypeError(msg)
        given = inputs + (None,) * (len(names) - len(inputs))
        if interop.foreign(given, out):  # torch or DLPack: NumPy views, then back
            arrays, out_array, wrap = interop.adapt(self.op.op_name, names, given, out)
            return wrap(self(*arrays, out=out_array))
        return self.op._call((given[0], self.weights, *given[1:]), out)

    @property
    def lowering(self) -> str | None:
        """How the last call ran (see the op's ``lowering``)."""
        return self.op.lowering

    def __repr__(self) -> str:
        w = self.weights
        return f"{self.op!r}.with_constant_weights(<{w.dtype} array {w.shape}>)"

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.weights.flags.writeable = False

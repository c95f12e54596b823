"""Running the three ops on CPU torch tensors, for :mod:`onednn_convt.torch`.

A call's *signature* is the op class, its :class:`Geometry`, and for each tensor its shape,
strides, dtype and negation bit. The first call of a signature takes the op's own path: the
tensors as NumPy views of their memory (channels_last ones as NXC), the op's checks,
planning and compile, and its messages. Where the plan it made has a C++ executor (the
library op reads the arrays as given and writes a dense result: see ``plan.Plan``), the
signature keeps that executor, and its next calls allocate the result with torch and run the
executor on the tensors' addresses (``data_ptr()``): no NumPy views, no Python checks past
the signature. A signature whose plan has no executor (a polyphase or finishing lowering)
takes the op's path every time; so does a guarded bf16/f16 call whose result holds an Inf
or NaN (the op redoes it in f32).

Imported by :mod:`onednn_convt.torch` only: it imports torch.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any, Optional, Sequence, Union

import torch
from torch import Tensor

from . import interop, limits, native
from .ops import ConvTransposeBackwardWeights

IntOrTuple = Union[int, Sequence[int]]


def _tuple(name: str, value: IntOrTuple, rank: int, fn: str, least: int) -> tuple[int, ...]:
    """``value`` (an int, or one per spatial dim) as ``rank`` ints of at least ``least``."""
    if _is_int(value):
        values: tuple[Any, ...] = (value,) * rank
    elif isinstance(value, (tuple, list, torch.Size)):
        values = tuple(value)
    else:
        msg = f"{fn}: argument '{name}' expected an int or a tuple of {rank} ints, got {type(value).__name__}"
        raise TypeError(msg)
    if not all(_is_int(v) for v in values):
        msg = f"{fn}: argument '{name}' expected ints, got {value!r}"
        raise TypeError(msg)
    if len(values) != rank:
        msg = f"{fn}: argument '{name}' expected an int or {rank} ints, got {value!r}"
        raise ValueError(msg)
    if any(v < least for v in values):
        bound = "positive" if least == 1 else "non-negative"
        msg = f"{fn}: argument '{name}' expected {bound} values, got {value!r}"
        raise ValueError(msg)
    return tuple(int(v) for v in values)


def _is_int(v: Any) -> bool:
    """An integer (a NumPy one too), not a bool (NumPy's bool is no Integral)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class Geometry:
    """The attributes of one call, as the ops take them; equal (and hashed) by value, so
    that the op cache and the executors' signatures find it whoever built it."""

    __slots__ = ("rank", "strides", "pads", "output_padding", "dilations", "groups", "pads_end", "op_output_padding",
                 "_key", "_hash")

    def __init__(self, rank: int, stride: IntOrTuple, padding: IntOrTuple, output_padding: IntOrTuple,
                 groups: int, dilation: IntOrTuple, fn: str) -> None:
        self.rank = rank
        self.strides = _tuple("stride", stride, rank, fn, 1)
        self.pads = _tuple("padding", padding, rank, fn, 0)
        self.output_padding = _tuple("output_padding", output_padding, rank, fn, 0)
        self.dilations = _tuple("dilation", dilation, rank, fn, 1)
        if not _is_int(groups):
            msg = f"{fn}: argument 'groups' expected an int, got {type(groups).__name__}"
            raise TypeError(msg)
        if groups < 1:
            msg = f"{fn}: argument 'groups' expected a positive int, got {groups}"
            raise ValueError(msg)
        self.groups = int(groups)
        for o, s, d in zip(self.output_padding, self.strides, self.dilations):
            if not (o < s or o < d):  # torch's own rule
                msg = (
                    f"{fn}: argument 'output_padding' expected values smaller than either stride "
                    f"or dilation (as torch requires), got output_padding={self.output_padding}, "
                    f"stride={self.strides}, dilation={self.dilations}"
                )
                raise ValueError(msg)
        self.pads_end, self.op_output_padding = self._ends(fn)
        self._key = (self.strides, self.pads, self.output_padding, self.dilations, self.groups)
        self._hash = hash(self._key)

    def _ends(self, fn: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The op's pads_end and output_padding for torch's padding and output_padding.

        torch takes output_padding below the stride or the dilation; the op (the spec: D6)
        below the stride. An output position is the same sum of taps whichever of pads_end
        and output_padding made room for it, so where torch's output_padding reaches the
        stride the op gets it as less pads_end, and what the padding cannot give as
        output_padding: the same output, the same gradients."""
        ends, extra = [], []
        for p, o, s in zip(self.pads, self.output_padding, self.strides):
            take = 0 if o < s else min(o, p)
            ends.append(p - take)
            extra.append(o - take)
        past = [i for i, (o, s) in enumerate(zip(extra, self.strides)) if o >= s]
        if past:
            i = past[0]
            msg = (
                f"{fn}: output_padding={self.output_padding} with padding={self.pads}, stride={self.strides} "
                f"and dilation={self.dilations}: in spatial dim {i} it adds {extra[i]} positions past the "
                f"transposed convolution's full output, which oneDNN's ConvTranspose cannot give (at most "
                f"stride - 1 = {self.strides[i] - 1}); expected output_padding - padding below the stride there"
            )
            raise ValueError(msg)
        return tuple(ends), tuple(extra)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Geometry) and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def with_groups(self, groups: int) -> "Geometry":
        """The same attributes with ``groups`` groups (the batching rules of
        :mod:`onednn_convt.torch_func` fold a vmapped dim into the groups)."""
        return Geometry(self.rank, self.strides, self.pads, self.output_padding, groups, self.dilations,
                        "conv_transpose")

    def lists(self) -> tuple[list[int], list[int], list[int], int, list[int]]:
        """stride, padding, output_padding, groups, dilation: the custom ops' arguments."""
        return (list(self.strides), list(self.pads), list(self.output_padding), self.groups,
                list(self.dilations))

    def attrs(self, data_format: str) -> dict[str, Any]:
        """The op's attributes for activations in ``data_format`` and torch's weights (IOX)."""
        return dict(strides=self.strides, pads_begin=self.pads, pads_end=self.pads_end,
                    dilations=self.dilations, output_padding=self.op_output_padding,
                    groups=self.groups, data_format=data_format, weights_format="IOX")


#: :class:`Geometry` of hashable arguments, built once (a list argument raises TypeError);
#: typed, so that stride=2.0 or True is not the cached Geometry of 2 or 1 (they equal them)
#: but reaches the checks
cached_geometry = functools.lru_cache(maxsize=256, typed=True)(Geometry)


@functools.lru_cache(maxsize=256)
def _op(cls: Any, geometry: Geometry, data_format: str, extra: tuple[tuple[str, Any], ...]) -> Any:
    """The op object for these attributes, shared by every call (it keeps the compiled plans).

    Not :func:`functional._op`: that one normalizes any user's attributes (lists, the types
    of values) on every call; these come from a Geometry, ints and tuples."""
    return cls(**geometry.attrs(data_format), **dict(extra))


def channels_last(t: Tensor, weight: Optional[Tensor] = None) -> bool:
    """Whether an op on t, (N, C, X...), runs channels-last (NXC over t's memory) and gives
    a channels-last result: t dense as (N, X..., C) and not as NCX; or dense both ways (all
    spatial sizes 1, or one channel), where torch's own layer decides by the strides: a
    channels-last result where t's strides, or those of ``weight`` (the layer's weights),
    look channels-last to torch (:func:`_strides_channels_last`). DCGAN's z (N, 100, 1, 1),
    made channels_last along with the model, so gives a channels-last result, as torch's
    layer does."""
    perm = (0, *range(2, t.dim()), 1)
    if not t.permute(perm).is_contiguous():
        return False
    if not t.is_contiguous():
        return True
    return _strides_channels_last(t) or (weight is not None and _strides_channels_last(weight))


def _strides_channels_last(t: Tensor) -> bool:
    """torch's reading of a 4-D or 5-D tensor's strides as channels-last (c10's
    is_channels_last_strides_2d/3d, which suggest_memory_format follows): walking C, then
    the spatial dims innermost first, then N, each stride at least the extent of the ones
    before it (a size-1 dim adds no extent), and N's not equal to C's where nothing lies
    between them."""
    if t.dim() not in (4, 5):
        return False
    sizes, strides = t.shape, t.stride()
    if strides[1] == 0:
        return False
    least = 0
    for d in (1, *range(t.dim() - 1, 1, -1), 0):
        if sizes[d] == 0 or strides[d] < least:
            return False
        if d == 0 and least == strides[1]:
            return False
        least = strides[d]
        if sizes[d] > 1:
            least *= sizes[d]
    return True


def _to_nxc(t: Tensor) -> Tensor:
    return t.permute(0, *range(2, t.dim()), 1)


def from_nxc(t: Tensor) -> Tensor:
    """(N, X..., C) viewed as (N, C, X...)."""
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def channels_last_format(rank: int) -> Optional[torch.memory_format]:
    """torch's channels-last memory format for tensors of ``rank`` spatial dims (None in 1-D,
    which has none: a channels-last 1-D tensor is a strided view)."""
    return {2: torch.channels_last, 3: torch.channels_last_3d}.get(rank)


def memory_format(rank: int) -> torch.memory_format:
    """The memory format that makes an activation of ``rank`` spatial dims channels-last
    (``torch.contiguous_format`` in 1-D, where a dense (N, C, L) is the closest)."""
    return channels_last_format(rank) or torch.contiguous_format


class _Fast:
    """A signature's executor and how to lay out its result."""

    __slots__ = ("executor", "shape", "strides", "relayout", "relayout_strides")

    def __init__(self, executor: Any, shape: tuple[int, ...], strides: tuple[int, ...],
                 relayout: Optional[torch.memory_format], relayout_strides: tuple[int, ...]) -> None:
        self.executor = executor
        # the result as torch sees it: (N, C, X...) with channels-last strides for an NXC call,
        # over the dense memory the executor writes; its dtype is the activation's
        self.shape = shape
        self.strides = strides
        # BackwardWeights: the second activation brought to the first's layout, and the strides
        # that gave (the executor was compiled for them)
        self.relayout = relayout
        self.relayout_strides = relayout_strides


#: signature -> its executor; None where its plan has none (the op's path every time)
_FAST: dict[Any, Optional[_Fast]] = {}
_FAST_SLOTS = 256
#: the fork generation (onednn_convt.native) of the executors in _FAST: a forked child's
#: were compiled for the parent's OpenMP threads, and its calls take the op's path again
_generation = native.fork_generation


def run(cls: Any, geometry: Geometry, activation: Tensor, second: Tensor, bias: Optional[Tensor] = None,
        weights_shape: Optional[tuple[int, ...]] = None) -> Tensor:
    """One op, laid out as ``activation`` is: a channels_last one runs as NXC over its own
    memory (N, X..., C), and an activation result comes back channels_last.

    ``second``: the weights (IOX, torch's layout) for ConvTranspose (which takes ``bias``
    too) and ConvTransposeBackwardData; for ConvTransposeBackwardWeights, diff_dst, brought
    to ``activation``'s layout, and ``weights_shape`` the result's shape."""
    key = (cls, geometry, weights_shape, activation.shape, activation.stride(), activation.dtype,
           activation.is_neg(), second.shape, second.stride(), second.dtype, second.is_neg(),
           None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.is_neg()))
    if _generation != native.fork_generation:
        _forget()
    fast = _FAST.get(key)
    if fast is not None and not limits.filling:
        if fast.relayout is not None:
            second = second.contiguous(memory_format=fast.relayout)
        if fast.relayout is None or second.stride() == fast.relayout_strides:
            out = activation.new_empty_strided(fast.shape, fast.strides)  # the activation's dtype, on the CPU
            pointers = [activation.data_ptr(), second.data_ptr()]
            if bias is not None:
                pointers.append(bias.data_ptr())
            try:
                fast.executor.run_pointers(pointers, out.data_ptr())
            except native.SignatureMismatch:
                pass  # misaligned memory, or a guarded result to redo: the op's path below
            else:
                return out
    result, fast = _run_op(cls, geometry, activation, second, bias, weights_shape)
    if key not in _FAST or fast is not None:
        if len(_FAST) >= _FAST_SLOTS:
            try:  # drop the oldest; another thread may be doing the same
                del _FAST[next(iter(_FAST))]
            except (KeyError, RuntimeError, StopIteration):
                pass
        _FAST[key] = fast
    return result


def _forget() -> None:
    global _generation
    _FAST.clear()
    _generation = native.fork_generation


def _run_op(cls: Any, geometry: Geometry, activation: Tensor, second: Tensor, bias: Optional[Tensor],
            weights_shape: Optional[tuple[int, ...]]) -> tuple[Tensor, Optional[_Fast]]:
    """The call through the op (NumPy views of the tensors), and the signature's executor."""
    weights_grad = cls is ConvTransposeBackwardWeights
    nxc = channels_last(activation, None if weights_grad else second)
    relayout = None
    if weights_grad and nxc != channels_last(second):  # both activations in one layout
        relayout = memory_format(geometry.rank) if nxc else torch.contiguous_format
        second = second.contiguous(memory_format=relayout)
    args = [_to_nxc(activation) if nxc else activation, _to_nxc(second) if nxc and weights_grad else second, bias]
    extra = () if weights_shape is None else (("weights_shape", weights_shape),)
    op = _op(cls, geometry, "NXC" if nxc else "NCX", extra)
    arrays = [None if t is None else interop.to_numpy(op.op_name, name, t.detach())
              for name, t in zip(op.input_names, args)]
    array = op(*arrays)
    result: Tensor = interop.to_torch(array)
    if nxc and not weights_grad:
        result = from_nxc(result)
    executor = op.executor_for(arrays)
    fast = None
    # the executor writes its output dense: the result's memory where that is dense and as
    # large (a plan's pointer_executor writes it in the library's shape)
    if executor is not None and executor.dense_output and array.flags.c_contiguous and result.dtype == activation.dtype and \
            math.prod(executor.output_shape) == array.size and all(_same_memory(t, a) for t, a in zip(args, arrays)):
        strides = tuple(second.stride()) if relayout is not None else ()
        fast = _Fast(executor, tuple(result.shape), tuple(result.stride()), relayout, strides)
    return result, fast


def _same_memory(t: Optional[Tensor], a: Any) -> bool:
    """Whether the array the op took is ``t``'s memory as it is: the executor will be given
    ``t.data_ptr()`` where the plan had the array (a negated view is materialized first)."""
    if t is None or a is None:
        return t is None and a is None
    item = a.itemsize
    return bool(a.ctypes.data == t.data_ptr() and a.strides == tuple(s * item for s in t.stride())
                and not t.is_neg())

"""The description of one lowering: which library op runs a call, and on what."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from .. import dtypes, guards


@dataclass
class Lowering:
    """How one call maps onto a library op.

    Attributes:
        kind: library op kind that runs (``"ConvolutionBackwardData"``, ``"Convolution"``,
            ``"ConvTranspose"`` or ``"MatMul"`` for the forward; ``"Convolution"``,
            ``"ConvTransposeBackwardData"`` or ``"MatMul"`` for BackwardData, spec D9;
            ``"ConvTransposeBackwardWeights"``, ``"ConvolutionBackwardWeights"`` or
            ``"MatMul"`` for BackwardWeights). Which one runs a problem, and why:
            :mod:`onednn_convt.lowering.rules`.
        attrs: library attributes, fully resolved (explicit pads, auto_pad ``"None"``).
        inputs: indices of the call's inputs passed to the library, in its order.
        out_shape: shape of the result.
        prepare: optional; turns those inputs into the library's inputs (views or copies).
        finish: optional; turns the library's output (of ``library_shape``) and the call's
            inputs into the result, in f32 (rounded afterwards) or, when it only reshapes
            the library's output, in the call's dtype.
        library_shape: shape of the library's output where it differs from ``out_shape``
            (always with ``finish``). Without ``finish`` the library writes the result
            itself, C-contiguous, in this shape: a reshape of ``out_shape``.
        prepared_elems: elements ``prepare`` allocates (copies it makes; the memory estimate
            counts them in the compute dtype).
        finish_elems: elements ``finish`` allocates besides the library's output (the memory
            estimate counts them as f32); 0 for a finish that returns a view of it (then,
            without ``out=``, the library's output is the result). None: the bound of the
            1-D MatMul forward's finish (the library's output widened to f32, a padded sum,
            the crop and a transpose: three results and the output).
        weights_arg: position, among the library's inputs, of the weights (or of the array
            made from the weights alone); None for an op without a weights input. Ops with
            constant weights mark that input constant (:mod:`onednn_convt.constant_weights`).
        f32_only: compute bf16/f16 in f32 even where the CPU has native kernels, because
            the library's are wrong on this problem
            (:func:`onednn_convt.lowering.weights.backward_weights_needs_f32`).
        guard: the name of the guard (:mod:`onednn_convt.guards`) that chose this lowering
            to keep the problem away from a known-bad kernel, else None.
        exact: optional; the lowering that recomputes a native bf16/f16 call in f32 when its
            result holds an Inf or NaN (see ``_Plan._guarded``), where this one cannot
            (zero-padded taps turn an Inf input into NaN). None: this lowering.
        name: the candidate's name among the problem's lowerings (:mod:`onednn_convt.lowering`),
            e.g. ``"Convolution (flipped weights)"``; the kind when not set.
        single_thread: compile the library op for one thread (a problem too small to gain
            from the thread pool: :func:`onednn_convt.lowering.rules.single_threaded`).
        bias_stage: the library op runs without the bias (the last library input); a second
            partition adds it in dst (the guard
            :data:`onednn_convt.guards.STRIDED_DECONVOLUTION_EPILOGUE`).
        host_bias: the library op runs without the bias (the last library input), which the
            core adds to its f32 result along this axis after each run (a small problem:
            :func:`onednn_convt.lowering.forward.bias_apart`); None: no such bias.
        phases: the ops of a lowering made of several, run in turn: a polyphase one's
            stride-1 ops (:mod:`.polyphase`), a per-group one's groups (:mod:`.per_group`),
            the depth taps' 2-D ops (:mod:`.depth_taps`); empty for every other lowering.
        unit_views: ``prepare`` only inserts axes of size 1 (a lifted 1-D call,
            :mod:`.lifted`): the library's inputs and output are the call's memory, and the
            C++ executor takes the call's arrays as they are.
    """

    kind: str
    attrs: dict[str, Any]
    inputs: tuple[int, ...]
    out_shape: tuple[int, ...]
    prepare: Optional[Callable[[list[np.ndarray]], list[np.ndarray]]] = None
    finish: Optional[Callable[[np.ndarray, Sequence[Any]], np.ndarray]] = None
    library_shape: tuple[int, ...] = ()
    prepared_elems: int = 0
    finish_elems: Optional[int] = None
    weights_arg: Optional[int] = None
    f32_only: bool = False
    guard: Optional[str] = None
    exact: Optional[Lowering] = None
    name: str = ""
    single_thread: bool = False
    bias_stage: bool = False
    host_bias: Optional[int] = None
    phases: tuple[Phase, ...] = ()
    unit_views: bool = False

    @property
    def library_out_shape(self) -> tuple[int, ...]:
        """The shape of the library's output (``library_shape`` if set, else ``out_shape``)."""
        return self.library_shape or self.out_shape

    def library_args(self, arrays: Sequence[Any], emulated: bool) -> list[np.ndarray]:
        """The arrays handed to the library (emulated: f32 copies of the inputs first)."""
        args = [arrays[i] for i in self.inputs]
        if emulated:
            args = [dtypes.to_f32(a) for a in args]
        return self.prepare(args) if self.prepare is not None else args


def one_library_op(inner: Lowering) -> bool:
    """Whether ``inner`` can run inside a wrapping lowering (:mod:`.channels_last`,
    :mod:`.lifted`), which hands the library views or copies of the call's arrays and takes
    its result as written: a single library op on the arrays, which writes its problem's
    result itself, and so is its f32 redo (``exact``) if it has one."""
    return (not inner.phases and inner.finish is None and not inner.library_shape
            and (inner.exact is None or one_library_op(inner.exact)))


def parts_native(dtype: str) -> bool:
    """Whether a lowering of several library ops on views (polyphase, per group) runs in
    ``dtype`` itself here: f32, or bf16 where the CPU has native bf16 kernels (each part
    would convert its inputs to f32 otherwise)."""
    return dtype == "f32" or (dtype == "bf16" and guards.dispatch_isa() in guards.BF16_NATIVE)


@dataclass(frozen=True)
class View:
    """A view of an array that slices alone cannot say: basic indexing (integers drop their
    axes), then optionally the axes in another order (``np.transpose``). Always a view: no
    copy, so a result's view is written in place.

    Attributes:
        index: the index (slices and integers).
        axes: the order of the indexed view's axes (None: as they are).
        merged: index the array with its first two axes taken as one (an NXC activation's
            samples and depth planes, :mod:`.depth_taps`): a view where the array's strides
            allow it (:func:`merges`), else, for an array that is only read, a copy. A
            result's window is never a copy: :func:`onednn_convt.plan.plan_for` runs a call
            whose ``out=`` does not merge into a fresh result and copies that.
    """

    index: tuple[Union[slice, int], ...]
    axes: Optional[tuple[int, ...]] = None
    merged: bool = False


#: how a phase takes a part of an array: the index of its view (``()``: all of it), or a
#: :class:`View`
Window = Union[tuple[slice, ...], View]


def merges(a: np.ndarray) -> bool:
    """Whether ``a``'s first two axes are one axis in memory (a reshape to one is a view)."""
    n, d = a.shape[:2]
    return bool(n == 1 or d == 1 or a.strides[0] == d * a.strides[1])


def window(a: np.ndarray, w: Window) -> np.ndarray:
    """The part ``w`` of ``a`` (a view; a copy of an array whose first two axes do not
    merge, for a :class:`View` that merges them)."""
    if isinstance(w, View):
        if w.merged:
            a = a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])
        v = a[w.index]
        return v if w.axes is None else v.transpose(w.axes)
    return a[w] if w else a


@dataclass(frozen=True)
class Phase:
    """One op of a lowering made of several (a polyphase lowering's stride-1 op,
    :mod:`onednn_convt.lowering.polyphase`; a group, a depth tap's 2-D op).

    Attributes:
        lowering: the op's own lowering (its part's problem's); None: the phase holds
            the bias, or zeros, alone (``fill``).
        inputs: for each input of that problem, in its order: (index of the call's input,
            the :data:`Window` of it the op reads).
        out: the :data:`Window` of the result the op writes.
        fill: where the result is filled first (a forward's bias, or zeros; None: nowhere).
        accumulate: add the op's result to its window of the result instead of writing it
            (polyphase BackwardData's phases after the first; the depth taps' parts that
            another part wrote first).
        zero: with ``accumulate``, the indices along the first axis of the op's result
            zeroed before it is added: the depth taps' merged batches, whose planes there
            met a neighbouring sample's planes (:mod:`.depth_taps`).
    """

    lowering: Optional[Lowering]
    inputs: tuple[tuple[int, Window], ...]
    out: Window
    fill: Optional[Window]
    accumulate: bool = False
    zero: tuple[int, ...] = ()

    def args(self, arrays: Sequence[Any]) -> list[Any]:
        """The op's inputs: its windows of the call's ``arrays``."""
        return [window(arrays[i], w) for i, w in self.inputs]


# -- library op kinds (Lowering.kind) ---------------------------------------------------
CONVOLUTION = "Convolution"
CONVOLUTION_BACKWARD_DATA = "ConvolutionBackwardData"
CONVOLUTION_BACKWARD_WEIGHTS = "ConvolutionBackwardWeights"
CONV_TRANSPOSE = "ConvTranspose"
CONV_TRANSPOSE_BACKWARD_DATA = "ConvTransposeBackwardData"
CONV_TRANSPOSE_BACKWARD_WEIGHTS = "ConvTransposeBackwardWeights"
MATMUL = "MatMul"

# -- candidate names (Lowering.name) that are more than their kind ------------------------
FLIPPED_CONVOLUTION = "Convolution (flipped weights)"
OVERLAP_ADD = "MatMul (overlap-add)"
FRAMES = "MatMul (frames)"
TILES = "MatMul (tiles)"
#: a 2-D/3-D forward with few output channels as a MatMul into columns and their sum (:mod:`.matmul_columns`)
COLUMNS = "MatMul (columns)"
SUBSAMPLED = "Convolution (subsampled)"
ZERO_PADDED_TAPS = "Convolution (zero-padded taps)"
POLYPHASE = "Polyphase"
#: a grouped call as one ungrouped op per group (:mod:`.per_group`)
PER_GROUP = "Per group"
#: an NCX call run as its NXC problem between reorders (:mod:`.channels_last`)
CHANNELS_LAST = "Channels-last"
#: a 1-D call run as its 2-D problem of height 1 (:mod:`.lifted`)
LIFTED = "Lifted to 2-D"
#: BackwardData with few diff_dst channels as a stride-1 op over diff_dst's blocks along its
#: last spatial dim (:mod:`.space_to_depth`)
SPACE_TO_DEPTH = "Space-to-depth"
#: a 3-D depthwise call as 2-D ones, one per depth tap (:mod:`.depth_taps`)
DEPTH_TAPS = "Depth taps"
#: an NCX 3-D depthwise call as the depth taps of its NXC problem, between reorders of the
#: activations (:func:`.depth_taps.applies_channels_last`)
DEPTH_TAPS_CHANNELS_LAST = "Channels-last depth taps"

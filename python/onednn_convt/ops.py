"""The op classes: ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights.

Each class gives the spec of its op: its inputs, the checks of their shapes against the
attributes, and the :class:`~onednn_convt.problem.Problem` a call is; the call path they
share is :class:`onednn_convt.op_base.Op`'s.

Layouts: activations are NXC (default) or NCX by ``data_format``; weights are XOI
(default) = (X..., OC/groups, IC) or IOX = (IC, OC/groups, X...) by ``weights_format``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence, overload

import numpy as np
from numpy.typing import ArrayLike

from . import dtypes, fused_plan, fusion, layouts, lowering, schema, shapes
from .problem import Problem
from .constant_weights import ConstantWeights
from .interop import Array
from .post_ops import Dequantize, PostOp, Quantize
from .schema import IntList

from .op_base import Op, WeightsOp


_ATTR_DOC = """
    Attributes (keyword-only; library names and spellings, spec.md D1-D6):
        strides, pads_begin, pads_end, dilations: one int (every spatial dim) or one per
            spatial dim; defaults 1, 0, 0, 1. Pads are cropped from dst (forward view).
        auto_pad: "None" (default), "SAME_UPPER", "SAME_LOWER" or "VALID", any case. When
            set, pads come from (kernel, dilation, stride) as for the forward op (D8).
        groups: int >= 1, default 1.
        data_format: "NXC" (default) or "NCX", for the activation tensors (D12).
        weights_format: "XOI" (default) = (X..., OC/groups, IC) or IOX = (IC, OC/groups, X...).
        output_padding: extra elements at the end of dst, 0 <= value < stride.
        strict: raise UnsupportedError instead of computing a low-precision dtype in f32
            where the CPU has no native kernel (D10).
"""


class ConvTranspose(WeightsOp):
    __doc__ = (
        """Transposed convolution: dst = ConvTranspose(src, weights) [+ bias].

    Per spatial dim, dst = stride*(src-1) + dilation*(k-1)+1 - pads_begin - pads_end +
    output_padding; dst has OC = O*groups channels.
"""
        + _ATTR_DOC
    )

    op_name = "ConvTranspose"
    input_names: tuple[str, ...] = ("src", "weights", "bias")
    output_name = "dst"
    #: dtype code -> whether the library compiles fused graphs natively in it here
    _NATIVE_FUSED: ClassVar[dict[str, bool]] = {}

    def __init__(
        self, *, strides: IntList = 1, pads_begin: IntList = 0, pads_end: IntList = 0,
        dilations: IntList = 1, auto_pad: str = "None", output_padding: IntList = 0,
        groups: int = 1, data_format: str = "NXC", weights_format: str = "XOI", strict: bool = False,
        post_ops: Optional[Sequence[PostOp | str]] = None,
        src_dequantize: Optional[Dequantize] = None, weights_dequantize: Optional[Dequantize] = None,
        dst_quantize: Optional[Quantize] = None,
    ) -> None:
        super().__init__(
            dict(strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                 auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                 data_format=data_format, weights_format=weights_format),
            strict,
        )
        self.fusion = fusion.make_fusion(self.op_name, post_ops, src_dequantize, weights_dequantize, dst_quantize)
        if self.fusion is not None:
            self.input_names = self.fusion.input_names()
        self._plain_op: Optional[ConvTranspose] = None

    def __repr__(self) -> str:
        text = super().__repr__()
        f = self.fusion
        if f is None:
            return text
        extra = [f"post_ops={list(f.post_ops)!r}"] if f.post_ops else []
        for name in ("src_dequantize", "weights_dequantize", "dst_quantize"):
            if getattr(f, name) is not None:
                extra.append(f"{name}={getattr(f, name)!r}")
        return text[:-1] + ", " + ", ".join(extra) + ")"

    @overload
    def __call__(self, src: Array, weights: Array, bias: Optional[Array] = None, *post_inputs: Array,
                 out: Optional[Array] = None) -> Array: ...
    @overload
    def __call__(self, src: ArrayLike, weights: ArrayLike, bias: Optional[ArrayLike] = None,
                 *post_inputs: ArrayLike, out: Optional[np.ndarray] = None) -> np.ndarray: ...
    def __call__(self, src: Any, weights: Any, bias: Any = None, *post_inputs: Any, out: Any = None) -> Any:
        """Run the op.

        Args:
            src: (N, IC, X...) for NCX or (N, X..., IC) for NXC.
            weights: (IC, OC/groups, X...) for IOX or (X..., OC/groups, IC) for XOI.
            bias: optional, shape (OC,).
            *post_inputs: the second tensor of each binary post-op (Add, Multiply, ...), in
                chain order; each broadcasts NumPy-style to dst.
            out: optional array to write dst into (exact shape and dtype). It may be a
                binary post-op's own tensor of dst's shape and strides (a residual): the
                result then overwrites it, computed from its values before the call. For a
                fused Add in NXC f32 the library runs that in place, the fastest residual
                Add (docs/guide/fusion.md); elsewhere the tensor is read from a copy.

        Arrays are NumPy arrays, torch tensors or other DLPack producers (CPU memory), all
        of one type; the result has that type (see :mod:`onednn_convt.interop`).

        Returns:
            dst, (N, OC, X...) or (N, X..., OC), in the inputs' dtype (an int8 op: f32, or
            the dtype of ``dst_quantize``).
        """
        if post_inputs or self.fusion is not None:
            want = 0 if self.fusion is None else len(self.fusion.binary)
            if len(post_inputs) != want or any(x is None for x in post_inputs):
                names = ", ".join(self.input_names[3:]) or "none"
                msg = f"{self.op_name}: expected {want} post-op tensor(s) after the bias ({names}), got {len(post_inputs)}"
                raise TypeError(msg)
            return self._call((src, weights, bias, *post_inputs), out)
        return self._call((src, weights, bias), out)

    def with_constant_weights(self, weights: ArrayLike) -> ConstantWeights:
        if self.fusion is not None:
            msg = f"{self.op_name}: with_constant_weights is for ops without post-ops or quantization"
            raise ValueError(msg)
        return super().with_constant_weights(weights)

    def _make_plan(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> Any:
        if self.fusion is not None:
            return fused_plan.make_plan(self, arrays, out)
        return super()._make_plan(arrays, out)

    def _check_aliasing(self, arrays: Sequence[Any], out: np.ndarray) -> None:
        if self.fusion is None:
            return super()._check_aliasing(arrays, out)
        for name, a in zip(self.input_names, arrays):
            if a is None or not np.may_share_memory(a, out):
                continue
            if name.startswith("post_ops[") and fused_plan.is_whole(a, out):
                continue  # a binary post-op's tensor of dst's shape: the result overwrites it
            msg = f"{self.op_name}: argument 'out' shares memory with input '{name}'"
            if name.startswith("post_ops["):
                msg += " (out may be a post-op tensor itself, of dst's shape and strides, not part of one)"
            raise ValueError(msg)

    def _plain(self) -> ConvTranspose:
        """This op without post-ops or quantization (a fused call's unfused fallback)."""
        if self._plain_op is None:
            plain = ConvTranspose.__new__(ConvTranspose)
            Op.__init__(plain, dict(self.attrs), self.strict)
            plain.fusion, plain._plain_op = None, None
            self._plain_op = plain
        return self._plain_op

    def _convtranspose_attrs(self, src_shape: Sequence[int], w_shape: Sequence[int]) -> dict[str, Any]:
        """The library ConvTranspose's attributes for these (checked) shapes."""
        xs = shapes.split_activation(src_shape, self.attrs["data_format"])[2]
        kernel = shapes.split_weights(w_shape, self.attrs["weights_format"])[2]
        op = schema.per_dim(self.op_name, "output_padding", self.attrs["output_padding"], len(xs))
        return lowering.build(self._sized_problem(src_shape, w_shape, xs, kernel, tuple(op)), "ConvTranspose").attrs

    def _problem(self, arrays: Sequence[Any], code: str) -> Problem:
        src, w, bias = arrays[:3]
        a = self.attrs
        self._check_rank("src", src)
        self._check_rank("weights", w)
        read = [layouts.Read("src", src.shape, "in"), layouts.Read("weights", w.shape, "weights")]
        self._check_same_rank(*read)
        n, ic, xs = shapes.split_activation(src.shape, a["data_format"])
        i, o, kernel = shapes.split_weights(w.shape, a["weights_format"])
        g = a["groups"]
        self._check_channels(ic, i, o * g, o, "src", "dst", "weights", read)
        s = self._geometry(len(xs), kernel).strides
        op = schema.per_dim(self.op_name, "output_padding", a["output_padding"], len(xs))
        for dim, (p, st) in enumerate(zip(op, s)):
            if p >= st:
                msg = f"{self.op_name}: attribute 'output_padding' expected < stride, got {p} >= {st} in spatial dim {dim}"
                raise ValueError(msg)
        if bias is not None and (bias.ndim != 1 or bias.shape[0] != o * g):
            msg = f"{self.op_name}: argument 'bias' expected shape ({o * g},), got {bias.shape}"
            raise ValueError(msg)
        shapes_in = (src.shape, w.shape) + (() if bias is None else (bias.shape,))
        return self._sized_problem(src.shape, w.shape, xs, kernel, tuple(op), code, shapes_in)

    def _sized_problem(
        self, src_shape: Sequence[int], w_shape: Sequence[int], xs: tuple[int, ...], kernel: tuple[int, ...],
        op: tuple[int, ...], code: str = "", input_shapes: tuple[tuple[int, ...], ...] = (),
    ) -> Problem:
        """The Problem of a forward call whose ranks, channels and output_padding are checked."""
        a = self.attrs
        n, ic, _ = shapes.split_activation(src_shape, a["data_format"])
        _, o, _ = shapes.split_weights(w_shape, a["weights_format"])
        g = a["groups"]
        geometry = self._geometry(len(xs), kernel)
        ys = shapes.conv_transpose_output(xs, kernel, *geometry.astuple(), op)
        if min(ys) < 1:
            msg = f"{self.op_name}: dst spatial size would be {ys}; pads crop more than the output"
            raise ValueError(msg)
        return Problem(
            self.op_name, code, a["data_format"], a["weights_format"], g, n, ic, o * g, xs, tuple(ys), kernel,
            geometry, op, len(input_shapes) > 2, input_shapes or (tuple(src_shape), tuple(w_shape)),
            shapes.join_activation(n, o * g, ys, a["data_format"]),
        )


class ConvTransposeBackwardData(WeightsOp):
    __doc__ = (
        """Gradient of ConvTranspose with respect to src: diff_src from diff_dst and weights.

    Per spatial dim, diff_src = floor((diff_dst + pads_begin + pads_end - dilation*(k-1)-1) /
    stride) + 1. Runs as the library's Convolution op over the same weights memory, which
    handles dilations correctly (spec D9), or, without dilation in 1-D or NCX, as the
    library's ConvTransposeBackwardData, which is faster there (:mod:`onednn_convt.lowering.rules`).
    ``output_padding``, if given, is the forward's and is checked against the shapes only (D6).
"""
        + _ATTR_DOC
    )

    op_name = "ConvTransposeBackwardData"
    input_names = ("diff_dst", "weights")
    output_name = "diff_src"

    def __init__(
        self, *, strides: IntList = 1, pads_begin: IntList = 0, pads_end: IntList = 0,
        dilations: IntList = 1, auto_pad: str = "None", output_padding: Optional[IntList] = None,
        groups: int = 1, data_format: str = "NXC", weights_format: str = "XOI", strict: bool = False,
    ) -> None:
        super().__init__(
            dict(strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                 auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                 data_format=data_format, weights_format=weights_format),
            strict,
        )

    @overload
    def __call__(self, diff_dst: Array, weights: Array, *, out: Optional[Array] = None) -> Array: ...
    @overload
    def __call__(self, diff_dst: ArrayLike, weights: ArrayLike, *,
                 out: Optional[np.ndarray] = None) -> np.ndarray: ...
    def __call__(self, diff_dst: Any, weights: Any, *, out: Any = None) -> Any:
        """Run the op (arrays of any one type, as for :class:`ConvTranspose`).

        Args:
            diff_dst: (N, OC, X...) for NCX or (N, X..., OC) for NXC.
            weights: (IC, OC/groups, X...) for IOX or (X..., OC/groups, IC) for XOI.
            out: optional array to write diff_src into.

        Returns:
            diff_src, (N, IC, X...) or (N, X..., IC).
        """
        return self._call((diff_dst, weights), out)

    def _problem(self, arrays: Sequence[Any], code: str) -> Problem:
        dd, w = arrays
        a = self.attrs
        self._check_rank("diff_dst", dd)
        self._check_rank("weights", w)
        read = [layouts.Read("diff_dst", dd.shape, "out"), layouts.Read("weights", w.shape, "weights")]
        self._check_same_rank(*read)
        n, oc, ys = shapes.split_activation(dd.shape, a["data_format"])
        i, o, kernel = shapes.split_weights(w.shape, a["weights_format"])
        g = a["groups"]
        self._check_channels(i, i, oc, o, "diff_src", "diff_dst", "weights", read)
        geometry = self._geometry(len(ys), kernel)
        xs = shapes.backward_data_output(ys, kernel, *geometry.astuple())
        if min(xs) < 1:
            msg = f"{self.op_name}: diff_src spatial size would be {xs}; diff_dst {ys} is too small for the kernel and pads"
            raise ValueError(msg)
        self._check_forward_extent(xs, ys, kernel, geometry, "diff_src", "diff_dst")
        return Problem(
            self.op_name, code, a["data_format"], a["weights_format"], g, n, i, oc, tuple(xs), ys, kernel, geometry,
            (0,) * len(ys), False, (dd.shape, w.shape), shapes.join_activation(n, i, xs, a["data_format"]),
        )


class ConvTransposeBackwardWeights(Op):
    __doc__ = (
        """Gradient of ConvTranspose with respect to weights: diff_weights from src and diff_dst.

    The diff_weights shape, in ``weights_format`` order, comes from the ``weights_shape``
    input if given (any 1-D integer array-like), else from the ``weights_shape`` attribute
    (spec D7). auto_pad resolves to the forward op's pads (D8).
"""
        + _ATTR_DOC
    )

    op_name = "ConvTransposeBackwardWeights"
    input_names = ("src", "diff_dst", "weights_shape")
    output_name = "diff_weights"

    def __init__(
        self, *, strides: IntList = 1, pads_begin: IntList = 0, pads_end: IntList = 0,
        dilations: IntList = 1, auto_pad: str = "None", output_padding: Optional[IntList] = None,
        groups: int = 1, data_format: str = "NXC", weights_format: str = "XOI",
        weights_shape: Optional[Sequence[int]] = None, strict: bool = False,
    ) -> None:
        super().__init__(
            dict(strides=strides, pads_begin=pads_begin, pads_end=pads_end, dilations=dilations,
                 auto_pad=auto_pad, output_padding=output_padding, groups=groups,
                 data_format=data_format, weights_format=weights_format, weights_shape=weights_shape),
            strict,
        )

    @overload
    def __call__(self, src: Array, diff_dst: Array, weights_shape: Optional[ArrayLike] = None, *,
                 out: Optional[Array] = None) -> Array: ...
    @overload
    def __call__(self, src: ArrayLike, diff_dst: ArrayLike, weights_shape: Optional[ArrayLike] = None, *,
                 out: Optional[np.ndarray] = None) -> np.ndarray: ...
    def __call__(self, src: Any, diff_dst: Any, weights_shape: Any = None, *, out: Any = None) -> Any:
        """Run the op (arrays of any one type, as for :class:`ConvTranspose`).

        Args:
            src: the forward src, (N, IC, X...) for NCX or (N, X..., IC) for NXC.
            diff_dst: (N, OC, X...) for NCX or (N, X..., OC) for NXC.
            weights_shape: optional 1-D integer array-like; wins over the attribute.
            out: optional array to write diff_weights into.

        Returns:
            diff_weights, (IC, OC/groups, X...) for IOX or (X..., OC/groups, IC) for XOI.
        """
        return self._call((src, diff_dst, weights_shape), out)

    @staticmethod
    def _weights_shape_key(ws: Optional[np.ndarray]) -> Any:
        """The weights_shape input's part of a call's signature (None: by the attribute)."""
        return None if ws is None else (ws.dtype, ws.shape, ws.tobytes())

    def _signature(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> Any:
        src, dd, ws = arrays
        return super()._signature((src, dd), out), self._weights_shape_key(ws)

    def _executor_inputs(self, inputs: tuple[Any, ...], made_for: Any) -> Optional[tuple[Any, ...]]:
        # the executor sees src and diff_dst alone: the last plan fits only if it was made for
        # this weights_shape (src and diff_dst leave the kernel open: the forward's
        # output_padding is not an attribute here, and auto_pad SAME_* ignores the kernel)
        return inputs[:2] if made_for[1] == self._weights_shape_key(inputs[2]) else None

    def _weights_shape(self, ws: Any, rank: int) -> tuple[int, ...]:
        op = self.op_name
        if ws is None:
            value = self.attrs["weights_shape"]
            if value is None:
                msg = f"{op}: weights_shape expected as input 2 or as the attribute, got neither"
                raise ValueError(msg)
            shape = (value,) if isinstance(value, int) else tuple(value)
        else:
            if ws.dtype.kind not in "iu":
                msg = f"{op}: argument 'weights_shape' expected a 1-D integer array, got dtype {ws.dtype}"
                raise TypeError(msg)
            if ws.ndim != 1:
                msg = f"{op}: argument 'weights_shape' expected a 1-D integer array, got shape {ws.shape}"
                raise ValueError(msg)
            shape = tuple(int(x) for x in ws)
            info = np.iinfo(dtypes.SHAPE_DTYPE)
            if any(not 1 <= x <= info.max for x in shape):
                msg = f"{op}: argument 'weights_shape' expected positive s32 values, got {list(shape)}"
                raise ValueError(msg)
        if len(shape) != rank:
            msg = f"{op}: weights_shape expected {rank} entries like src, got {list(shape)}"
            raise ValueError(msg)
        return shape

    def _problem(self, arrays: Sequence[Any], code: str) -> Problem:
        src, dd, ws = arrays
        a = self.attrs
        self._check_rank("src", src)
        self._check_rank("diff_dst", dd)
        read = [layouts.Read("src", src.shape, "in"), layouts.Read("diff_dst", dd.shape, "out")]
        self._check_same_rank(*read)
        wshape = self._weights_shape(ws, src.ndim)
        n, ic, xs = shapes.split_activation(src.shape, a["data_format"])
        n2, oc, ys = shapes.split_activation(dd.shape, a["data_format"])
        if n != n2:
            msg = f"{self.op_name}: 'diff_dst' batch {n2} expected equal to the 'src' batch {n}"
            raise ValueError(msg)
        i, o, kernel = shapes.split_weights(wshape, a["weights_format"])
        read.append(layouts.Read("weights_shape", tuple(wshape), "weights"))
        self._check_channels(ic, i, oc, o, "src", "diff_dst", "weights_shape", read)
        geometry = self._geometry(len(xs), kernel)
        self._check_forward_extent(xs, ys, kernel, geometry, "src", "diff_dst")
        return Problem(
            self.op_name, code, a["data_format"], a["weights_format"], a["groups"], n, ic, oc, xs, ys, kernel,
            geometry, (0,) * len(xs), False, (src.shape, dd.shape), tuple(wshape),
        )

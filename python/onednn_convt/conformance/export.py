"""Graph JSON of Python calls: what :func:`to_graph_json` and :func:`case_graph_json` write.

:func:`to_graph_json` writes the graph of a Python call in the library's spelling: every
attribute of the op kind, defaults included, ``type`` first in every attribute entry, both
``data_format`` and ``weights_format`` (benchdnn needs them, spec 8), ``auto_pad`` as
``"None"``/``"SAME_UPPER"``/..., one entry per spatial dim in every list. Its output loads
back through :mod:`onednn_convt.conformance.graph_json`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..shapes import dense_strides
from .graph import CONVT_KINDS, LIBRARY_ATTRS, Attr, Graph, GraphOp, LogicalTensor
from .graph_json import dumps


def _tensor_of(array: np.ndarray, tid: int, code: str) -> LogicalTensor:
    size = array.itemsize
    if all(s > 0 and s % size == 0 for s in array.strides):
        stride = [s // size for s in array.strides]
    else:  # the op copies such arrays to dense memory before the library sees them
        stride = list(dense_strides(array.shape))
    return LogicalTensor(tid, code, [int(d) for d in array.shape], stride)


def library_attrs(kind: str, attrs: dict[str, Any], spatial: int) -> dict[str, Attr]:
    """Every library attribute of ``kind`` from an op's normalized attributes.

    Args:
        kind: op kind.
        attrs: the op's ``attrs`` (ints, tuples, library spellings, None where not given);
            ``weights_shape`` must already be resolved for BackwardWeights.
        spatial: number of spatial dims (lists are written with one entry per dim).

    Raises:
        ValueError: a list attribute whose length is not ``spatial``.
    """
    from .. import schema

    out: dict[str, Attr] = {}
    for name, t in LIBRARY_ATTRS[kind].items():
        value = attrs.get(name)
        if name == "weights_shape":
            out[name] = Attr(t, [int(v) for v in value] if value is not None else [0] * 12)
        elif t == "s64[]":
            out[name] = Attr(t, list(schema.per_dim(kind, name, value, spatial)))
        elif t == "s64":
            out[name] = Attr(t, int(value if value is not None else 1))
        else:
            out[name] = Attr(t, str(value))
    return out


def graph_of_call(op: Any, *inputs: Any) -> Graph:
    """The :class:`Graph` of the call ``op(*inputs)``; see :func:`to_graph_json`."""
    from .. import dtypes, legacy
    from .op_case import expected_output_shape

    if isinstance(op, legacy.ConvTransposeBackpropFilters):
        inner = op._op  # the ConvTransposeBackwardWeights that computes it
        inputs = tuple(inputs)
        if len(inputs) > 2 and inputs[2] is not None:
            shape = list(np.asarray(inputs[2]).tolist())
            ax0, ax1 = op._axes
            shape[ax0], shape[ax1] = shape[ax1], shape[ax0]
            inputs = (*inputs[:2], np.asarray(shape, np.int32))
        op = inner
    kind = getattr(op, "op_name", None)
    if kind not in CONVT_KINDS:
        msg = f"to_graph_json: argument 'op' expected a ConvTranspose, ConvTransposeBackwardData or ConvTransposeBackwardWeights object, got {type(op).__name__}"
        raise TypeError(msg)
    if getattr(op, "fusion", None) is not None:
        return _graph_of_fused_call(op, inputs)
    names = type(op).input_names
    arrays = [None if x is None else np.asarray(x) for x in inputs]
    while arrays and arrays[-1] is None:
        arrays.pop()
    if len(arrays) < 2 or len(arrays) > len(names) or any(a is None for a in arrays):
        msg = f"to_graph_json: {kind} expected inputs {', '.join(names)} (the last optional), got {len(inputs)}"
        raise ValueError(msg)
    attrs = dict(op.attrs)
    tensors: list[LogicalTensor] = []
    code: Optional[str] = None
    ws_input: Optional[list[int]] = None
    for i, (name, a) in enumerate(zip(names, arrays)):
        assert a is not None
        if name == "weights_shape":
            ws_input = [int(v) for v in np.ravel(a)]
            tensors.append(LogicalTensor(i, "s32", [len(ws_input)], [1]))
            continue
        c = dtypes.code_of(a.dtype)
        if c is None or (code is not None and c != code):
            msg = f"to_graph_json: {kind} argument '{name}' expected dtype {dtypes.expected_names()} like the other inputs, got {a.dtype}"
            raise TypeError(msg)
        code = c
        tensors.append(_tensor_of(a, i, c))
    assert code is not None
    if kind == "ConvTransposeBackwardWeights":
        ws = ws_input if ws_input is not None else attrs.get("weights_shape")
        if ws is None:
            msg = f"to_graph_json: {kind} weights_shape expected as input 2 or as the attribute, got neither"
            raise ValueError(msg)
        attrs["weights_shape"] = tuple(int(v) for v in ws)
    spatial = arrays[0].ndim - 2  # type: ignore[union-attr]
    out_shape = expected_output_shape(kind, attrs, [tuple(a.shape) for a in arrays])  # type: ignore[union-attr]
    _check_output_shape(kind, out_shape)
    output = LogicalTensor(len(tensors), code, list(out_shape), list(dense_strides(out_shape)))
    from .. import native

    graph_op = GraphOp(0, f"{kind}_0", kind, library_attrs(kind, attrs, spatial), tensors, [output])
    return Graph([graph_op], version=native.onednn_version())


def _check_output_shape(kind: str, shape: Sequence[int]) -> None:
    """Raise ValueError unless every dim of the output (weights_shape included) is >= 1: a
    graph with a negative or empty shape is not written."""
    if not shape or min(shape) < 1:
        msg = (
            f"to_graph_json: {kind} would have an output of shape {list(shape)}; every dim must "
            "be at least 1 (the attributes do not fit the inputs' shapes)"
        )
        raise ValueError(msg)


#: JSON types of the attributes of the ops a fused call adds (post-ops' own are f32).
FUSED_ATTR_TYPES = {
    "scales": "f32[]",
    "zps": "s64[]",
    "qtype": "string",
    "axis": "s64",
    "auto_broadcast": "string",
    "data_format": "string",
}


def _node_attrs(kind: str, attrs: dict[str, Any], spatial: int) -> dict[str, Attr]:
    if kind == "ConvTranspose":
        return library_attrs(kind, attrs, spatial)
    out = {}
    for name, value in attrs.items():
        t = FUSED_ATTR_TYPES.get(name, "f32")
        if t == "f32[]":
            value = [float(v) for v in value]
        elif t == "s64[]":
            value = [int(v) for v in value]
        elif t == "f32":
            value = float(value)
        elif t == "s64":
            value = int(value)
        out[name] = Attr(t, value)
    return out


def _array_code(a: np.ndarray) -> Optional[str]:
    from .. import dtypes
    from ..post_ops import INT8_DTYPES

    for code, dt in INT8_DTYPES.items():
        if a.dtype == dt:
            return code
    return dtypes.code_of(a.dtype)


def _graph_of_fused_call(op: Any, inputs: Sequence[Any]) -> Graph:
    """The whole graph of a fused ConvTranspose call: the nodes the package compiles
    (:func:`onednn_convt.fusion.graph_nodes`), inputs first (src, weights, the bias if given,
    each binary post-op's tensor at dst's rank), then each node's output, in node order."""
    from .. import fusion, native
    from .op_case import expected_output_shape

    f = op.fusion
    name = op.op_name
    given = list(inputs)
    if len(given) < 2 or given[0] is None or given[1] is None:
        msg = f"to_graph_json: {name} expected inputs {', '.join(op.input_names)}, got {len(given)}"
        raise ValueError(msg)
    src, w = np.asarray(given[0]), np.asarray(given[1])
    bias = None if len(given) < 3 or given[2] is None else np.asarray(given[2])
    operands = [np.asarray(x) for x in given[3:]]
    if len(operands) != len(f.binary) or any(x is None for x in given[3:]):
        msg = (
            f"to_graph_json: {name} expected {len(f.binary)} post-op tensor(s) after the bias "
            f"({', '.join(op.input_names[3:]) or 'none'}), got {len(operands)}"
        )
        raise ValueError(msg)
    arrays = [src, w] + ([bias] if bias is not None else []) + operands
    codes = []
    for a, arg in zip(
        arrays,
        ["src", "weights"] + (["bias"] if bias is not None else []) + list(op.input_names[3:]),
    ):
        c = _array_code(a)
        if c is None:
            msg = f"to_graph_json: {name} argument '{arg}' has dtype {a.dtype}, which is not a oneDNN data type here"
            raise TypeError(msg)
        codes.append(c)
    if f.int8:
        inter = "f32"
        out_code = f.dst_quantize.dtype if f.dst_quantize is not None else "f32"
    else:
        if len(set(codes)) > 1:
            got = ", ".join(codes)
            msg = (
                f"to_graph_json: every tensor of a fused float call must have one dtype, got {got}"
            )
            raise TypeError(msg)
        inter = out_code = codes[0]
    out_shape = expected_output_shape(name, dict(op.attrs), [src.shape, w.shape])
    _check_output_shape(name, out_shape)
    rank = len(out_shape)
    operand_shapes = []
    for x in operands:
        if x.ndim > rank:
            msg = f"to_graph_json: {name} post-op tensor of shape {x.shape} has more dims than dst {out_shape}"
            raise ValueError(msg)
        operand_shapes.append((1,) * (rank - x.ndim) + tuple(x.shape))
    nodes = fusion.graph_nodes(
        op, f, bias is not None, out_shape, inter, out_code, operand_shapes, src.shape, w.shape
    )
    n_args = len(arrays)
    placed = arrays[: n_args - len(operands)] + [
        x.reshape(s) for x, s in zip(operands, operand_shapes)
    ]
    tensors = [_tensor_of(a, i, c) for i, (a, c) in enumerate(zip(placed, codes))]
    outputs = [
        LogicalTensor(n_args + k, code, [int(d) for d in shape], [int(v) for v in strides])
        for k, (_, _, _, (shape, strides, code)) in enumerate(nodes)
    ]

    def ref(i: int) -> LogicalTensor:
        return tensors[i] if i >= 0 else outputs[-1 - i]

    spatial = src.ndim - 2
    ops = [
        GraphOp(
            k,
            f"{kind}_{k}",
            kind,
            _node_attrs(kind, attrs, spatial),
            [ref(i) for i in refs],
            [outputs[k]],
        )
        for k, (kind, attrs, refs, _) in enumerate(nodes)
    ]
    return Graph(ops, version=native.onednn_version())


def to_graph_json(op: Any, *inputs: Any, indent: Optional[int] = 2) -> str:
    """The oneDNN graph JSON of the call ``op(*inputs)``, for benchdnn or this runner.

    Written in the library's spelling with every attribute: lists with one entry per
    spatial dim, ``auto_pad`` as ``"None"``/``"SAME_UPPER"``/..., both formats,
    ``output_padding`` for ConvTranspose and the resolved ``weights_shape`` for
    ConvTransposeBackwardWeights (a ``weights_shape`` input is written as a third, s32
    input as well, its values in the attribute since the format holds no data). An
    ``output_padding`` given to a backward op is only checked by this package and is not a
    library attribute, so it is not written. The legacy ConvTransposeBackpropFilters is
    written as the ConvTransposeBackwardWeights that computes it.

    A fused ConvTranspose (``post_ops=``, or int8 with ``src_dequantize=`` ...) is written
    as the whole graph the package compiles for the call (:func:`onednn_convt.fusion.graph_nodes`):
    the Dequantize ops of src and weights, the ConvTranspose (its bias as input 2, pads
    resolved as compiled), each post-op (a binary one's tensor at dst's rank, through its
    Dequantize when it has one) and the Quantize, with tensor ids, dtypes, shapes and
    strides; pass the bias as None to write a call without bias that has post-op tensors.

    Args:
        op: an op object (``onednn_convt.ConvTranspose(...)``, ...).
        *inputs: the arrays of the call, in the op's input order (NumPy arrays in the
            op's layouts: activations NXC/NCX, weights XOI/IOX).
        indent: JSON indentation (None: one line).

    Returns:
        The JSON text (input tensor ids 0.., then the outputs; a single-op graph, or a
        fused call's chain with op ids 0.. in chain order).

    Raises:
        TypeError: not an op object, or unsupported/mixed dtypes.
        ValueError: wrong number of inputs, list attributes of the wrong length, or shapes
            for which the output shape cannot be computed.
    """
    return dumps(graph_of_call(op, *inputs), indent=indent)


def case_graph_json(case: Any, indent: Optional[int] = 2) -> str:
    """The graph JSON of a runnable :class:`~onednn_convt.conformance.model.Case`, with its
    overrides applied (to hand a failing case to oneDNN's tools)."""
    import onednn_convt

    from ..dtypes import FLOAT_DTYPES, SHAPE_DTYPE
    from .fill import place

    if case.status is not None or case.kind is None:
        msg = f"case_graph_json: the case is {case.status}: {case.reason}"
        raise ValueError(msg)
    if case.pattern is not None:
        from ..post_ops import INT8_DTYPES

        by_role = {
            t.role: place(
                np.zeros(t.shape), INT8_DTYPES.get(t.dtype) or FLOAT_DTYPES[t.dtype], t.order
            )
            for t in case.inputs
        }
        operands = [by_role[t.role] for t in case.inputs if t.role.startswith("post_ops[")]
        fused = onednn_convt.ConvTranspose(**case.attrs, **case.pattern.op_kwargs())
        return to_graph_json(
            fused, by_role["src"], by_role["weights"], by_role.get("bias"), *operands, indent=indent
        )
    op = getattr(onednn_convt, case.kind)(**case.attrs)
    arrays = [
        np.asarray(t.values, SHAPE_DTYPE)
        if t.role == "weights_shape"
        else place(np.zeros(t.shape), FLOAT_DTYPES[t.dtype], t.order)
        for t in case.inputs
    ]
    return to_graph_json(op, *arrays, indent=indent)

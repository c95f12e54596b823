"""The graph JSON format's model: a :class:`Graph` of :class:`GraphOp` entries, their
:class:`LogicalTensor` inputs and outputs and :class:`Attr` attributes, the op kinds and
attribute schema of the three ConvTranspose ops, and :class:`GraphJSONError`.
:mod:`.graph_json` reads files into it; :mod:`.export` writes calls out of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


#: The op kinds this package runs.
CONVT_KINDS = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")

#: Every op kind of oneDNN 3.2's Graph API (``dnnl::graph::op::kind``): a kind outside this
#: set is a typo or not a oneDNN op (INVALID); one inside it but not in CONVT_KINDS is a
#: valid graph this runner does not cover (SKIPPED).
GRAPH_OP_KINDS = frozenset(
    """Abs AbsBackward Add AvgPool AvgPoolBackward BatchNormForwardTraining BatchNormInference
    BatchNormTrainingBackward BiasAdd BiasAddBackward Clamp ClampBackward Concat Convolution
    ConvolutionBackwardData ConvolutionBackwardWeights ConvTranspose ConvTransposeBackwardData
    ConvTransposeBackwardWeights Dequantize Divide DynamicDequantize DynamicQuantize Elu
    EluBackward End Exp GELU GELUBackward HardSigmoid HardSigmoidBackward HardSwish
    HardSwishBackward Interpolate InterpolateBackward LayerNorm LayerNormBackward LeakyReLU Log
    LogSoftmax LogSoftmaxBackward MatMul Maximum MaxPool MaxPoolBackward Minimum Mish
    MishBackward Multiply Pow PReLU PReLUBackward Quantize Reciprocal ReduceL1 ReduceL2
    ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReLU ReLUBackward Reorder Round Select
    Sigmoid SigmoidBackward SoftMax SoftMaxBackward SoftPlus SoftPlusBackward Sqrt
    SqrtBackward Square SquaredDifference StaticReshape StaticTranspose Subtract Tanh
    TanhBackward TypeCast Wildcard""".split()
)

#: Attribute value types of the format (the entry's ``"type"``).
ATTR_TYPES = ("string", "bool", "s64", "s64[]", "f32", "f32[]")

#: How the library writes an unknown dim or stride.
UNKNOWN_DIM = -(2**63)

#: Library attribute schema of each op kind: name -> JSON type, in the order we write them
#: (spec 2). Required: strides, pads_begin, pads_end, dilations.
LIBRARY_ATTRS: dict[str, dict[str, str]] = {
    kind: {
        "strides": "s64[]",
        "pads_begin": "s64[]",
        "pads_end": "s64[]",
        "dilations": "s64[]",
        "auto_pad": "string",
        "groups": "s64",
        "data_format": "string",
        "weights_format": "string",
        **({"output_padding": "s64[]"} if kind == "ConvTranspose" else {}),
        **({"weights_shape": "s64[]"} if kind == "ConvTransposeBackwardWeights" else {}),
    }
    for kind in CONVT_KINDS
}
REQUIRED_ATTRS = ("strides", "pads_begin", "pads_end", "dilations")


class GraphJSONError(ValueError):
    """The text is not a well-formed oneDNN graph JSON; the message names where."""


@dataclass
class Attr:
    """One attribute entry: its JSON ``type`` and ``value``."""

    type: str
    value: Any

    def to_json(self) -> dict[str, Any]:
        """``{"type": ..., "value": ...}`` with ``type`` first (benchdnn requires it)."""
        return {"type": self.type, "value": self.value}


@dataclass
class LogicalTensor:
    """A logical tensor entry. ``shape``/``stride`` hold UNKNOWN_DIM where unknown."""

    id: int
    dtype: str
    shape: list[int]
    stride: list[int] = field(default_factory=lambda: [UNKNOWN_DIM])
    layout_type: str = "strided"
    property_type: str = "undef"

    def to_json(self) -> dict[str, Any]:
        """The entry in the library's key order."""
        return {
            "id": self.id,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "stride": list(self.stride),
            "layout_type": self.layout_type,
            "property_type": self.property_type,
        }

    @property
    def known_shape(self) -> bool:
        """Whether every dim is known (>= 0)."""
        return all(d >= 0 for d in self.shape)


@dataclass
class GraphOp:
    """One op entry of a graph."""

    id: int
    name: str
    kind: str
    attrs: dict[str, Attr]
    inputs: list[LogicalTensor]
    outputs: list[LogicalTensor]

    def copy(self) -> GraphOp:
        """A copy whose attributes and tensor lists can be changed without changing this op
        (attribute values and tensors are shared: they are replaced, never changed)."""
        return GraphOp(
            self.id, self.name, self.kind, dict(self.attrs), list(self.inputs), list(self.outputs)
        )

    def to_json(self) -> dict[str, Any]:
        """The entry in the library's key order."""
        return {
            "id": self.id,
            "name": self.name,
            "kind": self.kind,
            "attrs": {k: a.to_json() for k, a in self.attrs.items()},
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }


@dataclass
class Graph:
    """A whole graph file; ``extra`` keeps optional top-level keys (``input_ports``, ...)."""

    ops: list[GraphOp]
    version: str = "3.2.0"
    engine_kind: str = "cpu"
    fpmath_mode: str = "strict"
    extra: dict[str, Any] = field(default_factory=dict)

    def entries(self) -> int:
        """How many ops, attributes and tensor entries the graph has (what checking a case
        of it reads; computed once)."""
        n = self.__dict__.get("_entries")
        if n is None:
            n = sum(1 + len(op.attrs) + len(op.inputs) + len(op.outputs) for op in self.ops)
            self.__dict__["_entries"] = n
        return int(n)

    def to_json(self) -> dict[str, Any]:
        """The top-level object (``graph`` last, as the library writes it)."""
        return {
            "version": self.version,
            "engine_kind": self.engine_kind,
            "fpmath_mode": self.fpmath_mode,
            **self.extra,
            "graph": [op.to_json() for op in self.ops],
        }

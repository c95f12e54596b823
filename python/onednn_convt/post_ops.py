"""What can follow a ConvTranspose in one fused call: post-ops and (de)quantization.

The table :data:`POST_OPS` is the one place that says, for each post-op, its library op
kind, whether it takes a second tensor, its attributes with their defaults, and its math
(float64, as the library defines it). :class:`PostOp` is one step of a chain;
:class:`Dequantize` and :class:`Quantize` carry the library's quantization attributes
(``scales``, ``zps``, ``qtype``, ``axis``) under the library's names.

The library (oneDNN 3.2, pattern ``convtranspose_post_ops_fusion``) fuses a ConvTranspose,
its bias and up to three post-ops into one partition; the int8 patterns add Dequantize
before the ConvTranspose (and before a binary post-op's second tensor) and Quantize after.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from . import reference

_F64 = np.ndarray

#: The longest chain of post-ops the library fuses with a ConvTranspose (oneDNN 3.2).
MAX_CHAIN = 3


@dataclass(frozen=True)
class Kind:
    """One post-op kind of the library.

    Attributes:
        name: the library op kind (``"ReLU"``, ``"Add"``, ...).
        attrs: its f32 attributes and their defaults (None: required).
        is_binary: whether it takes a second tensor (broadcast NumPy-style to dst).

    The float64 math of each is :func:`onednn_convt.reference.post_op`.
    """

    name: str
    attrs: Mapping[str, Optional[float]] = field(default_factory=dict)
    is_binary: bool = False


def _kinds(*kinds: Kind) -> dict[str, Kind]:
    return {k.name: k for k in kinds}


#: Every post-op a fused ConvTranspose takes, by library name: oneDNN 3.2 fuses each of
#: these after a ConvTranspose (measured); it does not fuse Pow, which is left out.
POST_OPS: dict[str, Kind] = _kinds(
    Kind("Abs"),
    Kind("Clamp", {"min": None, "max": None}),
    Kind("Elu", {"alpha": None}),
    Kind("Exp"),
    Kind("GELU"),
    Kind("HardSigmoid", {"alpha": None, "beta": None}),
    Kind("HardSwish"),
    Kind("LeakyReLU", {"alpha": None}),
    Kind("Log"),
    Kind("Mish"),
    Kind("ReLU"),
    Kind("Round"),
    Kind("Sigmoid"),
    Kind("SoftPlus", {"beta": 1.0}),
    Kind("Sqrt"),
    Kind("Square"),
    Kind("Tanh"),
    *(Kind(name, is_binary=True) for name in ("Add", "Subtract", "Multiply", "Divide", "Maximum", "Minimum")),
)
_BY_LOWER = {name.lower(): kind for name, kind in POST_OPS.items()}

#: Integer types of quantized tensors, by library code, with their ranges.
INT8_DTYPES: dict[str, np.dtype[Any]] = {"u8": np.dtype(np.uint8), "s8": np.dtype(np.int8)}
QTYPES = ("per_tensor", "per_channel")


def _floats(where: str, name: str, value: Any) -> tuple[float, ...]:
    values = [value] if isinstance(value, numbers.Real) else value
    try:
        out = tuple(float(v) for v in values)
    except TypeError:
        msg = f"{where}: attribute '{name}' expected a number or a list of numbers, got {value!r}"
        raise TypeError(msg) from None
    if not out or not all(math.isfinite(v) for v in out):
        msg = f"{where}: attribute '{name}' expected finite numbers, got {value!r}"
        raise ValueError(msg)
    return out


def _ints(where: str, name: str, value: Any) -> tuple[int, ...]:
    values = [value] if isinstance(value, numbers.Integral) else value
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
        msg = f"{where}: attribute '{name}' expected an int or a list of ints, got {value!r}"
        raise TypeError(msg)
    return tuple(int(v) for v in values)


@dataclass(frozen=True)
class Dequantize:
    """The library's Dequantize: ``f32 = (x - zps) * scales`` on a u8/s8 tensor.

    Args:
        scales: one scale (``qtype="per_tensor"``) or one per index of dim ``axis``.
        zps: zero points, as many as ``scales`` (default all 0).
        qtype: ``"per_tensor"`` or ``"per_channel"``.
        axis: the dim the per-channel values run along (negative counts from the end).
    """

    scales: Union[float, Sequence[float]] = 1.0
    zps: Union[int, Sequence[int], None] = None
    qtype: str = "per_tensor"
    axis: int = 1

    op_name = "Dequantize"

    def __post_init__(self) -> None:
        where = self.op_name
        scales = _floats(where, "scales", self.scales)
        zps = (0,) * len(scales) if self.zps is None else _ints(where, "zps", self.zps)
        if self.qtype not in QTYPES:
            msg = f"{where}: attribute 'qtype' expected one of {', '.join(QTYPES)}, got {self.qtype!r}"
            raise ValueError(msg)
        if self.qtype == "per_tensor" and (len(scales) != 1 or len(zps) != 1):
            msg = f"{where}: qtype 'per_tensor' expected one scale and one zero point, got {len(scales)} and {len(zps)}"
            raise ValueError(msg)
        if len(zps) != len(scales):
            msg = f"{where}: attribute 'zps' expected {len(scales)} values (one per scale), got {len(zps)}"
            raise ValueError(msg)
        if not isinstance(self.axis, numbers.Integral) or isinstance(self.axis, bool):
            msg = f"{where}: attribute 'axis' expected an int, got {self.axis!r}"
            raise TypeError(msg)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "zps", zps)
        object.__setattr__(self, "axis", int(self.axis))

    def library_attrs(self, rank: int) -> dict[str, Any]:
        """The library op's attributes (the axis made non-negative for a tensor of ``rank``)."""
        return {"scales": list(self.scales), "zps": list(self.zps), "qtype": self.qtype,  # type: ignore[arg-type]
                "axis": self.axis % rank if self.qtype == "per_channel" else 0}

    def check(self, where: str, name: str, shape: Sequence[int]) -> None:
        """Raise ValueError unless this quantization fits a tensor of ``shape``."""
        if self.qtype != "per_channel":
            return
        rank = len(shape)
        if not -rank <= self.axis < rank:
            msg = f"{where}: {self.op_name} of '{name}' has axis {self.axis}, out of range for rank {rank}"
            raise ValueError(msg)
        n = shape[self.axis]
        if len(self.scales) != n:  # type: ignore[arg-type]
            msg = (f"{where}: {self.op_name} of '{name}' has {len(self.scales)} scales "  # type: ignore[arg-type]
                   f"for axis {self.axis}, expected {n} (one per index of that dim)")
            raise ValueError(msg)

    def apply(self, x: np.ndarray) -> _F64:
        """float64 (x - zps) * scales."""
        return reference.dequantize(x, self.scales, self.zps, self.qtype, self.axis)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Quantize(Dequantize):
    """The library's Quantize: ``saturate(round_half_even(x / scales + zps))`` into
    ``dtype`` (``"u8"`` or ``"s8"``). Same attributes as :class:`Dequantize`."""

    dtype: str = "u8"

    op_name = "Quantize"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in INT8_DTYPES:
            msg = f"Quantize: dtype expected 'u8' or 's8', got {self.dtype!r}"
            raise TypeError(msg)

    def apply(self, x: np.ndarray) -> _F64:
        """The quantized values, as float64 integers in the dtype's range."""
        return reference.quantize(x, self.scales, self.zps, self.dtype, self.qtype, self.axis)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PostOp:
    """One post-op of a fused ConvTranspose.

    Args:
        kind: the library's op name, any case: ``"ReLU"``, ``"LeakyReLU"``, ``"GELU"``,
            ``"Sigmoid"``, ``"Tanh"``, ``"Elu"``, ``"Clamp"``, ``"Square"``, ``"Abs"``,
            ``"Exp"``, ``"Log"``, ``"Sqrt"``, ``"HardSwish"``, ``"HardSigmoid"``, ``"Mish"``,
            ``"SoftPlus"``, ``"Round"``; binary ``"Add"``, ``"Subtract"``, ``"Multiply"``,
            ``"Divide"``, ``"Maximum"``, ``"Minimum"``.
        dequantize: binary ops of an int8 call only: the second tensor is u8/s8 and is
            dequantized first (the library's "sum" post-op, ``Add`` of a dequantized tensor).
        **attrs: the kind's f32 attributes, required as in the library: ``alpha`` for
            LeakyReLU and Elu, ``alpha`` and ``beta`` for HardSigmoid, ``min`` and ``max``
            for Clamp; ``beta`` for SoftPlus is optional (default 1).

    A binary post-op's second tensor is given at call time, after the bias, in chain order;
    it broadcasts NumPy-style to dst (per-channel: ``(OC,)`` for NXC, ``(1, OC, 1, 1)`` for
    NCX; or dst's full shape).
    """

    kind: str
    attrs: Mapping[str, float] = field(default_factory=dict)
    dequantize: Optional[Dequantize] = None

    def __init__(self, kind: str, *, dequantize: Optional[Dequantize] = None, **attrs: float) -> None:
        if not isinstance(kind, str):
            msg = f"PostOp: kind expected a string, got {kind!r}"
            raise TypeError(msg)
        spec = _BY_LOWER.get(kind.lower())
        if spec is None:
            msg = f"PostOp: unknown post-op {kind!r}; expected one of {', '.join(POST_OPS)}"
            raise ValueError(msg)
        unknown = sorted(set(attrs) - set(spec.attrs))
        if unknown:
            expected = ", ".join(spec.attrs) or "none"
            msg = f"PostOp {spec.name}: unknown attribute(s) {', '.join(unknown)}; expected {expected}"
            raise TypeError(msg)
        values: dict[str, float] = {}
        for name, default in spec.attrs.items():
            given = attrs.get(name, default)
            if given is None:
                msg = f"PostOp {spec.name}: attribute '{name}' is required"
                raise ValueError(msg)
            if not isinstance(given, numbers.Real) or isinstance(given, bool):
                msg = f"PostOp {spec.name}: attribute '{name}' expected a number, got {given!r}"
                raise TypeError(msg)
            values[name] = _floats(f"PostOp {spec.name}", name, given)[0]
        if spec.name == "Clamp" and values["min"] > values["max"]:
            msg = f"PostOp Clamp: attribute 'min' ({values['min']}) expected <= 'max' ({values['max']})"
            raise ValueError(msg)
        if spec.name == "SoftPlus" and values["beta"] == 0:
            msg = "PostOp SoftPlus: attribute 'beta' expected non-zero"
            raise ValueError(msg)
        if dequantize is not None and not spec.is_binary:
            msg = f"PostOp {spec.name}: dequantize is for a binary post-op's second tensor"
            raise ValueError(msg)
        if dequantize is not None and (not isinstance(dequantize, Dequantize) or isinstance(dequantize, Quantize)):
            msg = f"PostOp {spec.name}: dequantize expected a Dequantize, got {type(dequantize).__name__}"
            raise TypeError(msg)
        object.__setattr__(self, "kind", spec.name)
        object.__setattr__(self, "attrs", values)
        object.__setattr__(self, "dequantize", dequantize)

    @property
    def spec(self) -> Kind:
        return POST_OPS[self.kind]

    @property
    def is_binary(self) -> bool:
        return self.spec.is_binary

    def __repr__(self) -> str:
        given = [repr(self.kind)] + [f"{k}={v!r}" for k, v in self.attrs.items()]
        if self.dequantize is not None:
            given.append(f"dequantize={self.dequantize!r}")
        return f"PostOp({', '.join(given)})"

    def library_attrs(self) -> dict[str, Any]:
        if self.is_binary:
            return {"auto_broadcast": "numpy"}
        return {k: float(v) for k, v in self.attrs.items()}

    def apply(self, x: _F64, other: Optional[np.ndarray] = None) -> _F64:
        """float64 math: ``x`` the running value, ``other`` a binary op's second tensor."""
        if other is not None and self.dequantize is not None:
            other = self.dequantize.apply(other)
        return reference.post_op(self.kind, x, other, **self.attrs)


def as_post_ops(where: str, given: Any) -> tuple[PostOp, ...]:
    """A checked chain: PostOp objects or kind names (``"ReLU"``), at most MAX_CHAIN."""
    if given is None:
        return ()
    if isinstance(given, (str, PostOp)):
        given = [given]
    chain = tuple(p if isinstance(p, PostOp) else PostOp(p) if isinstance(p, str) else _bad(where, p) for p in given)
    if len(chain) > MAX_CHAIN:
        msg = (f"{where}: argument 'post_ops' expected at most {MAX_CHAIN} post-ops (what oneDNN 3.2 "
               f"fuses after a ConvTranspose), got {len(chain)}")
        raise ValueError(msg)
    return chain


def _bad(where: str, p: Any) -> PostOp:
    msg = f"{where}: argument 'post_ops' expected PostOp objects or kind names, got {p!r}"
    raise TypeError(msg)

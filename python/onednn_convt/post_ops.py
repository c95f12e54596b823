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
from typing import Any, Mapping, NoReturn, Optional, Sequence, Union

import numpy as np

from . import reference, schema
from .schema import short_repr

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

#: Dispatch ISAs (:func:`onednn_convt.guards.dispatch_isa`) whose oneDNN 3.2 int8 kernels
#: have no VNNI and compute wrong values: u8 x s8 products summed in pairs saturate at 16
#: bits, and an s8 src's weights are halved (their low bit dropped). Int8 calls there run
#: unfused, in f32 (:func:`onednn_convt.fused_plan.make_plan` has the measurements).
INT8_WITHOUT_VNNI = frozenset({"default", "sse41", "avx", "avx2", "avx512_core"})
#: Dispatch ISAs on which oneDNN 3.2 runs an int8 chain whose "sum" (:func:`library_sum`)
#: follows another post-op on its avx2 int8 kernel, without VNNI where the CPU lacks AVX-VNNI
#: (or the ISA cap excludes it): such calls run unfused.
INT8_SUM_AFTER_POST_OP = frozenset({"avx512_core_vnni", "avx512_core_bf16"})
#: On those ISAs, an int8 sum with a zero point at stride 1 falls back to that avx2 kernel
#: where the src has at most this many channels per group: such calls run unfused.
INT8_SUM_ZERO_POINT_FEW_CHANNELS = 4


#: float32's range: library attributes and scales are f32 (a value outside becomes inf, and
#: a scale below the smallest normal f32 is flushed to 0 by the kernels)
_F32 = np.finfo(np.float32)
#: s32, the type oneDNN 3.2 keeps zero points in (a larger one wrapped around)
S32 = (-(2**31), 2**31 - 1)
#: the values of an 8-bit tensor (u8 and s8): a Dequantize's zero points
INT8_VALUES = (-128, 255)


def _values(where: str, name: str, value: Any, what: str, scalar: type) -> list[Any]:
    """``value`` as a non-empty list of ``scalar`` numbers (bool excluded): one number, or a
    list, tuple, range or 1-D NumPy array of them; TypeError otherwise."""
    expected = f"{where}: attribute '{name}' expected {what} or a list of them"
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, (list, tuple, range)) or (isinstance(value, np.ndarray) and value.ndim == 1):
        values = list(value)
    elif isinstance(value, np.ndarray):
        msg = f"{expected}, got an array of shape {value.shape}"
        raise TypeError(msg)
    else:
        values = [value]
    for v in values:
        if not isinstance(v, scalar) or isinstance(v, (bool, np.bool_)):
            msg = f"{expected}, got {short_repr(v)} ({type(v).__name__})"
            raise TypeError(msg)
    if not values:
        msg = f"{expected}, got an empty {type(value).__name__}"
        raise ValueError(msg)
    return values


def _as_f32(v: Any) -> float:
    """``v`` rounded to float32, as the library takes it (inf where it overflows)."""
    try:
        f = float(v)
    except OverflowError:  # an int beyond float64
        return math.inf
    with np.errstate(over="ignore"):
        return float(np.float32(f))


def _floats(where: str, name: str, value: Any) -> tuple[float, ...]:
    """Numbers finite in float32 (the library's type for them), as given (float64)."""
    values = _values(where, name, value, "a number", numbers.Real)
    bad = [v for v in values if not math.isfinite(_as_f32(v))]
    if bad:
        msg = (f"{where}: attribute '{name}' expected finite float32 numbers (magnitude at most "
               f"{float(_F32.max):.4g}), got {short_repr(bad[0])}")
        raise ValueError(msg)
    return tuple(float(v) for v in values)


def _scales(where: str, name: str, value: Any) -> tuple[float, ...]:
    """Scales: finite, non-zero and normal in float32 (either sign: the library computes
    negative scales right, measured; smaller ones are flushed to 0 by its kernels)."""
    out = _floats(where, name, value)
    tiny = float(_F32.tiny)
    bad = [v for v in out if abs(_as_f32(v)) < tiny]
    if bad:
        msg = (f"{where}: attribute '{name}' expected non-zero scales of magnitude {tiny:.4g} to "
               f"{float(_F32.max):.4g} (normal float32 numbers), got {short_repr(bad[0])}")
        raise ValueError(msg)
    return out


def _ints(where: str, name: str, value: Any, lo: int = S32[0], hi: int = S32[1], why: str = "s32") -> tuple[int, ...]:
    """Integers (Python or NumPy; no bool, no floats) in [lo, hi]."""
    out = tuple(int(v) for v in _values(where, name, value, "an int", numbers.Integral))
    bad = [v for v in out if not lo <= v <= hi]
    if bad:
        msg = f"{where}: attribute '{name}' expected integers in [{lo}, {hi}] ({why}), got {short_repr(bad[0])}"
        raise ValueError(msg)
    return out


@dataclass(frozen=True)
class Dequantize:
    """The library's Dequantize: ``f32 = (x - zps) * scales`` on a u8/s8 tensor.

    Args:
        scales: one scale (``qtype="per_tensor"``) or one per index of dim ``axis``: numbers
            (a list, tuple or 1-D array of them), finite, non-zero and normal in float32,
            either sign.
        zps: zero points, as many as ``scales`` (default all 0): integers (not bool, not
            floats), values of an 8-bit tensor, in [-128, 255]; a :class:`Quantize`'s may be
            any s32 value.
        qtype: ``"per_tensor"`` or ``"per_channel"``.
        axis: the dim the per-channel values run along (negative counts from the end).

    Raises:
        TypeError: a scale or zero point of the wrong type (a string, a bool, a float zero
            point), or ``qtype``/``axis`` of the wrong type.
        ValueError: out of those ranges, empty, or the wrong number of them.
    """

    scales: Union[float, Sequence[float]] = 1.0
    zps: Union[int, Sequence[int], None] = None
    qtype: str = "per_tensor"
    axis: int = 1

    op_name = "Dequantize"

    def _zps(self, where: str) -> tuple[int, ...]:
        """The zero points, checked: values of an 8-bit tensor. oneDNN 3.2 multiplies a src
        zero point by the weights in 32-bit integers (its compensation), which overflows:
        wrong values from zps = 2**24 on (measured; s32 is the attribute's type), right for
        any zps in [-128, 255]."""
        return _ints(where, "zps", self.zps, *INT8_VALUES, "the values of a u8 or s8 tensor")

    def __post_init__(self) -> None:
        where = self.op_name
        scales = _scales(where, "scales", self.scales)
        zps = (0,) * len(scales) if self.zps is None else self._zps(where)
        if not isinstance(self.qtype, str):
            msg = f"{where}: attribute 'qtype' expected a string, one of {', '.join(QTYPES)}, got {type(self.qtype).__name__}"
            raise TypeError(msg)
        qtype = schema.spelled(self.qtype, QTYPES)
        if qtype is None:
            msg = f"{where}: attribute 'qtype' expected one of {', '.join(QTYPES)} (any case), got {self.qtype!r}"
            raise ValueError(msg)
        object.__setattr__(self, "qtype", qtype)
        if self.qtype == "per_tensor" and (len(scales) != 1 or len(zps) != 1):
            msg = f"{where}: qtype 'per_tensor' expected one scale and one zero point, got {len(scales)} and {len(zps)}"
            raise ValueError(msg)
        if len(zps) != len(scales):
            msg = f"{where}: attribute 'zps' expected {len(scales)} values (one per scale), got {len(zps)}"
            raise ValueError(msg)
        if not isinstance(self.axis, numbers.Integral) or isinstance(self.axis, bool):
            msg = f"{where}: attribute 'axis' expected an int, got {short_repr(self.axis)}"
            raise TypeError(msg)
        if not -5 <= self.axis <= 4:
            msg = f"{where}: attribute 'axis' expected an int in [-5, 4] (tensors have rank 3 to 5), got {short_repr(self.axis)}"
            raise ValueError(msg)
        object.__setattr__(self, "scales", scales)
        object.__setattr__(self, "zps", zps)
        object.__setattr__(self, "axis", int(self.axis))

    @property
    def has_zero_points(self) -> bool:
        """Whether some zero point is not 0."""
        return any(z != 0 for z in self.zps)  # type: ignore[union-attr]

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

    def _zps(self, where: str) -> tuple[int, ...]:
        """The zero points, checked: s32, the library's type for them (it wrapped larger
        ones around). oneDNN 3.2 computes ``x / scales + zps`` in f32 and saturates, right
        for any s32 zero point (measured), so they may lie outside dst's range."""
        return _ints(where, "zps", self.zps)

    def __post_init__(self) -> None:
        code = schema.spelled(self.dtype, tuple(INT8_DTYPES)) if isinstance(self.dtype, str) else None
        if code is None:  # a dtype it cannot be: a TypeError, as for arrays
            msg = f"Quantize: dtype expected 'u8' or 's8' (any case), got {short_repr(self.dtype)}"
            raise TypeError(msg)
        object.__setattr__(self, "dtype", code)
        super().__post_init__()

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
            msg = f"PostOp: unknown post-op {kind!r}; expected one of {', '.join(POST_OPS)} (any case)"
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


def library_sum(post_ops: Sequence[PostOp], operand_shapes: Sequence[Sequence[int]],
                dst_shape: Sequence[int]) -> int | None:
    """The index of the post-op that oneDNN 3.2 runs as its "sum" post-op (accumulating into
    dst) rather than as a binary one: the first ``Add`` whose tensor has dst's full shape
    (``operand_shapes``: each binary post-op's tensor at dst's rank, in chain order). A later
    such Add stays a binary Add (``ONEDNN_VERBOSE``: ``attr-post-ops:eltwise_relu+sum``,
    ``sum+binary_add``). None if there is none."""
    shapes = iter(operand_shapes)
    for i, p in enumerate(post_ops):
        if p.is_binary and tuple(next(shapes)) == tuple(dst_shape) and p.kind == "Add":
            return i
    return None


def as_post_ops(where: str, given: Any) -> tuple[PostOp, ...]:
    """A checked chain: PostOp objects or kind names (``"ReLU"``), at most MAX_CHAIN, given
    as one of them or a list or tuple of them. Errors name ``where`` and the argument."""
    if given is None:
        return ()
    if isinstance(given, (str, PostOp)):
        given = [given]
    if not isinstance(given, (list, tuple)):
        msg = (f"{where}: argument 'post_ops' expected a list of PostOp objects or kind names, "
               f"got {type(given).__name__} {short_repr(given)}")
        raise TypeError(msg)
    chain = []
    for p in given:
        if isinstance(p, str):
            try:
                p = PostOp(p)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{where}: argument 'post_ops': {e}") from None
        elif not isinstance(p, PostOp):
            _bad(where, p)
        chain.append(p)
    if len(chain) > MAX_CHAIN:
        msg = (f"{where}: argument 'post_ops' expected at most {MAX_CHAIN} post-ops (what oneDNN 3.2 "
               f"fuses after a ConvTranspose), got {len(chain)}")
        raise ValueError(msg)
    return tuple(chain)


def _bad(where: str, p: Any) -> NoReturn:
    msg = f"{where}: argument 'post_ops' expected PostOp objects or kind names, got {short_repr(p)}"
    raise TypeError(msg)

"""Deterministic input data, filled as benchdnn fills deconvolution problems (spec 10).

Every input is integers drawn uniformly from a range that depends on the graph dtype and the
tensor's kind (benchdnn's table):

=====  ===========  ===========  ==========  ==============
dtype  SRC          WEI          BIA         DST / diff_dst
=====  ===========  ===========  ==========  ==============
f32    [-32, 32]    [-32, 32]    [-8, 8]     [-8, 8]
bf16   [-4, 4]      [-8, 8]      [-8, 8]     [-4, 4]
f16    [-4, 4]      [-2, 2]      [-8, 8]     [-4, 4]
=====  ===========  ===========  ==========  ==============

The two tensors multiplied together (fwd: src x weights, bwd_d: diff_dst x weights,
bwd_w: src x diff_dst) are narrowed by halving, alternately, until one product fits the
output dtype exactly (``2**digits / (max|a| * max|b|) >= 1``, digits = 24 for f32, 8 bf16,
11 f16). The activation input (src for fwd, diff_dst for the backward ops) is then made
sparse with density ``min(1, safe_n_acc / n_acc)``, where ``safe_n_acc = 2**digits /
(max|a| * max|b|)`` and ``n_acc`` is the number of products summed into one output element
(fwd: IC/G * kernel, bwd_d: OC/G * kernel, bwd_w: N * src spatial size). So sums are small
integers, exact in f32 accumulation and usually exactly representable in the output dtype:
the result can be compared with the reference exactly. The first element of every 64 is
made non-zero and positive so that no tensor is all zeros.

Each tensor's values come from a NumPy generator seeded by (role, dtype, shape): the same
case always gets the same data.

The fill draws float64 values (about 40 bytes per element at its peak): the runner fills a
case only after its memory estimate (:func:`.memory.memory_estimate`, which counts these
draws) is under the memory limit, and only cases whose ranks and dtypes were checked.

Pattern cases (a ConvTranspose with post-ops, or int8) are filled by :func:`pattern_plan`;
its docstring says how (these ranges are ours, chosen so that results are exact and not all
saturated, not benchdnn's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .. import shapes
from ..dtypes import FLOAT_DTYPES, SHAPE_DTYPE
from .model import Case, TensorSpec

#: dtype -> data kind -> (min, max)
RANGES: dict[str, dict[str, tuple[int, int]]] = {
    "f32": {"src": (-32, 32), "wei": (-32, 32), "bia": (-8, 8), "dst": (-8, 8)},
    "bf16": {"src": (-4, 4), "wei": (-8, 8), "bia": (-8, 8), "dst": (-4, 4)},
    "f16": {"src": (-4, 4), "wei": (-2, 2), "bia": (-8, 8), "dst": (-4, 4)},
}
#: Significand bits of each dtype (integers up to 2**digits are exact).
DIGITS = {"f32": 24, "bf16": 8, "f16": 11}
#: data kind of each input role
KIND_OF_ROLE = {"src": "src", "weights": "wei", "bias": "bia", "diff_dst": "dst"}
#: per op: the two data kinds multiplied, the sparse one first
PRODUCTS = {
    "ConvTranspose": ("src", "wei"),
    "ConvTransposeBackwardData": ("dst", "wei"),
    "ConvTransposeBackwardWeights": ("dst", "src"),
}
CHUNK = 64
_SEED = 20230723
_ROLE_SEEDS = {"src": 1, "weights": 2, "bias": 3, "diff_dst": 4}


@dataclass(frozen=True)
class FillPlan:
    """Ranges and density of a case's inputs."""

    ranges: dict[str, tuple[int, int]]
    sparse: str
    density: float
    n_acc: int
    safe_n_acc: int


def _abs_max(r: tuple[int, int]) -> int:
    return max(abs(r[0]), abs(r[1]), 1)


def accumulation_length(case: Case) -> int:
    """Products summed into one output element (benchdnn's ``n_acc``, an upper bound)."""
    attrs, by_role = case.attrs, {t.role: t for t in case.inputs}
    df = attrs.get("data_format") or "NXC"
    wf = attrs.get("weights_format") or "XOI"
    g = int(attrs.get("groups") or 1)
    if case.kind == "ConvTransposeBackwardWeights":
        n, _, xs = shapes.split_activation(by_role["src"].shape or (), df)
        return max(1, n * math.prod(xs))
    i, o, kernel = shapes.split_weights(by_role["weights"].shape or (), wf)
    per_group = i // g if case.kind == "ConvTranspose" else o
    return max(1, per_group * math.prod(kernel))


def plan(case: Case, digits: Optional[int] = None) -> FillPlan:
    """The ranges and density benchdnn would use for ``case`` (see the module docstring);
    ``digits``: exact bits to fit the products and sums in, instead of the dtype's."""
    assert case.kind is not None and case.dtype is not None
    dtype = case.dtype
    ranges = dict(RANGES[dtype])
    digits = DIGITS[dtype] if digits is None else digits
    a, b = PRODUCTS[case.kind]
    kinds = [a, b]
    turn = 0
    while (1 << digits) // (_abs_max(ranges[a]) * _abs_max(ranges[b])) < 1:
        k = kinds[turn % 2]
        lo, hi = ranges[k]
        ranges[k] = (int(lo / 2), int(hi / 2))
        turn += 1
    safe = (1 << digits) // (_abs_max(ranges[a]) * _abs_max(ranges[b]))
    n_acc = accumulation_length(case)
    return FillPlan(ranges, a, min(1.0, safe / n_acc), n_acc, safe)


def integers(
    shape: Sequence[int], lo: int, hi: int, density: float, seed: Sequence[int]
) -> np.ndarray:
    """Float64 integers in [lo, hi], zero where a draw is over ``density``, the first of
    every 64 elements (row-major) non-zero and positive."""
    rng = np.random.default_rng([_SEED, *seed])
    size = math.prod(shape)
    values = rng.integers(lo, hi, size=size, endpoint=True).astype(np.float64)
    if density < 1.0:
        values[rng.random(size) >= density] = 0.0
    firsts = values[::CHUNK]
    values[::CHUNK] = np.maximum(np.abs(firsts), 1.0)
    return values.reshape(tuple(shape))


def place(values: np.ndarray, dtype: Any, order: Sequence[int]) -> np.ndarray:
    """``values`` converted to ``dtype`` in memory order ``order`` (outermost dim first).

    The result has the logical shape of ``values``; with a non-plain order it is a
    transposed view of a dense buffer (e.g. ``(0, 2, 3, 1)``: NCHW viewed over NHWC memory).
    """
    order = tuple(order) or tuple(range(values.ndim))
    buffer = np.empty([values.shape[i] for i in order], dtype)
    view = buffer.transpose(np.argsort(order))
    with np.errstate(over="ignore", invalid="ignore"):
        view[...] = values.astype(dtype)
    return view


def make_input(case: Case, spec: TensorSpec, fill_plan: FillPlan) -> np.ndarray:
    """The array of one input of ``case``."""
    if spec.role == "weights_shape":
        return np.asarray(spec.values, SHAPE_DTYPE)
    kind = KIND_OF_ROLE[spec.role]
    lo, hi = fill_plan.ranges[kind]
    density = fill_plan.density if kind == fill_plan.sparse else 1.0
    assert spec.shape is not None
    seed = [_ROLE_SEEDS[spec.role], list(FLOAT_DTYPES).index(spec.dtype), *spec.shape]
    return place(integers(spec.shape, lo, hi, density, seed), FLOAT_DTYPES[spec.dtype], spec.order)


def make_inputs(case: Case) -> list[np.ndarray]:
    """Every input of a runnable case, in index order."""
    if case.pattern is not None:
        pp = pattern_plan(case)
        return [make_pattern_input(spec, pp) for spec in case.inputs]
    p = plan(case)
    return [make_input(case, spec, p) for spec in case.inputs]


# -- pattern cases ------------------------------------------------------------------------------

#: Raw values of a quantized input of an int8 pattern (src, weights, a dequantized operand).
INT8_RANGES: dict[str, tuple[int, int]] = {"u8": (0, 10), "s8": (-5, 5)}
#: Integer ranges of the other inputs of a pattern: f32 bias of an int8 pattern (at most), and
#: a binary post-op's float tensor: additive kinds (Add, Subtract, Maximum, Minimum) and
#: magnitudes of multiplicative ones (Multiply, Divide: never 0, either sign).
BIAS_RANGE = (-8, 8)
ADDITIVE_RANGE = (-4, 4)
FACTOR_RANGE = (1, 4)
MULTIPLICATIVE = ("Multiply", "Divide")
#: Post-ops that are exact on integers held exactly in f32, so a chain of them rounds only
#: once (at the end) in the library as in the reference: such float chains are judged
#: exactly; any other kind (Exp, GELU, Divide, LeakyReLU's alpha * x, ...) within a tolerance.
EXACT_POST_OPS = (
    "Abs",
    "Add",
    "Maximum",
    "Minimum",
    "Multiply",
    "ReLU",
    "Round",
    "Square",
    "Subtract",
)
#: Bits of an f32 significand: every intermediate value of an exact chain stays below 2**24.
F32_DIGITS = 24
#: seeds of the pattern roles (post_ops[i]: 5 + i)
_CODES = ("f32", "bf16", "f16", "u8", "s8")


def exact_chain(post_ops: Sequence[Any]) -> bool:
    """Whether a float chain of these post-ops is judged exactly (see EXACT_POST_OPS; a
    Clamp with integer bounds is exact too)."""
    for p in post_ops:
        if p.kind == "Clamp" and all(float(v).is_integer() for v in p.attrs.values()):
            continue
        if p.kind not in EXACT_POST_OPS:
            return False
    return True


@dataclass(frozen=True)
class PatternPlan:
    """Ranges and density of a pattern case's inputs.

    Attributes:
        ranges: role -> (min, max) of the values drawn (raw integers for a quantized input;
            for a multiplicative operand, the magnitudes).
        density: of src (the other inputs are dense).
        zero_points: role -> zero point of its Dequantize: src's sparse zeros are drawn as
            this raw value, so that they dequantize to 0.
        n_acc: products summed into one ConvTranspose output.
        digits: float patterns: the exact bits the ConvTranspose's sums were fitted in.
        target: int8 patterns: the aimed-at spread of the ConvTranspose's output.
    """

    ranges: dict[str, tuple[int, int]]
    density: float
    zero_points: dict[str, int] = field(default_factory=dict)
    n_acc: int = 1
    digits: int = 0
    target: float = 0.0


def _bits(n: float) -> int:
    return max(1, math.ceil(math.log2(abs(n) + 1)))


def _operand_range(kind: str, float_code: Optional[str]) -> tuple[int, int]:
    if kind in MULTIPLICATIVE:
        return FACTOR_RANGE
    if float_code is not None and float_code in RANGES:
        return RANGES[float_code]["dst"]
    return ADDITIVE_RANGE


def _fits(bits: int, case: Case, ranges: dict[str, tuple[int, int]]) -> bool:
    """Whether the ConvTranspose's sums of ``bits`` bits keep every value of the chain exact
    in f32 (the last one may round, once, when dst is f32)."""
    assert case.pattern is not None
    has_bias = any(t.role == "bias" for t in case.inputs)
    steps: list[tuple[str, int]] = [("Add", _bits(_abs_max(ranges["bias"])))] if has_bias else []
    for i, p in enumerate(case.pattern.post_ops):
        r = ranges.get(f"post_ops[{i}]")
        steps.append((p.kind, _bits(_abs_max(r)) if r else 0))
    b = bits
    for n, (kind, ob) in enumerate(steps):
        if kind in ("Add", "Subtract", "Maximum", "Minimum"):
            b = max(b, ob) + 1
        elif kind == "Multiply":
            b += ob
        elif kind == "Square":
            b *= 2
        last = n == len(steps) - 1
        if b > F32_DIGITS and not (last and case.dtype == "f32"):
            return False
    return True


def _rms(lo: int, hi: int, zp: int = 0) -> float:
    values = np.arange(lo, hi + 1, dtype=np.float64) - zp
    return float(np.sqrt(np.mean(values * values)))


def _halve(r: tuple[int, int]) -> tuple[int, int]:
    return (int(r[0] / 2), int(r[1] / 2))


def pattern_plan(case: Case) -> PatternPlan:
    """The fill of a pattern case.

    Float patterns: src, weights and bias as the plain ConvTranspose's (:func:`plan`), with
    fewer exact digits when the chain needs headroom: every intermediate value of a chain of
    exact post-ops (:data:`EXACT_POST_OPS`) then stays an integer below 2**24, so the
    library's f32 steps and the float64 reference agree exactly; a chain with other kinds
    gets sums below 2**6 (no overflow in Exp, values where the functions are not flat).
    A binary post-op's tensor: integers in the dtype's DST range, or magnitudes 1..4 of
    either sign for Multiply/Divide.

    Int8 patterns: raw u8 values in [0, 10], s8 in [-5, 5] (src, weights, dequantized
    operands), f32 operands as above, an f32 bias of small integers. The spread of the
    ConvTranspose's output is aimed at what the Quantize maps into its range without
    saturating (an eighth of its float range), carried back through the post-ops (Square:
    square root; Multiply: divided by the largest factor; Add: minus half the operand): the
    src and weights ranges are halved, alternately, until one product is within that spread,
    then src gets the density that sums about the right number of products (at least two
    on average). src's zeros are its zero point, so they dequantize to 0.
    """
    p = case.pattern
    assert p is not None and case.output is not None
    by_role = {t.role: t for t in case.inputs}
    if not p.int8:
        code = case.output.dtype
        ranges: dict[str, tuple[int, int]] = {}
        for i, post in enumerate(p.post_ops):
            if post.is_binary:
                ranges[f"post_ops[{i}]"] = _operand_range(post.kind, code)
        exact = exact_chain(p.post_ops)
        digits = DIGITS[code] if exact else min(DIGITS[code], 6)
        base = plan(case, digits)
        ranges.update(
            {"src": base.ranges["src"], "weights": base.ranges["wei"], "bias": base.ranges["bia"]}
        )
        while exact and digits > 4 and not _fits(digits, case, ranges):
            digits -= 1
            base = plan(case, digits)
            ranges.update(
                {
                    "src": base.ranges["src"],
                    "weights": base.ranges["wei"],
                    "bias": base.ranges["bia"],
                }
            )
        return PatternPlan(ranges, base.density, n_acc=base.n_acc, digits=digits)

    assert p.src_dequantize is not None and p.weights_dequantize is not None
    src_q, w_q = p.src_dequantize, p.weights_dequantize
    zps = {"src": int(src_q.zps[0])}  # type: ignore[index]
    ranges = {
        "src": INT8_RANGES.get(by_role["src"].dtype, INT8_RANGES["u8"]),
        "weights": INT8_RANGES.get(by_role["weights"].dtype, INT8_RANGES["s8"]),
    }
    q = p.dst_quantize
    if q is not None:
        lo, hi = (0, 255) if q.dtype == "u8" else (-128, 127)
        target = (hi - lo) * abs(float(q.scales[0])) / 8  # type: ignore[index]
    else:
        target = 256.0
    operand_max: dict[str, float] = {}
    for i, post in enumerate(p.post_ops):
        if not post.is_binary:
            continue
        role = f"post_ops[{i}]"
        spec = by_role[role]
        if post.dequantize is not None:
            r = INT8_RANGES.get(spec.dtype, INT8_RANGES["s8"])
            zp, scale = int(post.dequantize.zps[0]), float(post.dequantize.scales[0])  # type: ignore[index]
            operand_max[role] = max(abs(r[0] - zp), abs(r[1] - zp)) * abs(scale)
        else:
            r = _operand_range(post.kind, None)
            operand_max[role] = _abs_max(r)
        ranges[role] = r
    for i in reversed(range(len(p.post_ops))):
        kind = p.post_ops[i].kind
        om = operand_max.get(f"post_ops[{i}]", 0.0)
        if kind == "Square":
            target = math.sqrt(target)
        elif kind == "Multiply":
            target /= max(om, 1.0)
        elif kind in ("Add", "Subtract", "Maximum", "Minimum"):
            target = max(target - om / 2, target / 2)
    if "bias" in by_role:
        bmax = max(1, min(BIAS_RANGE[1], int(target)))
        ranges["bias"] = (-bmax, bmax)
        target = max(target - bmax / 2, target / 2)
    scales = np.asarray(w_q.scales, np.float64)
    w_scale = float(np.sqrt(np.mean(scales * scales)))
    s_scale = abs(float(src_q.scales[0]))  # type: ignore[index]

    def term() -> float:
        return _rms(*ranges["src"], zps["src"]) * s_scale * _rms(*ranges["weights"]) * w_scale

    turn = 0
    while term() > target:
        key = ("src", "weights")[turn % 2]
        other = ("weights", "src")[turn % 2]
        if _abs_max(ranges[key]) > 1:
            ranges[key] = _halve(ranges[key])
        elif _abs_max(ranges[other]) > 1:
            ranges[other] = _halve(ranges[other])
        else:
            break
        turn += 1
    n_acc = accumulation_length(case)
    density = (target / max(term(), 1e-30)) ** 2 / n_acc
    density = min(1.0, max(density, min(1.0, 2.0 / n_acc)))
    return PatternPlan(ranges, density, zps, n_acc=n_acc, target=target)


def make_pattern_input(spec: TensorSpec, pp: PatternPlan) -> np.ndarray:
    """The array of one input of a pattern case."""
    assert spec.shape is not None
    lo, hi = pp.ranges[spec.role]
    seed = [
        _ROLE_SEEDS.get(spec.role, 5 + _operand_index(spec.role)),
        _CODES.index(spec.dtype),
        *spec.shape,
    ]
    if spec.dtype in ("u8", "s8"):
        zp = pp.zero_points.get(spec.role, 0)
        density = pp.density if spec.role == "src" else 1.0
        values = integers(spec.shape, lo - zp, hi - zp, density, seed) + zp  # zeros: the zero point
        info = np.iinfo(np.uint8 if spec.dtype == "u8" else np.int8)
        values = np.clip(values, info.min, info.max)
        return place(values, np.uint8 if spec.dtype == "u8" else np.int8, spec.order)
    density = pp.density if spec.role == "src" else 1.0
    if spec.role.startswith("post_ops[") and lo > 0:  # magnitudes of a factor: either sign
        magnitudes = integers(spec.shape, lo, hi, 1.0, seed)
        signs = np.where(
            np.random.default_rng([_SEED, *seed, 1]).random(magnitudes.shape) < 0.5, -1.0, 1.0
        )
        values = magnitudes * signs
    else:
        values = integers(spec.shape, lo, hi, density, seed)
    return place(values, FLOAT_DTYPES[spec.dtype], spec.order)


def _operand_index(role: str) -> int:
    return int(role[len("post_ops[") : -1]) if role.startswith("post_ops[") else 0

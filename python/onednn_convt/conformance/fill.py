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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import shapes
from ..dtypes import FLOAT_DTYPES, SHAPE_DTYPE
from .cases import Case, TensorSpec

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


def plan(case: Case) -> FillPlan:
    """The ranges and density benchdnn would use for ``case`` (see the module docstring)."""
    assert case.kind is not None and case.dtype is not None
    dtype = case.dtype
    ranges = dict(RANGES[dtype])
    digits = DIGITS[dtype]
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
    p = plan(case)
    return [make_input(case, spec, p) for spec in case.inputs]

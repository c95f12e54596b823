"""Shared test helpers: one problem description (:class:`Config`), its random generator, the
reference results it implies, and the tolerance rule every numeric test uses.

A :class:`Config` is a complete ConvTranspose problem: sizes, every attribute, layouts.
Shapes are derived here from the spec's formulas (spec.md Part II section 4), not from
``onednn_convt.shapes``, so the tests check the package's shape code too. Values come from
``onednn_convt.reference`` (the float64 oracle).

:func:`build_config` draws a configuration through a ``choose(name, options)`` callable,
so one generator serves both seeded NumPy sweeps (:func:`random_config`) and hypothesis
(:func:`configs`), where shrinking works per attribute.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import onednn_convt as oc
from onednn_convt import dtypes, reference

Dims = tuple[int, ...]

#: NumPy dtype of each dtype code the package accepts (spec D10).
DTYPES: dict[str, np.dtype[Any]] = {
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f16": np.dtype(np.float16),
}
#: Unit roundoff-sized epsilon of each dtype code (distance from 1 to the next value).
EPS = {"f32": 2.0**-23, "bf16": 2.0**-7, "f16": 2.0**-10}
AUTO_PADS = ("None", "SAME_UPPER", "SAME_LOWER", "VALID")
LAYOUTS = [(df, wf) for df in ("NCX", "NXC") for wf in ("IOX", "XOI")]
OPS = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")


def benchmark_script(name: str) -> Any:
    """The module of ``benchmarks/<name>.py`` (scripts, not a package), registered in
    ``sys.modules`` under ``name`` (a dataclass in it looks its module up there)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def ek(k: int, d: int) -> int:
    """Effective kernel extent with dilation ``d``."""
    return d * (k - 1) + 1


@dataclass(frozen=True)
class Config:
    """One ConvTranspose problem: sizes and every attribute, one entry per spatial dim.

    ``ic``/``oc`` are the forward src/dst channel counts (full, not per group);
    ``pads_begin``/``pads_end`` are the explicit pads given to the op (ignored when
    ``auto_pad`` is not ``"None"``).
    """

    src: Dims
    kernel: Dims
    n: int = 2
    ic: int = 4
    oc: int = 6
    groups: int = 1
    strides: Dims = ()
    dilations: Dims = ()
    pads_begin: Dims = ()
    pads_end: Dims = ()
    output_padding: Dims = ()
    auto_pad: str = "None"
    data_format: str = "NCX"
    weights_format: str = "IOX"
    bias: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        rank = len(self.src)
        for attr, neutral in (
            ("strides", 1), ("dilations", 1), ("pads_begin", 0), ("pads_end", 0), ("output_padding", 0)
        ):
            value = getattr(self, attr)
            if isinstance(value, int):
                value = (value,) * rank
            elif not value:
                value = (neutral,) * rank
            object.__setattr__(self, attr, tuple(value))

    # -- derived sizes ------------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Number of spatial dims."""
        return len(self.src)

    @property
    def pads(self) -> tuple[Dims, Dims]:
        """Resolved (pads_begin, pads_end): the forward op's rule for every auto_pad (D8)."""
        if self.auto_pad.upper() == "NONE":
            return self.pads_begin, self.pads_end
        if self.auto_pad.upper() == "VALID":
            return (0,) * self.rank, (0,) * self.rank
        begin, end = [], []
        for k, s, d in zip(self.kernel, self.strides, self.dilations):
            total = max(0, ek(k, d) - s)
            b = total // 2 if self.auto_pad.upper() == "SAME_UPPER" else total - total // 2
            begin.append(b)
            end.append(total - b)
        return tuple(begin), tuple(end)

    @property
    def dst(self) -> Dims:
        """Spatial dims of the forward dst: s*(src-1) + ek - pb - pe + output_padding."""
        pb, pe = self.pads
        return tuple(
            s * (x - 1) + ek(k, d) - b - e + p
            for x, k, s, d, b, e, p in zip(
                self.src, self.kernel, self.strides, self.dilations, pb, pe, self.output_padding
            )
        )

    def activation_shape(self, c: int, spatial: Sequence[int]) -> Dims:
        """An activation shape in this config's data_format."""
        return (self.n, c, *spatial) if self.data_format == "NCX" else (self.n, *spatial, c)

    @property
    def src_shape(self) -> Dims:
        return self.activation_shape(self.ic, self.src)

    @property
    def dst_shape(self) -> Dims:
        return self.activation_shape(self.oc, self.dst)

    @property
    def weights_shape(self) -> Dims:
        """IOX = (IC, OC/G, X...), XOI = (X..., OC/G, IC) (spec D4)."""
        o = self.oc // self.groups
        if self.weights_format == "IOX":
            return (self.ic, o, *self.kernel)
        return (*self.kernel, o, self.ic)

    @property
    def valid(self) -> bool:
        """Whether the problem is well formed (positive dst, channels divisible)."""
        return (
            min(self.dst) >= 1
            and self.ic % self.groups == 0
            and self.oc % self.groups == 0
            and all(0 <= p < s for p, s in zip(self.output_padding, self.strides))
        )

    # -- reduction lengths (products summed into one output element) -------------------
    @property
    def fwd_reduction(self) -> int:
        return self.ic // self.groups * math.prod(self.kernel)

    @property
    def bwd_data_reduction(self) -> int:
        return self.oc // self.groups * math.prod(self.kernel)

    @property
    def bwd_weights_reduction(self) -> int:
        return self.n * math.prod(self.src)

    # -- attributes ---------------------------------------------------------------------
    def attrs(self, op: str = "ConvTranspose", *, output_padding: bool | None = None) -> dict[str, Any]:
        """Attributes for the op class ``op`` (library names).

        ``output_padding`` is always given to ConvTranspose; the backward ops get it (D6)
        when ``output_padding`` is True, or by default when it is non-zero.
        """
        a: dict[str, Any] = {
            "strides": self.strides, "pads_begin": self.pads_begin, "pads_end": self.pads_end,
            "dilations": self.dilations, "auto_pad": self.auto_pad, "groups": self.groups,
            "data_format": self.data_format, "weights_format": self.weights_format,
        }
        if output_padding is None:
            output_padding = op == "ConvTranspose" or any(self.output_padding)
        if output_padding:
            a["output_padding"] = self.output_padding
        return a

    def ref_attrs(self) -> dict[str, Any]:
        """Attributes for the reference's backward functions (no output_padding there)."""
        a = self.attrs("ConvTransposeBackwardData", output_padding=False)
        return a

    # -- data and reference results -----------------------------------------------------
    def tensors(self, rng: np.random.Generator, code: str = "f32") -> dict[str, np.ndarray]:
        """Random src, weights, bias and diff_dst in dtype ``code`` (standard normal)."""
        dtype = DTYPES[code]
        return {
            "src": rng.standard_normal(self.src_shape).astype(dtype),
            "weights": rng.standard_normal(self.weights_shape).astype(dtype),
            "bias": rng.standard_normal(self.oc).astype(dtype),
            "diff_dst": rng.standard_normal(self.dst_shape).astype(dtype),
        }

    def ref_forward(self, src: Any, weights: Any, bias: Any = None) -> np.ndarray:
        return reference.conv_transpose(src, weights, bias, **self.attrs())

    def ref_backward_data(self, diff_dst: Any, weights: Any) -> np.ndarray:
        return reference.conv_transpose_backward_data(diff_dst, weights, **self.ref_attrs())

    def ref_backward_weights(self, src: Any, diff_dst: Any) -> np.ndarray:
        return reference.conv_transpose_backward_weights(
            src, diff_dst, self.weights_shape, **self.ref_attrs()
        )

    def with_(self, **changes: Any) -> Config:
        """A copy with some fields changed."""
        return replace(self, **changes)

    def __str__(self) -> str:
        """A compact id, e.g. ``2d-n2-c4x6-g2-x5x4-k3x3-s2x1-d1x1-p0x1-0x2-op0x0-None-NCX-IOX``."""
        dims = lambda v: "x".join(map(str, v))
        return (
            f"{self.rank}d-n{self.n}-c{self.ic}x{self.oc}-g{self.groups}-x{dims(self.src)}"
            f"-k{dims(self.kernel)}-s{dims(self.strides)}-d{dims(self.dilations)}"
            f"-p{dims(self.pads_begin)}-{dims(self.pads_end)}-op{dims(self.output_padding)}"
            f"-{self.auto_pad}-{self.data_format}-{self.weights_format}{'-bias' if self.bias else ''}"
        )


# -- generation -----------------------------------------------------------------------------
Chooser = Callable[[str, Sequence[Any]], Any]


def as_if_on(monkeypatch: Any, arch: str, isa: str) -> None:
    """Make the rules key this process's CPU as ``arch`` at dispatch ISA class ``isa``
    (:func:`onednn_convt.lowering.rules.this_cpu`): the tables and the rules measured apart
    from them (lifted, depth taps) then choose as they would there."""
    from onednn_convt.lowering import rules

    monkeypatch.setattr(rules, "this_cpu", lambda: (arch, isa))


def strided(a: np.ndarray) -> np.ndarray:
    """The same values as every other element of a twice-as-long last axis (other strides)."""
    big = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def spread(arrays: Sequence[Any]) -> list[Any]:
    """A call's arrays of three or more dims :func:`strided`; the others (a bias, None) as given."""
    return [a if a is None or a.ndim < 3 else strided(a) for a in arrays]


def build_config(choose: Chooser, rank: int | None = None, max_tries: int = 20) -> Config:
    """A random valid :class:`Config`, every choice made through ``choose(name, options)``.

    Covers ranks 1-3, groups (incl. depthwise), strides, dilations, asymmetric pads, pads_end
    that crop, output_padding, every auto_pad mode, both data and weights formats, bias.
    Sizes shrink with the rank so one problem stays a few milliseconds.
    """
    rank = rank or choose("rank", (1, 2, 3))
    small = rank == 3
    g_kind = choose("groups", ("1", "2", "3", "depthwise"))
    per_group_ic = choose("ic_per_group", (1, 2, 3))
    per_group_oc = choose("oc_per_group", (1, 2, 3))
    if g_kind == "depthwise":
        groups = choose("depthwise_channels", (2, 3, 4))
        per_group_ic = per_group_oc = 1
    else:
        groups = int(g_kind)
    kernel = tuple(choose(f"kernel{i}", (1, 2, 3) if small else (1, 2, 3, 4, 5)) for i in range(rank))
    strides = tuple(choose(f"stride{i}", (1, 2, 3)) for i in range(rank))
    dilations = tuple(choose(f"dilation{i}", (1, 2) if small else (1, 2, 3)) for i in range(rank))
    src = tuple(choose(f"src{i}", (1, 2, 3, 4) if small else (1, 2, 3, 5, 7, 8)) for i in range(rank))
    auto_pad = choose("auto_pad", ("None", "None", "SAME_UPPER", "SAME_LOWER", "VALID"))
    output_padding = tuple(choose(f"output_padding{i}", tuple(range(s))) for i, s in enumerate(strides))
    # Pads up to the effective kernel, and sometimes a pads_end that crops past it.
    pads_begin = tuple(choose(f"pads_begin{i}", tuple(range(ek(k, d)))) for i, (k, d) in enumerate(zip(kernel, dilations)))
    pads_end = tuple(choose(f"pads_end{i}", tuple(range(ek(k, d) + 3))) for i, (k, d) in enumerate(zip(kernel, dilations)))
    cfg = Config(
        src=src, kernel=kernel, n=choose("n", (1, 2)), ic=groups * per_group_ic,
        oc=groups * per_group_oc, groups=groups, strides=strides, dilations=dilations,
        pads_begin=pads_begin, pads_end=pads_end, output_padding=output_padding,
        auto_pad=auto_pad, data_format=choose("data_format", ("NCX", "NXC")),
        weights_format=choose("weights_format", ("IOX", "XOI")), bias=choose("bias", (False, True)),
    )
    # Crops that leave nothing: shrink the pads (keeps every other choice).
    while not cfg.valid and max_tries > 0:
        cfg = cfg.with_(pads_end=tuple(max(0, p - 1) for p in cfg.pads_end),
                        pads_begin=tuple(max(0, p - 1) for p in cfg.pads_begin))
        max_tries -= 1
    assert cfg.valid, cfg
    return cfg


def random_config(rng: np.random.Generator, rank: int | None = None) -> Config:
    """A random valid :class:`Config` from a NumPy generator (seeded sweeps)."""
    return build_config(lambda _name, options: options[int(rng.integers(len(options)))], rank)


def configs(rank: int | None = None) -> Any:
    """A hypothesis strategy of valid :class:`Config` objects (shrinks attribute by attribute)."""
    from hypothesis import strategies as st

    @st.composite
    def strategy(draw: Any) -> Config:
        return build_config(lambda _name, options: draw(st.sampled_from(list(options))), rank)

    return strategy()


def seeded_configs(count: int, seed: int, rank: int | None = None) -> list[Config]:
    """``count`` random configurations from ``seed`` (for ``pytest.mark.parametrize``)."""
    rng = np.random.default_rng(seed)
    return [random_config(rng, rank) for _ in range(count)]


# -- what this CPU runs natively ------------------------------------------------------------
def int8_fuses() -> bool:
    """Whether an int8 graph fuses into the library here: without VNNI every int8 call takes
    the guard ``int8_without_vnni``'s route (the op in f32, the rest in NumPy; docs/deviations.md)."""
    from onednn_convt.post_ops import INT8_WITHOUT_VNNI

    return oc.guards.dispatch_isa() not in INT8_WITHOUT_VNNI


def native(code: str, op: str = "ConvTranspose") -> bool:
    """Whether ``op`` has native kernels for the dtype ``code`` on this CPU (else the package
    computes it in f32: the lowering's name ends in " (f32 emulation)")."""
    return bool(oc.info()["dtypes"][op][code] == "native")


#: the end of a lowering's name where the package computes a low-precision dtype in f32
EMULATION = " (f32 emulation)"


def lowering_here(want: str, code: str, op: str = "ConvTranspose") -> str:
    """The lowering name ``want`` of a ``code`` call as this CPU gives it: where ``code`` has
    no native kernels, the same route computed in f32 ends in :data:`EMULATION`."""
    return want if native(code, op) or want.endswith(EMULATION) else want + EMULATION


def require_native(code: str, op: str = "ConvTranspose") -> None:
    """Skip a test of a route that only a CPU with native ``code`` kernels takes."""
    import pytest

    if not native(code, op):
        pytest.skip(f"{op} computes {code} in f32 on this CPU (no native kernels)")


# -- tolerance ------------------------------------------------------------------------------
def emulated_dtype() -> np.dtype[Any]:
    """A low-precision dtype ConvTranspose computes in f32 on this CPU (f16 first): for tests
    of the emulation itself. Skips the test on a CPU with native bf16 and f16 kernels."""
    import pytest

    support = oc.info()["dtypes"]["ConvTranspose"]
    for code in ("f16", "bf16"):
        if support[code] == "emulated":
            return dtypes.FLOAT_DTYPES[code]
    pytest.skip("every dtype has a native kernel on this CPU")


def tolerance(code: str, reduction: int) -> float:
    """Largest accepted ``max|got - ref| / max|ref|`` for an output of dtype ``code``.

    One rounding of the output to ``code`` (``EPS[code]``), plus f32 accumulation error that
    grows with the reduction length (products summed per output element), with margin.
    """
    return EPS[code] + 8 * max(1, reduction) * EPS["f32"]


def assert_close(got: Any, ref: Any, code: str, reduction: int, what: str = "",
                 magnitude: Any = None) -> None:
    """Assert ``got`` matches the float64 ``ref`` within :func:`tolerance` (same shape),
    relative to ``max|ref|`` or, if given, to ``max|magnitude|``: the reference on the
    inputs' absolute values (the sum of |products|, which bounds the accumulation error
    where the products cancel)."""
    got64 = np.asarray(got, dtype=np.float64)
    ref64 = np.asarray(ref, dtype=np.float64)
    assert got64.shape == ref64.shape, f"{what}: shape {got64.shape} != reference {ref64.shape}"
    assert np.all(np.isfinite(got64)), f"{what}: non-finite values in the result"
    scale = float(np.max(np.abs(ref64 if magnitude is None else np.asarray(magnitude, np.float64)))) if ref64.size else 0.0
    np.testing.assert_allclose(
        got64, ref64, rtol=0, atol=tolerance(code, reduction) * scale, err_msg=what
    )


def assert_lowering_matches(instance: Any, low: Any, arrays: Sequence[Any], ref: Any, code: str, reduction: int,
                            what: str = "") -> None:
    """The op ``instance``'s plan of the lowering ``low`` on ``arrays``, allocated and into a
    NaN-filled out=, within tolerance of ``ref``."""
    got = instance._target().plan(low, arrays, None, code).run(arrays, None)
    out = np.full(ref.shape, np.nan, got.dtype)
    into = instance._target().plan(low, arrays, out, code).run(arrays, out)
    assert into is out
    for result in (got, into):
        assert_close(result, ref, code, reduction, what)


def rounded(x: np.ndarray, code: str) -> np.ndarray:
    """``x`` rounded to dtype ``code`` (what the op sees), returned as that dtype."""
    return np.asarray(x).astype(DTYPES[code])


def inner(a: Any, b: Any) -> float:
    """<a, b> in float64."""
    return float(np.vdot(np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()))


# -- hand-picked cases covering the attribute space -----------------------------------------
def _case(name: str, src: Dims, kernel: Dims, **kw: Any) -> Config:
    return Config(src=src, kernel=kernel, name=name, **kw)


#: Named configurations every op is checked on (ids name what each covers).
CASES: list[Config] = [
    _case("1d_plain", (7,), (3,)),
    _case("1d_stride2_pads", (7,), (4,), strides=2, pads_begin=1, pads_end=2),
    _case("1d_dilation2_stride3", (5,), (3,), strides=3, dilations=2),
    _case("1d_op", (5,), (3,), strides=3, output_padding=2, pads_begin=1),
    _case("1d_groups2", (6,), (3,), ic=4, oc=6, groups=2, strides=2),
    _case("1d_depthwise", (6,), (3,), ic=4, oc=4, groups=4, strides=2, pads_begin=1),
    _case("1d_crop_pads_end", (6,), (3,), strides=2, pads_end=7),
    _case("1d_crop_pads_begin", (6,), (3,), strides=2, pads_begin=5, pads_end=1),
    _case("1d_kernel1", (5,), (1,), strides=2),
    _case("1d_kernel_lt_stride", (5,), (2,), strides=3, output_padding=1),
    _case("2d_plain", (5, 4), (3, 3)),
    _case("2d_asym", (5, 4), (3, 2), strides=(2, 1), pads_begin=(0, 1), pads_end=(2, 0)),
    _case("2d_dilated", (4, 5), (3, 2), dilations=(2, 3), strides=(1, 2), pads_begin=(1, 0)),
    _case("2d_op", (4, 4), (3, 3), strides=(2, 3), output_padding=(1, 2), pads_begin=1, pads_end=1),
    _case("2d_groups3_bias", (4, 5), (2, 3), ic=6, oc=9, groups=3, strides=2, bias=True),
    _case("2d_depthwise_dil", (5, 5), (3, 3), ic=3, oc=3, groups=3, dilations=2, pads_begin=2, pads_end=1),
    _case("2d_same_upper", (5, 6), (3, 4), strides=2, auto_pad="SAME_UPPER"),
    _case("2d_same_lower_dil", (5, 5), (3, 3), strides=2, dilations=2, auto_pad="SAME_LOWER"),
    _case("2d_valid_op", (5, 5), (3, 2), strides=2, auto_pad="VALID", output_padding=(1, 0)),
    _case("2d_same_upper_op", (5, 5), (3, 3), strides=2, auto_pad="same_upper", output_padding=1),
    _case("2d_nxc_xoi", (5, 4), (3, 3), strides=2, data_format="NXC", weights_format="XOI", bias=True),
    _case("2d_nxc_iox_groups", (4, 4), (2, 2), ic=4, oc=2, groups=2, data_format="NXC"),
    _case("2d_ncx_xoi_dil", (4, 4), (2, 3), dilations=(3, 1), strides=2, weights_format="XOI"),
    _case("3d_plain", (3, 3, 3), (2, 2, 2)),
    _case("3d_mixed", (3, 2, 4), (2, 3, 1), strides=(2, 1, 3), dilations=(1, 2, 1),
          pads_begin=(1, 0, 0), pads_end=(0, 2, 1), output_padding=(1, 0, 2)),
    _case("3d_groups_nxc_xoi", (2, 3, 3), (3, 2, 2), ic=4, oc=6, groups=2, strides=2,
          data_format="NXC", weights_format="XOI", bias=True),
    _case("3d_same_lower", (3, 3, 2), (3, 3, 3), strides=(2, 2, 1), auto_pad="SAME_LOWER"),
    _case("3d_valid_depthwise", (2, 3, 2), (2, 2, 3), ic=2, oc=2, groups=2, auto_pad="VALID"),
]
CASE_IDS = [c.name for c in CASES]
assert all(c.valid for c in CASES)


def bench_main(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` with stdout and stderr captured and the process's thread counts restored."""
    import contextlib
    import io
    import os

    from onednn_convt.bench.cli import set_threads
    from onednn_convt.cli import main
    from onednn_convt.info import omp_max_threads

    stdout, stderr = io.StringIO(), io.StringIO()
    env, threads = os.environ.get("OMP_NUM_THREADS"), omp_max_threads()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
    finally:
        if threads is not None:
            set_threads(threads)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env
    return code, stdout.getvalue(), stderr.getvalue()

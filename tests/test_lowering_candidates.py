"""Every lowering the autotuner may choose computes the op: each candidate of each named case
(and of cases that reach the rarer candidates) matches the float64 reference in every dtype,
and the candidates list what the rules pick and nothing a guard forbids."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers import CASE_IDS, CASES, OPS, Config, assert_close
from test_numerics import inputs_of, reference

import onednn_convt as oc
from onednn_convt import _core, guards, lowering
from onednn_convt.lowering import base, matmul_tiles, rules

FWD, BWD_D, BWD_W = OPS

#: cases that reach the candidates the named cases do not (or rarely) have
EXTRA = [
    # stride 1, dense and grouped: the flipped-weights Convolution beside the library ops
    Config(src=(5, 4), kernel=(3, 2), pads_begin=(1, 0), pads_end=(0, 1), ic=4, oc=6, name="2d_s1_dense"),
    Config(src=(5, 5), kernel=(3, 3), pads_begin=1, pads_end=1, ic=4, oc=6, groups=2, data_format="NXC",
           weights_format="XOI", bias=True, name="2d_s1_groups_bias"),
    # 1-D, small kernel: the overlap-add MatMul and the frames (kernel <= 8 * stride)
    Config(src=(9,), kernel=(6,), strides=3, pads_begin=2, pads_end=1, ic=5, oc=4, bias=True, name="1d_overlap_add"),
    Config(src=(8,), kernel=(16,), strides=8, pads_begin=4, pads_end=4, ic=4, oc=3, data_format="NXC",
           weights_format="XOI", name="1d_hifigan_like"),
    # few output channels, 2-D and 3-D, strided: the MatMul into columns (kernel not a
    # multiple of the stride: zero taps), both layouts and weights orders, a bias
    Config(src=(4, 5), kernel=(5, 3), strides=(2, 3), pads_begin=(2, 1), pads_end=(1, 0), output_padding=(1, 0),
           ic=5, oc=1, bias=True, name="2d_one_channel_columns"),
    Config(src=(3, 2, 4), kernel=(3, 2, 4), strides=(2, 1, 2), pads_begin=(1, 0, 1), pads_end=(0, 1, 2), n=2, ic=4,
           oc=3, data_format="NXC", weights_format="XOI", name="3d_three_channels_columns"),
    # 1-D depthwise: the lifted form (the 2-D problem of height 1), which the rules choose on AVX2
    Config(src=(9,), kernel=(4,), strides=2, pads_begin=1, pads_end=2, ic=4, oc=4, groups=4, data_format="NXC",
           weights_format="XOI", bias=True, name="1d_depthwise"),
    # 3-D depthwise: the depth taps (2-D ops on plane views), per sample (NCX's views swap
    # axes) and per plane, with a tap that reaches every plane and without one, a bias
    Config(src=(3, 4, 3), kernel=(4, 3, 2), strides=(2, 1, 2), dilations=(1, 2, 1), pads_begin=(1, 2, 0),
           pads_end=(2, 0, 1), output_padding=(1, 0, 1), n=2, ic=3, oc=3, groups=3, bias=True,
           name="3d_depthwise_per_sample"),
    Config(src=(5, 3, 3), kernel=(3, 2, 3), strides=(1, 2, 1), pads_begin=(2, 0, 1), pads_end=(2, 1, 1), n=1,
           ic=4, oc=4, groups=4, data_format="NXC", weights_format="XOI", name="3d_depthwise_nxc"),
    Config(src=(2, 3, 2), kernel=(3, 3, 2), strides=(3, 1, 2), dilations=(2, 1, 1), pads_begin=(3, 1, 0),
           pads_end=(4, 1, 0), n=3, ic=2, oc=2, groups=2, data_format="NXC", weights_format="IOX",
           name="3d_depthwise_per_plane"),
    # NCX 3-D depthwise whose NXC problem's taps run over every sample's planes: those taps
    # between reorders (channels-last depth taps), stride 1 with a bias, and k4 s2 p1
    Config(src=(4, 3, 2), kernel=(3, 3, 2), pads_begin=(1, 1, 0), pads_end=(1, 1, 0), n=3, ic=4, oc=4, groups=4,
           bias=True, name="3d_depthwise_ncx_merging"),
    Config(src=(3, 2, 2), kernel=(4, 2, 2), strides=(2, 1, 1), pads_begin=(1, 0, 0), pads_end=(1, 0, 0), n=2,
           ic=2, oc=2, groups=2, name="3d_depthwise_ncx_k4s2"),
    # BackwardWeights as a MatMul over frames with IOX weights and activations in NXC: 2-D src
    # of several positions, dilated (its frames copied as they lie, then transposed)
    Config(src=(3, 4), kernel=(3, 2), strides=2, dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 1), ic=4, oc=5,
           data_format="NXC", weights_format="IOX", name="2d_nxc_iox_frames"),
    # stride = kernel, no pads: the tiles MatMul
    Config(src=(3, 4), kernel=(2, 2), strides=2, ic=5, oc=3, name="2d_tiles"),
    Config(src=(2, 3, 2), kernel=(2, 2, 2), strides=2, ic=3, oc=4, data_format="NXC", weights_format="XOI",
           bias=True, name="3d_tiles_bias"),
    Config(src=(3, 4), kernel=(2, 2), strides=2, ic=5, oc=3, bias=True, name="2d_tiles_bias"),
    # NCX and IOX with no bias: the forward's weights copied so that src is read as stored
    Config(src=(2, 3, 2), kernel=(2, 3, 2), strides=(2, 3, 2), n=2, ic=3, oc=4, name="3d_tiles_ncx"),
    # ... with the weights in the activations' other layout (BackwardData copies them
    # transposed), several samples
    Config(src=(3, 4), kernel=(2, 3), strides=(2, 3), n=3, ic=5, oc=3, weights_format="XOI",
           name="2d_tiles_ncx_xoi"),
    Config(src=(5,), kernel=(4,), strides=4, n=3, ic=4, oc=6, data_format="NXC", weights_format="IOX",
           name="1d_tiles_nxc_iox"),
    # one src position, any stride: the tiles MatMul too (DCGAN's z layer), IOX and XOI, NXC
    # (one 2-D MatMul) and NCX, with a bias
    Config(src=(1, 1), kernel=(4, 4), ic=5, oc=3, bias=True, name="2d_one_position_bias"),
    Config(src=(1, 1), kernel=(4, 3), strides=(1, 2), ic=5, oc=3, data_format="NXC", weights_format="XOI",
           name="2d_one_position_nxc"),
    Config(src=(1, 1), kernel=(2, 3), strides=3, ic=4, oc=6, data_format="NXC", weights_format="IOX", bias=True,
           name="2d_one_position_nxc_iox"),
    Config(src=(1, 1, 1), kernel=(2, 2, 3), ic=3, oc=4, data_format="NXC", weights_format="XOI", bias=True,
           name="3d_one_position_bias"),
    # a dilated 1x1 kernel (dilation changes nothing there): passed on to oneDNN 3.2 it chose
    # jit_bf16_1x1's backward data for the ConvolutionBackwardData candidates, wrong at this
    # size in bf16 (every other output off by up to 5x; torch fuzzer seed 1128203 trial 925)
    Config(src=(5, 6), kernel=(1, 1), n=1, ic=1, oc=3, strides=(1, 2), dilations=(1, 2), output_padding=(0, 1),
           name="2d_1x1_dilated_output_padding"),
    # stride 4 along the last dim alone: each polyphase phase of NCX dst is evenly spaced at
    # a step of 4 elements, which oneDNN 3.2's Reorder writes wrongly (strides.writable;
    # plain fuzzer seed 4001 trial 2209, Polyphase in f32 of bf16: values of 1e37 and NaN)
    Config(src=(15, 15), kernel=(3, 1), n=1, ic=42, oc=42, groups=3, strides=(1, 4), pads_begin=(2, 0),
           pads_end=(1, 0), output_padding=(0, 3), name="2d_ncx_stride4_phases"),
]
ALL = CASES + EXTRA
ALL_IDS = CASE_IDS + [c.name for c in EXTRA]


def op_of(op: str, cfg: Config) -> Any:
    if op == FWD:
        return oc.ConvTranspose(**cfg.attrs())
    if op == BWD_D:
        return oc.ConvTransposeBackwardData(**cfg.attrs(op))
    return oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))


def call_arrays(op: str, cfg: Config, arrays: list[Any]) -> list[Any]:
    """The arrays as an op object's plan takes them (absent optional inputs as None)."""
    if op == FWD:
        return arrays + [None] * (3 - len(arrays))
    if op == BWD_W:
        return arrays + [None]
    return arrays


#: (dtype, threads) of each run: bf16 and f16 on the thread pool under ``-m slow``, so that the
#: default suite keeps its ten minutes (f32 covers the pool, one thread covers every dtype)
DTYPE_THREADS = [pytest.param(code, threads, marks=pytest.mark.slow) if threads == "pool" and code != "f32"
                 else (code, threads) for threads in ("one", "pool") for code in ("f32", "bf16", "f16")]


@pytest.mark.parametrize(("code", "threads"), DTYPE_THREADS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cfg", ALL, ids=ALL_IDS)
def test_every_candidate_matches_the_reference(cfg, op, code, threads):
    """Compiled for one thread (what these small problems get: rules.single_threaded) and
    for the thread pool (what larger problems get)."""
    rng = np.random.default_rng(7)
    arrays = inputs_of(op, cfg.tensors(rng, code), cfg)
    instance = op_of(op, cfg)
    given = call_arrays(op, cfg, arrays)
    problem = instance._problem(given, code)
    names = lowering.candidates(problem)
    assert names[0] == lowering.rule(problem) and len(set(names)) == len(names)
    want = reference(op, cfg, arrays)
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    _core.clear_cache()  # the cache's partitions of these specs may be the other mode's
    for name in names:
        low = lowering.build(problem, name)
        assert low.name == name or low.f32_only  # a guard's route may fall back to f32
        assert low.single_thread == (problem.flops <= rules.SINGLE_THREAD_FLOPS)
        low = replace(low, single_thread=threads == "one")
        got = instance._target().plan(low, given, None, code).run(given, None)
        assert got.dtype == arrays[0].dtype and got.shape == want.shape
        assert_close(got, want, code, reduction, f"{name}: {cfg}")


def test_extra_cases_reach_the_rarer_candidates():
    """The EXTRA cases exist for these candidates: check that they still have them."""
    seen: set[tuple[str, str]] = set()
    for cfg in EXTRA:
        for op in OPS:
            arrays = inputs_of(op, cfg.tensors(np.random.default_rng(0), "f32"), cfg)
            problem = op_of(op, cfg)._problem(call_arrays(op, cfg, arrays), "f32")
            seen.update((op, n) for n in lowering.candidates(problem))
    for wanted in [(FWD, base.FLIPPED_CONVOLUTION), (FWD, base.OVERLAP_ADD), (FWD, base.TILES), (FWD, base.COLUMNS),
                   (FWD, base.CONVOLUTION_BACKWARD_DATA), (BWD_D, base.FRAMES),
                   (BWD_D, base.CONV_TRANSPOSE_BACKWARD_DATA), (BWD_D, base.TILES), (BWD_W, base.FRAMES),
                   (BWD_W, base.CONVOLUTION_BACKWARD_WEIGHTS), (FWD, base.CHANNELS_LAST), (BWD_D, base.CHANNELS_LAST),
                   (BWD_W, base.CHANNELS_LAST), (FWD, base.LIFTED), (BWD_D, base.LIFTED), (BWD_W, base.LIFTED),
                   (FWD, base.DEPTH_TAPS_CHANNELS_LAST), (BWD_D, base.DEPTH_TAPS_CHANNELS_LAST),
                   (BWD_W, base.DEPTH_TAPS_CHANNELS_LAST)]:
        assert wanted in seen, wanted


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
def test_the_tiles_matmul_takes_no_f16_bias(code, fmt):
    """oneDNN 3.2 runs an f16 MatMul with a bias on its reference kernel (6.6 s for a U-Net
    layer on Sapphire Rapids, 3.6 ms without): in f16 the finishing step adds it."""
    cfg = Config(src=(3, 4), kernel=(2, 2), strides=2, ic=5, oc=3, bias=True, data_format=fmt,
                 weights_format="IOX" if fmt == "NCX" else "XOI")
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(0), code), cfg)
    problem = op_of(FWD, cfg)._problem(call_arrays(FWD, cfg, arrays), code)
    low = lowering.build(problem, base.TILES)
    given = low.library_args(call_arrays(FWD, cfg, arrays), emulated=False)
    assert len(given) == (2 if code == "f16" else 3)
    assert (low.finish is not None) == (code == "f16" or fmt == "NCX")


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("src, bias", [((3, 4), False), ((3, 4), True), ((1, 1), False)])
def test_the_ncx_tiles_forward_copies_iox_weights_unless_that_saves_nothing(code, src, bias):
    """In NCX the tiles forward reads src as stored, the IOX weights copied into the
    product's order (1.25-1.44x faster on an AMD Zen4); it reads src through a transposed
    view, the weights as stored, where the MatMul adds the bias (not in f16) or src has one
    position (its result is dst)."""
    cfg = Config(src=src, kernel=(2, 2), strides=2, ic=5, oc=3, bias=bias)
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(0), code), cfg)
    problem = op_of(FWD, cfg)._problem(call_arrays(FWD, cfg, arrays), code)
    low = lowering.build(problem, base.TILES)
    copied = src != (1, 1) and not (bias and code != "f16")
    assert low.prepared_elems == (4 * 3 * 5 if copied else 0)
    weights, cols = low.library_args(call_arrays(FWD, cfg, arrays), emulated=False)[:2]
    if copied:  # W (K*OC, IC) @ cols (N, IC, P): src as stored
        assert weights.shape == (12, 5) and weights.flags.c_contiguous
        assert np.shares_memory(cols, arrays[0]) and cols.flags.c_contiguous


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("data_format", "weights_format", "src", "ic", "oc_", "by_rows"), [
    ("NCX", "IOX", (3, 4), 3, 5, True),  # diff_dst 4*5/3 = 6.7x src's elements: by rows, transposed after
    ("NCX", "IOX", (3, 4), 5, 4, False),  # 16/5 = 3.2x: by columns, the weights' own memory
    ("NCX", "IOX", (1, 1), 3, 5, False),  # one src position: by columns, whatever the sizes
    ("NCX", "XOI", (3, 4), 5, 4, True),  # XOI: by rows, its own memory
    ("NXC", "IOX", (3, 4), 3, 5, False),  # NXC: IOX by columns (src through a transposed view)
    ("NXC", "XOI", (3, 4), 3, 5, True),
])
def test_the_tiles_backward_weights_orientation(code, data_format, weights_format, src, ic, oc_, by_rows):
    """The tiles BackwardWeights multiplies frames (taps*OC, N*P) @ src (N*P, IC) (by rows),
    but src^T (IC, N*P) @ frames (N*P, OC*K) (by columns) for IOX weights in NXC, and in NCX
    where diff_dst has fewer than ROWS_FROM times src's elements or src one position. Both
    give the reference's weights, C-contiguous, into ``out`` too."""
    if (data_format, weights_format, src) == ("NCX", "IOX", (3, 4)):  # the cases stand on each side
        assert (oc_ * 4 >= matmul_tiles.ROWS_FROM * ic) == by_rows
    cfg = Config(src=src, kernel=(2, 2), strides=2, n=2, ic=ic, oc=oc_, data_format=data_format,
                 weights_format=weights_format)
    arrays = inputs_of(BWD_W, cfg.tensors(np.random.default_rng(3), code), cfg)
    given = call_arrays(BWD_W, cfg, arrays)
    instance = op_of(BWD_W, cfg)
    low = lowering.build(instance._problem(given, code), base.TILES)
    assert low.library_shape == ((4 * oc_, ic) if by_rows else (ic, oc_ * 4))
    assert (low.finish is not None) == (by_rows and weights_format == "IOX")  # the transpose
    want = reference(BWD_W, cfg, arrays)
    plan = instance._target().plan(low, given, None, code)
    got = plan.run(given, None)
    assert got.flags.c_contiguous and got.dtype == arrays[0].dtype
    assert_close(got, want, code, cfg.bwd_weights_reduction, str(cfg))
    out = np.full_like(got, np.nan)
    assert plan.run(given, out) is out
    np.testing.assert_array_equal(out.view(np.uint8), got.view(np.uint8))


def test_a_guarded_problem_has_the_guards_lowering_alone():
    """Where a guard is active the tuner has nothing to choose but the guard's route, in
    NCX also run in NXC: BackwardData with stride >= kernel in bf16 on AMX (on other CPUs
    the guard is off and the library ops are candidates again)."""
    cfg = Config(src=(4, 4), kernel=(2, 2), strides=3, ic=4, oc=4)
    arrays = inputs_of(BWD_D, cfg.tensors(np.random.default_rng(0), "bf16"), cfg)
    problem = op_of(BWD_D, cfg)._problem(arrays, "bf16")
    names = lowering.candidates(problem)
    if guards.stride_not_below_kernel("bf16", cfg.kernel, (3, 3)):  # NCX: also the route in NXC
        assert names == [base.ZERO_PADDED_TAPS, base.CHANNELS_LAST]
        assert lowering.build(problem, base.CHANNELS_LAST).guard == guards.AMX_STRIDE_NOT_BELOW_KERNEL.name
    else:
        assert base.CONVOLUTION in names and base.CONV_TRANSPOSE_BACKWARD_DATA in names


def test_unknown_candidate_name_is_a_value_error():
    cfg = CASES[0]
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(0), "f32"), cfg)
    problem = op_of(FWD, cfg)._problem(call_arrays(FWD, cfg, arrays), "f32")
    with pytest.raises(ValueError, match="ConvTranspose: no lowering named 'Nope'"):
        lowering.build(problem, "Nope")


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_channels_last_runs_the_nxc_op_between_reorders(monkeypatch: pytest.MonkeyPatch, op: str, code: str) -> None:
    """An NCX call as its NXC problem's library op, the activations reordered there and the
    result back: the reference's values, into a fresh result and into an out= view of
    other strides, with a bias (a forward's); NXC calls have no such candidate."""
    cfg = Config(src=(5, 6), kernel=(3, 3), strides=2, pads_begin=1, pads_end=0, ic=6, oc=4, groups=2, bias=True,
                 name="2d_channels_last")
    rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: (
        base.CHANNELS_LAST if base.CHANNELS_LAST in lowering.candidates(p, native=native) else rule(p, native=native)))
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(3), code), cfg)
    instance = op_of(op, cfg)
    given = call_arrays(op, cfg, arrays)
    want = reference(op, cfg, arrays)
    got = instance(*given)
    assert "(in NXC, reordered)" in (instance.lowering or ""), instance.lowering  # bf16 under AVX2: emulated
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    assert_close(got, want, code, reduction)
    wide = np.zeros(got.shape[:-1] + (2 * got.shape[-1],), got.dtype)
    view = wide[..., ::2]
    assert instance(*given, out=view) is view
    np.testing.assert_array_equal(np.asarray(view, np.float64), np.asarray(got, np.float64))
    nxc = replace(cfg, data_format="NXC", weights_format="XOI")
    nxc_arrays = inputs_of(op, nxc.tensors(np.random.default_rng(3), code), nxc)
    problem = op_of(op, nxc)._problem(call_arrays(op, nxc, nxc_arrays), code)
    assert base.CHANNELS_LAST not in lowering.candidates(problem)

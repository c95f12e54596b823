"""A 3-D depthwise call as 2-D ops, one per depth tap (onednn_convt.lowering.depth_taps): the
reference's values of the three ops over random geometries, layouts and out= arrays, which
planes each op writes or adds to, and the rule that chooses it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import OPS, Config, as_if_on, assert_close, build_config, spread
from test_lowering_candidates import call_arrays, op_of
from test_numerics import inputs_of, reference

from onednn_convt import lowering
from onednn_convt.lowering import base, depth_taps

#: the shipped rules, kept before the tests' fixture (conftest.hand_rules) takes them out
MEASURED_ON, ELSEWHERE = dict(depth_taps.MEASURED_ON), depth_taps.ELSEWHERE
CHANNELS_LAST_ON = dict(depth_taps.CHANNELS_LAST_ON)

FWD, BWD_D, BWD_W = OPS


def _random_config(rng: np.random.Generator) -> Config:
    """A random valid 3-D depthwise problem (helpers.build_config, its groups drawn depthwise)."""
    return build_config(lambda name, options: "depthwise" if name == "groups" else options[int(rng.integers(len(options)))],
                        rank=3)


def _problem(cfg: Config, code: str = "f32", op: str = BWD_D) -> Any:
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(0), code), cfg)
    return op_of(op, cfg)._problem(call_arrays(op, cfg, arrays), code)


@pytest.fixture
def taps_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every problem with the depth taps runs them (in f32 for bf16/f16)."""
    rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: next(
        (n for n in lowering.candidates(p, native=native) if n.startswith(base.DEPTH_TAPS)), None)
        or rule(p, native=native, phase=phase))


@pytest.mark.usefixtures("taps_everywhere")
@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("seed", range(8))
def test_depth_taps_match_the_reference(seed: int, op: str, code: str) -> None:
    """Random geometries (taps that reach every plane or none does, per sample and per
    plane, a forward's bias or none): a fresh result, an out= full of NaN laid out in
    Fortran order (every window a view of other strides) and the inputs as every other
    element of larger arrays."""
    rng = np.random.default_rng(seed)
    cfg = _random_config(rng)
    while not depth_taps.fits(_problem(cfg, op=op)):
        cfg = _random_config(rng)
    instance = _matches_the_reference(op, cfg, rng, code)
    assert (instance.lowering or "").startswith(base.DEPTH_TAPS), instance.lowering


@pytest.mark.usefixtures("taps_everywhere")
@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("seed", range(10))
def test_strided_forward_taps_that_write_match_the_reference(seed: int, code: str) -> None:
    """Random forwards strided in depth (dilations, pads, output_padding, a bias or none, one
    to three samples): where the taps write the planes no earlier tap met
    (depth_taps._forward_order), the reference's values for a fresh result, an out= in
    Fortran order and strided inputs."""
    rng = np.random.default_rng(300 + seed)
    fixed = {"groups": "depthwise", "stride0": 2 + seed % 2, "n": 1 + seed % 3, "bias": seed % 2 == 0}

    def choose(name: str, options: Any) -> Any:
        return fixed.get(name, options[int(rng.integers(len(options)))])

    def writes(cfg: Config) -> bool:
        p = _problem(cfg, op=FWD)
        return depth_taps.fits(p) and depth_taps._forward_order(p, depth_taps._reach(p)) is not None

    cfg = build_config(choose, rank=3)
    while not writes(cfg):
        cfg = build_config(choose, rank=3)
    instance = _matches_the_reference(FWD, cfg, rng, code)
    phases = instance.last_plan.lowering.phases
    assert any(ph.lowering is not None and not ph.accumulate for ph in phases), instance.lowering


def _matches_the_reference(op: str, cfg: Config, rng: np.random.Generator, code: str) -> Any:
    """The op of ``cfg`` (returned) on random arrays gives the reference's values: a fresh
    result, an out= full of NaN in Fortran order (every window a view of other strides,
    whose ops may add to it differently: a fused sum, onednn_convt.plan.SumPlan) and the
    inputs as every other element of larger arrays."""
    arrays = inputs_of(op, cfg.tensors(rng, code), cfg)
    given = call_arrays(op, cfg, arrays)
    want = reference(op, cfg, arrays)
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    instance = op_of(op, cfg)
    got = instance(*given)
    assert_close(got, want, code, reduction, f"{instance.lowering}: {cfg}")
    out = np.full(got.shape[::-1], np.nan, got.dtype).T
    assert instance(*given, out=out) is out
    assert_close(out, want, code, reduction, f"out= in Fortran order: {cfg}")
    assert_close(instance(*spread(given)), want, code, reduction, f"strided inputs: {cfg}")
    return instance


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("seed", range(4))
def test_channels_last_taps_match_the_reference(monkeypatch: pytest.MonkeyPatch, seed: int, op: str,
                                               code: str) -> None:
    """Random NCX geometries whose NXC taps merge (auto_pad SAME, or k = s): the NXC taps
    between reorders (in f32 for bf16), for a fresh result, an out= full of NaN in Fortran
    order and strided inputs."""
    rng = np.random.default_rng(200 + seed)
    name = base.DEPTH_TAPS_CHANNELS_LAST + ("" if code == "f32" else lowering.IN_F32)
    rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: name if name in lowering.candidates(
        p, native=native) else rule(p, native=native, phase=phase))
    fixed = {"data_format": "NCX", "weights_format": ("IOX", "XOI")[seed % 2], "groups": "depthwise"}

    def choose(key: str, options: Any) -> Any:
        if key == "auto_pad" and seed < 2:
            return ("SAME_UPPER", "SAME_LOWER")[int(rng.integers(2))]
        return fixed.get(key, options[int(rng.integers(len(options)))])

    cfg = build_config(choose, rank=3)
    while name not in lowering.candidates(_problem(cfg, code, op)):
        cfg = build_config(choose, rank=3)
    instance = _matches_the_reference(op, cfg, rng, code)
    assert (instance.lowering or "").endswith("(in NXC, reordered)" + ("" if code == "f32" else " (f32 emulation)"))


def _tiled(kernel: int, stride: int, **geometry: Any) -> Config:
    """An NXC 3-D depthwise layer over 4 planes whose depth geometry is ``geometry``'s."""
    return Config(src=(4, 3, 2), kernel=(kernel, 3, 2), strides=(stride, 1, 1), n=3, ic=4, oc=4, groups=4,
                  data_format="NXC", weights_format="XOI", name=f"k{kernel}s{stride}")


#: NXC layers whose dst has ``s`` planes per src plane (every tap merges samples and planes):
#: taps off every edge, a tap at each edge, dilated and asymmetric ones, output_padding
TILED = [
    _tiled(3, 1).with_(pads_begin=(1, 1, 0), pads_end=(1, 1, 0)),
    _tiled(4, 2).with_(pads_begin=(1, 0, 0), pads_end=(1, 0, 0)),
    _tiled(2, 2),
    _tiled(3, 2).with_(pads_begin=(1, 1, 0), pads_end=(1, 1, 0), output_padding=(1, 0, 0)),
    _tiled(3, 1).with_(dilations=(2, 1, 1), pads_begin=(2, 1, 0), pads_end=(2, 1, 0)),
    _tiled(5, 1).with_(pads_begin=(3, 0, 0), pads_end=(1, 0, 0)),
    _tiled(1, 3).with_(output_padding=(2, 0, 0)),
]


@pytest.mark.usefixtures("taps_everywhere")
@pytest.mark.parametrize("pieces", [False, True], ids=["whole", "pieces"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cfg", TILED, ids=lambda c: f"{c.name}-p{c.pads_begin[0]}{c.pads_end[0]}")
def test_merged_samples_match_the_reference(monkeypatch: pytest.MonkeyPatch, cfg: Config, op: str,
                                            pieces: bool) -> None:
    """Each tap's ops over all samples' planes (a strided forward excepted), in one run or
    (``pieces``: MERGED_BYTES of two planes) in runs of two planes: the reference's values
    for a fresh result, an out= in Fortran order (whose samples and planes do not merge:
    run into a fresh result and copied), an out= of 1 sample, and strided inputs (merged as
    copies). An Inf in the first sample's input stays out of the others' results."""
    if pieces:
        monkeypatch.setattr(depth_taps, "MERGED_BYTES", 2 * 4 * cfg.oc * int(np.prod(cfg.src[1:])))
    rng = np.random.default_rng(7)
    for one in (cfg.with_(n=1), cfg.with_(bias=op == FWD)):  # 3 samples last, for the Inf
        arrays = inputs_of(op, one.tensors(rng), one)
        given = call_arrays(op, one, arrays)
        want = reference(op, one, arrays)
        reduction = {FWD: one.fwd_reduction, BWD_D: one.bwd_data_reduction, BWD_W: one.bwd_weights_reduction}[op]
        instance = op_of(op, one)
        got = instance(*given)
        phases = instance.last_plan.lowering.phases
        runs = [w for ph in phases for w in (ph.out,) + tuple(w for _, w in ph.inputs)
                if isinstance(w, base.View) and w.merged]
        assert bool(runs) is (op != FWD or cfg.strides[0] == 1), instance.lowering
        if runs and pieces:  # runs of at most two planes, not one per tap
            ops = sum(ph.lowering is not None for ph in phases)
            assert ops > cfg.kernel[0] and all(len(range(1 << 30)[w.index[0]]) <= 2 for w in runs), runs
        assert_close(got, want, "f32", reduction, str(one))
        for out in (np.full(got.shape[::-1], np.nan, got.dtype).T, np.full(got.shape, np.nan, got.dtype)):
            assert instance(*given, out=out) is out
            assert_close(out, want, "f32", reduction, f"out= of strides {out.strides}: {one}")
        assert_close(instance(*spread(given)), want, "f32", reduction, f"strided inputs: {one}")
    if op != BWD_W:  # a weights gradient sums over the samples
        assert one.n == 3
        arrays[0][0] = np.inf
        want = reference(op, one, arrays)
        got = instance(*call_arrays(op, one, arrays))
        assert np.isfinite(got[1:]).all()
        assert_close(got[1:], want[1:], "f32", reduction, f"an Inf in sample 0: {one}")


@pytest.mark.usefixtures("taps_everywhere")
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("seed", range(6))
def test_random_merged_runs_match_the_reference(monkeypatch: pytest.MonkeyPatch, seed: int, op: str) -> None:
    """Random NXC geometries whose depth tiles (auto_pad SAME_UPPER/LOWER: s dst planes per
    src plane), three samples, runs cut into pieces of a random number of planes: the
    reference's values, with inputs as every other element of larger arrays."""
    rng = np.random.default_rng(100 + seed)
    fixed = {"data_format": "NXC", "n": 3, "groups": "depthwise"}

    def choose(name: str, options: Any) -> Any:
        if name == "auto_pad":
            return ("SAME_UPPER", "SAME_LOWER")[int(rng.integers(2))]
        return fixed.get(name, options[int(rng.integers(len(options)))])

    cfg = build_config(choose, rank=3)
    while not depth_taps.fits(_problem(cfg, op=op)):
        cfg = build_config(choose, rank=3)
    planes = int(rng.integers(1, 2 * cfg.src[0] + 1))
    monkeypatch.setattr(depth_taps, "MERGED_BYTES", planes * 4 * cfg.oc * int(np.prod(cfg.dst[1:])))
    arrays = inputs_of(op, cfg.tensors(rng), cfg)
    given = call_arrays(op, cfg, arrays)
    want = reference(op, cfg, arrays)
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    instance = op_of(op, cfg)
    assert_close(instance(*given), want, "f32", reduction, str(cfg))
    assert_close(instance(*spread(given)), want, "f32", reduction, f"strided inputs: {cfg}")


def test_each_plane_is_written_once_then_added_to() -> None:
    """The ops of a tap that reaches every plane write them, the others add; where no tap
    reaches every plane, diff_src is zeroed first. Per sample where that takes few enough
    ops (PER_SAMPLE_OPS; NCX: the views swap the channel and plane axes), else per plane."""
    def build(cfg: Config) -> base.Lowering:
        return lowering.build(_problem(cfg), base.DEPTH_TAPS)

    # k4 s2 p1 over 3 planes: taps 1 and 2 reach all three, 0 and 3 two each; 2 samples,
    # NCX: 8 ops per sample against 10 per plane, more than 0.7 times: per plane, tap 1's
    # three ops write, the rest add
    whole = Config(src=(3, 2, 2), kernel=(4, 3, 3), strides=(2, 1, 1), pads_begin=(1, 1, 1), pads_end=(1, 1, 1),
                   n=2, ic=4, oc=4, groups=4, name="whole")
    assert depth_taps.PER_SAMPLE_OPS["NCX"] < 8 / 10
    low = build(whole)
    assert [ph.accumulate for ph in low.phases] == [False] * 3 + [True] * 7
    assert all(ph.fill is None for ph in low.phases)
    assert all(isinstance(ph.out, base.View) and ph.out.axes is None for ph in low.phases)
    # one sample: 4 ops against 10, per sample on swapped views; tap 1's one op writes
    low = build(whole.with_(n=1))
    assert [ph.accumulate for ph in low.phases] == [False] + [True] * 3
    first = low.phases[0]
    assert isinstance(first.out, base.View) and first.out.index[0] == 0 and first.out.axes == (1, 0, 2, 3)
    # in NXC the per-sample views are dense: per sample up to PER_SAMPLE_OPS["NXC"] times the
    # ops (k3 s2 p1 over 3 planes: 5 dst planes, not 2 per src plane, so no tap merges)
    nxc = whole.with_(kernel=(3, 3, 3), data_format="NXC", weights_format="XOI")
    assert depth_taps.PER_SAMPLE_OPS["NXC"] >= 1
    # 2 samples: 6 ops against 7, per sample; 3 samples: 9, per plane
    assert len(build(nxc.with_(n=2)).phases) == 6 and len(build(nxc.with_(n=3)).phases) == 7
    # NXC with 2 dst planes per src plane (k4 s2 p1): each tap is one op over every sample's
    # planes (samples and planes merged); tap 1 writes, the others add, taps 0 and 3 with the
    # planes of their result that met a neighbouring sample zeroed (3 samples: the runs'
    # planes 2 and 5)
    tiled = whole.with_(n=3, data_format="NXC", weights_format="XOI")
    low = build(tiled)
    assert [ph.accumulate for ph in low.phases] == [False, True, True, True]
    assert [ph.zero for ph in low.phases] == [(), (2, 5), (), (2, 5)]
    assert all(isinstance(ph.out, base.View) and ph.out.merged for ph in low.phases)
    assert depth_taps.parts(_problem(tiled)) == 4
    # BackwardWeights merges only the taps that reach every plane (a sum over the run would
    # take the neighbours' products): taps 1 and 2 one op each, taps 0 and 3 per plane (two
    # planes each, against three samples)
    low = lowering.build(_problem(tiled, op=BWD_W), base.DEPTH_TAPS)
    assert [ph.accumulate for ph in low.phases] == [False, True, False, False, False, True]
    assert [isinstance(ph.inputs[0][1], base.View) and ph.inputs[0][1].merged for ph in low.phases] == \
        [False, False, True, True, False, False]
    assert not any(ph.zero for ph in low.phases)
    # k2 s3 p1 over 3 planes: tap 0 reaches planes 1 and 2, tap 1 planes 0 and 1; zeroed,
    # then added to
    none = Config(src=(3, 2, 2), kernel=(2, 3, 3), strides=(3, 1, 1), pads_begin=(1, 1, 1), pads_end=(1, 1, 1),
                  n=4, ic=2, oc=2, groups=2, data_format="NXC", weights_format="XOI", name="none")
    low = build(none)
    assert low.phases[0].lowering is None and low.phases[0].fill == ()
    assert all(ph.accumulate for ph in low.phases[1:])
    # 4 samples x 2 taps = 8 ops per sample against 2 + 2 planes per plane: per plane
    assert depth_taps.parts(_problem(none)) == 4 == len(low.phases) - 1
    assert all(isinstance(ph.out, base.View) and ph.out.axes is None for ph in low.phases[1:])
    # the forward, k4 s2 p1 over 3 planes: taps 1 and 2 meet the even and the odd dst planes
    # (0 2 4, 1 3 5) and write them, taps 0 and 3 meet some of those again and add; no plane
    # is left to fill; the bias is added after the ops (bias_stage)
    low = lowering.build(_problem(whole.with_(bias=True), op=FWD), base.DEPTH_TAPS)
    assert [ph.accumulate for ph in low.phases] == [False] * 6 + [True] * 4
    assert all(ph.fill is None for ph in low.phases) and low.bias_stage
    assert [ph.out.index[-1] for ph in low.phases[:6]] == [0, 2, 4, 1, 3, 5]  # type: ignore[union-attr]
    # taps that tile dst (k2 s2) write every plane; k1 s2 with output_padding 1 leaves the
    # odd planes to zero, each run of them a fill of its own (NCX: the planes' axis is 2)
    tiles = lowering.build(_problem(whole.with_(kernel=(2, 3, 3), pads_begin=(0, 1, 1), pads_end=(0, 1, 1)), op=FWD),
                           base.DEPTH_TAPS)
    assert not any(ph.accumulate or ph.fill is not None for ph in tiles.phases) and not tiles.bias_stage
    sparse = whole.with_(kernel=(1, 3, 3), pads_begin=(0, 1, 1), pads_end=(0, 1, 1), output_padding=(1, 0, 0))
    low = lowering.build(_problem(sparse, op=FWD), base.DEPTH_TAPS)
    fills = [ph.fill for ph in low.phases if ph.lowering is None]
    assert [f.index[2] for f in fills] == [slice(1, 2), slice(3, 4), slice(5, 6)]  # type: ignore[union-attr]
    assert not any(ph.accumulate for ph in low.phases)
    # where a tap meets planes both met and not met before (k2 s2 with dilation 2: taps 0
    # and 1 meet planes 0 2 4 and 2 4 6), dst is filled (the bias, or zeros) first and every
    # op adds to it
    overlap = whole.with_(kernel=(2, 3, 3), dilations=(2, 1, 1), pads_begin=(0, 1, 1), pads_end=(0, 1, 1), bias=True)
    low = lowering.build(_problem(overlap, op=FWD), base.DEPTH_TAPS)
    assert low.phases[0].lowering is None and low.phases[0].fill == () and not low.bias_stage
    assert all(ph.accumulate for ph in low.phases[1:])
    # BackwardWeights: each tap's first op writes its slice of the weights, the others add;
    # a tap that reaches no plane (k5 s1 over one plane, pads 1/1: taps 0 and 4) is zeroed
    low = lowering.build(_problem(whole, op=BWD_W), base.DEPTH_TAPS)
    assert [ph.accumulate for ph in low.phases] == [False, True, False, True, True, False, True, True, False, True]
    lone = whole.with_(src=(1, 2, 2), kernel=(5, 3, 3), strides=1, pads_begin=(1, 1, 1), pads_end=(1, 1, 1))
    low = lowering.build(_problem(lone, op=BWD_W), base.DEPTH_TAPS)
    zeroed = [ph.out for ph in low.phases if ph.lowering is None]
    assert zeroed == [base.View((slice(None), slice(None), t)) for t in (0, 4)]
    assert all(ph.fill == ph.out for ph in low.phases if ph.lowering is None)


def test_which_problems_have_them() -> None:
    """A 3-D depthwise problem of any op, in at most MAX_PARTS ops; f32 itself, bf16/f16 in
    f32 (not for a strict op); not 2-D or grouped problems."""
    cfg = Config(src=(4, 3, 3), kernel=(3, 3, 3), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=4, groups=4)
    assert base.DEPTH_TAPS in lowering.candidates(_problem(cfg))
    bf16 = _problem(cfg, "bf16")
    assert base.DEPTH_TAPS + lowering.IN_F32 in lowering.candidates(bf16)
    assert not any(n.startswith(base.DEPTH_TAPS) for n in lowering.candidates(bf16, native=True))
    for other in (cfg.with_(ic=8, oc=8), Config(src=(4, 3), kernel=(3, 3), strides=2, pads_begin=1, pads_end=1, n=2,
                                                  ic=4, oc=4, groups=4),
                  cfg.with_(n=depth_taps.MAX_PARTS, src=(depth_taps.MAX_PARTS, 3, 3))):
        for op in OPS:
            assert not any(n.startswith(base.DEPTH_TAPS) for n in lowering.candidates(_problem(other, op=op))), other
    for op in (FWD, BWD_W):
        assert base.DEPTH_TAPS in lowering.candidates(_problem(cfg.with_(bias=op == FWD), op=op))


#: (op, data format, kind of layer) -> whether the rules take the depth taps, per CPU; the
#: kinds: "overlapping" (depth kernel 4, stride 2), "tiled" (kernel 2, stride 2), "shallow"
#: (overlapping, fewer src planes than MIN_WEIGHTS_PLANES), "stride1" (kernel 3, stride 1),
#: "k3s2" (kernel 3, stride 2); each CPU's docstring says why
RULES = {
    ("zen3", "avx2"): {
        (BWD_D, "NCX", "tiled"): True, (BWD_D, "NXC", "tiled"): True,
        (FWD, "NXC", "tiled"): True, (FWD, "NCX", "overlapping"): True, (FWD, "NCX", "tiled"): False,
        (BWD_W, "NXC", "overlapping"): True, (BWD_W, "NXC", "tiled"): False,
        (BWD_W, "NXC", "shallow"): False, (BWD_W, "NCX", "overlapping"): False,
    },
    ("zen4", "avx512_core_bf16"): {
        (BWD_D, "NCX", "tiled"): False, (BWD_D, "NCX", "overlapping"): True, (BWD_D, "NXC", "tiled"): True,
        (FWD, "NCX", "stride1"): True, (FWD, "NCX", "k3s2"): False,
        (BWD_W, "NXC", "overlapping"): True, (BWD_W, "NXC", "shallow"): True, (BWD_W, "NXC", "tiled"): True,
        (BWD_W, "NCX", "stride1"): False, (BWD_W, "NCX", "tiled"): False,
    },
    ("zen5", "avx512_core_bf16"): {  # not measured there: where they won on both
        (BWD_D, "NCX", "tiled"): False, (BWD_D, "NCX", "overlapping"): True, (BWD_D, "NXC", "tiled"): True,
        (FWD, "NCX", "stride1"): True, (FWD, "NXC", "stride1"): True, (FWD, "NXC", "overlapping"): False,
        (FWD, "NXC", "tiled"): False,
        (BWD_W, "NXC", "overlapping"): True, (BWD_W, "NXC", "shallow"): False, (BWD_W, "NCX", "stride1"): False,
    },
}


@pytest.mark.parametrize("machine", sorted(RULES))
@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_the_rules_choose_them_where_they_ran_faster(monkeypatch: pytest.MonkeyPatch, code: str,
                                                     machine: tuple[str, str]) -> None:
    """Each CPU where they were measured has its rule (:data:`depth_taps.MEASURED_ON`, keyed
    by microarchitecture and dispatch ISA class as the tables are), and another CPU takes
    them where they won on every one of those (``depth_taps.faster_everywhere``); a bf16
    problem takes them in f32. (The channels-last taps, which come first where their own rule
    takes them, are left out here: the next test.)"""
    monkeypatch.setattr(depth_taps, "MEASURED_ON", dict(MEASURED_ON))
    monkeypatch.setattr(depth_taps, "ELSEWHERE", ELSEWHERE)
    monkeypatch.setattr(depth_taps, "CHANNELS_LAST_ON", {})
    as_if_on(monkeypatch, *machine)
    name = base.DEPTH_TAPS + ("" if code == "f32" else lowering.IN_F32)
    overlapping = Config(src=(4, 3, 3), kernel=(4, 3, 3), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=4,
                         groups=4)
    kinds = {
        "overlapping": overlapping,
        "tiled": overlapping.with_(kernel=(2, 2, 2), pads_begin=(0, 0, 0), pads_end=(0, 0, 0)),
        "shallow": overlapping.with_(src=(depth_taps.MIN_WEIGHTS_PLANES - 1, 3, 3)),
        "stride1": overlapping.with_(kernel=(3, 3, 3), strides=1),
        "k3s2": overlapping.with_(kernel=(3, 3, 3)),
    }
    for (op, fmt, kind), taps in RULES[machine].items():
        cfg = kinds[kind].with_(data_format=fmt, weights_format="XOI" if fmt == "NXC" else "IOX")
        p = _problem(cfg, code, op)
        assert (lowering.rule(p) == name) is taps, (op, fmt, kind, lowering.rule(p))


#: per CPU, the kinds of NCX layer (as in RULES) where the rules take the channels-last depth
#: taps: the Zen4's at a depth stride of 1; no CPU that did not measure them
CHANNELS_LAST_RULES = {
    ("zen4", "avx512_core_bf16"): {"stride1": True, "overlapping": False, "tiled": False},
    ("zen3", "avx2"): {"stride1": False, "overlapping": False},
    ("zen5", "avx512_core_bf16"): {"stride1": False},
}


@pytest.mark.parametrize("machine", sorted(CHANNELS_LAST_RULES))
@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_the_rules_take_the_channels_last_taps_where_they_ran_faster(
        monkeypatch: pytest.MonkeyPatch, code: str, machine: tuple[str, str]) -> None:
    """An NCX problem whose NXC taps merge its samples has the channels-last depth taps
    (in f32 for bf16), which the rules take where they were measured faster
    (``depth_taps.CHANNELS_LAST_ON``), on every op; NXC problems and NCX ones whose NXC
    taps do not merge (a strided forward) lack them."""
    monkeypatch.setattr(depth_taps, "MEASURED_ON", dict(MEASURED_ON))
    monkeypatch.setattr(depth_taps, "ELSEWHERE", ELSEWHERE)
    monkeypatch.setattr(depth_taps, "CHANNELS_LAST_ON", dict(CHANNELS_LAST_ON))
    as_if_on(monkeypatch, *machine)
    name = base.DEPTH_TAPS_CHANNELS_LAST + ("" if code == "f32" else lowering.IN_F32)
    overlapping = Config(src=(4, 3, 3), kernel=(4, 3, 3), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=4,
                         groups=4)
    kinds = {"overlapping": overlapping, "stride1": overlapping.with_(kernel=(3, 3, 3), strides=1),
             "tiled": overlapping.with_(kernel=(2, 2, 2), pads_begin=(0, 0, 0), pads_end=(0, 0, 0))}
    for kind, taken in CHANNELS_LAST_RULES[machine].items():
        for op in OPS:
            p = _problem(kinds[kind], code, op)
            has = name in lowering.candidates(p)
            assert has is (op != FWD or kind == "stride1"), (kind, op)
            assert (lowering.rule(p) == name) is (taken and has), (kind, op, lowering.rule(p))
            nxc = _problem(kinds[kind].with_(data_format="NXC", weights_format="XOI"), code, op)
            assert not any(n.startswith(base.DEPTH_TAPS_CHANNELS_LAST) for n in lowering.candidates(nxc))


def test_a_bf16_forward_follows_the_zen4s_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the Zen4 a strided bf16 forward takes them where the depth kernel is a multiple of
    its stride (the library's native bf16 op is slow there), in either format, and in NXC
    from MIN_BF16_CHANNELS channels; f32 in NXC, and in NCX where the depth kernel is a
    longer multiple of its stride (k4 s2, not k2 s2 or k3 s2)."""
    cfg = Config(src=(4, 3, 3), kernel=(4, 3, 3), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=4, groups=4)
    wide = depth_taps.MIN_BF16_CHANNELS
    for code, fmt, kernel, channels, taps in [
            ("bf16", "NCX", 4, 4, True), ("bf16", "NXC", 3, 4, False), ("bf16", "NXC", 3, wide, True),
            ("bf16", "NCX", 3, wide, False), ("f32", "NCX", 4, 4, True), ("f32", "NCX", 2, 4, False),
            ("f32", "NCX", 3, 4, False), ("f32", "NXC", 3, 4, True)]:
        one = cfg.with_(kernel=(kernel, 3, 3), data_format=fmt, weights_format="XOI" if fmt == "NXC" else "IOX",
                        ic=channels, oc=channels, groups=channels)
        assert depth_taps.faster_on_zen4(_problem(one, code, FWD)) is taps, (code, fmt, kernel, channels)


@pytest.mark.usefixtures("taps_everywhere")
def test_the_native_loop_runs_each_tap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's native loop runs every 2-D op of the plan on its windows (the NCX
    ones swap axes) and says it leaves the sums out."""
    from onednn_convt.bench import peers, suites

    layer = suites.Layer("t", 2, 4, 4, (3, 2, 2), (4, 3, 3), 2, 1, groups=4)
    case = suites.Config("test", layer, "bwd_d", "f32", "NCX").build()
    case.op(*case.args)
    assert (case.op.lowering or "").startswith(base.DEPTH_TAPS)
    calls: list[int] = []
    for plan in case.op.last_plan.plans:
        if plan is not None:
            real = plan.compiled
            monkeypatch.setattr(plan, "compiled", type("Counted", (), {
                "time_loop": lambda self, a, o, k, real=real: (calls.append(k), real.time_loop(a, o, k))[1]})())
    run, note = peers.native_runner(case)
    assert "phases only" in note
    assert run(3) >= 0.0
    assert calls == [3] * sum(p is not None for p in case.op.last_plan.plans)


@pytest.mark.usefixtures("taps_everywhere")
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_constant_weights_take_each_taps_own_slice(fmt: str) -> None:
    """With the weights bound as constant, every tap's 2-D op reads its own slice of them
    (the ops share a signature, each compiles its own constant copy): the forward with a
    bias and BackwardData give the reference's values, call after call; the description
    counts the 2-D ops, not the fill."""
    cfg = Config(src=(4, 3, 3), kernel=(4, 3, 3), strides=2, pads_begin=1, pads_end=1, n=2, ic=4, oc=4, groups=4,
                 bias=True, data_format=fmt, weights_format="IOX" if fmt == "NCX" else "XOI")
    rng = np.random.default_rng(3)
    for op in (FWD, BWD_D):
        arrays = inputs_of(op, cfg.tensors(rng), cfg)
        want = reference(op, cfg, arrays)
        bound = op_of(op, cfg).with_constant_weights(arrays[1])
        rest = [arrays[0]] + arrays[2:]
        for _ in range(3):
            assert_close(bound(*rest), want, "f32", cfg.fwd_reduction if op == FWD else cfg.bwd_data_reduction, op)
        ops = sum(p is not None for p in bound.op.last_plan.plans)
        assert f"({ops} 2-D ops:" in (bound.op.lowering or ""), bound.op.lowering

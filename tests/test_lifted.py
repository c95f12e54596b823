"""A 1-D call run as its 2-D problem of height 1 (onednn_convt.lowering.lifted): the
reference's values in every op, dtype and layout, through the C++ executor on the call's own
arrays, and the rule that chooses it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers import OPS, Config, as_if_on, assert_close, spread
from test_lowering_candidates import call_arrays, op_of
from test_numerics import inputs_of, reference

import onednn_convt as oc
from onednn_convt import _core, lowering, native, plan
from onednn_convt.lowering import base, lifted

FWD, BWD_D, BWD_W = OPS

#: depthwise with every attribute off its default; a grouped and a dense one
CASES = [
    Config(src=(11,), kernel=(4,), strides=2, dilations=2, pads_begin=2, pads_end=0, output_padding=1,
           ic=6, oc=6, groups=6, bias=True, name="1d_depthwise_every_attribute"),
    Config(src=(9,), kernel=(5,), strides=3, pads_begin=1, pads_end=2, ic=8, oc=8, groups=8, data_format="NXC",
           weights_format="XOI", bias=True, name="1d_depthwise_nxc"),
    Config(src=(7,), kernel=(3,), ic=4, oc=6, groups=2, data_format="NXC", weights_format="IOX",
           name="1d_grouped_s1"),
    Config(src=(6,), kernel=(2,), strides=2, ic=3, oc=5, name="1d_dense_tiled"),
]
CASE_IDS = [c.name for c in CASES]


def _reduction(op: str, cfg: Config) -> int:
    return {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]


@pytest.fixture
def lift_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 1-D problem (and polyphase phase) runs lifted."""
    rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: (
        base.LIFTED if base.LIFTED in lowering.candidates(p, native=native) else rule(p, native=native, phase=phase)))


@pytest.mark.usefixtures("lift_everything")
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_lifted_matches_the_reference(cfg: Config, op: str, code: str) -> None:
    """Into a fresh result (three calls: the plan's, then the executor's), into a dense
    out= and into an out= view of other strides; the same arrays as strided views."""
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(5), code), cfg)
    instance = op_of(op, cfg)
    given = call_arrays(op, cfg, arrays)
    want = reference(op, cfg, arrays)
    for _ in range(3):
        got = instance(*given)
        assert "as 2-D" in (instance.lowering or ""), instance.lowering
        assert_close(got, want, code, _reduction(op, cfg), f"{cfg}")
    dense = np.full_like(got, np.nan)
    assert instance(*given, out=dense) is dense
    np.testing.assert_array_equal(np.asarray(dense, np.float64), np.asarray(got, np.float64))
    wide = np.zeros(got.shape[:-1] + (2 * got.shape[-1],), got.dtype)
    assert instance(*given, out=wide[..., ::2]) is not None
    np.testing.assert_array_equal(np.asarray(wide[..., ::2], np.float64), np.asarray(got, np.float64))
    # the arrays as every other element of larger ones: other strides, another signature
    again = instance(*spread(given))
    assert_close(again, want, code, _reduction(op, cfg), f"strided views: {cfg}")


@pytest.mark.usefixtures("lift_everything")
@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_the_executor_takes_the_call_arrays_and_no_others(code: str) -> None:
    """After a lifted call the op's C++ executor runs the next call of the same arrays; a
    call of another length, or of the 2-D arrays themselves (the same memory with a unit
    axis), on the same op object takes its own plan and gets its own shape and values."""
    cfg = Config(src=(11,), kernel=(4,), strides=2, ic=6, oc=6, groups=6, bias=True)
    instance = oc.ConvTranspose(strides=2, groups=6, data_format="NCX", weights_format="IOX")
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(1), code), cfg)
    first = instance(*arrays)
    assert instance._fast is not None and "as 2-D" in (instance.lowering or "")  # the lifted plan's executor
    assert_close(instance(*arrays), reference(FWD, cfg, arrays), code, cfg.fwd_reduction)
    longer = replace(cfg, src=(13,))
    more = inputs_of(FWD, longer.tensors(np.random.default_rng(2), code), longer)
    assert_close(instance(*more), reference(FWD, longer, more), code, longer.fwd_reduction)
    planar = [arrays[0][:, :, None, :], arrays[1][:, :, None, :], arrays[2]]
    two = instance(*planar)
    assert two.shape == first.shape[:2] + (1,) + first.shape[2:]
    np.testing.assert_array_equal(np.asarray(two[:, :, 0], np.float64), np.asarray(first, np.float64))
    assert "as 2-D" not in (instance.lowering or "")


def test_the_executor_refuses_shapes_that_differ_in_more_than_unit_dims() -> None:
    cfg = CASES[3]
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(0), "f32"), cfg)
    given = call_arrays(FWD, cfg, arrays)
    problem = op_of(FWD, cfg)._problem(given, "f32")
    low = lowering.build(problem, base.LIFTED)
    f32 = np.dtype(np.float32)
    compiled = plan.compile_lowering(low, given, None, f32, "f32", False).compiled
    dtypes = [f32] * len(low.inputs)
    shapes = [list(a.shape) for a in arrays]
    native.Executor(compiled, dtypes, f32, call_shapes=shapes, call_out_shape=list(low.out_shape))
    wrong = [shapes[0][:-1] + [shapes[0][-1] + 1], shapes[1]]
    with pytest.raises(ValueError, match="size 1 alone"):
        native.Executor(compiled, dtypes, f32, call_shapes=wrong)
    with pytest.raises(ValueError, match="size 1 alone"):
        native.Executor(compiled, dtypes, f32, call_out_shape=[*low.out_shape, 2])
    # more dtypes (and call shapes) than the op has inputs: refused before any shape is read
    with pytest.raises(ValueError, match="one dtype per input"):
        native.Executor(compiled, dtypes * 2, f32, call_shapes=shapes * 2)
    with pytest.raises(ValueError, match="one call_shapes entry per input"):
        native.Executor(compiled, dtypes, f32, call_shapes=shapes[:1])


def _problem(op: str, cfg: Config, code: str = "f32") -> Any:
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(0), code), cfg)
    return op_of(op, cfg)._problem(call_arrays(op, cfg, arrays), code)


#: the shipped rules, kept before the tests' fixture (conftest.hand_rules) takes them out
MEASURED_ON, ELSEWHERE = dict(lifted.MEASURED_ON), lifted.ELSEWHERE

LIFTS, PHASES = "lifted", "polyphase with lifted phases"
#: (CPU key, dtype) -> (op, kind of layer) -> what the rules do with a 1-D depthwise problem
#: (None: they leave it to the tables); kinds: "overlapping" (k4 s2, NCX), "tiled" (k2 s2,
#: NCX), "nxc" (k5 s3), "stride1" (k3 s1, NCX); each CPU's docstring in lifted.py says why
ZEN3 = {(FWD, "overlapping"): LIFTS, (BWD_D, "overlapping"): LIFTS, (BWD_W, "overlapping"): PHASES,
        (BWD_W, "tiled"): LIFTS, (BWD_D, "tiled"): LIFTS, (FWD, "stride1"): LIFTS}
ZEN4_F32 = {**ZEN3, (BWD_D, "tiled"): None}
ZEN4_BF16 = {(FWD, "overlapping"): None, (FWD, "stride1"): LIFTS, (BWD_D, "overlapping"): LIFTS,
             (BWD_D, "tiled"): None, (BWD_D, "nxc"): LIFTS, (BWD_W, "overlapping"): None,
             (BWD_W, "nxc"): PHASES, (BWD_W, "tiled"): None, (BWD_W, "stride1"): None}
RULES = {
    (("zen3", "avx2"), "f32"): ZEN3, (("zen3", "avx2"), "bf16"): ZEN3,
    (("zen4", "avx512_core_bf16"), "f32"): ZEN4_F32, (("zen4", "avx512_core_bf16"), "bf16"): ZEN4_BF16,
    # not measured there: where it won on both
    (("zen5", "avx512_core_bf16"), "f32"): ZEN4_F32, (("zen5", "avx512_core_bf16"), "bf16"): ZEN4_BF16,
}


@pytest.mark.parametrize("machine,code", sorted(RULES))
def test_the_rules_lift_1d_depthwise_problems_where_they_ran_faster(monkeypatch: pytest.MonkeyPatch,
                                                                    machine: tuple[str, str], code: str) -> None:
    """Each CPU where it was measured has its rule (:data:`lifted.MEASURED_ON`), another CPU
    lifts where it won on all of them; a BackwardWeights whose kernel is longer than its
    stride > 1 runs its polyphase lowering with lifted phases; other problems, and problems
    the rule leaves, go to the tables."""
    monkeypatch.setattr(lifted, "MEASURED_ON", dict(MEASURED_ON))
    monkeypatch.setattr(lifted, "ELSEWHERE", ELSEWHERE)
    as_if_on(monkeypatch, *machine)
    depthwise = CASES[0].with_(bias=False, dilations=1, output_padding=0)  # polyphase takes no dilation
    kinds = {"overlapping": depthwise, "tiled": depthwise.with_(kernel=(2,), pads_begin=0, pads_end=0),
             "nxc": CASES[1].with_(bias=False), "stride1": depthwise.with_(kernel=(3,), strides=1)}
    for (op, kind), want in RULES[machine, code].items():
        p = _problem(op, kinds[kind], code)
        chosen = lowering.rule(p)
        if want == LIFTS:
            assert chosen == base.LIFTED, (op, kind, chosen)
        elif want == PHASES:
            assert chosen.startswith(base.POLYPHASE), (op, kind, chosen)
            low = lowering.build(p, chosen)
            assert low.phases and all(ph.lowering is None or ph.lowering.name == base.LIFTED for ph in low.phases)
        else:
            assert lifted.choice(p, lowering.candidates(p)) is None, (op, kind)
    for other in (CASES[2], CASES[3]):
        assert lifted.choice(_problem(FWD, other, code), [base.LIFTED]) is None
    assert lifted.choice(_problem(FWD, depthwise, code), [base.CONV_TRANSPOSE]) is None


def test_every_1d_problem_with_a_library_op_has_the_lifted_candidate_and_others_do_not() -> None:
    """Not a 2-D problem; not a 1-D one of a 128-tap kernel, which has the MatMul alone (the
    library would take minutes to compile the op), nor one that has a guard's route alone."""
    for cfg in CASES:
        for op in OPS:
            assert base.LIFTED in lowering.candidates(_problem(op, cfg))
    planar = Config(src=(3, 4), kernel=(2, 2), strides=2, ic=4, oc=4, groups=4)
    for op in OPS:
        assert base.LIFTED not in lowering.candidates(_problem(op, planar))
    long = Config(src=(3,), kernel=(130,), strides=65, ic=2, oc=2)
    assert lowering.candidates(_problem(FWD, long)) == [base.OVERLAP_ADD]
    assert not lifted.applies(_problem(FWD, long), [base.OVERLAP_ADD, base.TILES])
    assert lifted.applies(_problem(FWD, long), [base.CONV_TRANSPOSE])


def test_the_lifted_plan_checks_the_library_range_in_2d() -> None:
    """The 32-bit range checks read a lifted call's 1-D arrays with its 2-D attributes."""
    cfg = CASES[0]
    arrays = inputs_of(BWD_W, cfg.tensors(np.random.default_rng(0), "f32"), cfg)
    problem = op_of(BWD_W, cfg)._problem(call_arrays(BWD_W, cfg, arrays), "f32")
    low = lowering.build(problem, base.LIFTED)
    assert len(low.attrs["strides"]) == 2 and low.library_shape == (*cfg.weights_shape[:2], 1, 4)
    _core.clear_cache()
    got = op_of(BWD_W, cfg)._target().plan(low, call_arrays(BWD_W, cfg, arrays), None, "f32").run(
        call_arrays(BWD_W, cfg, arrays), None)
    assert_close(got, reference(BWD_W, cfg, arrays), "f32", cfg.bwd_weights_reduction)


def test_the_plane_problem_has_a_first_dim_of_one() -> None:
    plane = lifted.plane_problem(_problem(FWD, CASES[0]))
    assert plane.kernel == (1, 4) and plane.geometry.strides == (1, 2) and plane.geometry.dilations == (1, 2)
    assert plane.geometry.pads_begin == (0, 2) and plane.geometry.pads_end == (0, 0)
    assert plane.output_padding == (0, 1) and plane.src == (1, 11)
    assert plane.input_shapes[0] == (2, 6, 1, 11) and plane.input_shapes[1] == (6, 1, 1, 4)
    assert plane.out_shape == (2, 6, 1, plane.dst[1])
    nxc = lifted.plane_problem(_problem(BWD_W, CASES[1]))
    assert nxc.input_shapes[0] == (2, 1, 9, 8) and nxc.out_shape == (1, 5, 1, 8)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_conv_transpose1d_depthwise_lifted_matches_torch(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    """The torch drop-in on a 1-D depthwise layer, lifted (the rule on AVX2, forced here on
    any CPU): torch's values and gradients, on the executor's path after the first call."""
    torch = pytest.importorskip("torch")
    from onednn_convt import torch as octorch

    as_if_on(monkeypatch, "zen3", "avx2")
    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 21, generator=gen).to(dt)
    w = torch.randn(8, 1, 5, generator=gen).to(dt)
    b = torch.randn(8, generator=gen).to(dt)
    tol = 1e-5 if dtype == "float32" else 3e-2
    for _ in range(3):
        mine = [t.clone().requires_grad_() for t in (x, w, b)]
        theirs = [t.double().requires_grad_() for t in (x, w, b)]
        got = octorch.conv_transpose1d(*mine, stride=3, padding=2, output_padding=1, groups=8)
        want = torch.nn.functional.conv_transpose1d(*theirs, stride=3, padding=2, output_padding=1, groups=8)
        grad = torch.randn(want.shape, generator=gen, dtype=torch.float64)
        got.backward(grad.to(dt))
        want.backward(grad)
        scale = want.abs().max().item()
        assert got.dtype == dt and (got.double() - want).abs().max().item() <= tol * scale
        for m, t in zip(mine, theirs):
            assert m.grad is not None and t.grad is not None
            assert (m.grad.double() - t.grad).abs().max().item() <= tol * t.grad.abs().max().item()

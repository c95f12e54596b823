"""A phase that adds to the result (``Phase.accumulate``) as its op and an Add fused in the
library, in place (onednn_convt.plan.SumPlan): where the library runs it so, the values are
the reference's and, to an ulp or two, those of the fresh parts NumPy adds; planes a merged
depth tap must not reach keep their values; the benchmark's native loop times the fused
ops."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from helpers import OPS, Config, assert_close, spread
from test_depth_taps import TILED
from test_lowering_candidates import call_arrays, op_of
from test_numerics import inputs_of, reference

from onednn_convt import lowering
from onednn_convt.lowering import base
from onednn_convt.plan import PhasedPlan

FWD, BWD_D, BWD_W = OPS

#: 2-D ops as the library's forward Convolution, which fuses an Add in place (its
#: backward ops and ConvTranspose of few channels do not)
FUSING = ("Convolution", "Convolution (flipped weights)")


@pytest.fixture
def fusing_taps(monkeypatch: pytest.MonkeyPatch) -> None:
    """3-D depthwise problems run the depth taps, their 2-D ops a forward Convolution."""
    rule = lowering.rule

    def chosen(p: Any, native: bool = False, phase: bool = False) -> str:
        names = lowering.candidates(p, native=native)
        want = (base.DEPTH_TAPS,) if p.rank == 3 else FUSING
        return next((n for n in names if n.startswith(want)), None) or rule(p, native=native, phase=phase)

    monkeypatch.setattr(lowering, "rule", chosen)


def assert_numpy_sums(got: np.ndarray, numpy_sums: np.ndarray) -> None:
    """``got`` is NumPy's sums of the same parts, to float32 rounding (a kernel may start
    its sum from the window's values: AVX2's jit_dw, one ulp apart)."""
    scale = float(np.max(np.abs(numpy_sums)))
    np.testing.assert_allclose(got, numpy_sums, rtol=0, atol=4 * np.finfo(np.float32).eps * scale)


def _numpy_sums(instance: Any, given: list[Any]) -> np.ndarray:
    """The same plan's result with its sums made as fresh parts NumPy adds."""
    plan = instance.last_plan
    sums, plan.sums = plan.sums, []
    try:
        return np.array(instance(*given))
    finally:
        plan.sums = sums


#: merged NXC depth taps (k3 s1 p1, k4 s2 p1, k5 s1 p3/1): ops that add over every sample
CASES = [(cfg, op) for cfg in (TILED[0], TILED[1], TILED[5]) for op in (FWD, BWD_D)
         if op == BWD_D or cfg.strides[0] == 1]


@pytest.mark.usefixtures("fusing_taps")
@pytest.mark.parametrize(("cfg", "op"), CASES, ids=[f"{c.name}-{op}" for c, op in CASES])
def test_depth_taps_add_in_the_library(cfg: Config, op: str) -> None:
    """Every op that adds runs fused: the reference's values, NumPy's sums,
    into out= arrays of both orders and from strided inputs; an Inf in sample 0 reaches
    none of the other samples' planes (those the merged run meets are kept, not added to)."""
    rng = np.random.default_rng(3)
    one = cfg.with_(bias=op == FWD)
    arrays = inputs_of(op, one.tensors(rng), one)
    given = call_arrays(op, one, arrays)
    reduction = one.fwd_reduction if op == FWD else one.bwd_data_reduction
    instance = op_of(op, one)
    got = np.array(instance(*given))
    plan = instance.last_plan
    assert isinstance(plan, PhasedPlan) and (instance.lowering or "").startswith(base.DEPTH_TAPS)
    adding = [ph.accumulate for ph in plan.lowering.phases]
    assert any(adding) and [s is not None for s in plan.sums] == adding, instance.lowering
    assert any(ph.zero for ph in plan.lowering.phases), "no planes kept: the case tests nothing of keep"
    want = reference(op, one, arrays)
    assert_close(got, want, "f32", reduction, str(one))
    assert_numpy_sums(got, _numpy_sums(instance, given))
    for out in (np.full(got.shape[::-1], np.nan, got.dtype).T, np.full(got.shape, np.nan, got.dtype)):
        assert instance(*given, out=out) is out
        assert_close(out, want, "f32", reduction, f"out= of strides {out.strides}: {one}")
    assert_close(instance(*spread(given)), want, "f32", reduction, f"strided: {one}")
    arrays[0][0] = np.inf
    want = reference(op, one, arrays)
    hit = np.array(instance(*call_arrays(op, one, arrays)))
    assert any(instance.last_plan.sums)
    assert np.isfinite(hit[1:]).all()
    assert_close(hit[1:], want[1:], "f32", reduction, f"an Inf in sample 0: {one}")


@pytest.mark.usefixtures("fusing_taps")
def test_polyphase_backward_data_adds_in_the_library() -> None:
    """A k4 s2 NXC BackwardData as four stride-1 Convolutions: the three after the first
    add to diff_src fused, NumPy's values and the reference's (in NCX the
    library fuses no in-place Add here: its kernels write blocked layouts)."""
    cfg = Config(src=(5, 6), kernel=(4, 4), strides=(2, 2), pads_begin=(1, 1), pads_end=(1, 1), n=2, ic=16, oc=8,
                 groups=1, data_format="NXC", weights_format="XOI", name="k4s2")
    arrays = inputs_of(BWD_D, cfg.tensors(np.random.default_rng(5)), cfg)
    given = call_arrays(BWD_D, cfg, arrays)
    instance = op_of(BWD_D, cfg)
    plan = instance._target().plan(lowering.build(instance._problem(given, "f32"), base.POLYPHASE), given, None, "f32")
    assert isinstance(plan, PhasedPlan) and len(plan.plans) == 4
    got = plan.run(given, None)
    assert_close(got, reference(BWD_D, cfg, arrays), "f32", cfg.bwd_data_reduction, str(cfg))
    sums, plan.sums = plan.sums, []
    assert_numpy_sums(got, plan.run(given, None))
    if not any(sums):
        pytest.skip("the library fuses no in-place Add after these NXC phases on this CPU")
    assert [s is not None for s in sums] == [False, True, True, True]


@pytest.mark.usefixtures("fusing_taps")
def test_the_native_loop_times_the_fused_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's native loop runs each fused op, on the view it adds to, once per
    loop of a phase that adds, and each other phase's op."""
    from onednn_convt.bench import peers, suites

    layer = suites.Layer("t", 2, 4, 4, (3, 2, 2), (3, 3, 3), 1, 1, groups=4)
    case = suites.Config("test", layer, "bwd_d", "f32", "NXC").build()
    case.op(*case.args)
    plan = case.op.last_plan
    assert any(plan.sums), case.op.lowering
    calls: list[str] = []
    for name, holders in (("op", plan.plans), ("sum", plan.sums)):
        for holder in holders:
            if holder is not None:
                real = holder.compiled
                monkeypatch.setattr(holder, "compiled", type("Counted", (), {
                    "time_loop": lambda self, a, o, k, real=real, name=name: (calls.append(name),
                                                                             real.time_loop(a, o, k))[1]})())
    run, note = peers.native_runner(case)
    assert "NumPy sums" in note
    assert run(2) >= 0.0
    ops = [ph.lowering is not None for ph in plan.lowering.phases]
    assert calls == ["sum" if s is not None else "op" for s, o in zip(plan.sums, ops) if o]

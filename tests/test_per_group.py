"""The per-group lowering (onednn_convt.lowering.per_group): a grouped call as one ungrouped
library op per group on channel slices, against the reference, on random problems of every
op, format and rank, allocated and into a NaN-filled out=."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_close, assert_lowering_matches, random_config

import onednn_convt as oc
from onednn_convt import lowering, reference
from onednn_convt.lowering import base, per_group


def _random_call(rng: np.random.Generator, op: str, code: str):
    """A random grouped call (helpers.random_config: ranks 1-3, strides, dilations, pads,
    output_padding, depthwise among them): (op, arrays, reference, reduction length)."""
    cfg = random_config(rng)
    if cfg.groups < 2:
        return None
    t = cfg.tensors(rng, code)
    if op == "fwd":
        bias = t["bias"] if cfg.bias else None
        ref = cfg.ref_forward(t["src"], t["weights"], bias)
        return oc.ConvTranspose(**cfg.attrs()), [t["src"], t["weights"], bias], ref, cfg.fwd_reduction
    if op == "bwd_w":
        ref = cfg.ref_backward_weights(t["src"], t["diff_dst"])
        op_ = oc.ConvTransposeBackwardWeights(**cfg.attrs("ConvTransposeBackwardWeights"))
        return op_, [t["src"], t["diff_dst"], np.array(cfg.weights_shape)], ref, cfg.bwd_weights_reduction
    ref = cfg.ref_backward_data(t["diff_dst"], t["weights"])
    op_ = oc.ConvTransposeBackwardData(**cfg.attrs("ConvTransposeBackwardData"))
    return op_, [t["diff_dst"], t["weights"]], ref, cfg.bwd_data_reduction


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_d", "bwd_w"])
def test_per_group_matches_the_reference(op: str, code: str):
    rng = np.random.default_rng({"fwd": 1, "bwd_d": 2, "bwd_w": 3}[op] + (10 if code == "bf16" else 0))
    checked = 0
    for _ in range(200):
        call = _random_call(rng, op, code)
        if call is None:
            continue
        instance, arrays, ref, reduction = call
        problem = instance._problem(arrays, code)
        assert (base.PER_GROUP in lowering.candidates(problem)) == per_group.applies(problem)
        assert per_group.applies(problem) == (problem.groups <= per_group.MAX_GROUPS and
                                              (code == "f32" or oc.guards.dispatch_isa() in oc.guards.BF16_NATIVE))
        if not per_group.applies(problem):
            continue
        low = lowering.build(problem, base.PER_GROUP)
        assert len(low.phases) == problem.groups
        assert_lowering_matches(instance, low, arrays, ref, code, reduction, f"{op} {code} {instance}")
        checked += 1
    bf16_native = oc.guards.dispatch_isa() in oc.guards.BF16_NATIVE
    assert checked >= 40 or (code == "bf16" and not bf16_native), checked


def test_the_op_says_it_ran_per_group(monkeypatch):
    real_rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: (
        base.PER_GROUP if per_group.applies(p) else real_rule(p, native=native, phase=phase)))
    op = oc.ConvTranspose(strides=1, groups=4, data_format="NXC", weights_format="XOI")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 5, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3, 2, 8)).astype(np.float32)
    got = op(x, w)
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), groups=4, data_format="NXC",
                                    weights_format="XOI")
    assert_close(got, want, "f32", 2 * 9)
    assert re.fullmatch(r"Per group \(4 groups: .*\)", op.lowering), op.lowering


def test_a_part_is_never_parted_itself(monkeypatch):
    """Where the rules would run a grouped stride-1 phase per group (or a strided group as
    polyphase), the part runs as one op: a plan of parts does not nest (the plain fuzzer's
    drawn lowerings once nested them, and the call failed)."""
    real_rule = lowering.rule

    def parted_first(p, native=False, phase=False):
        names = lowering.candidates(p, native=native)
        for name in (base.PER_GROUP, base.POLYPHASE):
            if name in names:
                return name
        return real_rule(p, native=native, phase=phase)

    monkeypatch.setattr(lowering, "rule", parted_first)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 8, 5, 5)).astype(np.float32)
    w = rng.standard_normal((8, 2, 4, 4)).astype(np.float32)
    for name in (base.POLYPHASE, base.PER_GROUP):
        op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, groups=4, data_format="NCX", weights_format="IOX")
        problem = op._problem([x, w, None], "f32")
        low = lowering.build(problem, name)
        assert low.phases and all(ph.lowering is None or not ph.lowering.phases for ph in low.phases)
        got = op._target().plan(low, [x, w, None], None, "f32").run([x, w, None], None)
        want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), strides=2, pads_begin=1,
                                        pads_end=1, groups=4, data_format="NCX", weights_format="IOX")
        assert_close(got, want, "f32", 2 * 16)

"""dtypes (spec D10): f32, bf16 (ml_dtypes.bfloat16), f16 on all three ops.

Inputs are drawn in float64 and rounded to the dtype; the reference is computed from the
rounded values, and the tolerance is one rounding of the output plus f32 accumulation error
scaled by the reduction length. Where ``info()`` says a dtype is emulated, the op computes
in f32 and rounds, so the result must equal the f32 op's result rounded, exactly.
"""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, DTYPES, OPS, Config, assert_close, seeded_configs
from onednn_convt import guards
from onednn_convt.lowering import rules

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

CODES = list(DTYPES)
SUPPORT = oc.info()["dtypes"]
PICKED = [CASES[CASE_IDS.index(n)] for n in ("1d_op", "2d_groups3_bias", "2d_same_lower_dil", "3d_mixed")]
PICKED += seeded_configs(4, seed=505)


def run(op: str, cfg: Config, t: dict[str, np.ndarray], **extra):
    """(result, op object, reference in float64, reduction length)."""
    if op == "ConvTranspose":
        obj = oc.ConvTranspose(**cfg.attrs(), **extra)
        b = t["bias"] if cfg.bias else None
        return obj(t["src"], t["weights"], b), obj, cfg.ref_forward(t["src"], t["weights"], b), cfg.fwd_reduction
    if op == "ConvTransposeBackwardData":
        obj = oc.ConvTransposeBackwardData(**cfg.attrs(op), **extra)
        return obj(t["diff_dst"], t["weights"]), obj, cfg.ref_backward_data(t["diff_dst"], t["weights"]), cfg.bwd_data_reduction
    obj = oc.ConvTransposeBackwardWeights(**cfg.attrs(op), **extra)
    got = obj(t["src"], t["diff_dst"], cfg.weights_shape)
    return got, obj, cfg.ref_backward_weights(t["src"], t["diff_dst"]), cfg.bwd_weights_reduction


def test_info_reports_every_op_and_dtype():
    assert set(SUPPORT) == set(OPS)
    for op in OPS:
        assert set(SUPPORT[op]) == set(CODES)
        assert set(SUPPORT[op].values()) <= {"native", "emulated"}
        assert SUPPORT[op]["f32"] == "native"


@pytest.mark.parametrize("cfg", PICKED, ids=str)
@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("op", OPS)
def test_matches_reference_from_rounded_inputs(op, code, cfg):
    t = cfg.tensors(np.random.default_rng(61), code)
    got, obj, ref, reduction = run(op, cfg, t)
    assert got.dtype == DTYPES[code]
    # also emulated: where a guard routes the problem to f32, away from a known-bad kernel
    # of this CPU (test_guards.py checks where each guard applies), or a rule away from a
    # far slower one (rules.f16_backward_weights_in_f32)
    emulated = SUPPORT[op][code] == "emulated" or obj.last_plan.lowering.f32_only
    assert obj.last_plan.emulated is emulated
    assert ("(f32 emulation)" in obj.lowering) is emulated
    assert_close(got, ref, code, reduction, f"{op} {code} {cfg}")
    if emulated:  # computed in f32 on the same values, then rounded to nearest even
        t32 = {k: v.astype(np.float32) for k, v in t.items()}
        want, *_ = run(op, cfg, t32)
        np.testing.assert_array_equal(got, want.astype(DTYPES[code]))


@pytest.mark.parametrize("code", CODES)
@pytest.mark.parametrize("op", OPS)
def test_strict_raises_where_emulated(op, code):
    cfg = PICKED[1]
    t = cfg.tensors(np.random.default_rng(62), code)
    if SUPPORT[op][code] == "emulated":
        with pytest.raises(oc.UnsupportedError, match=f"{op}: oneDNN has no {code} kernel") as info:
            run(op, cfg, t, strict=True)
        assert info.value.status == 3 and isinstance(info.value, oc.OneDNNError)
    else:
        got, obj, ref, reduction = run(op, cfg, t, strict=True)
        # in f32 only where a guard keeps it away from a known-bad kernel of this CPU, or
        # a rule from a far slower one (rules.f16_backward_weights_in_f32): strict allows both
        assert obj.last_plan.emulated is obj.last_plan.lowering.f32_only
        slow_rule = op == OPS[2] and code == "f16" and guards.dispatch_isa() in rules.SLOW_F16_BACKWARD_WEIGHTS
        if obj.last_plan.lowering.f32_only:
            assert obj.guard is not None or slow_rule
        assert obj.last_plan.lowering.f32_only or not slow_rule
        assert_close(got, ref, code, reduction)


@pytest.mark.parametrize("code", ["bf16", "f16"])
def test_out_in_low_precision(code):
    cfg = PICKED[1]
    t = cfg.tensors(np.random.default_rng(63), code)
    op = oc.ConvTranspose(**cfg.attrs())
    want = op(t["src"], t["weights"], t["bias"])
    dense = np.zeros(cfg.dst_shape, DTYPES[code])
    assert op(t["src"], t["weights"], t["bias"], out=dense) is dense
    np.testing.assert_array_equal(dense, want)
    big = np.zeros((*cfg.dst_shape[:-1], cfg.dst_shape[-1] * 2), DTYPES[code])
    strided = big[..., ::2]  # a non-contiguous out
    op(t["src"], t["weights"], t["bias"], out=strided)
    np.testing.assert_array_equal(strided, want)
    assert not big[..., 1::2].any()


MIXED = [("f32", "bf16"), ("f32", "f16"), ("bf16", "f16"), ("f16", "f32")]


@pytest.mark.parametrize(("first", "second"), MIXED)
@pytest.mark.parametrize("op", OPS)
def test_mixed_dtypes_raise_type_error(op, first, second):
    cfg = PICKED[0]
    t1, t2 = cfg.tensors(np.random.default_rng(64), first), cfg.tensors(np.random.default_rng(64), second)
    names = {"ConvTranspose": ("src", "weights"), "ConvTransposeBackwardData": ("diff_dst", "weights"),
             "ConvTransposeBackwardWeights": ("src", "diff_dst")}[op]
    t = {**t1, names[1]: t2[names[1]]}
    with pytest.raises(TypeError, match=f"{op}: every float tensor of a call must have one dtype") as info:
        run(op, cfg, t)
    assert f"{names[1]}={second}" in str(info.value)


@pytest.mark.parametrize("code", CODES)
def test_bias_must_match_the_data_dtype(code):
    cfg = PICKED[1]
    t = cfg.tensors(np.random.default_rng(65), code)
    other = "f16" if code != "f16" else "bf16"
    with pytest.raises(TypeError, match=f"bias={other}"):
        oc.ConvTranspose(**cfg.attrs())(t["src"], t["weights"], t["bias"].astype(DTYPES[other]))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int8, np.complex64, np.bool_])
@pytest.mark.parametrize("op", OPS)
def test_other_dtypes_raise_type_error(op, dtype):
    cfg = PICKED[0]
    t = {k: v.astype(dtype) for k, v in cfg.tensors(np.random.default_rng(66)).items()}
    with pytest.raises(TypeError, match=f"{op}: argument '.*' expected dtype numpy.float32"):
        run(op, cfg, t)

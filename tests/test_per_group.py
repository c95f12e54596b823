"""The per-group lowering (onednn_convt.lowering.per_group): a grouped call as one ungrouped
library op per group on channel slices, against the reference, on random problems of every
op, format and rank, allocated and into a NaN-filled out=."""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers import assert_close

import onednn_convt as oc
from onednn_convt import lowering, reference
from onednn_convt.lowering import base, per_group


def _random_call(rng: np.random.Generator, op: str, code: str):
    rank = int(rng.integers(1, 4))
    fmt, wf = str(rng.choice(["NCX", "NXC"])), str(rng.choice(["IOX", "XOI"]))
    g = int(rng.choice([2, 3, 4, 8, 9]))
    ic, oc_ = g * int(rng.integers(1, 6)), g * int(rng.integers(1, 6))
    k = [int(rng.integers(1, 5)) for _ in range(rank)]
    s = [int(rng.integers(1, 4)) for _ in range(rank)]
    d = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
    pb, pe = [int(rng.integers(0, kk + 1)) for kk in k], [int(rng.integers(0, kk + 1)) for kk in k]
    op_ = [int(rng.integers(0, ss)) if op == "fwd" else 0 for ss in s]
    x = [int(rng.integers(1, 7)) for _ in range(rank)]
    y = [ss * (xx - 1) + dd * (kk - 1) + 1 - a - b + o for xx, kk, ss, dd, a, b, o in zip(x, k, s, d, pb, pe, op_)]
    if min(y) < 1:
        return None
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=g, data_format=fmt, weights_format=wf)

    def act(c, sp):
        return (2, c, *sp) if fmt == "NCX" else (2, *sp, c)

    ws = (ic, oc_ // g, *k) if wf == "IOX" else (*k, oc_ // g, ic)
    dt = oc.dtypes.FLOAT_DTYPES[code]
    src, w = rng.standard_normal(act(ic, x)).astype(dt), rng.standard_normal(ws).astype(dt)
    b, dd_ = rng.standard_normal(oc_).astype(dt), rng.standard_normal(act(oc_, y)).astype(dt)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    if op == "fwd":
        bias = b if rng.random() < 0.5 else None
        ref = reference.conv_transpose(f64(src), f64(w), None if bias is None else f64(bias), output_padding=op_,
                                       **attrs)
        return oc.ConvTranspose(output_padding=op_, **attrs), [src, w, bias], ref, ic // g * int(np.prod(k))
    if op == "bwd_w":
        ref = reference.conv_transpose_backward_weights(f64(src), f64(dd_), ws, **attrs)
        return oc.ConvTransposeBackwardWeights(**attrs), [src, dd_, np.array(ws)], ref, 2 * int(np.prod(y))
    ref = reference.conv_transpose_backward_data(f64(dd_), f64(w), **attrs)
    return oc.ConvTransposeBackwardData(**attrs), [dd_, w], ref, oc_ // g * int(np.prod(k))


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_d", "bwd_w"])
def test_per_group_matches_the_reference(op: str, code: str):
    rng = np.random.default_rng({"fwd": 1, "bwd_d": 2, "bwd_w": 3}[op] + (10 if code == "bf16" else 0))
    checked = 0
    for _ in range(120):
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
        got = instance._target().plan(low, arrays, None, code).run(arrays, None)
        out = np.full(ref.shape, np.nan, got.dtype)
        into = instance._target().plan(low, arrays, out, code).run(arrays, out)
        assert into is out
        for result in (got, into):
            assert_close(result, ref, code, reduction, f"{op} {code} {instance}")
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

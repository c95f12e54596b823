"""The polyphase lowering (lowering/polyphase.py): a strided op as stride-1 ops on strided views."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest

import onednn_convt as oc
from helpers import assert_close, assert_lowering_matches
from test_numerics import classes
from onednn_convt import lowering, reference
from onednn_convt.lowering import base, polyphase
from onednn_convt.problem import GROUP_CHANNELS_BLOCK


def test_phases_cover_every_output_once():
    """Along one dim, the phases' outputs partition dst, and each phase's taps are those of
    its residue; the taps reach exactly the outputs some src element feeds."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        x, k, s = (int(v) for v in rng.integers(1, [8, 8, 6]))
        pb, pe, op = int(rng.integers(0, k + 1)), int(rng.integers(0, k + 1)), int(rng.integers(0, s))
        y = s * (x - 1) + k - pb - pe + op
        if y < 1:
            continue
        seen = np.zeros(y, int)
        for d in polyphase.phases(x, k, s, pb, y):
            outs = range(d.first, d.first + d.count * s, s)
            seen[list(outs)] += 1
            assert d.taps == len(range(d.phase, k, s))
            for j, o in enumerate(outs):  # does any (i, t) with o + pb = s*i + t, t in the phase, exist?
                fed = any(0 <= (o + pb - t) // s < x and (o + pb - t) % s == 0 for t in range(d.phase, k, s))
                assert fed == (j < d.reach), (x, k, s, pb, pe, op, d, o)
            if d.taps and d.reach:
                assert d.pads_end >= 0 and x - 1 + d.taps - d.pads_begin - d.pads_end == d.reach
        assert (seen == 1).all(), (x, k, s, pb, pe, op)


def _random_call(rng: np.random.Generator, op: str, code: str):
    rank = int(rng.integers(1, 4))
    fmt, wf = str(rng.choice(["NCX", "NXC"])), str(rng.choice(["IOX", "XOI"]))
    g = int(rng.choice([1, 1, 2, 4]))
    ic, oc_ = g * int(rng.integers(1, 6)), g * int(rng.integers(1, 6))
    if rank == 3 and g > 1 and rng.random() < 0.5:  # polyphase takes a grouped 3-D problem of these only
        ic, oc_ = GROUP_CHANNELS_BLOCK * g, GROUP_CHANNELS_BLOCK * g
    k = [int(rng.integers(1, 6)) for _ in range(rank)]
    s = [int(rng.integers(1, 5)) for _ in range(rank)]
    s[0] = max(s[0], 2)
    pb, pe = [int(rng.integers(0, kk + 1)) for kk in k], [int(rng.integers(0, kk + 1)) for kk in k]
    op_ = [int(rng.integers(0, ss)) for ss in s]
    x = [int(rng.integers(1, 6)) for _ in range(rank)]
    y = [ss * (xx - 1) + kk - a - b + o for xx, kk, ss, a, b, o in zip(x, k, s, pb, pe, op_)]
    if min(y) < 1:
        return None
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, output_padding=op_, groups=g, data_format=fmt, weights_format=wf)

    def act(c, sp):
        return (2, c, *sp) if fmt == "NCX" else (2, *sp, c)

    ws = (ic, oc_ // g, *k) if wf == "IOX" else (*k, oc_ // g, ic)
    dt = oc.dtypes.FLOAT_DTYPES[code]
    src, w = rng.standard_normal(act(ic, x)).astype(dt), rng.standard_normal(ws).astype(dt)
    b, dd = rng.standard_normal(oc_).astype(dt), rng.standard_normal(act(oc_, y)).astype(dt)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    no_op = {key: v for key, v in attrs.items() if key != "output_padding"}
    if op == "fwd":
        bias = b if rng.random() < 0.5 else None

        def refer(a):
            return reference.conv_transpose(f64(a[0]), f64(a[1]), None if a[2] is None else f64(a[2]), **attrs)
        return oc.ConvTranspose(**attrs), [src, w, bias], refer, ic // g * int(np.prod(k))
    def all_pairs(d):
        """diff_dst zero-padded so that every (src, tap) pair lies inside it, pads 0: the
        reference then gives the zero-padded reading of a backward op (docs/deviations.md)."""
        axes = range(2, 2 + rank) if fmt == "NCX" else range(1, 1 + rank)
        for axis, xx, kk, ss, a in zip(axes, x, k, s, pb):
            need = ss * (xx - 1) + kk
            d = np.moveaxis(d, axis, 0)
            d = np.concatenate([np.zeros((a, *d.shape[1:])), d, np.zeros((max(0, need - a - d.shape[0]), *d.shape[1:]))])[:need]
            d = np.moveaxis(d, 0, axis)
        return d

    zero = {**no_op, "pads_begin": [0] * rank, "pads_end": [0] * rank}
    if op == "bwd_w":
        def refer(a, widest=False):
            if widest:
                return reference.conv_transpose_backward_weights(f64(a[0]), all_pairs(f64(a[1])), ws, **zero)
            return reference.conv_transpose_backward_weights(f64(a[0]), f64(a[1]), ws, **no_op)
        return oc.ConvTransposeBackwardWeights(**attrs), [src, dd, np.array(ws)], refer, 2 * int(np.prod(y))

    def refer(a, widest=False):
        if widest:
            return reference.conv_transpose_backward_data(all_pairs(f64(a[0])), f64(a[1]), **zero)
        return reference.conv_transpose_backward_data(f64(a[0]), f64(a[1]), **no_op)
    return oc.ConvTransposeBackwardData(**attrs), [dd, w], refer, oc_ // g * int(np.prod(k))


def _polyphase_calls(seed: int, op: str, code: str, in_f32: bool = False, count: int = 120):
    """Of ``count`` random calls, those that polyphase (``in_f32``: computed in f32) can run:
    (op instance, arrays, reference, reduction length, the polyphase lowering, the reference
    of other arrays); it is a candidate exactly there, and never of a strict op in f32."""
    name = base.POLYPHASE + lowering.IN_F32 if in_f32 else base.POLYPHASE
    applies = polyphase.applies_in_f32 if in_f32 else polyphase.applies
    rng = np.random.default_rng(seed + (10 if code == "bf16" else 0))
    for _ in range(count):
        call = _random_call(rng, op, code)
        if call is None:
            continue
        instance, arrays, refer, reduction = call
        problem = instance._problem(arrays, code)
        assert (name in lowering.candidates(problem)) == applies(problem)
        assert not in_f32 or name not in lowering.candidates(problem, native=True)
        if applies(problem):
            yield instance, arrays, refer(arrays), reduction, lowering.build(problem, name), refer


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_w", "bwd_d"])
def test_polyphase_matches_the_reference(op: str, code: str):
    """Random strided problems (1-D to 3-D, groups, pads, output_padding, kernels below
    and above the stride), allocated and into out= (NaN-filled), against the reference."""
    checked = 0
    for instance, arrays, ref, reduction, low, _ in _polyphase_calls({"fwd": 1, "bwd_w": 2, "bwd_d": 3}[op], op, code):
        assert_lowering_matches(instance, low, arrays, ref, code, reduction, f"{op} {code} {instance}")
        checked += 1
    bf16_native = oc.guards.dispatch_isa() in oc.guards.BF16_NATIVE
    assert checked >= 36 or (code == "bf16" and (op == "bwd_d" or not bf16_native)), checked


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_w", "bwd_d"])
def test_polyphase_in_f32_is_the_f32_polyphase_rounded_once(op: str, code: str, monkeypatch):
    """The polyphase form computed in f32 (a candidate of every strided dilation-1 bf16/f16
    problem, not of a strict op): its result, allocated and into a NaN-filled out=, is
    exactly the f32 polyphase result of the inputs widened to f32, rounded once to the dtype
    (BackwardData's phases summed in f32 before it), and within the dtype's tolerance of the
    reference; its op says it ran in f32."""
    checked = 0
    seed = {"fwd": 11, "bwd_w": 12, "bwd_d": 13}[op] + (0 if code == "bf16" else 20)
    for instance, arrays, ref, reduction, low, _ in _polyphase_calls(seed, op, code, in_f32=True, count=40):
        assert low.f32_only and low.phases
        wide = [np.asarray(a, np.float32) if i < 2 or op == "fwd" and a is not None else a for i, a in enumerate(arrays)]
        f32_problem = instance._problem(wide, "f32")
        exact = instance._target().plan(lowering.build(f32_problem, base.POLYPHASE), wide, None, "f32").run(wide, None)
        want = exact.astype(arrays[0].dtype)
        got = instance._target().plan(low, arrays, None, code).run(arrays, None)
        out = np.full(want.shape, np.nan, arrays[0].dtype)
        into = instance._target().plan(low, arrays, out, code).run(arrays, out)
        assert into is out and got.dtype == out.dtype == arrays[0].dtype
        for result in (got, into):
            np.testing.assert_array_equal(result.view(np.uint16), want.view(np.uint16), f"{op} {code} {instance}")
            assert_close(result, ref, code, reduction, f"{op} {code} {instance}")
        checked += 1
    assert checked >= 20, checked
    name = base.POLYPHASE + lowering.IN_F32
    op_ = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
    dt = oc.dtypes.FLOAT_DTYPES[code]
    problem = op_._problem([np.ones((1, 8, 4, 4), dt), np.ones((8, 4, 4, 4), dt), None], code)
    real_rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: name if p.dtype == code else real_rule(p, native=native))
    op_(np.ones((1, 8, 4, 4), dt), np.ones((8, 4, 4, 4), dt))
    assert polyphase.applies_in_f32(problem)
    assert re.fullmatch(r"Polyphase \(4 phases, stride 1: .*\) \(f32 emulation\)", op_.lowering), op_.lowering


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("op", ["fwd", "bwd_w", "bwd_d"])
def test_phases_run_channels_last_where_the_rules_say(op: str, code: str, monkeypatch):
    """Each phase lowered as the rules choose for it, here channels-last wherever it can run
    (the measured table chooses it for some stride-1 NCX problems): a phase's input is then a
    strided view reordered to NXC, every array through the library's Reorder. Against the
    reference (a view whose axes interleave once failed to compile)."""
    from onednn_convt.lowering import permute

    real_rule = lowering.rule

    def phases_channels_last(p, native=False, phase=False):
        if base.CHANNELS_LAST in lowering.candidates(p, native=native) and not polyphase.applies(p):
            return base.CHANNELS_LAST
        return real_rule(p, native=native)

    monkeypatch.setattr(lowering, "rule", phases_channels_last)
    monkeypatch.setattr(permute, "MIN_ELEMS", 1)
    checked = 0
    for instance, arrays, ref, reduction, low, _ in _polyphase_calls({"fwd": 4, "bwd_w": 5, "bwd_d": 6}[op], op, code,
                                                                     count=80):
        if not any(ph.lowering is not None and ph.lowering.name == base.CHANNELS_LAST for ph in low.phases):
            continue
        out = np.full(ref.shape, np.nan, oc.dtypes.FLOAT_DTYPES[code])
        for given in (None, out):
            got = instance._target().plan(low, arrays, given, code).run(arrays, given)
            assert_close(got, ref, code, reduction, f"{op} {code} {instance}")
        checked += 1
    assert checked >= 6 or code == "bf16", checked
    if op == "fwd" and code == "f32":  # and op.lowering says so
        monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p)
                            else phases_channels_last(p, native))
        conv = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
        x, w = np.ones((1, 8, 4, 4), np.float32), np.ones((8, 4, 4, 4), np.float32)
        conv(x, w)
        assert re.fullmatch(r"Polyphase \(4 phases, stride 1: \w+ in NXC, reordered\)", conv.lowering), conv.lowering


@pytest.mark.parametrize("op", ["fwd", "bwd_w"])  # BackwardData's phases run in f32 only
def test_a_polyphase_call_checks_dst_once_and_redoes_non_finite_phases(op: str, monkeypatch):
    """A native bf16 polyphase call checks its whole result for Inf and NaN once (each
    phase's strided view took 16x the time), and where it holds one runs the phases again,
    each checked and redone in f32 where oneDNN 3.2's bf16 kernels spread a NaN (groups):
    with one NaN, +Inf and -Inf in each input the NaN/Inf pattern is the reference's, on
    fresh results and into out=; finite inputs are checked once a call."""
    from onednn_convt import dtypes

    real = dtypes.all_finite
    seen: list[tuple[int, ...]] = []

    def counted(a: np.ndarray) -> bool:
        seen.append(a.shape)
        return real(a)

    monkeypatch.setattr(dtypes, "all_finite", counted)
    rng = np.random.default_rng(7)
    checked = 0
    for instance, arrays, ref, reduction, low, refer in _polyphase_calls({"fwd": 7, "bwd_w": 8, "bwd_d": 9}[op], op, "bf16"):
        plan = instance._target().plan(low, arrays, None, "bf16")
        guarded = [p for p in plan.plans if p is not None and p.make_fallback is not None]
        seen.clear()
        assert_close(plan.run(arrays, None), ref, "bf16", reduction, f"{op} {instance}")
        assert seen == ([ref.shape] if guarded else []), (seen, instance)
        bad = [a.copy() if i < 2 else a for i, a in enumerate(arrays)]  # src and weights, or src and diff_dst
        for a in bad[:2]:
            flat = a.reshape(-1)
            for spot, value in zip(rng.choice(flat.size, size=min(3, flat.size), replace=False), (np.nan, np.inf, -np.inf)):
                flat[spot] = value
        with np.errstate(invalid="ignore", over="ignore"):
            want = classes(refer(bad))
            widest = want if op == "fwd" else classes(refer(bad, widest=True))
        out = np.ones(ref.shape, arrays[0].dtype)
        for given in (None, out):
            got = classes(instance._target().plan(low, bad, given, "bf16").run(bad, given))
            # exact where the reference is non-finite; NaN beyond it only where the backward
            # ops' zero-padded reading has it (the library's own ops do the same)
            assert ((got == want) | ((got == 1) & (want != 0)) | ((got == 1) & (widest != 0))).all(), \
                (op, instance, np.argwhere(got != want)[:5])
            assert ((got == 0) | (widest != 0)).all(), (op, instance)
        checked += 1
    assert checked >= 20 or not oc.guards.dispatch_isa() in oc.guards.BF16_NATIVE, checked


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("op", ["fwd", "bwd_w", "bwd_d"])
def test_sixty_four_phases_match_the_reference(op: str, fmt: str, monkeypatch):
    """The most phases a problem splits into: FCN-8s' k16 s8 up-sampler geometry in 2-D
    (64 phases, two taps each, with pads) and a 3-D stride 4 with kernels below, at and above
    it (64 phases, some with no taps), through the op with the rules choosing polyphase,
    against the reference; one stride more (72 or 80 phases) has no polyphase form."""
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else
                        lowering.candidates(p)[0])
    rng = np.random.default_rng(64)
    wf = "IOX" if fmt == "NCX" else "XOI"
    for src, k, s, pb, pe in (((3, 4), (16, 16), (8, 8), (4, 0), (4, 3)),
                              ((2, 3, 2), (4, 3, 5), (4, 4, 4), (1, 0, 2), (0, 1, 1))):
        dst = tuple(ss * (x - 1) + kk - a - b for x, kk, ss, a, b in zip(src, k, s, pb, pe))
        attrs = dict(strides=s, pads_begin=pb, pads_end=pe, groups=2, data_format=fmt, weights_format=wf)
        ic, oc_ = (4, 6) if len(k) == 2 else (16, 16)  # 3-D: channels per group that polyphase takes

        def act(c, sp):
            return rng.standard_normal((2, c, *sp) if fmt == "NCX" else (2, *sp, c)).astype(np.float32)

        ws = (ic, oc_ // 2, *k) if wf == "IOX" else (*k, oc_ // 2, ic)
        x, w, dd = act(ic, src), rng.standard_normal(ws).astype(np.float32), act(oc_, dst)
        b = rng.standard_normal(oc_).astype(np.float32)
        if op == "fwd":
            instance, arrays = oc.ConvTranspose(**attrs), (x, w, b)
            ref = reference.conv_transpose(x, w, b, **attrs)
            reduction = ic // 2 * math.prod(k)
        elif op == "bwd_d":
            instance, arrays = oc.ConvTransposeBackwardData(**attrs), (dd, w)
            ref = reference.conv_transpose_backward_data(dd, w, **attrs)
            reduction = oc_ // 2 * math.prod(k)
        else:
            instance, arrays = oc.ConvTransposeBackwardWeights(**attrs), (x, dd, ws)
            ref = reference.conv_transpose_backward_weights(x, dd, ws, **attrs)
            reduction = 2 * math.prod(dst)
        got = instance(*arrays)
        # (a backward op leaves out the phases with no taps: 48 of the 3-D stride's 64)
        ran = re.match(r"Polyphase \((\d+) phases, stride 1: ", instance.lowering or "")
        assert ran and int(ran[1]) in (48, 64), instance.lowering
        assert_close(got, ref, "f32", reduction, f"{op} {fmt} k{k} s{s}")
        more = oc.ConvTranspose(**{**attrs, "strides": (*s[:-1], s[-1] + 1)})
        problem = more._problem([x, w, None], "f32")
        assert not polyphase.fits(problem) and base.POLYPHASE not in lowering.candidates(problem)


def test_the_op_says_it_ran_polyphase(monkeypatch):
    """A tuned or ruled choice of the polyphase form shows in op.lowering with its phases."""
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else
                        lowering.candidates(p)[0])
    x = np.ones((1, 8, 4, 4), np.float32)
    w = np.ones((8, 4, 4, 4), np.float32)
    op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
    got = op(x, w)
    assert op.lowering.startswith("Polyphase (4 phases, stride 1: "), op.lowering
    assert_close(got, reference.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1, data_format="NCX",
                                               weights_format="IOX"), "f32", 8 * 16)


def test_a_result_past_the_limits_is_refused_before_it_is_allocated(monkeypatch):
    """A polyphase call checks its phases' library range and its result's size before it
    allocates the result (which its phases' plans take views of): a result past the memory
    limit is a MemoryError naming the op, and a phase past oneDNN's 32-bit range the
    ValueError a plain call gives, with no allocation of the result either way. The phases
    run the library's own op, whatever this CPU's table would choose (under a default table
    a MatMul phase is within range, and its 32 GiB result is refused as a MemoryError)."""
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else
                        base.CONV_TRANSPOSE)
    allocated = []
    real_empty = np.empty

    def watched(shape, *args, **kwargs):
        allocated.append(tuple(np.atleast_1d(shape)))
        return real_empty(shape, *args, **kwargs)

    op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
    x = np.ones((4, 8, 64, 64), np.float32)  # result 4 x 4 x 128 x 128 f32: 1 MiB
    w = np.ones((8, 4, 4, 4), np.float32)
    oc.set_memory_limit(1 << 19)
    try:
        monkeypatch.setattr(np, "empty", watched)
        with pytest.raises(MemoryError, match=r"ConvTranspose: this call would allocate .* \(4, 4, 128, 128\)"):
            op(x, w)
        assert (4, 4, 128, 128) not in allocated
    finally:
        oc.set_memory_limit(None)
    # a kernel the library's 32-bit arithmetic cannot take (broadcast weights: no memory)
    huge = np.broadcast_to(np.ones((1, 1, 1, 1), np.float32), (1, 2, 2**31 - 1, 2))
    with pytest.raises(ValueError, match="ConvTranspose: spatial dim 0 .* 32-bit integers"):
        up = oc.ConvTranspose(strides=(1, 2), data_format="NCX", weights_format="IOX")
        up(np.ones((1, 1, 1, 1), np.float32), huge)
    assert not any(math.prod(s) > 2**30 for s in allocated)


@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
def test_no_polyphase_where_its_phases_would_run_on_gemm(fmt: str):
    """A grouped 3-D problem whose channels per group are not a multiple of 8 (depthwise
    among them) has no polyphase form: oneDNN 3.2 runs its stride-1 phases on its gemm
    convolution, each about as slow as the whole strided op (a 64-phase depthwise forward
    with a bias took 2.6 s, the library op 0.10). 8 and 16 channels per group, 2-D and 1-D
    depthwise layers, and 3-D dense ones keep it. The geometry the plain fuzzer timed out
    on (3-D depthwise, stride 4, a bias; smaller here) runs another lowering, right."""
    def problem(op_cls, g, ic, oc_, src, k, s, code="f32", bias=False):
        wf = "IOX" if fmt == "NCX" else "XOI"
        op = op_cls(strides=s, pads_begin=[0] * len(s), pads_end=[0] * len(s), groups=g, data_format=fmt,
                    weights_format=wf)
        dtype = np.float32 if code == "f32" else ml_dtypes.bfloat16
        x = np.zeros((1, ic, *src) if fmt == "NCX" else (1, *src, ic), dtype)
        w = np.zeros((ic, oc_ // g, *k) if wf == "IOX" else (*k, oc_ // g, ic), dtype)
        return op, [x, w, np.zeros(oc_, dtype) if bias else None]

    names = (base.POLYPHASE, base.POLYPHASE + lowering.IN_F32)
    for g, ic, oc_, has in ((128, 128, 128, False), (32, 64, 64, False), (8, 96, 96, False), (8, 64, 128, True),
                            (4, 64, 64, True), (1, 3, 5, True)):
        for code in ("f32", "bf16"):
            op, arrays = problem(oc.ConvTranspose, g, ic, oc_, (3, 2, 4), (4, 4, 4), (2, 2, 2), code)
            p = op._problem(arrays, code)
            assert polyphase.fits(p) == has and p.gemm_grouped == (not has), (g, ic, oc_)
            assert any(n in lowering.candidates(p) for n in names) == has, (g, ic, oc_, code)
    for src, k, s in (((6, 6), (4, 4), (2, 2)), ((30,), (8,), (4,))):  # depthwise below 3-D: JIT kernels
        op, arrays = problem(oc.ConvTranspose, 64, 64, 64, src, k, s)
        assert base.POLYPHASE in lowering.candidates(op._problem(arrays, "f32"))
    rng = np.random.default_rng(5)
    op, _ = problem(oc.ConvTranspose, 16, 16, 16, (3, 1, 2), (4, 4, 4), (4, 4, 4))
    x = rng.standard_normal((2, 16, 3, 1, 2) if fmt == "NCX" else (2, 3, 1, 2, 16)).astype(np.float32)
    w = rng.standard_normal((16, 1, 4, 4, 4) if fmt == "NCX" else (4, 4, 4, 1, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    got = op(x, w, b)
    assert not (op.lowering or "").startswith(base.POLYPHASE), op.lowering
    attrs = dict(strides=(4, 4, 4), pads_begin=(0, 0, 0), pads_end=(0, 0, 0), groups=16, data_format=fmt,
                 weights_format="IOX" if fmt == "NCX" else "XOI")
    assert_close(got, reference.conv_transpose(x, w, b, **attrs), "f32", 64, f"depthwise 3-D {fmt}")

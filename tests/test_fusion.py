"""Fused ConvTranspose: post_ops= and int8 (de)quantization, against the float64 reference."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import ml_dtypes
import numpy as np
import pytest

import onednn_convt as oc
from onednn_convt import Dequantize, PostOp, Quantize, reference
from onednn_convt.post_ops import INT8_SUM_AFTER_POST_OP, POST_OPS, library_sum

from helpers import EPS, int8_fuses, tolerance

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, output_padding=1)
#: a stride-1 geometry: the library fuses the chain into its deconvolution there
STRIDE1 = dict(strides=1, pads_begin=1, pads_end=1)
#: the guard that keeps a bias and post-ops out of the library's strided deconvolution
STAGED = "strided_deconvolution_epilogue"


#: how a staged call's lowering says it computed the ConvTranspose: a library op heading the
#: graph, or the plain op before it (its rules' lowering: polyphase, a MatMul form, ...)
STAGED_CORES = ("ConvolutionBackwardData", "ConvTranspose", "the plain op runs it")


def assert_staged(op: Any) -> None:
    """The op ran as its own partition(s), then the bias and post-ops in more (the guard)."""
    assert op.guard == STAGED and op.fused is False and op.partitions >= 2, op.lowering
    assert any(f" (the ConvTranspose as {core}, then the rest: {STAGED})" in op.lowering
               for core in STAGED_CORES), op.lowering
    plain = "(the ConvTranspose as the plain op runs it" in op.lowering
    assert (": the plain op, then " in op.lowering) == plain, op.lowering


@pytest.fixture
def flipped_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules choose the Convolution over flipped weights for every forward problem it can
    run (stride 1), where a fused call fuses its chain into it; whether the measured table
    chooses it is per CPU and shape (elsewhere a stride-1 call runs the op, then the rest)."""
    from onednn_convt import lowering
    from onednn_convt.lowering import base

    rule = lowering.rule

    def flipped_first(p: Any, native: bool = False, phase: bool = False) -> str:
        if p.op == "ConvTranspose" and base.FLIPPED_CONVOLUTION in lowering.candidates(p, native=native):
            return base.FLIPPED_CONVOLUTION
        return rule(p, native=native)

    monkeypatch.setattr(lowering, "rule", flipped_first)
UNARY_ATTRS: dict[str, dict[str, float]] = {
    "Clamp": {"min": -0.5, "max": 0.75}, "Elu": {"alpha": 0.7}, "LeakyReLU": {"alpha": 0.1},
    "HardSigmoid": {"alpha": 0.2, "beta": 0.5}, "SoftPlus": {"beta": 1.5},
}
#: unary kinds defined for positive inputs only: run after Abs and Add of 0.25
POSITIVE = ("Log", "Sqrt")
#: the ISA oneDNN dispatches to here, and whether its int8 kernels have VNNI: without, every
#: int8 call runs unfused (guard int8_without_vnni: docs/deviations.md)
ISA = oc.guards.dispatch_isa()
INT8_FUSES = int8_fuses()


def layout(data_format: str, n: int = 2, c: int = 4, x: int = 5) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(src shape, weights shape) for IC=c, OC=3, kernel 3, 2-D."""
    src = (n, c, x, x) if data_format == "NCX" else (n, x, x, c)
    w = (c, 3, 3, 3) if data_format == "NCX" else (3, 3, 3, c)
    return src, w


def formats(data_format: str) -> dict[str, str]:
    return dict(data_format=data_format, weights_format="IOX" if data_format == "NCX" else "XOI")


def inputs(data_format: str, code: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    s, w = layout(data_format)
    dt = DTYPES[code]
    return (rng.uniform(-1, 1, s).astype(dt), rng.uniform(-0.5, 0.5, w).astype(dt),
            rng.uniform(-0.5, 0.5, 3).astype(dt))


def check(got: Any, src: np.ndarray, w: np.ndarray, bias: Any, operands: list[np.ndarray],
          chain: list[PostOp], code: str, **attrs: Any) -> None:
    """got matches the reference within the ConvTranspose's tolerance carried through the
    chain: the chain evaluated at the reference's conv output moved by that tolerance."""
    y = reference.conv_transpose(src, w, bias, **attrs)
    reduction = w.size // 3

    def post(v: np.ndarray) -> np.ndarray:
        return _chain(v, chain, operands)

    delta = tolerance(code, reduction) * float(np.max(np.abs(y)))
    ref = post(y)
    bound = np.maximum(np.abs(post(y + delta) - ref), np.abs(post(y - delta) - ref))
    bound = bound + 4 * EPS[code] * np.abs(ref) + 1e-6
    got64 = np.asarray(got, np.float64)
    assert got64.shape == ref.shape
    bad = ~(np.abs(got64 - ref) <= bound)
    assert not bad.any(), f"{bad.sum()} of {bad.size} off: got {got64[bad][:5]}, ref {ref[bad][:5]}"


def _chain(y: np.ndarray, chain: list[PostOp], operands: list[np.ndarray]) -> np.ndarray:
    it = iter(operands)
    for p in chain:
        y = reference.post_op(p.kind, y, next(it) if p.is_binary else None, **p.attrs)
    return y


def chain_for(kind: str) -> tuple[list[PostOp], Callable[[tuple[int, ...], str], list[np.ndarray]]]:
    """A chain that exercises post-op ``kind`` and the operands it needs for dst ``shape``."""
    spec = POST_OPS[kind]
    if spec.is_binary:
        def operand(shape: tuple[int, ...], code: str) -> list[np.ndarray]:
            rng = np.random.default_rng(1)
            other = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)  # no zero: Divide
            return [other.astype(DTYPES[code])]
        return [PostOp(kind)], operand
    if kind in POSITIVE:
        def shift(shape: tuple[int, ...], code: str) -> list[np.ndarray]:
            return [np.full((1,), 0.25, DTYPES[code])]
        return [PostOp("Abs"), PostOp("Add"), PostOp(kind)], shift
    return [PostOp(kind, **UNARY_ATTRS.get(kind, {}))], lambda shape, code: []


@pytest.mark.parametrize("kind", sorted(POST_OPS))
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("geometry", ["stride 1", "stride 2"])
def test_each_post_op_fuses_and_matches_the_reference(flipped_rule: None, kind: str, data_format: str,
                                                      geometry: str) -> None:
    """Each post-op fuses at stride 1, on the forward Convolution over flipped weights where
    the rules run the plain call so (the library's deconvolution is 10-20x slower with it
    fused); at stride 2 the guard runs it after the op, in a partition of its own. Right
    either way."""
    attrs = STRIDE1 if geometry == "stride 1" else ATTRS
    src, w, b = inputs(data_format, "f32")
    chain, make = chain_for(kind)
    op = oc.ConvTranspose(**attrs, **formats(data_format), post_ops=chain)
    shape = reference.conv_transpose(src, w, **attrs, **formats(data_format)).shape
    operands = make(shape, "f32")
    got = op(src, w, b, *operands)
    if geometry == "stride 1":
        assert op.fused is True and op.partitions == 1 and op.guard is None, op.lowering
        assert (op.lowering or "").startswith("Convolution+") and "1 fused partition (the ConvTranspose as a " \
            "Convolution over flipped weights)" in (op.lowering or ""), op.lowering
    else:
        assert_staged(op)
    check(got, src, w, b, operands, chain, "f32", **attrs, **formats(data_format))


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_three_post_op_chain_with_broadcasts(code: str, data_format: str) -> None:
    src, w, b = inputs(data_format, code)
    fmt = formats(data_format)
    shape = reference.conv_transpose(src, w, **ATTRS, **fmt).shape
    per_channel = (1, 3, 1, 1) if data_format == "NCX" else (3,)
    rng = np.random.default_rng(2)
    operands = [rng.uniform(-1, 1, shape).astype(DTYPES[code]),
                rng.uniform(0.5, 2, per_channel).astype(DTYPES[code])]
    chain = [PostOp("Add"), PostOp("ReLU"), PostOp("Multiply")]
    op = oc.ConvTranspose(**ATTRS, **fmt, post_ops=chain)
    got = op(src, w, b, *operands)
    assert got.dtype == DTYPES[code] and got.shape == shape
    assert_staged(op)
    check(got, src, w, b, operands, chain, code, **ATTRS, **fmt)
    again = op(src, w, b, *operands)  # the signature's compiled plan (C++ fast path)
    np.testing.assert_array_equal(np.asarray(again, np.float64), np.asarray(got, np.float64))


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_depthwise_stride_one_fuses_on_the_convolution(flipped_rule: None, code: str, data_format: str) -> None:
    """The plain op's Convolution over flipped weights heads the graph (lowering.forward): dilated,
    asymmetric pads, a full-shape and a per-channel operand; twice (the plan's second call)."""
    rng = np.random.default_rng(11)
    c, dt, fmt = 6, DTYPES[code], formats(data_format)
    src = rng.uniform(-1, 1, (2, c, 7, 6) if data_format == "NCX" else (2, 7, 6, c)).astype(dt)
    w = rng.uniform(-0.5, 0.5, (c, 1, 3, 2) if data_format == "NCX" else (3, 2, 1, c)).astype(dt)
    b = rng.uniform(-0.5, 0.5, c).astype(dt)
    attrs = dict(groups=c, dilations=(2, 1), pads_begin=(1, 0), pads_end=(2, 1), **fmt)
    shape = reference.conv_transpose(src, w, **attrs).shape
    per_channel = (1, c, 1, 1) if data_format == "NCX" else (c,)
    operands = [rng.uniform(-1, 1, shape).astype(dt), rng.uniform(0.5, 2, per_channel).astype(dt)]
    chain = [PostOp("Add"), PostOp("ReLU"), PostOp("Multiply")]
    op = oc.ConvTranspose(**attrs, post_ops=chain)
    got = op(src, w, b, *operands)
    assert op.fused is True and (op.lowering or "").startswith("Convolution+BiasAdd+Add+ReLU+Multiply"), op.lowering
    check(got, src, w, b, operands, chain, code, **attrs)
    again = op(src, w, b, *operands)
    np.testing.assert_array_equal(np.asarray(again, np.float64), np.asarray(got, np.float64))


@pytest.mark.parametrize("rule, core, groups", [  # ConvolutionBackwardData: groups 1 only (its candidates)
    ("ConvTranspose", "ConvTranspose", 1), ("ConvTranspose", "ConvTranspose", 3),
    ("ConvolutionBackwardData", "ConvolutionBackwardData", 1),
    ("ConvTranspose in f32", "ConvTranspose", 1), ("ConvTranspose in f32", "ConvTranspose", 3),
])
@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_stride_one_runs_the_rules_deconvolution_then_the_rest(monkeypatch: pytest.MonkeyPatch, rule: str, core: str,
                                                               code: str, data_format: str, groups: int) -> None:
    """Stride 1 where the rules run the plain call on the library's deconvolution (not the
    Convolution over flipped weights, which could take the chain fused): that op alone, then
    the bias and post-ops (a speed rule: no guard); right, and the same again."""
    from onednn_convt import lowering

    real = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda problem, native=False, phase=False: (
        rule if problem.op == "ConvTranspose" else real(problem, native=native)))
    rng = np.random.default_rng(groups)
    c, dt = 3 * groups, DTYPES[code]
    nxc = data_format == "NXC"
    src = rng.uniform(-1, 1, (2, 5, 4, c) if nxc else (2, c, 5, 4)).astype(dt)
    w = rng.uniform(-0.5, 0.5, (3, 3, 3, c) if nxc else (c, 3, 3, 3)).astype(dt)  # OC/groups = 3
    b = rng.uniform(-0.5, 0.5, 3 * groups).astype(dt)
    attrs = dict(STRIDE1, groups=groups, **formats(data_format))
    shape = reference.conv_transpose(src, w, **attrs).shape
    channel = (3 * groups,) if nxc else (3 * groups, 1, 1)
    operands = [rng.uniform(-1, 1, shape).astype(dt), rng.uniform(0.5, 2, channel).astype(dt)]
    chain = [PostOp("Add"), PostOp("ReLU"), PostOp("Multiply")]
    op = oc.ConvTranspose(**attrs, post_ops=chain)
    got = op(src, w, b, *operands)
    assert op.fused is False and op.partitions >= 2 and op.guard is None, op.lowering
    assert (f"(the ConvTranspose as {core}, then the rest: oneDNN 3.2's stride-1 deconvolution is slow "
            "with them fused)") in (op.lowering or ""), op.lowering
    check(got, src, w, b, operands, chain, code, **attrs)
    np.testing.assert_array_equal(np.asarray(op(src, w, b, *operands), np.float64), np.asarray(got, np.float64))


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_stride_one_past_the_flip_runs_the_op_then_the_rest(code: str, data_format: str) -> None:
    """Stride 1 with a pad past the dilated kernel (no Convolution over flipped weights runs
    it): the op alone, then the bias and post-ops (a speed rule: no guard); right, twice."""
    src, w, b = inputs(data_format, code)
    attrs = dict(strides=1, pads_begin=(3, 0), pads_end=(0, 3), **formats(data_format))  # kernel 3: past 2
    shape = reference.conv_transpose(src, w, **attrs).shape
    operands = [np.random.default_rng(4).uniform(-1, 1, shape).astype(DTYPES[code])]
    chain = [PostOp("Add"), PostOp("GELU")]
    op = oc.ConvTranspose(**attrs, post_ops=chain)
    got = op(src, w, b, *operands)
    assert op.fused is False and op.partitions >= 2 and op.guard is None, op.lowering
    # the op alone as the plain call's rule runs it (ConvolutionBackwardData, or ConvTranspose
    # where the rule says so: bf16 under AVX2); bf16 under AVX2 also ends "(f32 emulation)"
    assert any(f"(the ConvTranspose as {core}, then the rest: oneDNN 3.2's stride-1 deconvolution "
               "is slow with them fused)" in (op.lowering or "")
               for core in ("ConvolutionBackwardData", "ConvTranspose")), op.lowering
    check(got, src, w, b, operands, chain, code, **attrs)
    np.testing.assert_array_equal(np.asarray(op(src, w, b, *operands), np.float64), np.asarray(got, np.float64))


@pytest.mark.parametrize("rule, core", [
    ("ConvTranspose", "ConvTranspose"), ("ConvolutionBackwardData", "ConvolutionBackwardData"),
    ("ConvTranspose in f32", "ConvTranspose"), ("Polyphase", "the plain op runs it"),
])
@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_the_staged_op_is_the_plain_calls(monkeypatch, rule: str, core: str, code: str, data_format: str) -> None:
    """A strided fused float call runs the op alone, then the rest: the op the rules run the
    plain call on at the graph's head where that is the library's ConvTranspose or
    ConvolutionBackwardData (in its native form for "... in f32"), else the plain op itself
    before the graph (which runs it as its rule says: here each polyphase phase by the
    real rules); right either way, and the same again; out= the residual Add's tensor."""
    from onednn_convt import lowering

    real = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda problem, native=False, phase=False: (
        rule if any(s > 1 for s in problem.geometry.strides) else real(problem, native=native)))
    src, w, b = inputs(data_format, code)
    attrs = dict(**ATTRS, **formats(data_format))
    shape = reference.conv_transpose(src, w, **attrs).shape
    operands = [np.random.default_rng(5).uniform(-1, 1, shape).astype(DTYPES[code])]
    chain = [PostOp("Add"), PostOp("ReLU")]
    op = oc.ConvTranspose(**attrs, post_ops=chain)
    got = op(src, w, b, *operands)
    assert_staged(op)
    assert f"(the ConvTranspose as {core}, then the rest" in (op.lowering or ""), op.lowering
    if core == "the plain op runs it":
        assert (op.lowering or "").startswith(rule + "+BiasAdd+Add+ReLU: the plain op, then "), op.lowering
        assert (op._plain().lowering or "").startswith(rule), op._plain().lowering
    check(got, src, w, b, operands, chain, code, **attrs)
    np.testing.assert_array_equal(np.asarray(op(src, w, b, *operands), np.float64), np.asarray(got, np.float64))
    residual = operands[0].copy()
    assert op(src, w, b, residual, out=residual) is residual
    np.testing.assert_array_equal(np.asarray(residual, np.float64), np.asarray(got, np.float64))


_REF_KERNEL_SCRIPT = """
import sys
import numpy as np
import onednn_convt as oc
from onednn_convt import PostOp
fmt = sys.argv[1]
rng = np.random.default_rng(0)
nxc = fmt == "NXC"
x = rng.uniform(-1, 1, (2, 4, 4, 16) if nxc else (2, 16, 4, 4)).astype(np.float32)
w = rng.uniform(-1, 1, (4, 4, 8, 16) if nxc else (16, 8, 4, 4)).astype(np.float32)
b = rng.uniform(-1, 1, 8).astype(np.float32)
full = rng.uniform(-1, 1, (2, 8, 8, 8) if nxc else (2, 8, 8, 8)).astype(np.float32)
channel = rng.uniform(-1, 1, (1, 1, 1, 8) if nxc else (1, 8, 1, 1)).astype(np.float32)
one = np.float32([0.5])
for chain, operands in (
    (["Add", "ReLU", "Multiply"], [full, channel]),
    (["ReLU", "Multiply"], [channel]),
    (["Add", "Add"], [full, channel]),
    (["ReLU", "Subtract"], [one]),
):
    op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format=fmt,
                          weights_format="XOI" if nxc else "IOX", post_ops=[PostOp(k) for k in chain])
    op(x, w, b, *operands)
    print("LOWERING", op.lowering, op.partitions)
"""


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_staged_broadcast_post_ops_stay_off_the_reference_kernel(data_format: str) -> None:
    """A staged call's post-ops run as binary primitives, later ones as their post-ops; a
    broadcast binary post-op (per channel, one value) would send such a primitive to
    oneDNN's reference kernel (ref:any, 10-50x slower): each starts a partition of its own.
    Checked on the library's own log (ONEDNN_VERBOSE), in a subprocess."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    done = subprocess.run([sys.executable, "-c", _REF_KERNEL_SCRIPT, data_format], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(ln.startswith("LOWERING") for ln in lines) == 4, done.stdout[-2000:]
    assert all(STAGED in ln for ln in lines if ln.startswith("LOWERING")), done.stdout[-2000:]
    refs = [ln for ln in lines if ln.startswith("onednn_verbose") and ",exec," in ln and "ref:any" in ln]
    assert not refs, refs[:3]


def test_staged_intermediates_of_huge_page_size() -> None:
    """A staged call whose partitions pass 2 MiB and more between them (the core's scratch
    buffers in transparent huge pages): right, and again on reused buffers, and after a
    smaller call of another op reused them."""
    rng = np.random.default_rng(6)
    src = rng.uniform(-1, 1, (2, 16, 64, 64)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 16, 4, 4)).astype(np.float32)
    b = rng.uniform(-1, 1, 16).astype(np.float32)
    attrs = dict(strides=2, pads_begin=1, pads_end=1, **formats("NCX"))
    chain = [PostOp("ReLU"), PostOp("Abs")]
    op = oc.ConvTranspose(**attrs, post_ops=chain)
    got = op(src, w, b)
    assert got.nbytes >= 2 << 20 and op.partitions >= 3, op.lowering
    check(got, src, w, b, [], chain, "f32", **attrs)
    np.testing.assert_array_equal(op(src, w, b), got)
    small = oc.ConvTranspose(**attrs, post_ops=chain)
    s_src, s_w, s_b = inputs("NCX", "f32")
    check(small(s_src, s_w, s_b), s_src, s_w, s_b, [], chain, "f32", **attrs)
    np.testing.assert_array_equal(op(src, w, b), got)


@pytest.mark.parametrize("operand_shape", [(1,), (), (3,), (1, 1, 1, 3), (2, 1, 1, 3), (1, 10, 10, 1)])
def test_binary_operand_broadcasts_numpy_style(operand_shape: tuple[int, ...]) -> None:
    src, w, b = inputs("NXC", "f32")
    other = np.random.default_rng(3).uniform(-1, 1, operand_shape).astype(np.float32)
    op = oc.ConvTranspose(**ATTRS, post_ops=[PostOp("Subtract")])
    got = op(src, w, None, other)
    check(got, src, w, None, [other], [PostOp("Subtract")], "f32", **ATTRS)


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("chain", [["Add"], ["ReLU", "Add"], ["Multiply"], ["Add", "Maximum"]])
def test_out_may_be_a_post_op_tensor(code: str, data_format: str, chain: list[str]) -> None:
    """out= a binary post-op's own tensor of dst's shape: the result overwrites it, computed
    from its values before the call (in place where the library can, from a copy elsewhere),
    on the first call and through the cached plan; out= the last operand too."""
    src, w, b = inputs(data_format, code)
    fmt = formats(data_format)
    shape = reference.conv_transpose(src, w, **ATTRS, **fmt).shape
    rng = np.random.default_rng(13)
    ops = [PostOp(k) for k in chain]
    op = oc.ConvTranspose(**ATTRS, **fmt, post_ops=ops)
    for round_ in range(2):
        operands = [rng.uniform(-1, 1, shape).astype(DTYPES[code]) for p in ops if p.is_binary]
        before = [x.copy() for x in operands]
        target = operands[round_ % len(operands)]
        got = op(src, w, b, *operands, out=target)
        assert got is target
        assert_staged(op)
        check(got, src, w, b, before, ops, code, **ATTRS, **fmt)


def test_out_in_place_saves_the_library_copy_where_it_can() -> None:
    """The library reads a fused Add's full-shape tensor from dst's memory in NXC f32 (its
    in-place "sum"); our in-place call hands it the tensor as dst, uncopied (here the
    partition after the op, under the stride guard: the op's result goes elsewhere first)."""
    src, w, b = inputs("NXC", "f32")
    op = oc.ConvTranspose(**ATTRS, post_ops=["Add"])
    shape = reference.conv_transpose(src, w, **ATTRS).shape
    residual = np.random.default_rng(14).uniform(-1, 1, shape).astype(np.float32)
    want = op(src, w, b, residual.copy())
    assert op.last_plan.compiled.inplace_inputs == [3]  # src, weights, bias, the Add's tensor
    got = op(src, w, b, residual, out=residual)
    assert got is residual
    np.testing.assert_array_equal(got, want)


def test_out_as_post_op_tensor_survives_the_low_precision_redo() -> None:
    """A native bf16 result holding an Inf is redone in f32 (FusedPlan.run): that redo reads
    the post-op tensor again, so out= that tensor must not have been overwritten in place."""
    src, w, b = inputs("NXC", "bf16")
    src[0, 1, 1, 0] = np.inf
    op = oc.ConvTranspose(**ATTRS, post_ops=["Add"])
    shape = reference.conv_transpose(src, w, **ATTRS).shape
    residual = np.random.default_rng(15).uniform(-1, 1, shape).astype(ml_dtypes.bfloat16)
    want = op(src, w, b, residual.copy())
    assert not np.isfinite(want.astype(np.float32)).all()
    got = op(src, w, b, residual, out=residual)
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


def test_out_overlapping_an_input_is_refused() -> None:
    """Only a whole post-op tensor may be out: a part of out, the same memory read another
    way, or src sharing out's memory is a ValueError naming the input."""
    src, w, b = inputs("NXC", "f32")
    op = oc.ConvTranspose(**ATTRS, post_ops=["Add"])
    shape = reference.conv_transpose(src, w, **ATTRS).shape
    out = np.zeros(shape, np.float32)
    for operand in (out[:1], out[:, ::-1]):
        with pytest.raises(ValueError, match=r"shares memory with input 'post_ops\[0\] \(Add\)'.*not part of one"):
            op(src, w, b, operand, out=out)
    base = np.zeros(out.size + src.size, np.float32)
    with pytest.raises(ValueError, match=r"shares memory with input 'src'"):
        op(base[: src.size].reshape(src.shape), w, b, np.ones(3, np.float32), out=base[src.size - 1: -1].reshape(shape))


def test_out_and_no_bias() -> None:
    src, w, _ = inputs("NCX", "f32")
    op = oc.ConvTranspose(**ATTRS, **formats("NCX"), post_ops=["Tanh"])
    out = np.empty((2, 3, 10, 10), np.float32)
    assert op(src, w, out=out) is out
    check(out, src, w, None, [], [PostOp("Tanh")], "f32", **ATTRS, **formats("NCX"))


def test_unfused_chain_still_right_and_says_how() -> None:
    # oneDNN 3.2 fuses a dequantized Add (the int8 "sum") only first and before a Quantize
    rng = np.random.default_rng(4)
    x = rng.integers(0, 10, (2, 5, 5, 4)).astype(np.uint8)
    w = rng.integers(-5, 5, (3, 3, 3, 4)).astype(np.int8)
    other = rng.integers(-5, 5, (2, 10, 10, 3)).astype(np.int8)
    chain = [PostOp("ReLU"), PostOp("Add", dequantize=Dequantize(scales=0.5, zps=1))]
    q = dict(src_dequantize=Dequantize(scales=0.25, zps=2), weights_dequantize=Dequantize(scales=0.5))
    op = oc.ConvTranspose(**ATTRS, post_ops=chain, **q)
    got = op(x, w, None, other)
    assert op.fused is False and "in NumPy" in (op.lowering or "")
    ref = reference.fused_conv_transpose(x, w, None, [other], post_ops=chain, **q, **ATTRS)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-5)


# -- int8 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("src_code", ["u8", "s8"])
@pytest.mark.parametrize("dst", [None, "u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_int8_against_the_reference(src_code: str, dst: str | None, per_channel: bool, data_format: str) -> None:
    rng = np.random.default_rng(5)
    groups = 2
    ic, o = 4, 3
    fmt = formats(data_format)
    s_shape = (2, ic, 5, 5) if data_format == "NCX" else (2, 5, 5, ic)
    w_shape = (ic, o, 3, 3) if data_format == "NCX" else (3, 3, o, ic)
    lo, hi = (0, 12) if src_code == "u8" else (-6, 6)
    x = rng.integers(lo, hi, s_shape).astype(np.uint8 if src_code == "u8" else np.int8)
    w = rng.integers(-5, 5, w_shape).astype(np.int8)
    bias = rng.integers(-4, 4, o * groups).astype(np.float32)
    scales = [0.5, 1.0, 2.0, 0.25, 1.5, 0.75] if per_channel else [0.5]
    axis = 1 if data_format == "NCX" else 2
    wq = Dequantize(scales=scales, qtype="per_channel", axis=axis) if per_channel else Dequantize(scales=scales)
    q = dict(src_dequantize=Dequantize(scales=0.5, zps=3), weights_dequantize=wq,
             dst_quantize=None if dst is None else Quantize(scales=2.0, zps=5 if dst == "u8" else -3, dtype=dst))
    chain = [PostOp("ReLU")]
    op = oc.ConvTranspose(**ATTRS, groups=groups, **fmt, post_ops=chain, **q)
    got = op(x, w, bias)
    assert op.fused is INT8_FUSES, op.lowering
    ref = reference.fused_conv_transpose(x, w, bias, post_ops=chain, **q, **ATTRS, groups=groups, **fmt)
    want = np.float32 if dst is None else {"u8": np.uint8, "s8": np.int8}[dst]
    assert got.dtype == want
    if dst is None:
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-4)
    else:
        np.testing.assert_array_equal(got.astype(np.float64), ref)
        assert len(np.unique(got)) > 3  # not saturated away


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_int8_depthwise_on_the_convolution(per_channel: bool, data_format: str) -> None:
    """Depthwise stride 1 fuses on the Convolution over flipped weights: per-channel
    weights scales move to that op's O axis; u8 dst judged exactly."""
    rng = np.random.default_rng(12)
    c, fmt = 6, formats(data_format)
    x = rng.integers(0, 12, (2, c, 6, 5) if data_format == "NCX" else (2, 6, 5, c)).astype(np.uint8)
    w = rng.integers(-5, 5, (c, 1, 3, 3) if data_format == "NCX" else (3, 3, 1, c)).astype(np.int8)
    bias = rng.integers(-4, 4, c).astype(np.float32)
    scales = [0.5, 1.0, 2.0, 0.25, 1.5, 0.75] if per_channel else [0.5]
    axis = 1 if data_format == "NCX" else 2
    wq = Dequantize(scales=scales, qtype="per_channel", axis=axis) if per_channel else Dequantize(scales=scales)
    q = dict(src_dequantize=Dequantize(scales=0.5, zps=3), weights_dequantize=wq,
             dst_quantize=Quantize(scales=2.0, zps=5, dtype="u8"))
    attrs = dict(groups=c, pads_begin=1, pads_end=(0, 2), **fmt)
    op = oc.ConvTranspose(**attrs, post_ops=["ReLU"], **q)
    got = op(x, w, bias)
    assert (op.fused is True and (op.lowering or "").startswith("Dequantize+Convolution+")) if INT8_FUSES \
        else op.fused is False, op.lowering
    ref = reference.fused_conv_transpose(x, w, bias, post_ops=[PostOp("ReLU")], **q, **attrs)
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    assert len(np.unique(got)) > 3


@pytest.mark.parametrize("other_dtype", [np.uint8, np.int8])
def test_int8_sum_post_op_and_chain(other_dtype: Any) -> None:
    rng = np.random.default_rng(6)
    x = rng.integers(0, 10, (2, 4, 5, 5)).astype(np.uint8)
    w = rng.integers(-5, 5, (4, 3, 3, 3)).astype(np.int8)
    other = rng.integers(-20 if other_dtype == np.int8 else 0, 20, (2, 3, 10, 10)).astype(other_dtype)
    per_channel = rng.integers(1, 4, (1, 3, 1, 1)).astype(np.float32)
    chain = [PostOp("Add", dequantize=Dequantize(scales=0.5, zps=-2)), PostOp("Multiply"), PostOp("Clamp", min=-8, max=40)]
    q = dict(src_dequantize=Dequantize(scales=1.0, zps=1), weights_dequantize=Dequantize(scales=0.5),
             dst_quantize=Quantize(scales=0.5, zps=10, dtype="u8"))
    op = oc.ConvTranspose(**ATTRS, **formats("NCX"), post_ops=chain, **q)
    got = op(x, w, None, other, per_channel)
    # an s8 sum into a u8 dst: oneDNN 3.2 fuses it wrongly, so it runs unfused; a u8 one runs
    # after the int8 op (stride 2: strided_deconvolution_epilogue)
    assert op.fused is False, op.lowering
    staged = other_dtype == np.uint8 and INT8_FUSES
    assert (op.guard == STAGED and op.partitions >= 2) if staged else op.partitions == 1, op.lowering
    ref = reference.fused_conv_transpose(x, w, None, [other, per_channel], post_ops=chain, **q, **ATTRS,
                                         **formats("NCX"))
    np.testing.assert_array_equal(got.astype(np.float64), ref)


#: int8 data the non-VNNI kernels get wrong: int8_fused_wrong.py's case 110 (u8 src with zero
#: point 17, s8 weights, IOX, NXC, stride 2, LeakyReLU then Add of an f32 dst-shaped tensor),
#: which oneDNN 3.2 returned as 231.36 where 318.0 is right
DATA = Path(__file__).resolve().parent / "data"


def int8_unary_add_case(seed: int, unary: str, src_code: str, zp: int, data_format: str, oc_: int,
                        stride: int, add_first: bool = False) -> tuple[Any, ...]:
    """A full-range int8 problem (s8 weights in [-128, 127]) with ``unary`` and an Add of an
    f32 dst-shaped tensor, in that order (or the Add first): (op, args, reference)."""
    rng = np.random.default_rng(seed)
    ic = 4
    src_shape = (1, 4, 4, ic) if data_format == "NXC" else (1, ic, 4, 4)
    x = (rng.integers(0, 256, src_shape).astype(np.uint8) if src_code == "u8"
         else rng.integers(-128, 128, src_shape).astype(np.int8))
    w = rng.integers(-128, 128, (ic, oc_, 2, 2)).astype(np.int8)
    attrs = {"strides": stride, "data_format": data_format, "weights_format": "IOX"}
    q = {"src_dequantize": Dequantize(scales=0.25, zps=zp), "weights_dequantize": Dequantize(scales=0.0625)}
    shape = reference.fused_conv_transpose(x, w, **q, **attrs).shape
    res = rng.integers(-4, 5, shape).astype(np.float32)
    unary_op = PostOp(unary, **UNARY_ATTRS.get(unary, {}))
    chain = [PostOp("Add"), unary_op] if add_first else [unary_op, PostOp("Add")]
    op = oc.ConvTranspose(**attrs, post_ops=chain, **q)
    ref = reference.fused_conv_transpose(x, w, None, [res], post_ops=chain, **q, **attrs)
    return op, (x, w, None, res), ref


def expected_int8_guard(sum_index: int | None, strided: bool = False) -> str | None:
    """The guard that routes an int8 call whose library sum is post-op ``sum_index`` here
    (``strided``: a stride above 1, where a sum runs after the int8 op, when no route that
    leaves the call unfused applies)."""
    if not INT8_FUSES:
        return "int8_without_vnni"
    if ISA in INT8_SUM_AFTER_POST_OP and (sum_index or 0) > 0:
        return "int8_sum_after_post_op"
    return STAGED if strided and sum_index is not None else None


def test_int8_unary_then_add_never_runs_on_the_saturating_avx2_kernel() -> None:
    """oneDNN 3.2 runs an int8 chain whose "sum" (an Add of a dst-shaped tensor) follows
    another post-op on jit_uni_int8:avx2 where the AVX-512 kernels refuse it; without VNNI its
    u8 x s8 products saturate at 16 bits (s8 src: its weights are halved). Such calls run
    unfused on the ISA levels with that fallback, every result is right (this file runs under
    each ISA cap too: test_isa_matrix), and the Add-first and unary-only chains stay fused."""
    d = np.load(DATA / "int8_case_110.npz")
    attrs = {"strides": 2, "data_format": "NXC", "weights_format": "IOX"}
    q = {"src_dequantize": Dequantize(scales=0.25, zps=17), "weights_dequantize": Dequantize(scales=0.0625)}
    chain = [PostOp("LeakyReLU", alpha=0.25), PostOp("Add")]
    op = oc.ConvTranspose(**attrs, post_ops=chain, **q)
    got = op(d["src"], d["w"], None, d["arr_0"])
    ref = reference.fused_conv_transpose(d["src"], d["w"], None, [d["arr_0"]], post_ops=chain, **q, **attrs)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3)
    # its kernel (1, 2) under stride 2 leaves rows no tap reaches, and src has a zero point:
    # where the sum guard does not apply, the compensation guard does
    want = expected_int8_guard(1) or "int8_compensation_in_tapless_rows"
    assert op.guard == want and op.fused is False, op.lowering
    cases = 0
    for seed in range(16):
        for add_first in (False, True):
            unary = ("ReLU", "Abs", "LeakyReLU", "Square")[seed % 4]
            op, args, ref = int8_unary_add_case(seed, unary, ("u8", "s8")[seed % 2], (0, 17)[seed // 2 % 2],
                                                ("NXC", "NCX")[seed // 4 % 2], (1, 3, 16, 17)[seed % 4],
                                                1 + seed // 8, add_first)
            got = op(*args)
            scale = max(1.0, float(np.abs(ref).max()))
            assert np.abs(got - ref).max() <= 1e-5 * scale, (seed, add_first, op.lowering)
            want = expected_int8_guard(0 if add_first else 1, strided=1 + seed // 8 > 1)
            assert op.guard == want, (seed, add_first, op.lowering)
            cases += 1
    assert cases == 32


def test_int8_full_range_values_are_right_without_vnni() -> None:
    """Without VNNI (ISA levels sse41 to avx512_core), oneDNN 3.2's int8 kernels saturate u8 x
    s8 pairs (255 * 127 * 2 > 32767) and halve an s8 src's weights (1 becomes 0): there every
    int8 call runs unfused, in f32; elsewhere the plain int8 graph is fused and exact."""
    q = {"src_dequantize": Dequantize(scales=1.0), "weights_dequantize": Dequantize(scales=1.0)}
    for x, w in ((np.full((1, 3, 3, 8), 255, np.uint8), np.full((2, 2, 4, 8), 127, np.int8)),
                 (np.full((1, 3, 3, 8), -7, np.int8), np.ones((2, 2, 4, 8), np.int8))):
        op = oc.ConvTranspose(**q)
        got = op(x, w)
        np.testing.assert_array_equal(got, reference.fused_conv_transpose(x, w, **q))
        assert op.fused is INT8_FUSES and op.guard == expected_int8_guard(None), op.lowering


@pytest.mark.parametrize("src_code", ["u8", "s8"])
@pytest.mark.parametrize("rank", [1, 2])
def test_int8_output_padding_past_pads_end_keeps_the_last_taps(src_code: str, rank: int) -> None:
    """oneDNN 3.2's int8 deconvolution kernels (jit_deconvolution:avx512_core_vnni,
    jit_uni_int8:avx2_vnni) drop the last src column's taps where the width's output_padding
    exceeds its pads_end (k2 s2 output_padding 1 gave [1 1 2 2 0 0 0] for [1 1 2 2 3 3 0]):
    such int8 calls run unfused; output_padding up to pads_end, or past it in the height
    only, stays fused."""
    rng = np.random.default_rng(rank)
    c, x = 16, 3
    for pads_end, dst in ((0, None), (1, Quantize(scales=4.0, zps=3, dtype="u8"))):
        attrs = {"strides": 2, "pads_begin": 0, "pads_end": pads_end, "output_padding": 1, "data_format": "NXC",
                     "weights_format": "IOX"}
        shape = (1, *(x,) * rank, c)
        src = (rng.integers(0, 50, shape).astype(np.uint8) if src_code == "u8"
               else rng.integers(-50, 50, shape).astype(np.int8))
        w = rng.integers(-60, 60, (c, c, *(2,) * rank)).astype(np.int8)
        q = {"src_dequantize": Dequantize(scales=0.5, zps=3), "weights_dequantize": Dequantize(scales=0.25),
                 "dst_quantize": dst}
        op = oc.ConvTranspose(**attrs, **q)
        got = np.asarray(op(src, w), np.float64)
        ref = reference.fused_conv_transpose(src, w, **q, **attrs)
        if dst is None:
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-4)
        else:  # output_padding == pads_end: fused where int8 fuses, exact
            np.testing.assert_array_equal(got, ref)
        want = ("int8_without_vnni" if not INT8_FUSES else
                "int8_output_padding_past_pads" if pads_end == 0 else None)
        assert op.guard == want and op.fused is (want is None), op.lowering
    if rank == 2:  # past pads_end in the height only: right on every kernel measured
        attrs = {"strides": 2, "output_padding": (1, 0), "data_format": "NXC", "weights_format": "IOX"}
        op = oc.ConvTranspose(**attrs, **q)
        np.testing.assert_array_equal(np.asarray(op(src, w), np.float64),
                                      reference.fused_conv_transpose(src, w, **q, **attrs))
        assert op.fused is INT8_FUSES, op.lowering


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_int8_compensation_in_rows_no_tap_reaches_is_right(data_format: str) -> None:
    """An s8 src or a src zero point makes oneDNN 3.2's int8 deconvolution kernels add a
    compensation per output row; in a height or depth dim whose stride exceeds the dilated
    kernel, rows no tap reaches came out as garbage (1e8, different from run to run). Such
    calls run unfused; a u8 src with zero point 0, or that gap in the width only, stays fused."""
    rng = np.random.default_rng(3)
    for src_code, zp, strides, routed in (("s8", 0, (3, 2), True), ("u8", 3, (3, 1), True), ("s8", 3, (4, 4), True),
                                          ("u8", 0, (3, 2), False), ("s8", 3, (1, 3), False)):
        shape = (2, 8, 3, 2) if data_format == "NCX" else (2, 3, 2, 8)
        x = (rng.integers(0, 50, shape).astype(np.uint8) if src_code == "u8"
             else rng.integers(-50, 50, shape).astype(np.int8))
        w = rng.integers(-60, 60, (8, 4, 1, 1) if data_format == "NCX" else (1, 1, 4, 8)).astype(np.int8)
        attrs = dict(strides=strides, **formats(data_format))
        q = {"src_dequantize": Dequantize(scales=0.5, zps=zp), "weights_dequantize": Dequantize(scales=0.25)}
        for again in range(3):  # the garbage differed from run to run
            op = oc.ConvTranspose(**attrs, **q)
            got = op(x, w)
            np.testing.assert_allclose(got, reference.fused_conv_transpose(x, w, **q, **attrs), rtol=1e-6, atol=1e-4)
        want = ("int8_without_vnni" if not INT8_FUSES else "int8_compensation_in_tapless_rows" if routed else None)
        assert op.guard == want and op.fused is (want is None), (src_code, zp, strides, op.lowering)


@pytest.mark.parametrize("oc_", [64, 96])
def test_int8_quantize_zero_point_survives_a_split_off_binary_post_op(oc_: int) -> None:
    """A binary post-op whose tensor the deconvolution kernel cannot broadcast (per channel
    and row; the gemm kernel of a dilated strided problem) runs as its own primitive, then
    the Quantize as a reorder into the NCX u8 dst, which dropped the zero point when OC is a
    multiple of 64 (every value 26 too low). Such calls run unfused; OC 96 stays fused."""
    rng = np.random.default_rng(4)
    attrs = {"strides": (4, 3), "dilations": (2, 1), "pads_begin": (1, 0), "pads_end": (1, 1), "data_format": "NCX",
                 "weights_format": "XOI"}
    x = rng.integers(0, 256, (2, 16, 3, 6)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 4, oc_, 16)).astype(np.int8)
    q = {"src_dequantize": Dequantize(scales=0.01), "weights_dequantize": Dequantize(scales=0.006),
             "dst_quantize": Quantize(scales=0.05, zps=26, dtype="u8")}
    other = rng.uniform(-2, 2, (1, oc_, 11, 1)).astype(np.float32)  # per channel and row
    op = oc.ConvTranspose(**attrs, post_ops=["Multiply"], **q)
    got = op(x, w, None, other)
    ref = reference.fused_conv_transpose(x, w, None, [other], post_ops=[PostOp("Multiply")], **q, **attrs)
    np.testing.assert_array_equal(got.astype(np.float64), ref)
    want = ("int8_without_vnni" if not INT8_FUSES else "int8_quantize_zero_point_dropped" if oc_ == 64 else None)
    assert op.guard == want and op.fused is (want is None), op.lowering


def test_int8_compensation_in_rows_past_the_full_output_is_right() -> None:
    """The rows past the full output (a height output_padding above its pads_end) are rows
    no tap reaches too: with a src zero point, the last one came out as 9e3 where
    Abs(bias) = 0.18 is right (the fused fuzzer, AMD Zen4). Such calls run unfused; with an
    overhang of one row, none, or zero point 0, the same call stays fused."""
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, (1, 34, 10, 4)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 2, 6, 34)).astype(np.int8)
    bias = rng.uniform(-1, 1, 6).astype(np.float32)
    for zp, output_padding, routed in ((35, (2, 0), True), (0, (2, 0), False), (35, (1, 0), False), (35, (0, 0), False)):
        attrs = {"strides": (3, 3), "pads_begin": (2, 0), "pads_end": (0, 1), "output_padding": output_padding,
                 "data_format": "NCX", "weights_format": "XOI"}
        q = {"src_dequantize": Dequantize(scales=0.01, zps=zp), "weights_dequantize": Dequantize(scales=0.0018)}
        for again in range(2):  # garbage differs from run to run
            op = oc.ConvTranspose(**attrs, post_ops=["Abs"], **q)
            got = op(x, w, bias)
            ref = reference.fused_conv_transpose(x, w, bias, post_ops=[PostOp("Abs")], **q, **attrs)
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
        want = ("int8_without_vnni" if not INT8_FUSES else "int8_compensation_in_tapless_rows" if routed else None)
        assert op.guard == want and op.fused is (want is None), (zp, output_padding, op.lowering)


@pytest.mark.parametrize("after", ["Multiply", "Maximum", "ReLU", None])
@pytest.mark.parametrize("sum_zp", [4, 0])
def test_int8_sum_zero_point_then_a_binary_post_op_is_right(sum_zp: int, after: str | None) -> None:
    """The library's sum of a dequantized u8 tensor with a zero point, then a binary
    post-op: oneDNN 3.2's fused kernel got up to 12 quantization steps wrong (the fused
    fuzzer, AMD Zen4). Such calls run unfused; zero point 0, a unary post-op after the sum
    or none stay fused."""
    rng = np.random.default_rng(7)
    x = rng.integers(0, 256, (2, 16, 7)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 12, 3)).astype(np.int8)
    chain = [PostOp("Add", dequantize=Dequantize(scales=0.25, zps=sum_zp))]
    operands = [rng.integers(0, 256, (2, 12, 9)).astype(np.uint8)]
    if after is not None:
        chain.append(PostOp(after))
        if chain[-1].is_binary:
            operands.append(rng.uniform(-2, 2, (1, 1, 9)).astype(np.float32))
    q = {"src_dequantize": Dequantize(scales=0.01), "weights_dequantize": Dequantize(scales=0.01),
         "dst_quantize": Quantize(scales=0.5, zps=5, dtype="u8")}
    attrs = {"data_format": "NCX", "weights_format": "IOX"}
    op = oc.ConvTranspose(**attrs, post_ops=chain, **q)
    got = op(x, w, None, *operands).astype(np.float64)
    ref = reference.fused_conv_transpose(x, w, None, operands, post_ops=chain, **q, **attrs)
    assert np.abs(got - ref).max() <= 1  # one quantization step: rounding of a value at a half
    routed = sum_zp != 0 and after in ("Multiply", "Maximum")
    want = ("int8_without_vnni" if not INT8_FUSES else "int8_sum_zero_point_before_binary" if routed else None)
    assert op.guard == want and op.fused is (want is None), (sum_zp, after, op.lowering)


@pytest.mark.parametrize("zp, width, routed", [(5, 5, True), (0, 5, False), (5, 4, False)])
def test_int8_src_zero_point_with_a_wide_kernel_is_right(zp: int, width: int, routed: bool) -> None:
    """A src zero point with a kernel 5 or more wide: oneDNN 3.2's brgconv got most of dst
    wrong in some shapes (k5 pads 4/0 over 12 columns, OC 64; the fused fuzzer, AMD Zen4).
    Such calls run unfused; without the zero point, or 4 wide, they stay fused."""
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, (1, 16, 12)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 64, width)).astype(np.int8)
    attrs = {"pads_begin": (width - 1,), "pads_end": (0,), "data_format": "NCX", "weights_format": "IOX"}
    q = {"src_dequantize": Dequantize(scales=0.01, zps=zp), "weights_dequantize": Dequantize(scales=0.0055)}
    op = oc.ConvTranspose(**attrs, **q)
    np.testing.assert_allclose(op(x, w), reference.fused_conv_transpose(x, w, **q, **attrs), rtol=1e-5, atol=1e-3)
    want = ("int8_without_vnni" if not INT8_FUSES else "int8_src_zero_point_wide_kernel" if routed else None)
    assert op.guard == want and op.fused is (want is None), op.lowering


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])  # in this order: see the docstring
def test_int8_one_dst_position_with_a_binary_post_op_is_right(data_format: str) -> None:
    """Every dst spatial size 1, a binary post-op: compiled first as NCX, oneDNN 3.2 fell
    back to its avx2 kernel, which saturates where the CPU lacks AVX-VNNI (4 of 37 values
    wrong on an AMD Zen4), and an NXC call compiled after it reused that kernel. Such calls
    run unfused in both layouts where that fallback is possible (NCX first here)."""
    rng = np.random.default_rng(9)
    x = rng.integers(0, 256, (1, 16, 1, 1) if data_format == "NCX" else (1, 1, 1, 16)).astype(np.uint8)
    w = rng.integers(-128, 128, (16, 37, 3, 3)).astype(np.int8)
    other = rng.uniform(-2, 2, (1, 37, 1, 1) if data_format == "NCX" else (1, 1, 1, 37)).astype(np.float32)
    attrs = {"pads_begin": (1, 1), "pads_end": (1, 1), "data_format": data_format, "weights_format": "IOX"}
    q = {"src_dequantize": Dequantize(scales=0.01, zps=3), "weights_dequantize": Dequantize(scales=0.01),
         "dst_quantize": Quantize(scales=0.5, zps=5, dtype="u8")}
    op = oc.ConvTranspose(**attrs, post_ops=["Multiply"], **q)
    got = op(x, w, None, other).astype(np.float64)
    ref = reference.fused_conv_transpose(x, w, None, [other], post_ops=[PostOp("Multiply")], **q, **attrs)
    assert np.abs(got - ref).max() <= 1  # one quantization step: rounding of a value at a half
    want = ("int8_without_vnni" if not INT8_FUSES else
            "int8_single_position_binary" if ISA in INT8_SUM_AFTER_POST_OP else None)
    assert op.guard == want and op.fused is (want is None), op.lowering


@pytest.mark.parametrize("sum_zp, channels, strides", [(17, 4, (1, 1)), (17, 2, (1, 1)), (0, 4, (1, 1)),
                                                    (17, 5, (1, 1)), (17, 4, (2, 1))])
def test_int8_sum_zero_point_with_few_src_channels_is_right(sum_zp: int, channels: int,
                                                            strides: tuple[int, int]) -> None:
    """A sum with a zero point at stride 1 over at most 4 src channels per group: oneDNN 3.2
    fell back to its avx2 kernel, which saturates where the CPU lacks AVX-VNNI (338 of 1,440
    values off by up to 21 steps in the fused fuzzer's case, an AMD Zen4). Such calls run
    unfused; zero point 0, 5 channels or a stride stay fused."""
    rng = np.random.default_rng(10)
    x = rng.integers(0, 256, (3, channels, 11, 5)).astype(np.uint8)
    w = rng.integers(-128, 128, (channels, 12, 4, 3)).astype(np.int8)
    attrs = {"strides": strides, "pads_begin": (3, 0), "pads_end": (3, 2), "data_format": "NCX",
             "weights_format": "IOX"}
    other = rng.integers(0, 256, (3, 12, 10 * strides[0] - 2, 4 * strides[1] + 1)).astype(np.uint8)
    chain = [PostOp("Add", dequantize=Dequantize(scales=0.05, zps=sum_zp))]
    q = {"src_dequantize": Dequantize(scales=0.05), "weights_dequantize": Dequantize(scales=0.0075),
         "dst_quantize": Quantize(scales=0.58, zps=20, dtype="u8")}
    op = oc.ConvTranspose(**attrs, post_ops=chain, **q)
    got = op(x, w, None, other).astype(np.float64)
    ref = reference.fused_conv_transpose(x, w, None, [other], post_ops=chain, **q, **attrs)
    assert np.abs(got - ref).max() <= 1  # one quantization step: rounding of a value at a half
    routed = sum_zp != 0 and channels <= 4 and strides == (1, 1) and ISA in INT8_SUM_AFTER_POST_OP
    if not INT8_FUSES:
        assert op.guard == "int8_without_vnni"
    elif routed:
        assert op.guard == "int8_sum_zero_point_few_channels" and not op.fused, op.lowering
    else:  # fused, or staged for another guard at a stride (strided_deconvolution_epilogue)
        assert op.guard in (None, "strided_deconvolution_epilogue"), op.lowering
        assert op.fused is (op.guard is None), op.lowering


def test_int8_compensation_where_no_tap_reaches_the_width_is_right() -> None:
    """Taps that all fall in the pads or between dilated taps along the width (k2 d2 pads
    1/1 over one src column): with a src zero point, brgconv returned garbage (1e6) for OC
    512. Such calls run unfused; without a zero point (u8) the same call stays fused."""
    rng = np.random.default_rng(5)
    attrs = {"dilations": (1, 2), "pads_begin": (0, 1), "pads_end": (2, 1), "data_format": "NCX",
             "weights_format": "IOX"}
    x = rng.integers(0, 50, (2, 16, 1, 1)).astype(np.uint8)
    w = rng.integers(-60, 60, (16, 512, 4, 2)).astype(np.int8)
    for zp in (7, 0):
        q = {"src_dequantize": Dequantize(scales=1.0, zps=zp), "weights_dequantize": Dequantize(scales=1.0)}
        op = oc.ConvTranspose(**attrs, **q)
        np.testing.assert_allclose(op(x, w), reference.fused_conv_transpose(x, w, **q, **attrs), atol=1e-4)
        want = ("int8_without_vnni" if not INT8_FUSES else "int8_compensation_in_tapless_rows" if zp else None)
        assert op.guard == want and op.fused is (want is None), op.lowering


def test_library_sum_is_the_first_add_of_a_dst_shaped_tensor() -> None:
    dst = (2, 3, 4, 4)
    relu, add, mul = PostOp("ReLU"), PostOp("Add"), PostOp("Multiply")
    assert library_sum([relu, add], [dst], dst) == 1
    assert library_sum([add, relu, add], [dst, dst], dst) == 0
    assert library_sum([mul, add], [dst, dst], dst) == 1  # a Multiply stays binary
    assert library_sum([add, add], [(1, 3, 1, 1), dst], dst) == 1  # per channel: binary
    assert library_sum([relu, add], [(1, 1, 1, 1)], dst) is None
    assert library_sum([relu], [], dst) is None


@pytest.mark.parametrize("level", ["AVX2", "AVX512_CORE_BF16"])
def test_int8_routes_hold_under_isa_caps(level: str) -> None:
    """The two int8 routes, in a child capped at ``level`` (where this CPU has it, the
    non-VNNI kernels run there): full-range int8 chains match the reference."""
    code = (
        "import numpy as np, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "import test_fusion as t\n"
        "t.test_int8_unary_then_add_never_runs_on_the_saturating_avx2_kernel()\n"
        "t.test_int8_full_range_values_are_right_without_vnni()\n"
        "t.test_int8_output_padding_past_pads_end_keeps_the_last_taps('s8', 2)\n"
        "t.test_int8_compensation_in_rows_no_tap_reaches_is_right('NCX')\n"
        "print(t.ISA)\n"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=level)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("chain", [["ReLU"], ["Multiply"], ["ReLU", "Add"]])
def test_fused_size_one_dims_with_odd_strides_reach_the_library_as_plain_calls_do(flipped_rule: None, code: str,
                                                                                  chain: list[str]) -> None:
    """IC = OC = 1 and kernel 1 (depthwise, stride 1: the Convolution over flipped weights,
    whose flip leaves a negative stride on a size-1 dim), and size-1 dims with zero or
    negative strides in every input: the fused call presents them to oneDNN as the plain call
    does (a bare AssertionError in the plan's describe before)."""
    dt = DTYPES[code]
    x = np.ones((1, 2, 1), dt)
    w = np.ones((1, 1, 1), dt)
    other = np.full((1,), 2.0, dt)
    cases = [
        (x, w, other),
        (x[:, :, ::-1], w[::-1, ::-1, ::-1], np.broadcast_to(other, (1, 1, 1))),  # negative / zero strides
        (np.broadcast_to(np.arange(2, dtype=dt)[None, :, None], (1, 2, 1)), w[..., None][..., 0], other[None]),
    ]
    for src, weights, operand in cases:
        op = oc.ConvTranspose(weights_format="IOX", post_ops=chain)
        operands = [operand] * sum(POST_OPS[k].is_binary for k in chain)
        got = op(src, weights, None, *operands)
        ref = reference.fused_conv_transpose(src, weights, None, operands, post_ops=[PostOp(k) for k in chain],
                                             weights_format="IOX")
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=1e-2)
        assert op.fused is True, op.lowering


# -- errors -----------------------------------------------------------------------------------

def test_errors_name_the_post_op() -> None:
    src, w, b = inputs("NXC", "f32")
    op = oc.ConvTranspose(**ATTRS, post_ops=[PostOp("ReLU"), PostOp("Add")])
    with pytest.raises(ValueError, match=r"post_ops\[1\] \(Add\).*does not broadcast"):
        op(src, w, b, np.zeros((2, 7, 1, 3), np.float32))
    with pytest.raises(TypeError, match=r"post_ops\[1\] \(Add\).*expected dtype"):
        op(src, w, b, np.zeros((3,), np.float64))
    with pytest.raises(TypeError, match=r"one float dtype.*post_ops\[1\] \(Add\)=bf16"):
        op(src, w, b, np.zeros((3,), ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match=r"expected 1 post-op tensor"):
        op(src, w, b)
    with pytest.raises(ValueError, match=r"unknown post-op 'Pow'"):
        PostOp("Pow")
    with pytest.raises(TypeError, match=r"PostOp ReLU: unknown attribute\(s\) alpha"):
        PostOp("ReLU", alpha=1.0)
    with pytest.raises(ValueError, match=r"PostOp LeakyReLU: attribute 'alpha' is required"):
        PostOp("LeakyReLU")
    with pytest.raises(ValueError, match=r"at most 3 post-ops"):
        oc.ConvTranspose(post_ops=["ReLU", "Tanh", "Abs", "Exp"])
    with pytest.raises(TypeError, match=r"expected PostOp objects or kind names"):
        oc.ConvTranspose(post_ops=[42])


def test_int8_errors() -> None:
    with pytest.raises(ValueError, match="no weights zero points"):
        oc.ConvTranspose(src_dequantize=Dequantize(scales=1.0), weights_dequantize=Dequantize(scales=1.0, zps=1))
    with pytest.raises(ValueError, match="both 'src_dequantize' and 'weights_dequantize'"):
        oc.ConvTranspose(src_dequantize=Dequantize(scales=1.0))
    with pytest.raises(ValueError, match="'dst_quantize' needs an int8 op"):
        oc.ConvTranspose(dst_quantize=Quantize(scales=1.0))
    with pytest.raises(TypeError, match="Quantize: dtype expected 'u8' or 's8'"):
        Quantize(scales=1.0, dtype="s32")
    op = oc.ConvTranspose(src_dequantize=Dequantize(scales=1.0),
                          weights_dequantize=Dequantize(scales=[1.0] * 4, qtype="per_channel", axis=0))
    x = np.zeros((1, 3, 3, 2), np.uint8)
    with pytest.raises(ValueError, match="per-channel axis 2"):
        op(x, np.zeros((3, 3, 4, 2), np.int8))
    good = oc.ConvTranspose(src_dequantize=Dequantize(scales=1.0), weights_dequantize=Dequantize(scales=1.0))
    with pytest.raises(TypeError, match="'weights' expected dtype int8"):
        good(x, np.zeros((3, 3, 4, 2), np.uint8))
    with pytest.raises(TypeError, match="an int8 ConvTranspose needs src_dequantize"):
        oc.ConvTranspose()(x, np.zeros((3, 3, 4, 2), np.int8))


def test_pickles_and_repr() -> None:
    op = oc.ConvTranspose(post_ops=[PostOp("Clamp", min=0, max=6)])
    again = pickle.loads(pickle.dumps(op))
    assert again.fusion == op.fusion
    assert "post_ops=[PostOp('Clamp', min=0.0, max=6.0)]" in repr(op)


@pytest.mark.parametrize("code", ["bf16", "f16"])
def test_guarded_low_precision_runs_the_graph_in_f32(code: str) -> None:
    # stride >= kernel: on AMX the guard keeps bf16 off the library's kernel; elsewhere the
    # native graph runs. Either way the answer is right and the lowering says which.
    rng = np.random.default_rng(7)
    dt = DTYPES[code]
    src = rng.uniform(-1, 1, (1, 4, 4, 2)).astype(dt)
    w = rng.uniform(-1, 1, (2, 2, 3, 2)).astype(dt)
    chain = [PostOp("Sigmoid")]
    op = oc.ConvTranspose(strides=3, post_ops=chain)  # stride > kernel: the taps do not tile dst
    got = op(src, w)
    check(got, src, w, None, [], chain, code, strides=3)
    guarded = oc.guards.active(oc.guards.AMX_STRIDE_NOT_BELOW_KERNEL, code)
    assert op.guard == ("amx_stride_not_below_kernel" if guarded else STAGED)
    assert op.fused is False and op.partitions == 2  # the stride guard: the op, then Sigmoid
    if guarded:
        assert "(f32 emulation)" in (op.lowering or "")
    # the second call runs the C++ executor, which converts to f32 staging memory when emulated
    assert op._fast is not None or not oc._core.fast_conversion
    again = op(src, w)
    np.testing.assert_array_equal(np.asarray(again, np.float64), np.asarray(got, np.float64))


def tiles_inputs(code: str, rank: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """NXC src, XOI weights (kernel 2), bias and dst's shape of a stride-2 problem whose taps
    tile dst (the U-Net up-sampling)."""
    rng = np.random.default_rng(seed)
    xs = (3, 4, 2)[:rank] if rank < 3 else (2, 3, 2)
    dt = DTYPES[code]
    src = rng.uniform(-1, 1, (2, *xs, 5)).astype(dt)
    w = rng.uniform(-0.5, 0.5, (*(2,) * rank, 3, 5)).astype(dt)
    return src, w, rng.uniform(-0.5, 0.5, 3).astype(dt), (2, *(2 * x for x in xs), 3)


@pytest.fixture
def tiles_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules choose the tiles MatMul for every problem it can run (the measured table
    chooses it for some shapes per CPU: the models suite's conv3d layer in f32 here)."""
    from onednn_convt import lowering
    from onednn_convt.lowering import base, matmul_tiles

    rule = lowering.rule

    def tiles_first(p: Any, native: bool = False, phase: bool = False) -> str:
        g = p.geometry
        if p.op == "ConvTranspose" and matmul_tiles.applies(p.kernel, *g.astuple(), p.groups, p.output_padding):
            return base.TILES
        return rule(p, native=native)

    monkeypatch.setattr(lowering, "rule", tiles_first)


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("chain, operands", [
    (["ReLU"], []), (["Add", "GELU"], ["full"]), (["Multiply", "Tanh", "Maximum"], ["one", "full"]),
    (["Add", "ReLU", "Multiply"], ["full", "channel"]),
])
def test_tiles_matmul_heads_the_graph_where_its_kernels_take_the_chain(
        tiles_rule: None, rank: int, code: str, chain: list[str], operands: list[str]) -> None:
    """Where the plain op runs as the tiles MatMul, the fused graph is that MatMul and its
    post-ops, in the MatMul's shape of dst: f32 and bf16 on the CPUs whose MatMul kernels
    take every chain (fusion.MATMUL_POST_OPS_ISAS), dst-shaped and one-valued tensors;
    else the ConvTranspose heads it. Right either way, twice (the plan's second call)."""
    from onednn_convt import fusion, guards

    src, w, b, shape = tiles_inputs(code, rank)
    rng = np.random.default_rng(5)
    sizes = {"full": shape, "one": (1,), "channel": (3,)}
    tensors = [rng.uniform(0.5, 1.5, sizes[o]).astype(DTYPES[code]) for o in operands]
    posts = [PostOp(k) for k in chain]
    op = oc.ConvTranspose(strides=2, post_ops=posts)
    got = op(src, w, b, *tensors)
    check(got, src, w, b, tensors, posts, code, strides=2)
    matmul = guards.dispatch_isa() in fusion.MATMUL_POST_OPS_ISAS.get(code, ()) and "channel" not in operands
    if matmul:
        assert op.fused is True and op.partitions == 1
    else:  # the plain op (the tiles MatMul, its rule), strided: the guard runs the post-ops after it
        assert_staged(op)
        assert "(the ConvTranspose as the plain op runs it" in (op.lowering or ""), op.lowering
    assert (op.lowering or "").startswith("MatMul+" if matmul else "MatMul (tiles)+"), op.lowering
    if matmul:
        assert "(the ConvTranspose as a MatMul over the taps)" in (op.lowering or "")
        assert "emulation" not in (op.lowering or "")  # bf16 native, guarded or not
    again = op(src, w, b, *tensors)
    np.testing.assert_array_equal(np.asarray(again, np.float64), np.asarray(got, np.float64))


@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_tiles_matmul_out_may_be_the_residual(tiles_rule: None, code: str) -> None:
    """out= the dst-shaped Add's own tensor, which the MatMul sees in its own shape."""
    src, w, b, shape = tiles_inputs(code, 2, seed=3)
    residual = np.random.default_rng(4).uniform(-1, 1, shape).astype(DTYPES[code])
    want = oc.ConvTranspose(strides=2, post_ops=["Add", "ReLU"])(src, w, b, residual)
    op = oc.ConvTranspose(strides=2, post_ops=["Add", "ReLU"])
    got = op(src, w, b, residual, out=residual)
    assert got is residual
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))


def test_torch_tensors_in_torch_tensor_out() -> None:
    torch = pytest.importorskip("torch")
    src, w, b = inputs("NCX", "f32")
    other = np.random.default_rng(8).uniform(-1, 1, (1, 3, 1, 1)).astype(np.float32)
    op = oc.ConvTranspose(**ATTRS, **formats("NCX"), post_ops=[PostOp("Maximum")])
    got = op(torch.from_numpy(src), torch.from_numpy(w), torch.from_numpy(b), torch.from_numpy(other))
    assert isinstance(got, torch.Tensor)
    check(got.numpy(), src, w, b, [other], [PostOp("Maximum")], "f32", **ATTRS, **formats("NCX"))


def test_random_chains_against_the_reference() -> None:
    """60 seeded problems: 1-D to 3-D, groups, layouts, dtypes, chains of 1-3 post-ops."""
    rng = np.random.default_rng(9)
    safe = [k for k in sorted(POST_OPS) if k not in POSITIVE + ("Exp", "Divide")]  # bounded gradients
    for case in range(60):
        spatial = int(rng.integers(1, 4))
        groups = int(rng.choice([1, 2]))
        ic, o = 2 * groups, int(rng.integers(1, 4))
        data_format = str(rng.choice(["NCX", "NXC"]))
        code = str(rng.choice(["f32", "bf16", "f16"]))
        xs = tuple(int(v) for v in rng.integers(2, 5, spatial))
        ks = tuple(int(v) for v in rng.integers(1, 4, spatial))
        stride = int(rng.integers(1, 3))
        fmt = formats(data_format)
        src_shape = (2, ic, *xs) if data_format == "NCX" else (2, *xs, ic)
        w_shape = (ic, o, *ks) if data_format == "NCX" else (*ks, o, ic)
        dt = DTYPES[code]
        src = rng.uniform(-1, 1, src_shape).astype(dt)
        w = rng.uniform(-1, 1, w_shape).astype(dt)
        bias = rng.uniform(-1, 1, o * groups).astype(dt) if rng.random() < 0.5 else None
        kinds = [str(k) for k in rng.choice(safe, int(rng.integers(1, 4)))]
        chain = [PostOp(k, **UNARY_ATTRS.get(k, {})) for k in kinds]
        attrs = dict(strides=stride, groups=groups, **fmt)
        shape = reference.conv_transpose(src, w, **attrs).shape
        operands = []
        for p in chain:
            if p.is_binary:
                full = list(shape)
                for d in range(len(full)):
                    if rng.random() < 0.5:
                        full[d] = 1
                operands.append(rng.uniform(-1, 1, full).astype(dt))
        op = oc.ConvTranspose(**attrs, post_ops=chain)
        got = op(src, w, bias, *operands)
        assert got.dtype == dt, case
        try:
            check(got, src, w, bias, operands, chain, code, **attrs)
        except AssertionError as e:
            raise AssertionError(f"case {case}: {code} {data_format} {src_shape} {w_shape} {kinds} {op.lowering}: {e}") from None


def test_int8_sum_on_the_strided_deconvolution_runs_after_the_op() -> None:
    """An int8 ConvTranspose (3-D, stride 2, 512 channels) with a dst-shaped Add into f32:
    oneDNN 3.2's strided kernel applied the library's 'sum' wrongly (errors of 1-1.6x the
    output's scale, fuzz/fused_chains.py); the int8 op runs alone, the Add after it."""
    rng = np.random.default_rng(0)
    src = rng.integers(0, 255, (1, 2, 2, 2, 512)).astype(np.uint8)
    w = rng.integers(-100, 100, (4, 4, 4, 256, 512)).astype(np.int8)
    attrs = dict(strides=2, pads_begin=1, pads_end=1, data_format="NXC", weights_format="XOI")
    q = dict(src_dequantize=Dequantize(scales=0.01, zps=34), weights_dequantize=Dequantize(scales=0.001))
    pre = reference.fused_conv_transpose(src, w, None, [], **q, **attrs)
    residual = rng.standard_normal(pre.shape).astype(np.float32)
    op = oc.ConvTranspose(**attrs, post_ops=["Add"], **q)
    got = op(src, w, None, residual)
    want = reference.fused_conv_transpose(src, w, None, [residual], post_ops=[PostOp("Add")], **q, **attrs)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    assert op.guard == expected_int8_guard(0, strided=True), op.lowering  # no VNNI: unfused


def test_a_post_op_the_library_refuses_in_bf16_runs_the_graph_in_f32() -> None:
    """bf16 Round after a strided ConvTranspose: the staged route gives Round a partition of
    its own, which oneDNN 3.2's eltwise refuses in bf16 (status 2); the graph runs in f32."""
    src, w, b = inputs("NCX", "bf16")  # NCX: BiasAdd, then Round alone
    chain = [PostOp("Round")]
    op = oc.ConvTranspose(**ATTRS, **formats("NCX"), post_ops=chain)
    got = op(src, w, b)
    check(got, src, w, b, [], chain, "bf16", **ATTRS, **formats("NCX"))
    assert op.guard == STAGED and "(f32 emulation)" in op.lowering, op.lowering

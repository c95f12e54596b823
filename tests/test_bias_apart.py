"""A forward's bias kept out of the library ops (``lowering.forward.bias_apart``): the core
adds it to a small f32 result after the op (``"+bias (core)"``; a bf16/f16 one computed in
f32 too), a second partition to a larger or low-precision one (``"+BiasAdd: 2 partitions"``);
a polyphase call's phases take it where the core adds it to each phase's view (a small f32
result), else one BiasAdd follows them over dst.

Each path against the float64 reference, planned and then through the C++ executor, into
fresh and strided (NaN-filled) out= arrays, with biases that are views (every other value,
reversed); and the core's own check of what it is handed."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import assert_close, require_native

from onednn_convt import _core, reference
from onednn_convt.lowering import base, forward

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

#: (spatial src, kernel, strides, groups): stride 1 and 2, 1-D to 3-D, grouped
SHAPES = [((5,), (3,), (1,), 1), ((5, 4), (3, 2), (1, 1), 1), ((4, 5), (4, 4), (2, 2), 1),
          ((3, 4), (3, 3), (1, 1), 2), ((3, 3, 2), (2, 3, 2), (2, 1, 1), 1)]


def _case(rng, shape, data_format, code, n=2, ic=4, oc_=6):
    sp, k, s, g = shape
    dt = ml_dtypes.bfloat16 if code == "bf16" else np.float32
    x = rng.standard_normal((n, ic, *sp) if data_format == "NCX" else (n, *sp, ic)).astype(dt)
    w = rng.standard_normal((ic, oc_ // g, *k)).astype(dt)
    longer = rng.standard_normal(2 * oc_).astype(dt)
    attrs = dict(strides=s, groups=g, data_format=data_format, weights_format="IOX")
    return attrs, x, w, longer


def _check(op, attrs, x, w, b, code, ic):
    ref = reference.conv_transpose(*(np.asarray(a, np.float64) for a in (x, w, b)), **attrs)
    k = int(np.prod(w.shape[2:]))
    strided = np.full((*ref.shape[:-1], 2 * ref.shape[-1]), np.nan, x.dtype)[..., ::2]
    for got in (op(x, w, b), op(x, w, b), op(x, w, b, out=strided), op(x, w, b, out=strided)):
        assert_close(got, ref, code, ic * k, f"{op!r} {op.lowering}")
    assert np.isnan(strided.base[..., 1::2].astype(np.float32)).all()  # the loop stays in the view


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_core_adds_a_small_f32_results_bias(shape, data_format):
    rng = np.random.default_rng(len(shape[0]))
    attrs, x, w, longer = _case(rng, shape, data_format, "f32")
    for b in (longer[::2], longer[:6][::-1], np.ascontiguousarray(longer[:6])):
        op = oc.ConvTranspose(**attrs)
        _check(op, attrs, x, w, b, "f32", 4)
        if op.lowering == "Convolution":  # over flipped weights (stride 1): the convolution takes it
            continue
        assert op.lowering.endswith("+bias (core)") and op.partitions == 1, op.lowering


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_partition_adds_the_bias_of_larger_or_bf16_results(shape, data_format, code, monkeypatch):
    monkeypatch.setattr(forward, "HOST_BIAS_ELEMENTS", 0)  # every f32 result "large"
    rng = np.random.default_rng(7)
    attrs, x, w, longer = _case(rng, shape, data_format, code)
    op = oc.ConvTranspose(**attrs)
    _check(op, attrs, x, w, longer[::2], code, 4)
    if op.lowering.removesuffix(" (f32 emulation)") != "Convolution":
        assert "+BiasAdd: 2 partitions" in op.lowering and op.partitions == 2, op.lowering


@pytest.mark.parametrize("code", ["bf16", "f16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_core_adds_the_bias_of_a_small_result_computed_in_f32(shape, data_format, code, monkeypatch):
    """A bf16/f16 forward whose library op computes in f32 (``"<name> in f32"``) is an f32
    problem to the bias: in a small result the core adds it to the f32 result, which is then
    rounded once (no BiasAdd partition). Exactly the f32 op of the same name on the widened
    inputs, rounded once; within tolerance of the reference, into strided out= too."""
    from onednn_convt import lowering

    rng = np.random.default_rng(9)
    attrs, x, w, longer = _case(rng, shape, data_format, "f32")
    dt = oc.dtypes.FLOAT_DTYPES[code]
    x, w, longer = x.astype(dt), w.astype(dt), longer.astype(dt)
    problem = oc.ConvTranspose(**attrs)._problem([x, w, longer[:6]], code)
    names = [n.removesuffix(lowering.IN_F32) for n in lowering.candidates(problem)
             if n.endswith(lowering.IN_F32)]
    names = [n for n in names if n in (base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA)]  # bias apart
    assert names, "no library op computed in f32"
    real_rule = lowering.rule
    for name in names:
        monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: name + lowering.IN_F32 if p.dtype == code
                            else name if p.dtype == "f32" else real_rule(p, native=native))
        for b in (longer[::2], np.ascontiguousarray(longer[:6])):
            op = oc.ConvTranspose(**attrs)
            _check(op, attrs, x, w, b, code, 4)
            assert op.lowering.endswith("+bias (core) (f32 emulation)") and op.partitions == 1, op.lowering
            f32 = oc.ConvTranspose(**attrs)
            want = f32(*(np.asarray(a, np.float32) for a in (x, w, b))).astype(dt)
            assert f32.lowering == name + "+bias (core)", f32.lowering
            np.testing.assert_array_equal(op(x, w, b).view(np.uint16), want.view(np.uint16), f"{name} {code}")


def test_the_choice():
    """Which way each problem goes."""
    op = oc.ConvTranspose(data_format="NCX", weights_format="IOX")
    x, w, b = np.ones((1, 4, 5, 5), np.float32), np.ones((4, 3, 3, 3), np.float32), np.ones(3, np.float32)
    p = op._problem([x, w, b], "f32")
    assert forward.bias_apart(p) == forward.HOST and base.CONVOLUTION_BACKWARD_DATA in forward.candidates(p)
    assert forward.bias_apart(op._problem([x, w, None], "f32")) is None
    assert forward.bias_apart(op._problem([x, w, b], "bf16")) == forward.STAGE
    assert forward.bias_apart(op._problem([x, w, b], "bf16"), in_f32=True) == forward.HOST
    big = np.ones((1, 4, 200, 200), np.float32)  # 3 x 202 x 202 > HOST_BIAS_ELEMENTS
    assert forward.bias_apart(op._problem([big, w, b], "f32")) == forward.STAGE


def _dense(shape, code="f32"):
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    return (list(shape), strides, code)


@pytest.mark.parametrize("axis", [1, 3])
def test_core_bias_on_any_output_strides(axis):
    """``_core.compile(..., bias_axis=)`` straight: the library op without the bias, then the
    core's loop over an output of other strides (a transposed view)."""
    rng = np.random.default_rng(axis)
    fmt = "NCX" if axis == 1 else "NXC"
    x = rng.standard_normal((2, 4, 5, 5) if fmt == "NCX" else (2, 5, 5, 4)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    shape = (2, 3, 7, 7) if fmt == "NCX" else (2, 7, 7, 3)
    base = np.full(shape[::-1], np.nan, np.float32)
    out = base.T  # Fortran order: no dense stride
    attrs = dict(strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1], auto_pad="None",
                 groups=1, data_format=fmt, weights_format="IOX", output_padding=[0, 0])
    out_desc = (list(shape), [s // 4 for s in out.strides], "f32")
    compiled = _core.compile("ConvTranspose", attrs, [_dense(x.shape), _dense(w.shape), _dense(b.shape)], out_desc,
                             bias_axis=axis)
    assert compiled.partitions == 1
    compiled.execute([x, w, b], out)
    ref = reference.conv_transpose(*(a.astype(np.float64) for a in (x, w, b)), data_format=fmt, weights_format="IOX")
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 4])
@pytest.mark.parametrize(("code", "large"), [("f32", False), ("f32", True), ("bf16", False)])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_polyphase_bias_in_the_phases_or_after_them(code, large, data_format, groups, monkeypatch):
    """The polyphase lowering forced: a small f32 result's phases take the bias (the core adds
    it to each view), a larger (or bf16) one's phases run without it and one BiasAdd follows
    over dst (in NumPy for an out= of other strides), unless every phase is a forward
    Convolution (depthwise), which takes it; the bias-only views hold the bias."""
    if code == "bf16":  # a forced route of the native bf16 kernels (emulated bf16: the f32 rules)
        require_native("bf16")
    from onednn_convt import lowering
    from onednn_convt.lowering import base, polyphase

    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else
                        lowering.candidates(p)[0])
    if large:
        monkeypatch.setattr(forward, "HOST_BIAS_ELEMENTS", 0)
    rng = np.random.default_rng(5)
    dt = ml_dtypes.bfloat16 if code == "bf16" else np.float32
    # k3 s4: kernel below the stride, so some phases hold the bias alone; output_padding too
    attrs = dict(strides=(2, 4), output_padding=(1, 2), pads_begin=(1, 0), pads_end=(0, 1), data_format=data_format,
                 weights_format="IOX")
    attrs["groups"] = groups
    oc_ = 3 if groups == 1 else 4
    x = rng.standard_normal((2, 4, 5, 4) if data_format == "NCX" else (2, 5, 4, 4)).astype(dt)
    w = rng.standard_normal((4, oc_ // groups, 3, 3)).astype(dt)
    longer = rng.standard_normal(2 * oc_).astype(dt)
    misaligned = np.zeros(oc_ * np.dtype(dt).itemsize + 1, np.uint8)[1:].view(dt)  # contiguous, one byte off
    misaligned[...] = longer[:oc_]
    assert not misaligned.flags.aligned
    for b in (longer[::2], longer[:oc_][::-1], misaligned):
        op = oc.ConvTranspose(**attrs)
        _check(op, attrs, x, w, b, code, 4 // groups)
        text = op.lowering or ""
        assert text.startswith("Polyphase"), text
        convolutions = all(p is None or p.lowering.kind == "Convolution" for p in op.last_plan.plans)
        after = (code == "bf16" or large) and not convolutions
        assert text.startswith("Polyphase+BiasAdd (") == after, text
        assert ("+bias (core)" in text) == (not after and not convolutions), text
        assert op.partitions == sum(p is not None for p in op.last_plan.plans) + after


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_polyphase_of_forward_convolutions_keeps_the_bias_in_them(code, data_format, monkeypatch):
    """A depthwise k4 s2 p1 layer, polyphase forced and every f32 result "large": each phase is
    the hand rules' forward Convolution over flipped weights, which takes the bias itself, so
    no BiasAdd follows."""
    if code == "bf16":  # a forced route of the native bf16 kernels (emulated bf16: the f32 rules)
        require_native("bf16")
    from onednn_convt import lowering
    from onednn_convt.lowering import base, polyphase

    rule = lowering.rule
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else
                        rule(p, native=native))
    monkeypatch.setattr(forward, "HOST_BIAS_ELEMENTS", 0)
    rng = np.random.default_rng(8)
    dt = ml_dtypes.bfloat16 if code == "bf16" else np.float32
    attrs = dict(strides=2, pads_begin=1, pads_end=1, groups=8, data_format=data_format, weights_format="IOX")
    x = rng.standard_normal((2, 8, 5, 4) if data_format == "NCX" else (2, 5, 4, 8)).astype(dt)
    w = rng.standard_normal((8, 1, 4, 4)).astype(dt)
    b = rng.standard_normal(8).astype(dt)
    op = oc.ConvTranspose(**attrs)
    _check(op, attrs, x, w, b, code, 4)
    assert op.lowering == "Polyphase (4 phases, stride 1: Convolution)", op.lowering

"""The lowering rules of onednn_convt.lowerings: each choice matches the float64 reference
on shapes that take it, in every dtype, with and without out=, and op.lowering reports it;
NaN and Inf stay within what the reference and the zero-padded reading allow."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import DTYPES, OPS, Config, assert_close
from test_backward_taps import loop_backward
from test_numerics import call, classes, inputs_of, reference, with_non_finite

import onednn_convt as oc
from onednn_convt.lowering import base, rules
from onednn_convt.lowering import weights as lowering_weights

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

FWD, BWD_D, BWD_W = OPS
CONV, CONV_BWD_W = base.CONVOLUTION, base.CONVOLUTION_BACKWARD_WEIGHTS
CONV_BWD_D = base.CONVOLUTION_BACKWARD_DATA
CONV_T, CONV_T_BWD_D, CONV_T_BWD_W = (
    base.CONV_TRANSPOSE, base.CONV_TRANSPOSE_BACKWARD_DATA, base.CONV_TRANSPOSE_BACKWARD_WEIGHTS,
)


def test_backward_data_rule():
    assert rules.backward_data_kind([1], "NXC") == CONV_T_BWD_D  # 1-D: either format
    assert rules.backward_data_kind([1], "NCX") == CONV_T_BWD_D
    assert rules.backward_data_kind([1, 1], "NCX") == CONV_T_BWD_D
    assert rules.backward_data_kind([1, 1, 1], "NCX") == CONV_T_BWD_D
    assert rules.backward_data_kind([1, 1], "NXC") == CONV  # 2-D/3-D NXC: Convolution
    assert rules.backward_data_kind([1, 1, 1], "NXC") == CONV
    assert rules.backward_data_kind([2], "NXC") == CONV  # dilated: always Convolution (D9)
    assert rules.backward_data_kind([1, 2], "NCX") == CONV


def test_backward_weights_rule():
    assert rules.backward_weights_kind(2, "NXC") == CONV_BWD_W
    assert rules.backward_weights_kind(3, "NXC") == CONV_BWD_W
    assert rules.backward_weights_kind(1, "NXC") == CONV_T_BWD_W
    assert rules.backward_weights_kind(2, "NCX") == CONV_T_BWD_W


def test_forward_rule():
    k, s1, d1, p1 = (3, 3), (1, 1), (1, 1), (1, 1)

    def kind(*args: object, bias: bool = False) -> str:
        return rules.forward_kind(*args, bias=bias)  # type: ignore[arg-type]

    assert kind(k, s1, d1, p1, p1, 8, 8, 8) == CONV  # depthwise, stride 1 (either format)
    assert kind(k, s1, d1, p1, p1, 8, 8, 8, bias=True) == CONV
    assert kind(k, (1, 2), d1, p1, p1, 8, 8, 8) == CONV_T  # a stride
    assert kind(k, s1, d1, p1, p1, 4, 8, 8) == CONV_T  # 2 channels per group
    assert kind(k, s1, d1, p1, p1, 8, 8, 16) == CONV_T  # channel multiplier
    assert kind(k, s1, d1, (3, 1), p1, 8, 8, 8) == CONV_T  # crops past the kernel
    assert kind(k, s1, (2, 2), (3, 1), p1, 8, 8, 8) == CONV  # ... not when dilated
    # groups 1 and no bias: the convolution's backward data, in every geometry
    assert kind(k, (2, 2), (1, 2), p1, (0, 1), 1, 4, 3) == CONV_BWD_D
    assert kind(k, s1, d1, p1, p1, 1, 1, 1) == CONV  # one channel: depthwise
    assert kind(k, (2, 2), d1, p1, p1, 1, 4, 3, bias=True) == CONV_T


@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
@pytest.mark.parametrize(("icg", "ocg", "groups"), [(2, 3, 1), (2, 3, 2), (2, 3, 3), (1, 1, 4), (1, 2, 3)])
def test_convolution_weights_is_the_flipped_per_group_transpose(weights_format, icg, ocg, groups):
    """Written element by element: conv[o, i, x] = convT[g*ICg + i, o - g*OCg, k-1-x]
    (depthwise, one channel in and out per group, takes a shortcut of its own)."""
    kernel = (3, 2)
    rng = np.random.default_rng(5)
    iox = rng.standard_normal((icg * groups, ocg, *kernel))
    w = iox if weights_format == "IOX" else iox.transpose(2, 3, 1, 0)
    fresh = lowering_weights.convolution_weights(w, weights_format, groups)
    buffer = np.full_like(fresh, np.nan)
    got = lowering_weights.convolution_weights(w, weights_format, groups, buffer)  # written into buffer
    assert got is buffer
    np.testing.assert_array_equal(got, fresh)
    oix = got if weights_format == "IOX" else got.transpose(3, 2, 0, 1)
    assert oix.shape == (ocg * groups, icg, *kernel) and got.flags.c_contiguous
    for o in range(ocg * groups):
        g = o // ocg
        for i in range(icg):
            for y in range(kernel[0]):
                for x in range(kernel[1]):
                    assert oix[o, i, y, x] == iox[g * icg + i, o - g * ocg, kernel[0] - 1 - y, kernel[1] - 1 - x]


#: (config, op, the lowering it takes): a variety of attributes per rule
RULED = [
    # BackwardData on the library's own op: 1-D in both formats, 2-D/3-D NCX
    (Config(src=(9,), kernel=(16,), strides=8, pads_begin=4, pads_end=4, ic=6, oc=4), BWD_D, CONV_T_BWD_D),
    (Config(src=(7,), kernel=(3,), strides=2, pads_begin=1, output_padding=1, ic=4, oc=6, groups=2,
            data_format="NXC", weights_format="XOI"), BWD_D, CONV_T_BWD_D),
    (Config(src=(5, 4), kernel=(3, 2), strides=(2, 3), pads_begin=(1, 0), pads_end=(0, 1), output_padding=(1, 2)),
     BWD_D, CONV_T_BWD_D),
    (Config(src=(6, 6), kernel=(3, 3), strides=1, pads_begin=1, pads_end=1, ic=8, oc=8, groups=8,
            weights_format="XOI"), BWD_D, CONV_T_BWD_D),
    (Config(src=(5, 5), kernel=(4, 4), strides=2, auto_pad="SAME_LOWER", output_padding=1, ic=4, oc=6, groups=2),
     BWD_D, CONV_T_BWD_D),
    (Config(src=(3, 4, 2), kernel=(2, 2, 2), strides=2, ic=4, oc=6), BWD_D, CONV_T_BWD_D),
    # ... dilated or 2-D NXC: Convolution
    (Config(src=(5, 4), kernel=(3, 3), strides=2, dilations=2), BWD_D, CONV),
    (Config(src=(7,), kernel=(3,), strides=2, dilations=3, data_format="NXC", weights_format="XOI"), BWD_D, CONV),
    (Config(src=(5, 4), kernel=(3, 2), strides=2, pads_begin=(1, 0), data_format="NXC", weights_format="IOX"),
     BWD_D, CONV),
    # BackwardWeights in 2-D/3-D NXC: ConvolutionBackwardWeights
    (Config(src=(5, 4), kernel=(3, 2), strides=(2, 3), pads_begin=(1, 0), pads_end=(0, 1), output_padding=(1, 2),
            data_format="NXC", weights_format="XOI"), BWD_W, CONV_BWD_W),
    (Config(src=(6, 5), kernel=(3, 3), dilations=(2, 1), pads_begin=2, ic=6, oc=6, groups=6,
            data_format="NXC", weights_format="IOX"), BWD_W, CONV_BWD_W),
    (Config(src=(5, 5), kernel=(4, 3), strides=2, auto_pad="SAME_UPPER", ic=4, oc=6, groups=2,
            data_format="NXC", weights_format="XOI"), BWD_W, CONV_BWD_W),
    (Config(src=(3, 4, 2), kernel=(2, 3, 2), strides=(2, 1, 2), dilations=(1, 2, 1), data_format="NXC",
            weights_format="XOI"), BWD_W, CONV_BWD_W),
    (Config(src=(7,), kernel=(3,), strides=2, data_format="NXC", weights_format="XOI"), BWD_W, CONV_T_BWD_W),
    # src and diff_dst of one shape: the library takes them swapped, and so must the fast path
    (Config(src=(6, 5), kernel=(3, 3), pads_begin=1, pads_end=1, ic=4, oc=4, groups=4, data_format="NXC",
            weights_format="XOI"), BWD_W, CONV_BWD_W),
    (Config(src=(5, 4), kernel=(3, 3), pads_begin=1, pads_end=1, ic=3, oc=3, data_format="NXC",
            weights_format="IOX"), BWD_W, CONV_BWD_W),
    # ConvTranspose, depthwise with stride 1: Convolution over flipped weights, either format
    (Config(src=(6, 5), kernel=(3, 3), pads_begin=1, pads_end=1, ic=6, oc=6, groups=6, bias=True), FWD, CONV),
    (Config(src=(6, 5), kernel=(3, 3), pads_begin=1, pads_end=1, ic=6, oc=6, groups=6, bias=True,
            data_format="NXC", weights_format="XOI"), FWD, CONV),
    (Config(src=(6, 5), kernel=(3, 2), dilations=(2, 3), pads_begin=(1, 0), pads_end=(4, 3), ic=4, oc=4, groups=4,
            data_format="NXC", weights_format="IOX"), FWD, CONV),
    (Config(src=(7,), kernel=(5,), auto_pad="SAME_LOWER", ic=3, oc=3, groups=3, data_format="NXC",
            weights_format="XOI"), FWD, CONV),
    (Config(src=(6, 5), kernel=(3, 3), pads_begin=(3, 0), ic=4, oc=4, groups=4, data_format="NXC",
            weights_format="XOI"), FWD, CONV_T),  # crops more than the kernel: ConvTranspose
    # ... but not in 3-D, where oneDNN 3.2 runs every lowering of a depthwise layer on its gemm
    # convolution, the library's op the fastest (problem.gemm_grouped): ConvTranspose
    (Config(src=(4, 3, 5), kernel=(2, 3, 3), dilations=(1, 2, 1), pads_begin=(0, 1, 2), ic=3, oc=3, groups=3,
            weights_format="XOI"), FWD, CONV_T),
    (Config(src=(3, 4, 2), kernel=(3, 1, 2), auto_pad="SAME_UPPER", ic=5, oc=5, groups=5, bias=True,
            data_format="NXC", weights_format="XOI"), FWD, CONV_T),
    # ConvTranspose, groups 1 without bias: ConvolutionBackwardData on the same weights memory
    (Config(src=(5, 4), kernel=(3, 2), strides=(2, 3), pads_begin=(1, 0), pads_end=(0, 1), output_padding=(1, 2)),
     FWD, CONV_BWD_D),
    (Config(src=(6, 5), kernel=(3, 3), strides=2, dilations=(2, 1), pads_begin=2, output_padding=1, ic=5, oc=7,
            data_format="NXC", weights_format="XOI"), FWD, CONV_BWD_D),
    (Config(src=(9,), kernel=(4,), strides=3, dilations=2, auto_pad="SAME_UPPER", output_padding=2, ic=6, oc=3,
            data_format="NXC", weights_format="IOX"), FWD, CONV_BWD_D),
    (Config(src=(7,), kernel=(16,), strides=8, pads_begin=4, pads_end=4, ic=3, oc=5), FWD, CONV_BWD_D),
    (Config(src=(3, 4, 2), kernel=(2, 3, 2), strides=(2, 1, 2), dilations=(1, 2, 1), pads_begin=(1, 0, 0),
            pads_end=(0, 2, 1), ic=4, oc=6, weights_format="XOI"), FWD, CONV_BWD_D),
    (Config(src=(5, 5), kernel=(4, 4), strides=2, auto_pad="SAME_LOWER", ic=4, oc=6, data_format="NXC",
            weights_format="XOI"), FWD, CONV_BWD_D),
    # ... with a bias too (added apart from the library op: lowering.forward.bias_apart)
    (Config(src=(5, 4), kernel=(3, 2), strides=2, pads_begin=1, ic=4, oc=6, bias=True), FWD, CONV_BWD_D),
    # ... with groups: ConvTranspose
    (Config(src=(5, 4), kernel=(3, 3), strides=2, ic=4, oc=6, groups=2, data_format="NXC", weights_format="XOI"),
     FWD, CONV_T),
]
RULED_IDS = [f"{op}-{kind}-{cfg}" for cfg, op, kind in RULED]


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("cfg", "op", "kind"), RULED, ids=RULED_IDS)
def test_each_lowering_matches_the_reference(cfg, op, kind, code):
    t = cfg.tensors(np.random.default_rng(41), code)
    arrays = inputs_of(op, t, cfg)
    instance = {FWD: oc.ConvTranspose(**cfg.attrs()), BWD_D: oc.ConvTransposeBackwardData(**cfg.attrs(op)),
                BWD_W: oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(op))}[op]
    got = instance(*arrays)
    # unless a guard keeps the problem away from a known-bad kernel on this CPU (test_guards.py)
    assert instance.lowering.startswith(kind) or instance.guard is not None, instance.lowering
    assert got.dtype == DTYPES[code]
    reduction = {FWD: cfg.fwd_reduction, BWD_D: cfg.bwd_data_reduction, BWD_W: cfg.bwd_weights_reduction}[op]
    assert_close(got, reference(op, cfg, arrays), code, reduction, str(cfg))
    for _ in range(2):  # repeated calls (the fast path where the plan has one)
        np.testing.assert_array_equal(instance(*arrays), got)
    out = np.empty_like(got)
    assert instance(*arrays, out=out) is out
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize(("cfg", "op", "kind"), RULED, ids=RULED_IDS)
def test_each_lowering_keeps_nan_and_inf_in_bounds(cfg, op, kind, code):
    """One NaN, +Inf and -Inf per input (three seeds): non-finite wherever the reference is,
    NaN beyond it only where the zero-padded reading of the backward ops has it (docs/deviations.md);
    the flipped-weights forward Convolution is exact like ConvTranspose."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        arrays = with_non_finite(inputs_of(op, cfg.tensors(rng, code), cfg), rng)
        got = classes(call(op, cfg, arrays))
        want = classes(reference(op, cfg, arrays))
        if op == FWD:
            np.testing.assert_array_equal(got, want)
            continue
        widest = classes(loop_backward(op, cfg, arrays, all_pairs=True))
        assert ((got == want) | ((got == 1) & (widest != 0))).all(), np.argwhere(got != want)[:5]


def test_flipped_weights_buffer_follows_new_weights_and_threads():
    """The depthwise forward Convolution keeps one flipped-weights array per thread and
    rewrites it each call: new weight values give new results (never the last call's
    weights), also with threads calling one op object with different weights at once."""
    from concurrent.futures import ThreadPoolExecutor

    from onednn_convt import reference as ref

    rng = np.random.default_rng(3)
    attrs = dict(pads_begin=1, pads_end=1, groups=8, data_format="NXC", weights_format="XOI")
    x = rng.standard_normal((2, 9, 7, 8)).astype(np.float32)
    weights = [rng.standard_normal((3, 3, 1, 8)).astype(np.float32) for _ in range(6)]
    expected = [ref.conv_transpose(x, w, **attrs) for w in weights]
    op = oc.ConvTranspose(**attrs)
    for w, want in zip(weights, expected):  # one thread, weights changing each call
        got = op(x, w)
        assert op.lowering == CONV
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    def run(i: int) -> bool:
        out = np.empty(expected[0].shape, np.float32)
        for _ in range(200):
            op(x, weights[i], out=out)
            if not np.allclose(out, expected[i], rtol=1e-5, atol=1e-5):
                return False
        return True

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(run, range(6)))

"""Large 1-D kernels run as MatMul + overlap-add and still match the reference exactly."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import onednn_convt as oc
from onednn_convt import accuracy, matmul_lowering, reference


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
@pytest.mark.parametrize(
    ("k", "s", "pb", "pe", "op"),
    [(130, 7, 5, 3, 2), (128, 128, 0, 0, 0), (200, 3, 150, 0, 1), (129, 64, 0, 200, 0)],
)
def test_large_kernel_forward_matches_reference(data_format, weights_format, k, s, pb, pe, op):
    rng = np.random.default_rng(k + s)
    n, ic, oc_, length = 2, 5, 3, 9
    x = rng.standard_normal((n, ic, length) if data_format == "NCX" else (n, length, ic)).astype(np.float32)
    w = rng.standard_normal((ic, oc_, k) if weights_format == "IOX" else (k, oc_, ic)).astype(np.float32)
    b = rng.standard_normal(oc_).astype(np.float32)
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, output_padding=op,
                 data_format=data_format, weights_format=weights_format)
    op_ = oc.ConvTranspose(**attrs)
    got = op_(x, w, b)
    assert op_.last_plan.lowering.kind == "MatMul"
    ref = reference.conv_transpose(x, w, b, **attrs)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert accuracy.relative_error(got, ref) <= accuracy.tolerance("f32", ic * k)


def test_rule_boundaries():
    assert matmul_lowering.applies([matmul_lowering.MIN_KERNEL], 1, [1])
    assert not matmul_lowering.applies([matmul_lowering.MIN_KERNEL - 1], 1, [1])
    assert not matmul_lowering.applies([256], 2, [1])  # grouped
    assert not matmul_lowering.applies([256], 1, [2])  # dilated
    assert not matmul_lowering.applies([256, 1], 1, [1, 1])  # 2-D


def test_inverse_stft_like_layer_bf16_and_out():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 65, 12)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((65, 1, 256)).astype(ml_dtypes.bfloat16)
    attrs = dict(strides=64, data_format="NCX", weights_format="IOX")
    ref = reference.conv_transpose(x, w, **attrs)
    out = np.empty(ref.shape, ml_dtypes.bfloat16)
    got = oc.ConvTranspose(**attrs)(x, w, out=out)
    assert got is out
    assert accuracy.relative_error(out, ref) <= accuracy.tolerance("bf16", 65 * 256)

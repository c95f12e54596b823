"""Dequantize / Quantize / PostOp attributes are checked when the object is built: zero
points are integers in the range the library computes right, scales finite, non-zero and
normal in float32 (a zero point of 2**31 used to wrap around silently, 2**63 gave pybind11's
"Unable to cast", 1.5 gave "'float' object is not iterable")."""

from __future__ import annotations

from typing import Any

import numpy as np
import onednn_convt as oc
import pytest
from onednn_convt import Dequantize, PostOp, Quantize, reference

GEO = {"strides": 2, "pads_begin": 1, "pads_end": 1}


@pytest.mark.parametrize("zps", [2**31, 2**32 + 5, 2**40, 2**63, -(2**31) - 1, 256, -129])
def test_dequantize_zero_points_out_of_range_raise_value_error(zps: int) -> None:
    with pytest.raises(ValueError, match=r"Dequantize: attribute 'zps' expected integers in \[-128, 255\]"):
        Dequantize(scales=0.25, zps=zps)


@pytest.mark.parametrize("zps", [2**31, 2**32 + 5, 2**63, -(2**31) - 1])
def test_quantize_zero_points_outside_s32_raise_value_error(zps: int) -> None:
    with pytest.raises(ValueError, match=r"Quantize: attribute 'zps' expected integers in \[-2147483648, 2147483647\] \(s32\)"):
        Quantize(scales=1.0, zps=zps, dtype="u8")


@pytest.mark.parametrize("zps", [1.5, float("nan"), 2.0, True, np.bool_(True), "3", b"\x01", [1, 2.5],
                                 np.array([[1]]), 1 + 0j, {"a": 1}])
def test_zero_points_that_are_not_integers_raise_type_error(zps: Any) -> None:
    for cls in (Dequantize, Quantize):
        with pytest.raises(TypeError, match=f"{cls.__name__}: attribute 'zps' expected an int"):
            cls(scales=1.0, zps=zps)


@pytest.mark.parametrize("scales", [1e39, float("inf"), float("nan"), 10**400, 3.5e38])
def test_scales_not_finite_in_f32_raise_value_error(scales: Any) -> None:
    for cls in (Dequantize, Quantize):
        with pytest.raises(ValueError, match=f"{cls.__name__}: attribute 'scales' expected finite float32"):
            cls(scales=scales)


@pytest.mark.parametrize("scales", [0.0, -0.0, 1e-46, 1e-39, [1.0, 0.0]])
def test_scales_zero_or_subnormal_in_f32_raise_value_error(scales: Any) -> None:
    with pytest.raises(ValueError, match="attribute 'scales' expected non-zero scales of magnitude 1.175e-38"):
        Dequantize(scales=scales, qtype="per_channel" if isinstance(scales, list) else "per_tensor")


@pytest.mark.parametrize("scales", ["1", True, 1 + 2j, None, {"x": 1.0}, np.ones((1, 1))])
def test_scales_of_the_wrong_type_raise_type_error(scales: Any) -> None:
    with pytest.raises(TypeError, match="Dequantize: attribute 'scales' expected a number"):
        Dequantize(scales=scales)


def test_quantization_attribute_types() -> None:
    with pytest.raises(TypeError, match="attribute 'qtype' expected a string"):
        Dequantize(qtype=["per_tensor"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Quantize: dtype expected 'u8' or 's8'"):
        Quantize(dtype=["u8"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="expected a number or a list of them, got an empty list"):
        Dequantize(scales=[])
    with pytest.raises(TypeError, match="attribute 'alpha' expected a number"):
        PostOp("LeakyReLU", alpha=True)
    with pytest.raises(ValueError, match="PostOp LeakyReLU: attribute 'alpha' expected finite float32"):
        PostOp("LeakyReLU", alpha=1e300)


def test_numpy_integers_and_arrays_are_taken() -> None:
    q = Dequantize(scales=np.array([0.5, 0.25], np.float32), zps=np.array([3, -4], np.int64), qtype="per_channel")
    assert q.zps == (3, -4) and q.scales == (0.5, 0.25)
    assert Dequantize(scales=np.float64(0.5), zps=np.int8(-7)).zps == (-7,)
    assert Quantize(scales=-2.0, zps=-(2**31), dtype="s8").zps == (-(2**31),)  # negative scales: right in the library


def test_zero_points_at_the_edges_match_the_reference() -> None:
    """The extreme accepted values compute right: src zero points 255 and -128 (oneDNN 3.2
    computes their compensation in 32 bits: wrong from 2**24 on), dst zero points of s32."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (1, 5, 5, 8)).astype(np.uint8)
    w = rng.integers(-128, 128, (3, 3, 4, 8)).astype(np.int8)
    wq = Dequantize(scales=1 / 64)
    for sq, dq in ((Dequantize(scales=0.25, zps=255), None), (Dequantize(scales=0.25, zps=-128), None),
                   (Dequantize(scales=0.25), Quantize(scales=8.0, zps=2**31 - 1, dtype="u8")),
                   (Dequantize(scales=0.25), Quantize(scales=8.0, zps=-(2**31), dtype="s8")),
                   (Dequantize(scales=0.25), Quantize(scales=8.0, zps=-200, dtype="u8"))):
        op = oc.ConvTranspose(**GEO, src_dequantize=sq, weights_dequantize=wq, dst_quantize=dq)
        got = np.asarray(op(x, w), np.float64)
        ref = reference.fused_conv_transpose(x, w, src_dequantize=sq, weights_dequantize=wq, dst_quantize=dq, **GEO)
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-4 if dq is None else 0)

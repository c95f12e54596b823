"""The lowering rules of onednn_convt.lowerings: each choice matches the float64 reference
on shapes that take it, in every dtype, and op.lowering reports it."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import Config, assert_close

import onednn_convt as oc
from onednn_convt import lowerings

OP = "ConvTransposeBackwardData"
CODES = {"f32": np.float32, "bf16": "bfloat16", "f16": np.float16}


def _dtype(code: str):
    if code == "bf16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return CODES[code]


def test_backward_data_rule():
    conv_t, conv = lowerings.CONV_TRANSPOSE_BACKWARD_DATA, lowerings.CONVOLUTION
    assert lowerings.backward_data_kind([1], "NXC") == conv_t  # 1-D: either format
    assert lowerings.backward_data_kind([1], "NCX") == conv_t
    assert lowerings.backward_data_kind([1, 1], "NCX") == conv_t
    assert lowerings.backward_data_kind([1, 1, 1], "NCX") == conv_t
    assert lowerings.backward_data_kind([1, 1], "NXC") == conv  # 2-D/3-D NXC: Convolution
    assert lowerings.backward_data_kind([1, 1, 1], "NXC") == conv
    assert lowerings.backward_data_kind([2], "NXC") == conv  # dilated: always Convolution (D9)
    assert lowerings.backward_data_kind([1, 2], "NCX") == conv


# shapes that take the library's ConvTransposeBackwardData: 1-D in both formats, 2-D/3-D NCX;
# groups, asymmetric pads, a diff_dst that includes the forward's output_padding, auto_pad
LIBRARY_BWD_D = [
    Config(src=(9,), kernel=(16,), strides=8, pads_begin=4, pads_end=4, ic=6, oc=4),
    Config(src=(7,), kernel=(3,), strides=2, pads_begin=1, pads_end=0, output_padding=1, ic=4, oc=6, groups=2),
    Config(src=(5, 4), kernel=(3, 2), strides=(2, 3), pads_begin=(1, 0), pads_end=(0, 1), output_padding=(1, 2)),
    Config(src=(6, 6), kernel=(3, 3), strides=1, pads_begin=1, pads_end=1, ic=8, oc=8, groups=8),
    Config(src=(5, 5), kernel=(4, 4), strides=2, auto_pad="SAME_LOWER", output_padding=1, ic=4, oc=6, groups=2),
    Config(src=(3, 4, 2), kernel=(2, 2, 2), strides=2, ic=4, oc=6),
]


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
@pytest.mark.parametrize(
    ("base", "data_format"),
    [(b, f) for b in LIBRARY_BWD_D for f in ("NCX", "NXC") if b.rank == 1 or f == "NCX"],  # 2-D/3-D NXC: Convolution
    ids=str,
)
def test_backward_data_lowering_matches_reference(base, data_format, weights_format, code):
    cfg = Config(**{**base.__dict__, "data_format": data_format, "weights_format": weights_format})
    t = cfg.tensors(np.random.default_rng(41))
    dd = t["diff_dst"].astype(_dtype(code))
    w = t["weights"].astype(_dtype(code))
    op = oc.ConvTransposeBackwardData(**cfg.attrs(OP))
    got = op(dd, w)
    assert op.lowering.startswith("ConvTransposeBackwardData"), op.lowering
    assert got.dtype == dd.dtype and got.shape == cfg.src_shape
    ref = cfg.ref_backward_data(dd.astype(np.float64), w.astype(np.float64))
    assert_close(got, ref, code, cfg.bwd_data_reduction, str(cfg))
    out = np.empty_like(got)
    assert op(dd, w, out=out) is out
    np.testing.assert_array_equal(out, got)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_backward_data_dilated_or_nxc_keeps_convolution(data_format):
    dilated = Config(src=(5, 4), kernel=(3, 3), strides=2, dilations=2, data_format=data_format)
    t = dilated.tensors(np.random.default_rng(42))
    op = oc.ConvTransposeBackwardData(**dilated.attrs(OP))
    got = op(t["diff_dst"], t["weights"])
    assert op.lowering == "Convolution"
    assert_close(got, dilated.ref_backward_data(t["diff_dst"], t["weights"]), "f32", dilated.bwd_data_reduction)
    dilated_1d = Config(src=(7,), kernel=(3,), strides=2, dilations=3, data_format=data_format)
    t = dilated_1d.tensors(np.random.default_rng(43))
    op = oc.ConvTransposeBackwardData(**dilated_1d.attrs(OP))
    got = op(t["diff_dst"], t["weights"])
    assert op.lowering == "Convolution"
    assert_close(got, dilated_1d.ref_backward_data(t["diff_dst"], t["weights"]), "f32", dilated_1d.bwd_data_reduction)

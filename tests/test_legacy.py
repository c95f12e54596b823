"""The legacy ConvTransposeBackpropFilters-1 (spec D14): filter_format XIO (default) or OIX,
filter_shape in that layout, computed as BackwardWeights with the channel axes swapped."""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close

L = oc.ConvTransposeBackpropFilters


def filter_layout(cfg: Config, filter_format: str) -> Config:
    """The BackwardWeights config whose weights_format matches ``filter_format``."""
    return cfg.with_(weights_format="IOX" if filter_format == "OIX" else "XOI")


def to_filter(w: np.ndarray, filter_format: str) -> np.ndarray:
    """IOX -> OIX = (OC/G, IC, X...); XOI -> XIO = (X..., IC, OC/G)."""
    return np.swapaxes(w, 0, 1) if filter_format == "OIX" else np.swapaxes(w, -1, -2)


def legacy_attrs(cfg: Config, filter_format: str) -> dict:
    a = cfg.attrs("ConvTransposeBackwardWeights")
    del a["weights_format"]
    return {**a, "filter_format": filter_format}


@pytest.mark.parametrize("filter_format", ["XIO", "OIX"])
@pytest.mark.parametrize("cfg", [c for c in CASES if c.name in {
    "1d_groups2", "2d_asym", "2d_same_upper_op", "2d_nxc_xoi", "3d_groups_nxc_xoi", "2d_depthwise_dil"}],
    ids=lambda c: c.name)
def test_matches_reference_in_filter_layout(cfg, filter_format):
    cfg = filter_layout(cfg, filter_format)
    t = cfg.tensors(np.random.default_rng(51))
    want = to_filter(cfg.ref_backward_weights(t["src"], t["diff_dst"]), filter_format)
    filter_shape = want.shape
    op = L(**legacy_attrs(cfg, filter_format), filter_shape=filter_shape)
    got = op(t["src"], t["diff_dst"])
    assert got.shape == filter_shape and got.flags.c_contiguous
    assert_close(got, want, "f32", cfg.bwd_weights_reduction, str(cfg))
    by_keyword = op(input_forward=t["src"], output_delta=t["diff_dst"])
    np.testing.assert_array_equal(by_keyword, got)


def test_default_filter_format_is_xio():
    cfg = CASES[CASE_IDS.index("2d_groups3_bias")].with_(data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(52))
    xio = to_filter(np.zeros(cfg.weights_shape), "XIO").shape  # (X..., IC, OC/G)
    got = L(**legacy_attrs(cfg, "XIO"))(t["src"], t["diff_dst"], xio)
    no_format = legacy_attrs(cfg, "XIO")
    del no_format["filter_format"]
    np.testing.assert_array_equal(L(**no_format)(t["src"], t["diff_dst"], xio), got)
    assert_close(got, to_filter(cfg.ref_backward_weights(t["src"], t["diff_dst"]), "XIO"), "f32",
                 cfg.bwd_weights_reduction)
    assert L().filter_format == "XIO" and L().attrs["weights_format"] == "XOI"
    assert L(filter_format="OIX").attrs["weights_format"] == "IOX"


@pytest.mark.parametrize("filter_format", ["XIO", "OIX"])
def test_filter_shape_input_wins_over_attribute(filter_format):
    small = Config(src=(5,), kernel=(2,), strides=2, pads_end=1, output_padding=1)
    big = small.with_(kernel=(3,), output_padding=0)
    small, big = filter_layout(small, filter_format), filter_layout(big, filter_format)
    t = small.tensors(np.random.default_rng(53))
    attrs = legacy_attrs(small, filter_format)
    del attrs["output_padding"]
    op = L(**attrs, filter_shape=to_filter(np.zeros(big.weights_shape), filter_format).shape)
    small_shape = to_filter(np.zeros(small.weights_shape), filter_format).shape
    got = op(t["src"], t["diff_dst"], np.array(small_shape, np.int32))
    want = to_filter(small.ref_backward_weights(t["src"], t["diff_dst"]), filter_format)
    assert_close(got, want, "f32", small.bwd_weights_reduction)


def test_out_is_written_in_filter_layout():
    cfg = filter_layout(Config(src=(4, 4), kernel=(3, 2), ic=4, oc=6, groups=2, strides=2), "OIX")
    t = cfg.tensors(np.random.default_rng(54))
    op = L(**legacy_attrs(cfg, "OIX"), filter_shape=(3, 4, 3, 2))
    out = np.full((3, 4, 3, 2), np.nan, np.float32)
    assert op(t["src"], t["diff_dst"], out=out) is out
    np.testing.assert_array_equal(out, op(t["src"], t["diff_dst"]))


@pytest.mark.parametrize(("make", "exc", "words"), [
    (lambda: L(filter_format="IOX"), ValueError, ("'filter_format'", "XIO or OIX")),
    (lambda: L(filter_format="xo"), ValueError, ("'filter_format'", "any case")),
    (lambda: L(weights_format="IOX"), TypeError, ("weights_format",)),
    (lambda: L(filter_shape=7), TypeError, ("'filter_shape'",)),
    (lambda: L(filter_shape=(6,)), ValueError, ("'filter_shape'",)),
    (lambda: L(strides=0), ValueError, ("'strides'",)),
], ids=["iox", "misspelled", "weights_format", "filter_shape_int", "filter_shape_short", "strides_zero"])
def test_invalid_attributes(make, exc, words):
    with pytest.raises(exc) as info:
        make()
    message = str(info.value)
    assert "ConvTransposeBackpropFilters" in message
    assert all(w in message for w in words), message


X, Y = np.ones((1, 4, 5, 5), np.float32), np.ones((1, 6, 7, 7), np.float32)
OIX = {"data_format": "NCX", "filter_format": "OIX"}


@pytest.mark.parametrize(("call", "exc", "words"), [
    (lambda: L(**OIX)(X, Y), ValueError, ("neither",)),
    (lambda: L(**OIX)(X, Y, np.array([[6, 4, 3, 3]])), ValueError, ("'filter_shape'", "1-D")),
    (lambda: L(**OIX)(X, Y, np.array([6.0, 4, 3, 3])), TypeError, ("integer",)),
    (lambda: L(**OIX)(X, Y, [4, 6, 3, 3]), ValueError, ("channel",)),
    (lambda: L(**OIX)(X, Y.astype(np.float16), [6, 4, 3, 3]), TypeError, ("one dtype",)),
    (lambda: L(**OIX)(X, Y, [6, 4, 3, 3], out=np.empty((6, 4, 3, 3), np.float16)), TypeError, ("'out'", "float32")),
    (lambda: L(**OIX)(X, Y, [6, 4, 3, 3], out=np.empty((4, 6, 3, 3), np.float32)), ValueError, ("'out'", "(6, 4, 3, 3)")),
    (lambda: L(**OIX)(X, Y, [6, 4, 3, 3], out=_read_only((6, 4, 3, 3))), ValueError, ("'out'",)),
    (lambda: L(**OIX)(X, Y, [6, 4, 3, 3], out=[0.0]), TypeError, ("'out'",)),
], ids=["no_shape", "shape_2d", "shape_float", "shape_channels", "mixed_dtypes", "out_dtype", "out_shape",
        "out_read_only", "out_list"])
def test_invalid_calls(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc
    message = str(info.value)
    assert "ConvTransposeBackpropFilters" in message
    assert all(w in message for w in words), message


def _read_only(shape: tuple[int, ...]) -> np.ndarray:
    a = np.empty(shape, np.float32)
    a.flags.writeable = False
    return a


def test_filter_format_takes_any_case():
    assert L(filter_format="xio").attrs["weights_format"] == L(filter_format="XIO").attrs["weights_format"]
    assert L(filter_format="Oix").attrs["weights_format"] == L(filter_format="OIX").attrs["weights_format"]

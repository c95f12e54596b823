"""Large 1-D kernels run as MatMul + overlap-add (forward) or as a MatMul over frames of
diff_dst (BackwardData) and still match the reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import onednn_convt as oc
from onednn_convt import accuracy, reference
from onednn_convt.lowering import matmul_lowering

#: these tests check the hand-written rules' routes by name (conftest.hand_rules): small
#: problems are of the measured table's "tiny" class, whose entries differ per ISA class
pytestmark = pytest.mark.usefixtures("hand_rules")


#: the data format and, in NCX, which form of the forward's MatMul runs (forced, whatever the
#: problem's size): src as (N, L, IC) rows, or as stored (matmul_lowering.reads_src_as_stored)
FORWARD_FORMS = [("NCX", "rows"), ("NCX", "as stored"), ("NXC", None)]


def force_ncx_form(monkeypatch: pytest.MonkeyPatch, form: str | None) -> None:
    if form is not None:
        monkeypatch.setattr(matmul_lowering, "reads_src_as_stored", lambda ic, length: form == "as stored")


@pytest.mark.parametrize(("data_format", "form"), FORWARD_FORMS)
@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
@pytest.mark.parametrize(
    ("k", "s", "pb", "pe", "op"),
    [(130, 7, 5, 3, 2), (128, 128, 0, 0, 0), (200, 3, 150, 0, 1), (129, 64, 0, 200, 0)],
)
def test_large_kernel_forward_matches_reference(monkeypatch, data_format, form, weights_format, k, s, pb, pe, op):
    force_ncx_form(monkeypatch, form)
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


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("weights_format", ["IOX", "XOI"])
@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(
    ("k", "s", "pb", "pe", "op"),
    # pads inside the kernel, a crop larger than the stride, output_padding, k == 8 * s,
    # a short diff_dst (every row an edge row), stride == kernel
    [(130, 64, 5, 3, 2), (200, 30, 150, 7, 0), (128, 16, 0, 40, 3), (256, 256, 0, 0, 0), (129, 17, 60, 60, 0)],
)
def test_large_kernel_backward_data_matches_reference(data_format, weights_format, code, k, s, pb, pe, op):
    rng = np.random.default_rng(k + s + pb)
    dtype = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}[code]
    n, ic, oc_, length = 2, 5, 3, 7
    y = s * (length - 1) + k - pb - pe + op
    dd = rng.standard_normal((n, oc_, y) if data_format == "NCX" else (n, y, oc_)).astype(dtype)
    w = rng.standard_normal((ic, oc_, k) if weights_format == "IOX" else (k, oc_, ic)).astype(dtype)
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, output_padding=op,
                 data_format=data_format, weights_format=weights_format)
    op_ = oc.ConvTransposeBackwardData(**attrs)
    out = np.full((n, ic, length) if data_format == "NCX" else (n, length, ic), np.nan, dtype)
    got = op_(dd, w, out=out)
    assert got is out and op_.last_plan.lowering.kind == "MatMul"
    del attrs["output_padding"]  # the forward's; BackwardData checks the shapes against it (D6)
    ref = reference.conv_transpose_backward_data(dd, w, **attrs)
    assert got.shape == ref.shape and got.dtype == dtype
    assert accuracy.relative_error(got, ref) <= accuracy.tolerance(code, oc_ * k)
    np.testing.assert_array_equal(op_(dd, w), got)  # the allocating call agrees


def _backward_data_loop(dd: np.ndarray, w: np.ndarray, s: int, pb: int, length: int) -> np.ndarray:
    """NCX/IOX BackwardData from the definition: only taps that land inside diff_dst."""
    n, oc_, y = dd.shape
    ic, _, k = w.shape
    out = np.zeros((n, ic, length))
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(length):
            for j in range(k):
                t = s * i + j - pb
                if 0 <= t < y:
                    out[:, :, i] += dd[:, :, t].astype(np.float64) @ w[:, :, j].T.astype(np.float64)
    return out


@pytest.mark.parametrize(
    ("data_format", "weights_format", "k", "s", "pb", "pe", "oc_"),
    # a large kernel in three layouts; the small-kernel f32 NXC/XOI rule (OC*k >= 2048)
    [("NCX", "IOX", 200, 30, 150, 7, 2), ("NXC", "XOI", 200, 30, 150, 7, 2), ("NCX", "XOI", 200, 30, 150, 7, 2),
     ("NXC", "XOI", 16, 8, 4, 4, 128)],
)
def test_backward_data_non_finite_weight_reaches_only_its_outputs(data_format, weights_format, k, s, pb, pe, oc_):
    """An Inf weight tap meets the frames' zero padding in the edge rows (0 * Inf = NaN): those
    taps do not exist, so the edge rows are redone from the real taps. Classes (finite, NaN,
    +Inf, -Inf) and finite values match a loop over the definition."""
    rng = np.random.default_rng(5)
    length = 9
    y = s * (length - 1) + k - pb - pe
    dd = rng.standard_normal((2, oc_, y)).astype(np.float32)
    w = rng.standard_normal((4, oc_, k)).astype(np.float32)
    w[0, 0, 0], w[1, 1, k - 1], w[2, 0, 3] = np.inf, -np.inf, np.nan
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, data_format=data_format, weights_format=weights_format)
    op_ = oc.ConvTransposeBackwardData(**attrs)
    ncx = data_format == "NCX"
    got = op_(dd if ncx else dd.transpose(0, 2, 1).copy(), w if weights_format == "IOX" else w.transpose(2, 1, 0).copy())
    got = got if ncx else got.transpose(0, 2, 1)
    assert op_.last_plan.lowering.kind == "MatMul"
    want = _backward_data_loop(dd, w, s, pb, length)
    for cls in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(cls(got), cls(want))
    assert np.isfinite(want).any() and not np.isfinite(want).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(("data_format", "form", "weights_format"),
                         [(f, form, w) for f, form in FORWARD_FORMS for w in (["IOX", "XOI"] if f == "NCX" else ["XOI"])])
def test_forward_non_finite_src_reaches_only_its_outputs(monkeypatch, data_format, form, weights_format):
    """The kernel (130) is not a multiple of the stride (7): the MatMul's taps are padded
    with zeros, which meet an Inf or NaN of src (0 * Inf = NaN) at outputs the kernel never
    reaches. Those are not taps: classes (finite, NaN, +Inf, -Inf) and finite values match
    the float64 reference."""
    force_ncx_form(monkeypatch, form)
    rng = np.random.default_rng(8)
    n, ic, oc_, length, k, s = 2, 4, 3, 9, 130, 7
    x = rng.standard_normal((n, ic, length)).astype(np.float32)
    x[0, 1, 4], x[1, 3, 8], x[1, 0, 0] = np.inf, -np.inf, np.nan
    w = np.abs(rng.standard_normal((ic, oc_, k))).astype(np.float32) + 0.5  # one sign: Inf stays Inf
    attrs = dict(strides=s, pads_begin=3, pads_end=2, data_format=data_format, weights_format=weights_format)
    op_ = oc.ConvTranspose(**attrs)
    ncx = data_format == "NCX"
    got = op_(x if ncx else x.transpose(0, 2, 1).copy(), w if weights_format == "IOX" else w.transpose(2, 1, 0).copy())
    got = got if ncx else got.transpose(0, 2, 1)
    assert op_.last_plan.lowering.kind == "MatMul"
    with np.errstate(invalid="ignore"):
        want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), strides=s, pads_begin=3,
                                        pads_end=2, data_format="NCX", weights_format="IOX")
    for cls in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(cls(got), cls(want))
    finite = np.isfinite(want)
    assert finite.any() and not finite.all()
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_a_long_ncx_forward_reads_src_as_stored(code):
    """L >= 512 and IC >= 16: the MatMul's output is (N, OC*k', L), src its right matrix as
    given; shorter or thinner, the (N, L, OC*k') rows. Both match the reference, with a
    bias, into a fresh result and into out=."""
    dtype = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[code]
    rng = np.random.default_rng(12)
    for ic, length, as_stored in [(16, 512, True), (16, 511, False), (15, 600, False)]:
        x = rng.standard_normal((2, ic, length)).astype(dtype)
        w = rng.standard_normal((ic, 3, 130)).astype(dtype)
        b = rng.standard_normal(3).astype(dtype)
        attrs = dict(strides=7, pads_begin=5, pads_end=3, data_format="NCX", weights_format="IOX")
        op_ = oc.ConvTranspose(**attrs)
        got = op_(x, w, b)
        assert op_.last_plan.lowering.kind == "MatMul"
        shape = op_.last_plan.lowering.library_shape
        assert shape == ((2, 3 * 133, length) if as_stored else (2, length, 3 * 133)), shape
        ref = reference.conv_transpose(x, w, b, **attrs)
        assert got.dtype == dtype and accuracy.relative_error(got, ref) <= accuracy.tolerance(code, ic * 130)
        out = np.full(got.shape, np.nan, dtype)
        assert op_(x, w, b, out=out) is out
        np.testing.assert_array_equal(out.view(np.uint8), got.view(np.uint8))


def test_rule_boundaries():
    assert matmul_lowering.applies([matmul_lowering.MIN_KERNEL], 1, [1])
    assert not matmul_lowering.applies([matmul_lowering.MIN_KERNEL - 1], 1, [1])
    assert not matmul_lowering.applies([256], 2, [1])  # grouped
    assert not matmul_lowering.applies([256], 1, [2])  # dilated
    assert not matmul_lowering.applies([256, 1], 1, [1, 1])  # 2-D
    # BackwardData: also at most MAX_OVERLAP taps per stride (the frames' size)
    most = matmul_lowering.MAX_OVERLAP

    def bwd_d(k: int, g: int, d: int, s: int, oc_: int = 1, f32: bool = False, fmt: str = "NCX",
              wf: str = "IOX") -> bool:
        return matmul_lowering.applies_backward_data([k], g, [d], [s], oc=oc_, f32=f32, data_format=fmt,
                                                     weights_format=wf)

    assert bwd_d(256, 1, 1, 256 // most)
    assert not bwd_d(256, 1, 1, 256 // most - 1)
    assert not bwd_d(127, 1, 1, 127)
    assert not bwd_d(256, 2, 1, 256)
    # ... and smaller kernels in f32 NXC/XOI with OC*k >= MIN_F32_REDUCTION
    least = matmul_lowering.MIN_F32_REDUCTION
    assert bwd_d(16, 1, 1, 8, least // 16, True, "NXC", "XOI")
    assert not bwd_d(16, 1, 1, 8, least // 16 - 1, True, "NXC", "XOI")
    assert not bwd_d(16, 1, 1, 8, least // 16, False, "NXC", "XOI")  # not f32
    assert not bwd_d(16, 1, 1, 8, least // 16, True, "NCX", "XOI")
    assert not bwd_d(16, 1, 1, 8, least // 16, True, "NXC", "IOX")
    assert not bwd_d(16, 1, 1, 1, least // 16, True, "NXC", "XOI")  # more than MAX_OVERLAP taps per stride
    assert not bwd_d(16, 2, 1, 8, least // 16, True, "NXC", "XOI")  # grouped
    assert not bwd_d(16, 1, 2, 8, least // 16, True, "NXC", "XOI")  # dilated


@pytest.mark.parametrize(
    ("k", "s", "pb", "pe", "length"),
    # the hifigan shape's pads, no pads, a crop past the stride, k == 8 * s, every row an edge row
    [(16, 8, 4, 4, 11), (4, 2, 0, 0, 9), (8, 4, 6, 1, 7), (8, 1, 3, 3, 6), (16, 16, 0, 0, 1)],
)
def test_f32_nxc_backward_data_with_small_kernels_matches_reference(k, s, pb, pe, length):
    """The f32 NXC/XOI MatMul lowering for kernels below MIN_KERNEL (OC*k >= 2048): results,
    out= and strided views against the reference; bf16 and NCX keep the library's op."""
    rng = np.random.default_rng(k * s + pb)
    n, ic, oc_ = 2, 6, -(-matmul_lowering.MIN_F32_REDUCTION // k)
    y = s * (length - 1) + k - pb - pe
    dd = rng.standard_normal((n, y, oc_)).astype(np.float32)
    w = rng.standard_normal((k, oc_, ic)).astype(np.float32)
    attrs = dict(strides=s, pads_begin=pb, pads_end=pe, data_format="NXC", weights_format="XOI")
    ref = reference.conv_transpose_backward_data(dd, w, **attrs)
    op_ = oc.ConvTransposeBackwardData(**attrs)
    got = op_(dd, w)
    assert op_.lowering == "MatMul"
    assert got.shape == ref.shape and got.dtype == np.float32
    assert accuracy.relative_error(got, ref) <= accuracy.tolerance("f32", oc_ * k)
    out = np.full(ref.shape, np.nan, np.float32)
    assert op_(dd, w, out=out) is out
    np.testing.assert_array_equal(out, got)
    wide = np.zeros((n, y, 2 * oc_), np.float32)
    wide[:, :, ::2] = dd  # a strided view of the same values
    np.testing.assert_array_equal(op_(wide[:, :, ::2], w), got)
    for other in (oc.ConvTransposeBackwardData(**dict(attrs, data_format="NCX")),):
        other(dd.transpose(0, 2, 1).copy(), w)
        assert other.lowering != "MatMul"
    bf16 = oc.ConvTransposeBackwardData(**attrs)
    bf16(dd.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16))
    assert bf16.lowering != "MatMul" or bf16.guard is not None  # a guard's MatMul (AMX, stride = kernel)


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

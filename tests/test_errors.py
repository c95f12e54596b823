"""Every invalid input raises the documented exception, before any native call, with a message
naming the op and the argument (ValueError for values and shapes, TypeError for types and
dtypes; spec D11)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import onednn_convt as oc
import pytest

F, D, W = "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"
NCX = {"data_format": "NCX", "weights_format": "IOX"}


def arr(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    return np.ones(shape, dtype)


# Valid baseline, NCX/IOX, 2-D: src 1x4x5x5, weights 4x6x3x3, dst/diff_dst 1x6x7x7.
X, WT, Y, WS = arr(1, 4, 5, 5), arr(4, 6, 3, 3), arr(1, 6, 7, 7), (4, 6, 3, 3)


def fwd(*args: Any, **attrs: Any) -> Callable[[], Any]:
    return lambda: oc.ConvTranspose(**{**NCX, **attrs})(*args)


def bwd_d(*args: Any, **attrs: Any) -> Callable[[], Any]:
    return lambda: oc.ConvTransposeBackwardData(**{**NCX, **attrs})(*args)


def bwd_w(*args: Any, **attrs: Any) -> Callable[[], Any]:
    attrs.setdefault("weights_shape", WS)
    return lambda: oc.ConvTransposeBackwardWeights(**{**NCX, **attrs})(*args)


# id -> (call, exception, op name, words the message must contain)
CASES: dict[str, tuple[Callable[[], Any], type, str, tuple[str, ...]]] = {
    # -- attribute values (constructor) --
    "strides_zero": (fwd(X, WT, strides=0), ValueError, F, ("'strides'", "positive")),
    "strides_negative_bwd_d": (bwd_d(Y, WT, strides=[1, -1]), ValueError, D, ("'strides'",)),
    "dilations_zero": (bwd_w(X, Y, dilations=0), ValueError, W, ("'dilations'",)),
    "pads_begin_negative": (fwd(X, WT, pads_begin=-1), ValueError, F, ("'pads_begin'", "non-negative")),
    "pads_end_negative": (bwd_d(Y, WT, pads_end=[0, -2]), ValueError, D, ("'pads_end'",)),
    "output_padding_negative": (fwd(X, WT, output_padding=-1), ValueError, F, ("'output_padding'",)),
    "groups_zero": (fwd(X, WT, groups=0), ValueError, F, ("'groups'",)),
    "groups_negative_bwd_d": (bwd_d(Y, WT, groups=-1), ValueError, D, ("'groups'",)),
    "groups_float": (bwd_w(X, Y, groups=1.5), TypeError, W, ("'groups'",)),
    "groups_bool": (fwd(X, WT, groups=True), TypeError, F, ("'groups'",)),
    "groups_list": (fwd(X, WT, groups=[2]), TypeError, F, ("'groups'",)),
    "strides_float": (fwd(X, WT, strides=2.0), TypeError, F, ("'strides'",)),
    "strides_float_in_list": (bwd_d(Y, WT, strides=[1, 2.0]), TypeError, D, ("'strides'",)),
    "strides_string": (fwd(X, WT, strides="2"), TypeError, F, ("'strides'",)),
    "strides_bytes": (fwd(X, WT, strides=b"\x02\x02"), TypeError, F, ("'strides'",)),  # found by the fuzz tests
    "pads_bytearray": (bwd_d(Y, WT, pads_begin=bytearray(2)), TypeError, D, ("'pads_begin'",)),
    "strides_empty": (fwd(X, WT, strides=[]), ValueError, F, ("'strides'", "1 to 3")),
    "strides_four": (bwd_w(X, Y, strides=[1, 1, 1, 1]), ValueError, W, ("'strides'", "1 to 3")),
    "strides_beyond_s64": (fwd(X, WT, strides=2**63), ValueError, F, ("'strides'",)),
    "auto_pad_unknown": (fwd(X, WT, auto_pad="same"), ValueError, F, ("'auto_pad'", "SAME_UPPER")),
    "auto_pad_explicit": (bwd_w(X, Y, auto_pad="EXPLICIT"), ValueError, W, ("'auto_pad'",)),
    "auto_pad_not_a_string": (bwd_d(Y, WT, auto_pad=1), TypeError, D, ("'auto_pad'",)),
    "data_format_nchw": (fwd(X, WT, data_format="NCHW"), ValueError, F, ("'data_format'", "NXC")),
    "weights_format_oix": (bwd_d(Y, WT, weights_format="OIX"), ValueError, D, ("'weights_format'", "Convolution")),
    "weights_shape_zero": (bwd_w(X, Y, weights_shape=(4, 0, 3, 3)), ValueError, W, ("'weights_shape'",)),
    "unknown_attribute_functional": (lambda: oc.conv_transpose(X, WT, foo=1), TypeError, F, ("foo",)),
    "weights_shape_on_forward_functional": (lambda: oc.conv_transpose(X, WT, weights_shape=WS), TypeError, F, ("weights_shape",)),
    # -- list lengths against the data (call) --
    "strides_length": (fwd(X, WT, strides=[1, 1, 1]), ValueError, F, ("'strides'", "2 entries")),
    "pads_length_bwd_d": (bwd_d(Y, WT, pads_begin=[0]), ValueError, D, ("'pads_begin'", "2 entries")),
    "dilations_length_bwd_w": (bwd_w(X, Y, dilations=(1, 1, 1)), ValueError, W, ("'dilations'", "2 entries")),
    "output_padding_length": (fwd(X, WT, strides=2, output_padding=[1]), ValueError, F, ("'output_padding'",)),
    # -- shapes --
    "src_rank_2": (fwd(arr(4, 5), arr(4, 6)), ValueError, F, ("'src'", "rank")),
    "src_rank_6": (fwd(arr(1, 4, 2, 2, 2, 2), arr(4, 6, 1, 1, 1, 1)), ValueError, F, ("'src'", "rank")),
    "weights_rank": (fwd(X, arr(4, 6, 3)), ValueError, F, ("'weights'", "rank")),
    "empty_dim": (fwd(arr(0, 4, 5, 5), WT), ValueError, F, ("'src'", "empty")),
    "diff_dst_rank_bwd_w": (bwd_w(X, arr(1, 6, 7)), ValueError, W, ("'diff_dst'", "rank")),
    "src_channels_vs_weights": (fwd(arr(1, 3, 5, 5), WT), ValueError, F, ("'weights'", "'src'")),
    "groups_not_dividing_ic": (fwd(X, WT, groups=3), ValueError, F, ("'src'", "groups=3")),
    "groups_not_dividing_bwd_d": (bwd_d(arr(1, 18, 7, 7), WT, groups=3), ValueError, D, ("groups=3",)),
    "diff_dst_channels": (bwd_d(arr(1, 5, 7, 7), WT), ValueError, D, ("'diff_dst'", "'weights'")),
    "output_padding_ge_stride": (fwd(X, WT, strides=2, output_padding=2), ValueError, F, ("'output_padding'", "stride")),
    "dst_cropped_to_nothing": (fwd(X, WT, pads_begin=4, pads_end=4), ValueError, F, ("dst", "pads")),
    "diff_dst_too_small": (bwd_d(arr(1, 6, 2, 2), WT, dilations=2), ValueError, D, ("diff_src", "diff_dst")),
    "bwd_d_output_padding_mismatch": (bwd_d(arr(1, 6, 11, 11), WT, strides=2, pads_begin=1, output_padding=0), ValueError, D, ("'diff_dst'",)),
    "bias_length": (fwd(X, WT, arr(5)), ValueError, F, ("'bias'", "(6,)")),
    "bias_2d": (fwd(X, WT, arr(1, 6)), ValueError, F, ("'bias'",)),
    "bias_scalar": (fwd(X, WT, np.float32(1)), ValueError, F, ("'bias'",)),
    # -- dtypes and types --
    "src_float64": (fwd(X.astype(np.float64), WT), TypeError, F, ("'src'", "float32")),
    "weights_int32": (bwd_d(Y, WT.astype(np.int32)), TypeError, D, ("'weights'",)),
    "mixed_f32_f16": (fwd(X, WT.astype(np.float16)), TypeError, F, ("one dtype", "weights=f16")),
    "bias_dtype": (fwd(X, WT, arr(6, dtype=np.float16)), TypeError, F, ("bias=f16",)),
    "bwd_w_mixed": (bwd_w(X, Y.astype(np.float16)), TypeError, W, ("diff_dst=f16",)),
    "src_string": (fwd("abc", WT), TypeError, F, ("'src'",)),
    "src_none": (fwd(None, WT), TypeError, F, ("'src'",)),
    "weights_none_bwd_d": (bwd_d(Y, None), TypeError, D, ("'weights'",)),
    "diff_dst_none_bwd_w": (bwd_w(X, None), TypeError, W, ("'diff_dst'",)),
    "src_dict": (fwd({"a": 1}, WT), TypeError, F, ("'src'",)),
    "nested_list_is_float64": (fwd(X.tolist(), WT), TypeError, F, ("'src'", "float64")),
    # -- weights_shape (BackwardWeights) --
    "weights_shape_neither": (bwd_w(X, Y, weights_shape=None), ValueError, W, ("weights_shape", "neither")),
    "weights_shape_float_input": (bwd_w(X, Y, np.array([4.0, 6, 3, 3])), TypeError, W, ("'weights_shape'", "integer")),
    "weights_shape_2d_input": (bwd_w(X, Y, np.array([WS])), ValueError, W, ("'weights_shape'", "1-D")),
    "weights_shape_negative_input": (bwd_w(X, Y, [4, -6, 3, 3]), ValueError, W, ("'weights_shape'", "positive")),
    "weights_shape_beyond_s32": (bwd_w(X, Y, [4, 6, 2**31, 3]), ValueError, W, ("'weights_shape'", "s32")),
    "weights_shape_length": (bwd_w(X, Y, [4, 6, 3]), ValueError, W, ("weights_shape", "4 entries")),
    "weights_shape_ic": (bwd_w(X, Y, [5, 6, 3, 3]), ValueError, W, ("'weights_shape'", "'src'")),
    "weights_shape_oc": (bwd_w(X, Y, [4, 5, 3, 3]), ValueError, W, ("'diff_dst'", "'weights_shape'")),
    "batch_mismatch": (bwd_w(X, arr(2, 6, 7, 7)), ValueError, W, ("'diff_dst'", "batch")),
    "diff_dst_not_from_src": (bwd_w(X, arr(1, 6, 9, 9)), ValueError, W, ("'diff_dst'", "'src'")),
    "diff_dst_output_padding_mismatch": (bwd_w(X, arr(1, 6, 8, 8), strides=1, output_padding=0), ValueError, W, ("'diff_dst'",)),
    # -- sizes too large to describe --
    "bwd_d_huge_pads": (bwd_d(Y, WT, pads_end=2**62), ValueError, D, ("diff_src",)),
    "fwd_huge_stride": (fwd(X, WT, strides=2**40), ValueError, F, ("dst",)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_invalid_input_raises(name):
    call, exc, op, words = CASES[name]
    with pytest.raises(exc) as info:
        call()
    assert type(info.value) is exc, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert op in message, message
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_the_baseline_of_the_table_is_valid():
    """Each op runs on the table's baseline arrays, so every case fails for its own reason."""
    assert fwd(X, WT)().shape == Y.shape
    assert fwd(X, WT, arr(6))().shape == Y.shape
    assert bwd_d(Y, WT)().shape == X.shape
    assert bwd_w(X, Y)().shape == WS
    assert bwd_w(X, Y, np.array(WS), weights_shape=None)().shape == WS


def test_errors_leave_the_op_usable():
    op = oc.ConvTranspose(**NCX)
    with pytest.raises(TypeError):
        op(X.astype(np.float64), WT)
    with pytest.raises(ValueError):
        op(arr(1, 3, 5, 5), WT)
    np.testing.assert_array_equal(op(X, WT), fwd(X, WT)())


def test_onednn_errors_keep_their_status():
    """What oneDNN itself refuses becomes OneDNNError (a RuntimeError) with .status."""
    ok = lambda d: ([1, 4, 5, 5], [100, 25, 5, 1], d)
    attrs = {"strides": [1, 1], "pads_begin": [0, 0], "pads_end": [0, 0], "dilations": [1, 1], "auto_pad": "same",
                 "groups": 1, "data_format": "NCX", "weights_format": "IOX"}
    with pytest.raises(oc.OneDNNError) as info:
        oc._core.compile("ConvTranspose", attrs, [ok("f32"), ([4, 6, 3, 3], [54, 9, 3, 1], "f32")],
                         ([1, 6, 7, 7], [294, 49, 7, 1], "f32"))
    assert isinstance(info.value, RuntimeError)
    assert info.value.status == 8 and info.value.status_name == "invalid_graph_op"
    assert "status 8" in str(info.value)


@pytest.mark.parametrize(("name", "bad"), [("groups", True), ("groups", 1.0), ("strides", 2.0), ("strides", [2.0])])
def test_functional_cache_does_not_hide_type_errors(name, bad):
    """True == 1 == 1.0 in Python: a cached op for the valid value must not answer for these."""
    good = {"groups": 1, "strides": 2}
    oc.conv_transpose(X, WT, **NCX, **good)
    with pytest.raises(TypeError, match=f"ConvTranspose: attribute '{name}'"):
        oc.conv_transpose(X, WT, **NCX, **{**good, name: bad})


def _dense(shape):
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return (list(shape), strides[::-1], "f32")


@pytest.mark.parametrize("a,b,c,message", [
    ((4, 1, 3, 5), (1, 2, 5, 6), (4, 2, 3, 6), None),  # both broadcast: compiles
    ((4, 1, 3, 5), (1, 2, 5, 6), (4, 3, 3, 6), "batch dims do not broadcast"),
    ((4, 2, 3, 5), (1, 3, 5, 6), (4, 2, 3, 6), "batch dims do not broadcast"),
    ((4, 3, 5), (1, 2, 5, 6), (4, 2, 3, 6), "unsupported ranks"),
    ((4, 1, 3, 5), (1, 2, 4, 6), (4, 2, 3, 6), "shapes do not multiply"),
])
def test_core_matmul_batch_dims_broadcast_or_raise(a, b, c, message):
    """The binding's own MatMul checks (kept from oneDNN 3.2, which can crash on bad shapes):
    batch dims broadcast NumPy-style from either operand; anything else is a ValueError."""
    args = ("MatMul", {}, [_dense(a), _dense(b)], _dense(c))
    if message is None:
        x = np.random.default_rng(0).standard_normal(a).astype(np.float32)
        y = np.random.default_rng(1).standard_normal(b).astype(np.float32)
        out = np.empty(c, np.float32)
        oc._core.compile(*args).execute([x, y], out)
        np.testing.assert_allclose(out, np.matmul(x, y), rtol=1e-5, atol=1e-5)
    else:
        with pytest.raises(ValueError, match=message):
            oc._core.compile(*args)


def test_core_reorder_copies_into_the_outputs_strides_or_raises():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    view = x.transpose(2, 0, 1)
    src = (list(view.shape), [s // 4 for s in view.strides], "f32")
    out = np.empty(view.shape, np.float32)
    oc._core.compile("Reorder", {}, [src], _dense(view.shape)).execute([view], out)
    assert np.array_equal(out, view)
    with pytest.raises(ValueError, match="same shape and dtype"):
        oc._core.compile("Reorder", {}, [src], _dense((4, 2, 4)))


# -- messages that say how the arrays were read (docs/guide/errors.md) --------------------
def test_a_channel_mismatch_says_how_each_array_was_read_and_suggests_pytorchs_layout():
    """Arrays in PyTorch's layout given to an op with the spec's defaults (NXC, XOI)."""
    src = np.zeros((2, 8, 16, 16), np.float32)  # (N, C, H, W)
    w = np.zeros((8, 4, 3, 3), np.float32)  # (IC, OC, kH, kW)
    with pytest.raises(ValueError) as info:
        oc.ConvTranspose(strides=2)(src, w)
    msg = str(info.value)
    assert msg.startswith("ConvTranspose: 'weights' has I = 3 (XOI), expected the channel count of 'src', 16")
    assert "'src' (2, 8, 16, 16) read as NXC: N 2, spatial (8, 16), C 16" in msg
    assert "'weights' (8, 4, 3, 3) read as XOI: kernel (8, 4), O 3, I 3" in msg
    assert msg.endswith("the shapes fit data_format='NCX', weights_format='IOX' (PyTorch's layout: "
                        "(N, C, X...) and (IC, OC/groups, X...))")
    fixed = oc.ConvTranspose(strides=2, data_format="NCX", weights_format="IOX")(src, w)
    assert fixed.shape == (2, 4, 33, 33)


@pytest.mark.parametrize("op", ["ConvTransposeBackwardData", "ConvTransposeBackwardWeights"])
def test_backward_channel_mismatches_say_how_the_arrays_were_read(op):
    dd = np.zeros((2, 4, 33, 33), np.float32)  # PyTorch's (N, OC, H, W)
    src = np.zeros((2, 8, 16, 16), np.float32)
    with pytest.raises(ValueError) as info:
        if op == "ConvTransposeBackwardData":
            oc.ConvTransposeBackwardData(strides=2)(dd, np.zeros((8, 4, 3, 3), np.float32))
        else:
            oc.ConvTransposeBackwardWeights(strides=2)(src, dd, [8, 4, 3, 3])
    msg = str(info.value)
    assert msg.startswith(op) and "'diff_dst' (2, 4, 33, 33) read as NXC: N 2, spatial (4, 33), C 33" in msg
    assert "PyTorch's layout" in msg


def test_other_formats_are_named_where_pytorchs_does_not_fit():
    """NCX src with XOI weights: the message names the pair that fits."""
    src = np.zeros((1, 6, 5, 5), np.float32)
    w = np.zeros((3, 3, 2, 6), np.float32)  # XOI, given with IOX
    with pytest.raises(ValueError, match=r"the shapes fit data_format='NCX', weights_format='XOI'$"):
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(src, w)
    with pytest.raises(ValueError) as info:  # nothing fits: no suggestion
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(np.zeros((1, 7, 5, 6), np.float32),
                                                                  np.zeros((5, 2, 3, 3), np.float32))
    assert "the shapes fit" not in str(info.value) and "read as NCX" in str(info.value)


@pytest.mark.parametrize(("src_shape", "w_shape", "fault", "missing"), [
    ((8, 16, 16), (8, 4, 3, 3), "src", "its batch dim"),  # (C, H, W): no batch
    ((2, 8, 16, 16), (8, 4, 3), "weights", "a dim"),
    ((2, 8, 16), (8, 4, 3, 3), "src", "its batch dim"),
])
def test_a_rank_mismatch_names_the_argument_at_fault(src_shape, w_shape, fault, missing):
    with pytest.raises(ValueError) as info:
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(np.zeros(src_shape, np.float32),
                                                                  np.zeros(w_shape, np.float32))
    msg = str(info.value)
    assert msg.startswith(f"ConvTranspose: argument '{fault}' has rank {min(len(src_shape), len(w_shape))} but ")
    assert msg.endswith(f"is '{fault}' missing {missing}?") and "read as NCX" in msg and "read as IOX" in msg


def test_a_rank_mismatch_of_backward_weights_names_its_argument():
    with pytest.raises(ValueError, match=r"argument 'diff_dst' has rank 3 but 'src' has rank 4.*"
                                         r"is 'diff_dst' missing its batch dim\?"):
        oc.ConvTransposeBackwardWeights(data_format="NCX", weights_format="IOX")(
            np.zeros((1, 8, 4, 4), np.float32), np.zeros((4, 7, 7), np.float32), [8, 4, 3, 3])


@pytest.mark.parametrize("container", [list, tuple])
def test_a_python_list_is_called_a_list(container):
    src = container(np.zeros((1, 2, 3, 3)).tolist())
    with pytest.raises(TypeError) as info:
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(src, np.zeros((2, 2, 3, 3), np.float32))
    msg = str(info.value)
    assert "argument 'src' expected a NumPy array of numpy.float32" in msg
    assert f"got a {container.__name__} (NumPy reads it as float64; pass numpy.asarray(..., numpy.float32))" in msg


@pytest.mark.parametrize(("make", "canonical"), [
    (lambda: oc.Dequantize(scales=1.0, qtype="PER_TENSOR").qtype, "per_tensor"),
    (lambda: oc.Quantize(scales=1.0, dtype="S8").dtype, "s8"),
    (lambda: oc.PostOp("relu").kind, "ReLU"),
    (lambda: oc.dtypes.resolve("BF16"), "bf16"),
    (lambda: oc.dtypes.resolve("Float32"), "f32"),
])
def test_every_spelling_takes_any_case(make, canonical):
    assert make() == canonical

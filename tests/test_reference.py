"""Tests for the NumPy float64 oracle ``onednn_convt.reference``.

The oracle is checked against an independent brute-force implementation written here with
plain Python loops over every index (tiny shapes only), against the adjoint identities that
tie the three ops together, and, when PyTorch is installed, against
``torch.nn.functional.conv_transpose{1,2,3}d`` and its autograd gradients.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onednn_convt import reference as ref

LAYOUTS = [(df, wf) for df in ("NCX", "NXC") for wf in ("IOX", "XOI")]


# --------------------------------------------------------------------------------------------
# Independent brute force (canonical layouts: activations NCX, weights IOX)
# --------------------------------------------------------------------------------------------


def bf_pads(kernel, strides, dilations, auto_pad, pads_begin, pads_end):
    """Effective pads straight from the spec (per-dim lists in, per-dim lists out)."""
    mode = auto_pad.upper()
    if mode == "NONE":
        return list(pads_begin), list(pads_end)
    if mode == "VALID":
        return [0] * len(kernel), [0] * len(kernel)
    begin, end = [], []
    for k, s, d in zip(kernel, strides, dilations):
        total = max(0, d * (k - 1) + 1 - s)
        pb = total // 2 if mode == "SAME_UPPER" else math.ceil(total / 2)
        begin.append(pb)
        end.append(total - pb)
    return begin, end


def _grid(shape):
    return itertools.product(*[range(n) for n in shape])


def bf_forward(src, w, bias, strides, pb, pe, dil, op, groups):
    """Scatter into the 'full' buffer, then crop/extend it: dst[t] = full[t + pb]."""
    n_batch, ic_total = src.shape[:2]
    in_sp = src.shape[2:]
    _, o_per_g, *kernel = w.shape
    icg = ic_total // groups
    oc = o_per_g * groups
    full_len = [s * (n - 1) + d * (k - 1) + 1 for s, n, d, k in zip(strides, in_sp, dil, kernel)]
    out_len = [f - b - e + p for f, b, e, p in zip(full_len, pb, pe, op)]
    full = np.zeros((n_batch, oc, *full_len))
    for n in range(n_batch):
        for ic in range(ic_total):
            g = ic // icg
            for i in _grid(in_sp):
                v = float(src[(n, ic, *i)])
                for o in range(o_per_g):
                    for j in _grid(kernel):
                        t = tuple(s * ii + jj * d for s, ii, jj, d in zip(strides, i, j, dil))
                        full[(n, g * o_per_g + o, *t)] += v * float(w[(ic, o, *j)])
    dst = np.zeros((n_batch, oc, *out_len))
    for n in range(n_batch):
        for c in range(oc):
            for t in _grid(out_len):
                p = tuple(tt + b for tt, b in zip(t, pb))
                if all(pp < f for pp, f in zip(p, full_len)):
                    dst[(n, c, *t)] = full[(n, c, *p)]
                if bias is not None:
                    dst[(n, c, *t)] += float(bias[c])
    return dst


def bf_backward_data(diff_dst, w, strides, pb, pe, dil, groups):
    """diff_src[n, ic, i] = sum_{o, j} diff_dst[n, g*O + o, s*i + j*d - pb] * W[ic, o, j]."""
    n_batch = diff_dst.shape[0]
    out_sp = diff_dst.shape[2:]
    ic_total, o_per_g, *kernel = w.shape
    icg = ic_total // groups
    in_sp = [
        (t + b + e - (d * (k - 1) + 1)) // s + 1
        for t, b, e, d, k, s in zip(out_sp, pb, pe, dil, kernel, strides)
    ]
    diff_src = np.zeros((n_batch, ic_total, *in_sp))
    for n in range(n_batch):
        for ic in range(ic_total):
            g = ic // icg
            for i in _grid(in_sp):
                acc = 0.0
                for o in range(o_per_g):
                    for j in _grid(kernel):
                        t = [s * ii + jj * d - b for s, ii, jj, d, b in zip(strides, i, j, dil, pb)]
                        if all(0 <= tt < lim for tt, lim in zip(t, out_sp)):
                            acc += float(diff_dst[(n, g * o_per_g + o, *t)]) * float(w[(ic, o, *j)])
                diff_src[(n, ic, *i)] = acc
    return diff_src


def bf_backward_weights(src, diff_dst, w_shape_iox, strides, pb, dil, groups):
    """diff_W[ic, o, j] = sum_{n, i} src[n, ic, i] * diff_dst[n, g*O + o, s*i + j*d - pb]."""
    n_batch, ic_total = src.shape[:2]
    in_sp = src.shape[2:]
    out_sp = diff_dst.shape[2:]
    _, o_per_g, *kernel = w_shape_iox
    icg = ic_total // groups
    dw = np.zeros(tuple(w_shape_iox))
    for ic in range(ic_total):
        g = ic // icg
        for o in range(o_per_g):
            for j in _grid(kernel):
                acc = 0.0
                for n in range(n_batch):
                    for i in _grid(in_sp):
                        t = [s * ii + jj * d - b for s, ii, jj, d, b in zip(strides, i, j, dil, pb)]
                        if all(0 <= tt < lim for tt, lim in zip(t, out_sp)):
                            acc += float(src[(n, ic, *i)]) * float(
                                diff_dst[(n, g * o_per_g + o, *t)]
                            )
                dw[(ic, o, *j)] = acc
    return dw


# --------------------------------------------------------------------------------------------
# Layout conversion (test-side, from canonical NCX / IOX)
# --------------------------------------------------------------------------------------------


def to_data(x_ncx, data_format):
    return np.ascontiguousarray(np.moveaxis(x_ncx, 1, -1)) if data_format == "NXC" else x_ncx


def from_data(x, data_format):
    return np.moveaxis(x, -1, 1) if data_format == "NXC" else x


def to_weights(w_iox, weights_format):
    if weights_format == "IOX":
        return w_iox
    return np.ascontiguousarray(np.transpose(w_iox, (*range(2, w_iox.ndim), 1, 0)))


def from_weights(w, weights_format):
    if weights_format == "IOX":
        return w
    nd = w.ndim
    return np.transpose(w, (nd - 1, nd - 2, *range(nd - 2)))


def weights_shape_in(shape_iox, weights_format):
    if weights_format == "IOX":
        return tuple(shape_iox)
    return (*shape_iox[2:], shape_iox[1], shape_iox[0])


# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


def make_case(
    src_sp,
    ic,
    o,
    kernel,
    *,
    n=1,
    groups=1,
    strides=1,
    dilations=1,
    pads_begin=0,
    pads_end=0,
    output_padding=0,
    auto_pad="None",
    bias=True,
):
    nd = len(src_sp)

    def lst(v):
        return [v] * nd if isinstance(v, int) else list(v)

    return {
        "n": n,
        "src_sp": list(src_sp),
        "ic": ic,
        "o": o,
        "kernel": list(kernel),
        "groups": groups,
        "strides": lst(strides),
        "dilations": lst(dilations),
        "pads_begin": lst(pads_begin),
        "pads_end": lst(pads_end),
        "output_padding": lst(output_padding),
        "auto_pad": auto_pad,
        "bias": bias,
    }


CASES = {
    "1d_basic": make_case([5], 2, 3, [3], n=2),
    "1d_stride_dil_asym_pads_op": make_case(
        [4], 2, 2, [3], strides=2, dilations=2, pads_begin=1, pads_end=2, output_padding=1
    ),
    "1d_groups2_s3_op2": make_case([3], 4, 2, [2], groups=2, strides=3, output_padding=2),
    "1d_large_pads_end_crops": make_case([4], 2, 2, [3], strides=2, pads_end=6),
    "1d_large_pads_begin_op_past_end": make_case(
        [4], 1, 2, [3], strides=2, pads_begin=7, output_padding=1
    ),
    "1d_k1": make_case([3], 2, 2, [1], strides=2, output_padding=1, bias=False),
    "2d_mixed": make_case(
        [3, 4],
        2,
        2,
        [2, 3],
        strides=[2, 1],
        dilations=[1, 2],
        pads_begin=[1, 0],
        pads_end=[0, 2],
        output_padding=[1, 0],
    ),
    "2d_depthwise": make_case(
        [3, 3], 3, 1, [3, 3], groups=3, strides=2, pads_begin=1, pads_end=1, output_padding=1
    ),
    "2d_depthwise_multiplier": make_case([3, 2], 2, 2, [2, 2], n=2, groups=2, dilations=2),
    "2d_groups_no_bias": make_case([2, 3], 4, 3, [3, 2], groups=2, strides=[1, 3], bias=False),
    "3d_mixed": make_case(
        [2, 3, 2],
        2,
        2,
        [2, 2, 3],
        strides=[1, 2, 2],
        dilations=[2, 1, 1],
        pads_begin=[0, 1, 1],
        pads_end=[1, 0, 2],
        output_padding=[0, 1, 0],
    ),
    "3d_groups": make_case([2, 2, 2], 4, 1, [2, 2, 2], groups=2, strides=2, pads_end=[0, 1, 2]),
    "auto_same_upper_2d": make_case(
        [3, 3], 2, 2, [3, 4], strides=2, auto_pad="SAME_UPPER", pads_begin=5, pads_end=5
    ),
    "auto_same_lower_2d": make_case([3, 3], 2, 2, [3, 4], strides=2, auto_pad="SAME_LOWER"),
    "auto_same_lower_dil": make_case([4], 2, 1, [3], strides=2, dilations=2, auto_pad="same_lower"),
    "auto_valid_2d": make_case(
        [3, 2], 2, 2, [3, 2], strides=[2, 1], auto_pad="VALID", pads_begin=1, pads_end=1
    ),
    "auto_none_lower": make_case([4], 2, 2, [3], strides=2, pads_begin=1, auto_pad="none"),
    "auto_same_upper_stride_gt_kernel": make_case([3], 1, 2, [2], strides=3, auto_pad="SAME_UPPER"),
}


def resolved(case):
    return bf_pads(
        case["kernel"],
        case["strides"],
        case["dilations"],
        case["auto_pad"],
        case["pads_begin"],
        case["pads_end"],
    )


def attrs_of(case, *, forward):
    out: dict[str, Any] = {
        "strides": case["strides"],
        "pads_begin": case["pads_begin"],
        "pads_end": case["pads_end"],
        "dilations": case["dilations"],
        "auto_pad": case["auto_pad"],
        "groups": case["groups"],
    }
    if forward:
        out["output_padding"] = case["output_padding"]
    return out


def random_tensors(case, rng):
    src = rng.standard_normal((case["n"], case["ic"], *case["src_sp"]))
    w = rng.standard_normal((case["ic"], case["o"], *case["kernel"]))
    bias = rng.standard_normal(case["o"] * case["groups"]) if case["bias"] else None
    return src, w, bias


# --------------------------------------------------------------------------------------------
# Tests against the brute force
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_all_ops_match_brute_force(name):
    case = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    src, w, bias = random_tensors(case, rng)
    pb, pe = resolved(case)
    want_dst = bf_forward(
        src,
        w,
        bias,
        case["strides"],
        pb,
        pe,
        case["dilations"],
        case["output_padding"],
        case["groups"],
    )
    diff_dst = rng.standard_normal(want_dst.shape)
    want_dsrc = bf_backward_data(
        diff_dst, w, case["strides"], pb, pe, case["dilations"], case["groups"]
    )
    want_dw = bf_backward_weights(
        src, diff_dst, w.shape, case["strides"], pb, case["dilations"], case["groups"]
    )
    assert np.abs(want_dst).max() > 0 and np.abs(want_dsrc).max() > 0
    assert np.abs(want_dw).max() > 0

    for df, wf in LAYOUTS:
        dst = ref.conv_transpose(
            to_data(src, df),
            to_weights(w, wf),
            bias,
            data_format=df,
            weights_format=wf,
            **attrs_of(case, forward=True),
        )
        assert dst.dtype == np.float64
        np.testing.assert_allclose(from_data(dst, df), want_dst, rtol=1e-12, atol=1e-12)

        dsrc = ref.conv_transpose_backward_data(
            to_data(diff_dst, df),
            to_weights(w, wf),
            data_format=df,
            weights_format=wf,
            **attrs_of(case, forward=False),
        )
        assert dsrc.dtype == np.float64
        np.testing.assert_allclose(from_data(dsrc, df), want_dsrc, rtol=1e-12, atol=1e-12)

        dw = ref.conv_transpose_backward_weights(
            to_data(src, df),
            to_data(diff_dst, df),
            weights_shape_in(w.shape, wf),
            data_format=df,
            weights_format=wf,
            **attrs_of(case, forward=False),
        )
        assert dw.dtype == np.float64
        assert dw.shape == weights_shape_in(w.shape, wf)
        np.testing.assert_allclose(from_weights(dw, wf), want_dw, rtol=1e-12, atol=1e-12)


def test_known_values_1d():
    # src [1, 2, 3], W [1, 10, 100], stride 2 -> full = [1, 10, 102, 20, 203, 30, 300]
    src = np.array([[[1.0, 2.0, 3.0]]])  # NCX
    w = np.array([[[1.0, 10.0, 100.0]]])  # IOX
    full = [1.0, 10.0, 102.0, 20.0, 203.0, 30.0, 300.0]
    kw = {"strides": 2, "data_format": "NCX", "weights_format": "IOX"}
    np.testing.assert_array_equal(ref.conv_transpose(src, w, **kw)[0, 0], full)
    # pads_begin 1 / pads_end 4 crop to full[1:3]; output_padding 2 reads past the end.
    out = ref.conv_transpose(src, w, pads_begin=1, pads_end=4, **kw)
    np.testing.assert_array_equal(out[0, 0], [10.0, 102.0])
    out = ref.conv_transpose(src, w, [0.5], pads_begin=5, output_padding=2, **kw)
    np.testing.assert_array_equal(out[0, 0], [30.5, 300.5, 0.5, 0.5])
    # Backward data of a delta at t picks W taps: diff_src[i] = sum_j dd[2i + j] W[j].
    dd = np.zeros((1, 1, 7))
    dd[0, 0, 4] = 1.0
    np.testing.assert_array_equal(
        ref.conv_transpose_backward_data(dd, w, **kw)[0, 0], [0.0, 100.0, 1.0]
    )
    dw = ref.conv_transpose_backward_weights(src, dd, (1, 1, 3), **kw)
    np.testing.assert_array_equal(dw[0, 0], [3.0, 0.0, 2.0])


# Table for src = 5: (k, s, d, dst size with SAME_*, dst size with VALID)
SIZE_TABLE = [
    (3, 2, 1, 10, 11),
    (3, 2, 2, 10, 13),
    (4, 2, 1, 10, 12),
    (1, 2, 1, 9, 9),
    (5, 3, 1, 15, 17),
]


@pytest.mark.parametrize(("k", "s", "d", "same_size", "valid_size"), SIZE_TABLE)
@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID", "same_upper", "valid"])
def test_auto_pad_size_table(k, s, d, same_size, valid_size, auto_pad):
    rng = np.random.default_rng(k * 100 + s * 10 + d)
    src = rng.standard_normal((1, 2, 5))
    w = rng.standard_normal((2, 2, k))
    kw = {
        "strides": s,
        "dilations": d,
        "auto_pad": auto_pad,
        "data_format": "NCX",
        "weights_format": "IOX",
    }
    dst = ref.conv_transpose(src, w, **kw)
    want_size = valid_size if auto_pad.upper() == "VALID" else same_size
    assert dst.shape == (1, 2, want_size)
    pb, pe = bf_pads([k], [s], [d], auto_pad, [0], [0])
    np.testing.assert_allclose(
        dst, bf_forward(src, w, None, [s], pb, pe, [d], [0], 1), rtol=1e-12, atol=1e-12
    )
    # Both backward ops use the same pads: backward data maps dst size back to src size 5.
    diff_dst = rng.standard_normal(dst.shape)
    dsrc = ref.conv_transpose_backward_data(diff_dst, w, **kw)
    assert dsrc.shape == src.shape
    np.testing.assert_allclose(
        dsrc, bf_backward_data(diff_dst, w, [s], pb, pe, [d], 1), rtol=1e-12, atol=1e-12
    )
    dw = ref.conv_transpose_backward_weights(src, diff_dst, w.shape, **kw)
    np.testing.assert_allclose(
        dw, bf_backward_weights(src, diff_dst, w.shape, [s], pb, [d], 1), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize(
    ("kernel", "strides", "dilations", "auto_pad", "want"),
    [
        ([3], 2, 1, "SAME_UPPER", ([0], [1])),
        ([3], 2, 1, "SAME_LOWER", ([1], [0])),
        ([3], 2, 1, "same_lower", ([1], [0])),
        ([3], 2, 2, "SAME_UPPER", ([1], [2])),
        ([3], 2, 2, "SAME_LOWER", ([2], [1])),
        ([4], 2, 1, "SAME_UPPER", ([1], [1])),
        ([1], 2, 1, "SAME_UPPER", ([0], [0])),
        ([5], 3, 1, "SAME_LOWER", ([1], [1])),
        ([2], 3, 1, "SAME_LOWER", ([0], [0])),
        ([3], 2, 1, "VALID", ([0], [0])),
        ([3], 2, 1, "None", ([4], [5])),
        ([3], 2, 1, "NONE", ([4], [5])),
        ([3, 4, 1], [2, 1, 1], [1, 1, 3], "SAME_UPPER", ([0, 1, 0], [1, 2, 0])),
        ([3, 4, 1], [2, 1, 1], [1, 1, 3], "SAME_LOWER", ([1, 2, 0], [0, 1, 0])),
    ],
)
def test_resolve_pads(kernel, strides, dilations, auto_pad, want):
    got = ref.resolve_pads(kernel, strides, dilations, auto_pad, 4 if len(kernel) == 1 else 0, 5)
    assert got == want
    assert all(isinstance(v, int) for lst in got for v in lst)


def test_defaults_are_nxc_xoi():
    rng = np.random.default_rng(7)
    src = rng.standard_normal((2, 3, 4, 2))  # NXC: N, H, W, IC
    w = rng.standard_normal((2, 3, 5, 2))  # XOI: KH, KW, OC, IC
    dst = ref.conv_transpose(src, w, strides=2)
    assert dst.shape == (2, 2 * 2 + 2, 3 * 2 + 3, 5)
    want = bf_forward(
        from_data(src, "NXC"),
        from_weights(w, "XOI"),
        None,
        [2, 2],
        [0, 0],
        [0, 0],
        [1, 1],
        [0, 0],
        1,
    )
    np.testing.assert_allclose(from_data(dst, "NXC"), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "dtype", [np.float16, np.float32, ml_dtypes.bfloat16, np.float64, np.int32, np.int8]
)
def test_input_dtypes_are_converted_to_float64(dtype):
    rng = np.random.default_rng(3)
    src = (rng.standard_normal((1, 3, 2)) * 4).astype(dtype)
    w = (rng.standard_normal((2, 2, 2)) * 4).astype(dtype)  # XOI: K, OC, IC
    bias = (rng.standard_normal(2) * 4).astype(dtype)
    src64, w64, b64 = (np.asarray(a, dtype=np.float64) for a in (src, w, bias))
    assert np.abs(src64).max() > 0
    dst = ref.conv_transpose(src, w, bias, strides=2, output_padding=1)
    assert dst.dtype == np.float64
    want = ref.conv_transpose(src64, w64, b64, strides=2, output_padding=1)
    np.testing.assert_array_equal(dst, want)
    want_bf = bf_forward(
        from_data(src64, "NXC"), from_weights(w64, "XOI"), b64, [2], [0], [0], [1], [1], 1
    )
    np.testing.assert_allclose(from_data(dst, "NXC"), want_bf, rtol=1e-12, atol=1e-12)
    dd = (rng.standard_normal(dst.shape) * 4).astype(dtype)
    dsrc = ref.conv_transpose_backward_data(dd, w, strides=2)
    assert dsrc.dtype == np.float64
    np.testing.assert_array_equal(
        dsrc, ref.conv_transpose_backward_data(np.asarray(dd, dtype=np.float64), w64, strides=2)
    )
    dw = ref.conv_transpose_backward_weights(src, dd, w.shape, strides=2)
    assert dw.dtype == np.float64
    np.testing.assert_array_equal(
        dw,
        ref.conv_transpose_backward_weights(
            src64, np.asarray(dd, dtype=np.float64), w.shape, strides=2
        ),
    )


def test_nested_lists_accepted():
    dst = ref.conv_transpose(
        [[[1, 2, 3]]], [[[1, 10]]], [1], strides=2, data_format="NCX", weights_format="IOX"
    )
    np.testing.assert_array_equal(dst, [[[2.0, 11.0, 3.0, 21.0, 4.0, 31.0]]])


# --------------------------------------------------------------------------------------------
# Adjoint identities on random configurations
# --------------------------------------------------------------------------------------------


def random_config(rng):
    nd = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 1, 2, 3]))
    icg = int(rng.integers(1, 4))
    o = int(rng.integers(1, 4))
    kernel = [int(v) for v in rng.integers(1, 5, nd)]
    strides = [int(v) for v in rng.integers(1, 4, nd)]
    dilations = [int(v) for v in rng.integers(1, 4, nd)]
    auto_pad = str(rng.choice(["None", "None", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    src_sp = [int(v) for v in rng.integers(1, 7 if nd < 3 else 4, nd)]
    pads_begin = [int(v) for v in rng.integers(0, 4, nd)]
    pads_end = [int(v) for v in rng.integers(0, 4, nd)]
    output_padding = [int(rng.integers(0, s)) for s in strides]
    return make_case(
        src_sp,
        icg * groups,
        o,
        kernel,
        n=int(rng.integers(1, 3)),
        groups=groups,
        strides=strides,
        dilations=dilations,
        pads_begin=pads_begin,
        pads_end=pads_end,
        output_padding=output_padding,
        auto_pad=auto_pad,
        bias=False,
    )


def test_adjoint_identities_random():
    rng = np.random.default_rng(12345)
    checked = 0
    while checked < 60:
        case = random_config(rng)
        pb, pe = resolved(case)
        out_sp = [
            s * (n - 1) + d * (k - 1) + 1 - b - e + p
            for s, n, d, k, b, e, p in zip(
                case["strides"],
                case["src_sp"],
                case["dilations"],
                case["kernel"],
                pb,
                pe,
                case["output_padding"],
            )
        ]
        if min(out_sp) < 1:
            with pytest.raises(ValueError, match="conv_transpose: computed output"):
                ref.conv_transpose(
                    *random_tensors(case, rng)[:2],
                    data_format="NCX",
                    weights_format="IOX",
                    **attrs_of(case, forward=True),
                )
            continue
        df, wf = LAYOUTS[checked % 4]
        src, w, _ = random_tensors(case, rng)
        x, wt = to_data(src, df), to_weights(w, wf)
        kw = {"data_format": df, "weights_format": wf}
        dst = ref.conv_transpose(x, wt, **kw, **attrs_of(case, forward=True))
        assert list(from_data(dst, df).shape[2:]) == out_sp
        y = rng.standard_normal(dst.shape)
        dsrc = ref.conv_transpose_backward_data(y, wt, **kw, **attrs_of(case, forward=False))
        dw = ref.conv_transpose_backward_weights(
            x, y, wt.shape, **kw, **attrs_of(case, forward=False)
        )
        assert dsrc.shape == x.shape and dw.shape == wt.shape
        lhs = float(np.sum(dst * y))
        scale = float(np.sum(np.abs(dst) * np.abs(y))) + 1e-300
        assert abs(lhs - float(np.sum(x * dsrc))) <= 1e-12 * scale
        assert abs(lhs - float(np.sum(wt * dw))) <= 1e-12 * scale
        checked += 1


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

_X = np.zeros((1, 4, 5))  # NCX, IC = 4
_W = np.zeros((4, 3, 3))  # IOX, OC/G = 3
_DD = np.zeros((1, 6, 7))  # NCX, OC = 6 with groups=2
_NCX_IOX = {"data_format": "NCX", "weights_format": "IOX"}

FWD = "conv_transpose:"
BWD_D = "conv_transpose_backward_data:"
BWD_W = "conv_transpose_backward_weights:"

INVALID = {
    "fwd_rank_2": (
        lambda: ref.conv_transpose(np.zeros((1, 4)), _W, **_NCX_IOX),
        FWD + " src.*rank",
    ),
    "fwd_rank_6": (
        lambda: ref.conv_transpose(np.zeros((1, 1, 1, 1, 1, 1)), _W, **_NCX_IOX),
        FWD + " src.*rank",
    ),
    "fwd_weights_rank": (
        lambda: ref.conv_transpose(_X, np.zeros((4, 3, 3, 3)), **_NCX_IOX),
        FWD + " weights.*rank 3",
    ),
    "fwd_ic_mismatch": (
        lambda: ref.conv_transpose(_X, np.zeros((2, 3, 3)), **_NCX_IOX),
        FWD + " src has 4 channels.*IC=2",
    ),
    "fwd_groups_not_dividing": (
        lambda: ref.conv_transpose(_X, _W, groups=3, **_NCX_IOX),
        FWD + " .*divisible by groups",
    ),
    "fwd_groups_zero": (lambda: ref.conv_transpose(_X, _W, groups=0, **_NCX_IOX), FWD + " groups"),
    "fwd_bias_len": (
        lambda: ref.conv_transpose(_X, _W, np.zeros(4), **_NCX_IOX),
        FWD + " bias.*OC=3",
    ),
    "fwd_strides_len": (
        lambda: ref.conv_transpose(_X, _W, strides=[1, 1], **_NCX_IOX),
        FWD + " strides must have 1 entries",
    ),
    "fwd_strides_zero": (
        lambda: ref.conv_transpose(_X, _W, strides=0, **_NCX_IOX),
        FWD + " .*strides must be >= 1",
    ),
    "fwd_dilations_zero": (
        lambda: ref.conv_transpose(_X, _W, dilations=[0], **_NCX_IOX),
        FWD + " .*dilations must be >= 1",
    ),
    "fwd_negative_pad": (
        lambda: ref.conv_transpose(_X, _W, pads_begin=-1, **_NCX_IOX),
        FWD + " .*pads_begin must be >= 0",
    ),
    "fwd_negative_output_padding": (
        lambda: ref.conv_transpose(_X, _W, output_padding=-1, **_NCX_IOX),
        FWD + " .*output_padding must be >= 0",
    ),
    "fwd_output_padding_len": (
        lambda: ref.conv_transpose(_X, _W, output_padding=[0, 0], **_NCX_IOX),
        FWD + " output_padding must have 1 entries",
    ),
    "fwd_float_stride": (
        lambda: ref.conv_transpose(_X, _W, strides=1.5, **_NCX_IOX),
        FWD + " strides must be an integer",
    ),
    "fwd_output_too_small": (
        lambda: ref.conv_transpose(_X, _W, pads_begin=4, pads_end=3, **_NCX_IOX),
        FWD + " computed output spatial size",
    ),
    "fwd_auto_pad": (
        lambda: ref.conv_transpose(_X, _W, auto_pad="SAME", **_NCX_IOX),
        FWD + " auto_pad",
    ),
    "fwd_data_format": (
        lambda: ref.conv_transpose(_X, _W, data_format="NCHW", weights_format="IOX"),
        FWD + " data_format",
    ),
    "fwd_weights_format": (
        lambda: ref.conv_transpose(_X, _W, data_format="NCX", weights_format="OIX"),
        FWD + " weights_format",
    ),
    "bwd_data_rank_mismatch": (
        lambda: ref.conv_transpose_backward_data(np.zeros((1, 3, 5, 5)), _W, **_NCX_IOX),
        BWD_D + " weights must have rank 4",
    ),
    "bwd_data_oc_mismatch": (
        lambda: ref.conv_transpose_backward_data(_DD, _W, **_NCX_IOX),
        BWD_D + " diff_dst has 6 channels.*OC=3",
    ),
    "bwd_data_groups": (
        lambda: ref.conv_transpose_backward_data(_DD, _W, groups=3, **_NCX_IOX),
        BWD_D + " .*divisible by groups",
    ),
    "bwd_data_size": (
        lambda: ref.conv_transpose_backward_data(np.zeros((1, 3, 1)), _W, **_NCX_IOX),
        BWD_D + " computed diff_src spatial size",
    ),
    "bwd_data_pads_len": (
        lambda: ref.conv_transpose_backward_data(_DD, _W, groups=2, pads_end=[1, 1], **_NCX_IOX),
        BWD_D + " pads_end must have 1 entries",
    ),
    "bwd_data_auto_pad": (
        lambda: ref.conv_transpose_backward_data(_DD, _W, groups=2, auto_pad=1, **_NCX_IOX),
        BWD_D + " auto_pad",
    ),
    "bwd_w_rank_mismatch": (
        lambda: ref.conv_transpose_backward_weights(
            _X, np.zeros((1, 6, 7, 7)), _W.shape, groups=2, **_NCX_IOX
        ),
        BWD_W + " diff_dst must have the same rank",
    ),
    "bwd_w_batch_mismatch": (
        lambda: ref.conv_transpose_backward_weights(
            _X, np.zeros((2, 6, 7)), _W.shape, groups=2, **_NCX_IOX
        ),
        BWD_W + " diff_dst batch size",
    ),
    "bwd_w_shape_rank": (
        lambda: ref.conv_transpose_backward_weights(_X, _DD, (4, 3), groups=2, **_NCX_IOX),
        BWD_W + " weights_shape must have rank 3",
    ),
    "bwd_w_ic_mismatch": (
        lambda: ref.conv_transpose_backward_weights(_X, _DD, (2, 3, 3), groups=2, **_NCX_IOX),
        BWD_W + " src has 4 channels.*IC=2",
    ),
    "bwd_w_oc_mismatch": (
        lambda: ref.conv_transpose_backward_weights(_X, _DD, _W.shape, **_NCX_IOX),
        BWD_W + " diff_dst has 6 channels.*OC=3",
    ),
    "bwd_w_dilations_len": (
        lambda: ref.conv_transpose_backward_weights(
            _X, _DD, _W.shape, groups=2, dilations=[1, 2], **_NCX_IOX
        ),
        BWD_W + " dilations must have 1 entries",
    ),
    "bwd_w_weights_format": (
        lambda: ref.conv_transpose_backward_weights(
            _X, _DD, _W.shape, groups=2, data_format="NCX", weights_format="XIO"
        ),
        BWD_W + " weights_format",
    ),
    "resolve_pads_auto_pad": (
        lambda: ref.resolve_pads([3], 1, 1, "SAME", 0, 0),
        "resolve_pads: auto_pad",
    ),
    "resolve_pads_len": (
        lambda: ref.resolve_pads([3, 3], [1, 1, 1], 1, "None", 0, 0),
        "resolve_pads: strides must have 2 entries",
    ),
    "resolve_pads_negative": (
        lambda: ref.resolve_pads([3], 1, 1, "None", 0, -2),
        "resolve_pads: .*pads_end must be >= 0",
    ),
}


@pytest.mark.parametrize("name", list(INVALID))
def test_invalid_arguments_raise(name):
    call, pattern = INVALID[name]
    with pytest.raises(ValueError, match=pattern):
        call()


def test_valid_baseline_of_invalid_table():
    # The fixtures used above are consistent when used correctly.
    assert ref.conv_transpose(_X, _W, **_NCX_IOX).shape == (1, 3, 7)
    assert ref.conv_transpose(_X, np.ones((4, 3, 3)), groups=2, **_NCX_IOX).shape == (1, 6, 7)
    assert ref.conv_transpose_backward_data(_DD, _W, groups=2, **_NCX_IOX).shape == (1, 4, 5)
    dw = ref.conv_transpose_backward_weights(_X, _DD, _W.shape, groups=2, **_NCX_IOX)
    assert dw.shape == _W.shape


# --------------------------------------------------------------------------------------------
# Cross-check with PyTorch (skipped when torch is not installed)
# --------------------------------------------------------------------------------------------

TORCH_CASES = [
    # (src spatial, IC, OC/G, kernel, groups, stride, pad (symmetric), output_padding, dilation)
    ([7], 4, 3, [3], 2, [2], [1], [1], [1]),
    ([6], 3, 2, [4], 3, [3], [2], [2], [2]),
    ([5, 4], 4, 2, [3, 2], 2, [2, 1], [1, 0], [1, 0], [1, 2]),
    ([4, 4], 3, 1, [3, 3], 3, [2, 2], [2, 1], [0, 1], [2, 1]),
    ([16, 16], 8, 8, [3, 3], 1, [2, 2], [1, 1], [1, 1], [1, 1]),
    ([3, 4, 3], 2, 3, [2, 3, 2], 1, [2, 1, 3], [1, 1, 0], [1, 0, 2], [1, 2, 1]),
    ([4, 3, 3], 4, 1, [3, 2, 2], 4, [1, 2, 2], [0, 1, 1], [0, 1, 0], [2, 1, 1]),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: f"{len(c[0])}d")
def test_matches_torch(case):
    torch = pytest.importorskip("torch")
    fnn = torch.nn.functional
    src_sp, ic, o, kernel, groups, stride, pad, op, dil = case
    nd = len(src_sp)
    conv = {1: fnn.conv_transpose1d, 2: fnn.conv_transpose2d, 3: fnn.conv_transpose3d}[nd]
    rng = np.random.default_rng(sum(src_sp) + 17 * nd + ic)
    src = rng.standard_normal((2, ic, *src_sp))
    w = rng.standard_normal((ic, o, *kernel))
    bias = rng.standard_normal(o * groups)

    xt = torch.tensor(src, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.tensor(bias, dtype=torch.float64)
    yt = conv(
        xt, wt, bt, stride=stride, padding=pad, output_padding=op, groups=groups, dilation=dil
    )
    gy = rng.standard_normal(tuple(yt.shape))
    yt.backward(torch.tensor(gy, dtype=torch.float64))
    want_dst = yt.detach().numpy()
    want_dsrc = xt.grad.numpy()
    want_dw = wt.grad.numpy()

    common = {
        "strides": stride,
        "pads_begin": pad,
        "pads_end": pad,
        "dilations": dil,
        "groups": groups,
    }
    for df, wf in LAYOUTS:
        dst = ref.conv_transpose(
            to_data(src, df),
            to_weights(w, wf),
            bias,
            output_padding=op,
            data_format=df,
            weights_format=wf,
            **common,
        )
        np.testing.assert_allclose(from_data(dst, df), want_dst, rtol=1e-10, atol=1e-10)
        dsrc = ref.conv_transpose_backward_data(
            to_data(gy, df), to_weights(w, wf), data_format=df, weights_format=wf, **common
        )
        np.testing.assert_allclose(from_data(dsrc, df), want_dsrc, rtol=1e-10, atol=1e-10)
        dw = ref.conv_transpose_backward_weights(
            to_data(src, df),
            to_data(gy, df),
            weights_shape_in(w.shape, wf),
            data_format=df,
            weights_format=wf,
            **common,
        )
        np.testing.assert_allclose(from_weights(dw, wf), want_dw, rtol=1e-10, atol=1e-10)

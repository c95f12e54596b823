"""``MatMul (columns)``: a 2-D/3-D strided forward with few output channels as one MatMul into
columns and their sum. Random problems (both layouts and weights orders, kernels that are
and are not multiples of the stride, pads, output_padding, a bias) against the float64
reference, and non-finite inputs against the library's own op."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_close

import onednn_convt as oc
from onednn_convt import lowering, reference
from onednn_convt.lowering import base, matmul_columns, permute


def _problem(rng: np.random.Generator, code: str):
    """A random problem that has the columns as a candidate."""
    while True:
        d = int(rng.integers(2, 4))
        fmt = str(rng.choice(["NCX", "NXC"]))
        wf = str(rng.choice(["IOX", "XOI"]))
        kernel = tuple(int(k) for k in rng.integers(1, 6, d))
        strides = tuple(int(s) for s in rng.integers(1, 4, d))
        pb = tuple(int(rng.integers(0, k)) for k in kernel)
        pe = tuple(int(rng.integers(0, k)) for k in kernel)
        opad = tuple(int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in strides)
        src = tuple(int(x) for x in rng.integers(1, 6, d))
        n, ic, o = int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(1, matmul_columns.MAX_OC + 1))
        if not matmul_columns.applies(kernel, strides, (1,) * d, 1, o):
            continue
        dtype = oc.dtypes.FLOAT_DTYPES[code]
        x = rng.standard_normal((n, ic, *src) if fmt == "NCX" else (n, *src, ic)).astype(dtype)
        w = rng.standard_normal((ic, o, *kernel) if wf == "IOX" else (*kernel, o, ic)).astype(dtype)
        b = rng.standard_normal(o).astype(np.float32) if rng.random() < 0.5 else None
        attrs = dict(strides=strides, pads_begin=pb, pads_end=pe, output_padding=opad, data_format=fmt,
                     weights_format=wf)
        try:
            op = oc.ConvTranspose(**attrs)
            problem = op._problem([x, w, b], code)
        except ValueError:  # an empty output, output_padding past the pads: draw again
            continue
        if base.COLUMNS in lowering.candidates(problem):
            return op, problem, attrs, [x, w, b], ic * int(np.prod(kernel))


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("seed", range(4))
def test_random_problems_match_the_reference(code, seed):
    rng = np.random.default_rng(seed)
    for _ in range(10):
        op, problem, attrs, arrays, reduction = _problem(rng, code)
        got = op._target().plan(lowering.build(problem, base.COLUMNS), arrays, None, code).run(arrays, None)
        x, w, b = (None if a is None else np.asarray(a, np.float64) for a in arrays)
        want = reference.conv_transpose(x, w, b, **attrs)
        assert got.dtype == arrays[0].dtype and got.shape == want.shape
        assert_close(got, want, code, reduction, f"{attrs} {x.shape} {w.shape}")


def test_non_finite_values_spread_as_in_the_library_op():
    """Inf and NaN in src or the weights reach the same outputs as the library's op (the zero
    taps that pad the kernel are no taps: 0 * Inf adds no NaN)."""
    rng = np.random.default_rng(11)
    for _ in range(20):
        op, problem, attrs, arrays, _ = _problem(rng, "f32")
        for a in arrays[:2]:
            flat = a.reshape(-1)
            flat[rng.integers(flat.size)] = rng.choice([np.inf, -np.inf, np.nan])
        lib = op._target().plan(lowering.build(problem, base.CONV_TRANSPOSE), arrays, None, "f32").run(arrays, None)
        got = op._target().plan(lowering.build(problem, base.COLUMNS), arrays, None, "f32").run(arrays, None)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(lib))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(lib))
        finite = np.isfinite(lib)
        np.testing.assert_allclose(got[finite], lib[finite], rtol=1e-4, atol=1e-4)


def test_only_strided_2d_3d_ungrouped_calls_with_few_output_channels_have_it():
    assert matmul_columns.applies((9, 9), (3, 3), (1, 1), 1, 1)
    assert not matmul_columns.applies((9,), (3,), (1,), 1, 1)  # 1-D: the overlap-add MatMul
    assert not matmul_columns.applies((3, 3), (1, 1), (1, 1), 1, 1)  # stride 1
    assert not matmul_columns.applies((4, 4), (2, 2), (1, 1), 2, 2)  # groups
    assert not matmul_columns.applies((4, 4), (2, 2), (2, 1), 1, 2)  # dilation
    assert not matmul_columns.applies((4, 4), (2, 2), (1, 1), 1, matmul_columns.MAX_OC + 1)
    assert matmul_columns.applies((8, 8), (2, 2), (1, 1), 1, 1)  # 16 slices
    assert not matmul_columns.applies((8, 8, 8), (2, 2, 2), (1, 1, 1), 1, 1)  # 64 slices


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("fmt,wf", [("NCX", "IOX"), ("NXC", "XOI"), ("NXC", "IOX")])
@pytest.mark.parametrize("geometry", [dict(kernel=4, strides=2, pads=1, opad=0), dict(kernel=3, strides=2, pads=1, opad=1)])
def test_calls_large_enough_for_the_library_permutes_match_the_reference(monkeypatch, code, fmt, wf, geometry):
    """An RGB output layer's size: the permuting copies after the sum (the phases into rows,
    NXC's channels moved last) run as oneDNN Reorders, not NumPy's fallback, and the result
    is the reference's, the pads cropped and output_padding's row added."""
    def no_fallback(*args, **kwargs):
        raise AssertionError("a permute fell back to NumPy")

    monkeypatch.setattr(permute, "_numpy_permuted", no_fallback)
    rng = np.random.default_rng(5)
    dtype = oc.dtypes.FLOAT_DTYPES[code]
    k, s, p, opad = geometry["kernel"], geometry["strides"], geometry["pads"], geometry["opad"]
    x = rng.standard_normal((2, 8, 64, 64) if fmt == "NCX" else (2, 64, 64, 8)).astype(dtype)
    w = rng.standard_normal((8, 3, k, k) if wf == "IOX" else (k, k, 3, 8)).astype(dtype)
    b = rng.standard_normal(3).astype(np.float32)
    attrs = dict(strides=s, pads_begin=p, pads_end=p, output_padding=opad, data_format=fmt, weights_format=wf)
    op = oc.ConvTranspose(**attrs)
    problem = op._problem([x, w, b], code)
    assert base.COLUMNS in lowering.candidates(problem)
    got = op._target().plan(lowering.build(problem, base.COLUMNS), [x, w, b], None, code).run([x, w, b], None)
    want = reference.conv_transpose(*(np.asarray(a, np.float64) for a in (x, w, b)), **attrs)
    assert got.dtype == x.dtype and got.shape == want.shape
    assert got.size >= permute.MIN_ELEMS  # the size the library permutes
    assert_close(got, want, code, 8 * k * k, f"{attrs}")


@pytest.mark.parametrize("fmt,wf", [("NCX", "IOX"), ("NXC", "XOI"), ("NXC", "IOX")])
def test_constant_weights_give_the_bits_of_weights_given_per_call(monkeypatch, fmt, wf):
    """``with_constant_weights`` marks the taps, the MatMul's first input in both layouts,
    constant: the same bits as the weights passed on each call, call after call."""
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.COLUMNS)
    rng = np.random.default_rng(9)
    w = rng.standard_normal((6, 3, 4, 4) if wf == "IOX" else (4, 4, 3, 6)).astype(np.float32)
    attrs = dict(strides=2, pads_begin=1, pads_end=1, data_format=fmt, weights_format=wf)
    plain = oc.ConvTranspose(**attrs)
    bound = oc.ConvTranspose(**attrs).with_constant_weights(w)
    for _ in range(3):  # a new src each call: only the weights may be held
        x = rng.standard_normal((2, 6, 20, 20) if fmt == "NCX" else (2, 20, 20, 6)).astype(np.float32)
        expected = plain(x, w)
        np.testing.assert_array_equal(bound(x).view(np.uint32), expected.view(np.uint32))
        want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **attrs)
        assert_close(expected, want, "f32", 6 * 16, fmt)
    assert plain.lowering == bound.lowering == "MatMul"
    assert bound.op.last_plan.compiled.constant_inputs == [0]

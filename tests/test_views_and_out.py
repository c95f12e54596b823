"""Inputs given as views (strided, transposed, negative and zero strides, misaligned,
read-only) give exactly the result of the contiguous input; ``out=`` is written in place or
refused with the documented exception."""

from __future__ import annotations

from typing import Callable

import numpy as np
import onednn_convt as oc
import pytest
from helpers import OPS, Config, assert_close, strided

CFG = Config(src=(5, 4), kernel=(3, 2), n=2, ic=4, oc=6, groups=2, strides=(2, 1), dilations=(1, 2),
             pads_begin=(1, 0), pads_end=(0, 1), output_padding=(1, 0), data_format="NXC", weights_format="XOI",
             bias=True)
T = CFG.tensors(np.random.default_rng(71))
INPUTS = {"ConvTranspose": ("src", "weights", "bias"), "ConvTransposeBackwardData": ("diff_dst", "weights"),
          "ConvTransposeBackwardWeights": ("src", "diff_dst")}
OUT_SHAPE = {"ConvTranspose": CFG.dst_shape, "ConvTransposeBackwardData": CFG.src_shape,
             "ConvTransposeBackwardWeights": CFG.weights_shape}


def make(op: str):
    if op == "ConvTransposeBackwardWeights":
        return oc.ConvTransposeBackwardWeights(**CFG.attrs(op), weights_shape=CFG.weights_shape)
    return getattr(oc, op)(**CFG.attrs(op))


def reference(op: str, arrays: list[np.ndarray]) -> tuple[np.ndarray, int]:
    if op == "ConvTranspose":
        return CFG.ref_forward(*arrays), CFG.fwd_reduction
    if op == "ConvTransposeBackwardData":
        return CFG.ref_backward_data(*arrays), CFG.bwd_data_reduction
    return CFG.ref_backward_weights(*arrays), CFG.bwd_weights_reduction


# -- views of the same values -----------------------------------------------------------
def transposed(a: np.ndarray) -> np.ndarray:
    """The same logical array stored in reversed axis order (Fortran order)."""
    return np.asfortranarray(a)


def channels_moved(a: np.ndarray) -> np.ndarray:
    """Last axis stored first: e.g. NXC values kept in NCX memory, viewed through moveaxis."""
    return np.moveaxis(np.ascontiguousarray(np.moveaxis(a, -1, 0)), 0, -1)


def negative(a: np.ndarray) -> np.ndarray:
    """Negative strides on every axis of length > 1."""
    rev = tuple(slice(None, None, -1) for _ in a.shape)
    return np.ascontiguousarray(a[rev])[rev]


def read_only(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


def misaligned(a: np.ndarray) -> np.ndarray:
    """Data starting one byte past an aligned address."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    b = np.frombuffer(raw.data, a.dtype, a.size, offset=1).reshape(a.shape)
    b[...] = a
    assert not b.flags.aligned
    return b


VIEWS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "strided": strided, "transposed": transposed, "channels_moved": channels_moved,
    "negative": negative, "read_only": read_only, "misaligned": misaligned,
}


@pytest.mark.parametrize("view", list(VIEWS))
@pytest.mark.parametrize("op", OPS)
def test_views_give_the_contiguous_result(op, view):
    names = INPUTS[op]
    base = [T[n] for n in names]
    want = make(op)(*base)
    for i, name in enumerate(names):
        arrays = list(base)
        arrays[i] = VIEWS[view](base[i])
        assert np.array_equal(arrays[i], base[i])
        before = arrays[i].copy()
        fresh = make(op)(*arrays)
        np.testing.assert_array_equal(fresh, want, err_msg=f"{op}: {view} {name}")
        np.testing.assert_array_equal(arrays[i], before)  # inputs are not written
    # every input a view at once, through one op object that also ran the contiguous arrays
    obj = make(op)
    obj(*base)
    reused = obj(*[VIEWS[view](a) for a in base])
    np.testing.assert_array_equal(reused, want)
    ref, reduction = reference(op, base)
    assert_close(want, ref, "f32", reduction)


@pytest.mark.parametrize("op", OPS)
def test_zero_stride_batch_from_none_indexing(op):
    """x[None] has stride 0 on its size-1 batch axis; the result is the batched one's slice."""
    names = INPUTS[op]
    single = {n: (T[n][:1] if n in ("src", "diff_dst") else T[n]) for n in names}
    with_none = {n: (T[n][0][None] if n in ("src", "diff_dst") else T[n]) for n in names}
    assert any(0 in with_none[n].strides for n in names)
    cfg1 = CFG.with_(n=1)
    got = make(op)(*[with_none[n] for n in names])
    np.testing.assert_array_equal(got, make(op)(*[np.ascontiguousarray(single[n]) for n in names]))
    ref, reduction = {
        "ConvTranspose": lambda: (cfg1.ref_forward(*[single[n] for n in names]), cfg1.fwd_reduction),
        "ConvTransposeBackwardData": lambda: (cfg1.ref_backward_data(*[single[n] for n in names]), cfg1.bwd_data_reduction),
        "ConvTransposeBackwardWeights": lambda: (cfg1.ref_backward_weights(*[single[n] for n in names]), cfg1.bwd_weights_reduction),
    }[op]()
    assert_close(got, ref, "f32", reduction)


@pytest.mark.parametrize("op", OPS)
def test_zero_stride_broadcast_inputs(op):
    """np.broadcast_to repeats one sample over the batch with stride 0 (read-only too)."""
    names = INPUTS[op]
    arrays = [np.broadcast_to(T[n][:1], T[n].shape) if n in ("src", "diff_dst") else T[n] for n in names]
    got = make(op)(*arrays)
    np.testing.assert_array_equal(got, make(op)(*[np.ascontiguousarray(a) for a in arrays]))


# -- out= -----------------------------------------------------------------------------------
def out_views(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    big = np.full((*shape[:-1], shape[-1] * 3), np.nan, np.float32)
    return {
        "dense": np.full(shape, np.nan, np.float32),
        "strided": big[..., 1::3],
        "fortran": np.asfortranarray(np.full(shape, np.nan, np.float32)),
    }


@pytest.mark.parametrize("kind", ["dense", "strided", "fortran"])
@pytest.mark.parametrize("op", OPS)
def test_out_is_written_in_place(op, kind):
    arrays = [T[n] for n in INPUTS[op]]
    want = make(op)(*arrays)
    obj = make(op)
    for _ in range(2):  # the first call plans, the second takes the fast path
        out = out_views(OUT_SHAPE[op])[kind]
        assert obj(*arrays, out=out) is out
        np.testing.assert_array_equal(out, want)
    if kind == "strided":
        parent = out.base
        assert np.isnan(parent[..., 0::3]).all() and np.isnan(parent[..., 2::3]).all()


def read_only_out(shape: tuple[int, ...]) -> np.ndarray:
    a = np.empty(shape, np.float32)
    a.flags.writeable = False
    return a


def overlapping_out(shape: tuple[int, ...]) -> np.ndarray:
    a = np.empty(shape[1:], np.float32)
    return np.lib.stride_tricks.as_strided(a, shape, (0, *a.strides))  # writeable, overlapping


def misaligned_out(shape: tuple[int, ...]) -> np.ndarray:
    """Contiguous float32, two bytes off alignment (the strides of a good out: the plan cache
    once took it for one and failed inside the library's call)."""
    size = int(np.prod(shape)) * 4
    return np.empty(size + 4, np.uint8)[2 : 2 + size].view(np.float32).reshape(shape)


BAD_OUT = {
    "wrong_shape": (lambda s: np.empty((*s[:-1], s[-1] + 1), np.float32), ValueError, "expected shape"),
    "wrong_rank": (lambda s: np.empty(s[1:], np.float32), ValueError, "expected shape"),
    "wrong_dtype": (lambda s: np.empty(s, np.float16), TypeError, "expected dtype float32"),
    "float64": (lambda s: np.empty(s, np.float64), TypeError, "expected dtype float32"),
    "read_only": (read_only_out, ValueError, "read-only"),
    "negative_strides": (lambda s: np.empty(s, np.float32)[..., ::-1], ValueError, "strides"),
    "overlapping": (overlapping_out, ValueError, "non-overlapping"),
    "misaligned": (misaligned_out, ValueError, "aligned"),
    "list": (lambda s: np.empty(s, np.float32).tolist(), TypeError, "expected a NumPy array"),
}


@pytest.mark.parametrize("warm", [False, True], ids=["first_call", "after_a_call_with_out"])
@pytest.mark.parametrize("bad", list(BAD_OUT))
@pytest.mark.parametrize("op", OPS)
def test_bad_out_is_refused(op, bad, warm):
    make_out, exc, words = BAD_OUT[bad]
    arrays = [T[n] for n in INPUTS[op]]
    obj = make(op)
    if warm:  # a cached plan (and its fast path) for a good out of the same signature
        obj(*arrays, out=np.empty(OUT_SHAPE[op], np.float32))
    with pytest.raises(exc) as info:
        obj(*arrays, out=make_out(OUT_SHAPE[op]))
    assert type(info.value) is exc
    assert f"{op}: argument 'out'" in str(info.value) and words in str(info.value), str(info.value)


@pytest.mark.parametrize("warm", [False, True], ids=["first_call", "after_a_call_with_out"])
@pytest.mark.parametrize("op", OPS)
def test_out_sharing_memory_with_an_input_is_refused(op, warm):
    names = INPUTS[op]
    shape = OUT_SHAPE[op]
    arrays = [T[n] for n in names]
    obj = make(op)
    size = max(int(np.prod(shape)), *(a.size for a in arrays))
    pool = np.zeros(2 * size, np.float32)
    out = pool[: int(np.prod(shape))].reshape(shape)
    if warm:
        obj(*arrays, out=out)
    first = pool[: arrays[0].size].reshape(arrays[0].shape)  # overlaps out
    first[...] = arrays[0]
    with pytest.raises(ValueError, match=f"{op}: argument 'out' shares memory with input '{names[0]}'"):
        obj(first, *arrays[1:], out=out)


@pytest.mark.parametrize("code", ["bf16", "f16"])
def test_out_and_views_in_low_precision_are_identical_to_dense(code):
    """The low-precision paths (emulated or native, as this CPU has them) handle views and a
    strided out the same way."""
    t = CFG.tensors(np.random.default_rng(72), code)
    op = oc.ConvTranspose(**CFG.attrs())
    want = op(t["src"], t["weights"], t["bias"])
    out = out_views(CFG.dst_shape)["strided"].astype(t["src"].dtype)
    op(negative(t["src"]), transposed(t["weights"]), strided(t["bias"]), out=out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("op", OPS)
def test_views_whose_strides_do_not_nest(op):
    """Every third row and column of larger NCX arrays: the rows' extent overruns the channel
    step, which oneDNN cannot describe (invalid_arguments); such inputs are copied."""
    cfg = CFG.with_(data_format="NCX", weights_format="IOX")
    t = cfg.tensors(np.random.default_rng(72))
    names = INPUTS[op][:2]
    views = []
    for name in names:
        a = t[name]
        if a.ndim == 4 and name != "weights":
            big = np.zeros((*a.shape[:2], 3 * a.shape[2] - 2, 3 * a.shape[3] - 2), a.dtype)
            big[:, :, ::3, ::3] = a
            a = big[:, :, ::3, ::3]
            assert a.strides[1] < a.strides[2] * a.shape[2]  # does not nest
        views.append(a)
    if op == "ConvTransposeBackwardWeights":
        obj = oc.ConvTransposeBackwardWeights(**cfg.attrs(op), weights_shape=cfg.weights_shape)
        got, ref, red = obj(*views), cfg.ref_backward_weights(*views), cfg.bwd_weights_reduction
    elif op == "ConvTranspose":
        obj = oc.ConvTranspose(**cfg.attrs())
        got, ref, red = obj(*views), cfg.ref_forward(*views), cfg.fwd_reduction
    else:
        obj = oc.ConvTransposeBackwardData(**cfg.attrs(op))
        got, ref, red = obj(*views), cfg.ref_backward_data(*views), cfg.bwd_data_reduction
    assert_close(got, ref, "f32", red, op)


def size_one_strides(a: np.ndarray, factor: int) -> np.ndarray:
    """``a`` (C-ordered values) in memory whose size-1 dims have ``factor`` times the dense
    stride there (0: stride 0, as ``x[None]`` gives); the other dims dense."""
    dense = np.ascontiguousarray(a)
    strides = tuple(s * factor if n == 1 else s for s, n in zip(dense.strides, dense.shape))
    base = np.zeros(max(1, factor) * dense.size + 64, a.dtype)
    view = np.lib.stride_tricks.as_strided(base, dense.shape, strides)
    view[...] = dense
    return view


@pytest.mark.parametrize("factor", [0, 2, 4])
@pytest.mark.parametrize("op", OPS)
def test_any_stride_on_size_one_dims(op, factor):
    """A size-1 dim's stride addresses nothing: batch 1 arrays (and kernel 1 weights, out=)
    with any stride there give the dense arrays' result bit for bit, through the lean path
    too. oneDNN 3.2 reads that stride in places (a binary Add: the next test); the package
    describes such dims in C order (strides.library_strides)."""
    cfg = CFG.with_(n=1, kernel=(3, 1), dilations=(1, 1))
    t = cfg.tensors(np.random.default_rng(72))
    names = INPUTS[op]
    dense = [t[n] for n in names]
    obj = oc.ConvTransposeBackwardWeights(**cfg.attrs(op), weights_shape=cfg.weights_shape) \
        if op == "ConvTransposeBackwardWeights" else getattr(oc, op)(**cfg.attrs(op))
    want = obj(*dense)
    odd = [size_one_strides(a, factor) for a in dense]
    assert any(a.strides != b.strides for a, b in zip(odd, dense))
    fresh = obj.__class__(**obj.attrs)  # a plan made for these strides
    for run in (fresh, fresh, obj):
        np.testing.assert_array_equal(run(*odd), want)
    out = size_one_strides(np.zeros_like(want), factor)
    for _ in range(2):
        assert fresh(*odd, out=out) is out
        np.testing.assert_array_equal(out, want)
    assert fresh._fast is not None  # no copy was needed: the lean path runs them


@pytest.mark.parametrize("factor", [0, 2, 4])
def test_fused_add_operand_with_any_stride_on_its_batch_dim(factor):
    """The staged route (ConvTranspose, then the Add as its own partition): oneDNN 3.2's
    binary Add added the wrong elements when the operand's batch stride (batch 1) was above
    the dense one (found by the reuse fuzzer: 4.4x the output's scale)."""
    rng = np.random.default_rng(73)
    attrs = dict(strides=[3, 1], groups=2, data_format="NCX", weights_format="XOI", auto_pad="VALID")
    src = rng.standard_normal((1, 8, 3, 3)).astype(np.float32)
    w = (rng.standard_normal((1, 3, 2, 8)) / 3).astype(np.float32)
    operand = rng.standard_normal((1, 4, 7, 5)).astype(np.float32)
    op = oc.ConvTranspose(**attrs, post_ops=[oc.PostOp("Add")])
    got = op(src, w, None, size_one_strides(operand, factor))
    want = oc.reference.conv_transpose(src, w, None, **attrs) + operand
    assert_close(got, want, "f32", 8 * 3)


#: problems whose result oneDNN 3.2 writes through a Reorder from a dense layout: into an
#: out= evenly spaced at a step of 4 or 8 elements that Reorder wrote the first element and
#: garbage after it (NaN here), from about 9,000 elements on (strides.writable)
EVEN_STEP_CASES = {
    "ncx_grouped": Config(src=(15, 15), kernel=(3, 1), n=1, ic=42, oc=42, groups=3, pads_begin=(2, 0),
                          pads_end=(1, 0)),
    "nxc": Config(src=(9, 20), kernel=(1, 1), n=3, ic=5, oc=6, strides=2, data_format="NXC", weights_format="XOI"),
}


@pytest.mark.parametrize("step", [2, 3, 4, 8])
@pytest.mark.parametrize("case", list(EVEN_STEP_CASES))
def test_out_evenly_spaced_at_any_step(case, step):
    """An out= that is every step-th element of a dense array gets the reference's values,
    and the elements between stay as they were, on the first call and on the lean path."""
    cfg = EVEN_STEP_CASES[case]
    t = cfg.tensors(np.random.default_rng(74))
    want = cfg.ref_forward(t["src"], t["weights"])
    obj = oc.ConvTranspose(**cfg.attrs("ConvTranspose"))
    parent = np.full((*want.shape[:-1], want.shape[-1] * step), np.nan, np.float32)
    out = parent[..., ::step]
    for _ in range(2):
        out[...] = np.nan
        assert obj(t["src"], t["weights"], out=out) is out
        assert_close(out, want, "f32", cfg.fwd_reduction, f"{case}, step {step}")
    assert np.isnan(parent[..., 1::step]).all()


def test_evenly_spaced_arrays_at_a_multiple_of_four_are_not_written_by_the_library():
    """The rule itself: the step between evenly spaced elements, and which the library writes."""
    from onednn_convt import strides

    dense = np.zeros((3, 5, 7), np.float32)
    wide = np.zeros((3, 5, 28), np.float32)
    cases = [  # (array, its even step, written by the library)
        (dense, 1, True),
        (wide[..., ::4], 4, False),
        (wide[..., ::2], 2, True),
        (wide[..., 1::4], 4, False),
        (np.zeros((3, 5, 56), np.float32)[..., ::8], 8, False),
        (np.zeros((3, 10, 28), np.float32)[:, ::2, ::4], 0, True),  # a gap between rows too
        (np.zeros((1, 1, 4)), 1, True),
        (np.zeros((6, 1, 12), np.float32)[:, :, ::4], 4, False),  # a size-1 dim changes nothing
    ]
    for a, step, writes in cases:
        assert strides.even_step(a) == step, a.strides
        assert strides.writable(a) == writes, a.strides

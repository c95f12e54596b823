"""ndarray subclasses as inputs and out=: np.memmap and a user's own subclass are computed on
their memory (out= written in place and returned as given); masked arrays are refused with a
TypeError that says masks are not supported. Any subclass used to recurse in interop until
RecursionError."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onednn_convt as oc
import pytest
from numpy import ma
from onednn_convt import reference

ATTRS = {"strides": 2, "pads_begin": 1, "pads_end": 0, "data_format": "NCX", "weights_format": "IOX"}


class Tagged(np.ndarray):
    """A user's subclass that carries an attribute (and would lose it through NumPy math)."""

    tag = "mine"


def memmap(tmp_path: Path, name: str, a: np.ndarray, mode: str = "w+") -> np.memmap:
    m = np.memmap(tmp_path / name, a.dtype, "w+", shape=a.shape)
    m[...] = a
    m.flush()
    return m if mode == "w+" else np.memmap(tmp_path / name, a.dtype, mode, shape=a.shape)


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return (rng.uniform(-1, 1, (2, 4, 5, 5)).astype(np.float32), rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32),
            rng.uniform(-1, 1, 3).astype(np.float32))


def test_memmap_inputs_and_out_compute_on_their_memory(tmp_path: Path) -> None:
    x, w, b = data()
    want = oc.conv_transpose(x, w, b, **ATTRS)
    op = oc.ConvTranspose(**ATTRS)
    for _ in range(2):  # the second call: the fast path, which takes plain arrays only
        got = op(memmap(tmp_path, "x", x), memmap(tmp_path, "w", w), memmap(tmp_path, "b", b))
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want)
    out = memmap(tmp_path, "out", np.zeros_like(want))
    assert op(x, w, b, out=out) is out
    np.testing.assert_array_equal(np.asarray(out), want)
    assert op(x, w, b, out=out) is out  # again, after a plan for these plain inputs exists
    ref = reference.conv_transpose(memmap(tmp_path, "x", x), memmap(tmp_path, "w", w), b, **ATTRS)
    np.testing.assert_allclose(want, ref, rtol=1e-5, atol=1e-5)


def test_read_only_memmap_is_an_input_not_an_out(tmp_path: Path) -> None:
    x, w, b = data()
    ro = memmap(tmp_path, "x", x, mode="r")
    np.testing.assert_array_equal(oc.conv_transpose(ro, w, b, **ATTRS), oc.conv_transpose(x, w, b, **ATTRS))
    out = memmap(tmp_path, "o", np.zeros((2, 3, 10, 10), np.float32), mode="r")
    with pytest.raises(ValueError, match="argument 'out' is read-only"):
        oc.conv_transpose(x, w, b, out=out, **ATTRS)


def test_a_users_subclass_everywhere() -> None:
    x, w, b = data()
    want = oc.conv_transpose(x, w, b, **ATTRS)
    tx, tw = x.view(Tagged), w.view(Tagged)
    np.testing.assert_array_equal(oc.conv_transpose(tx, tw, b.view(Tagged), **ATTRS), want)
    out = np.zeros_like(want).view(Tagged)
    assert oc.ConvTranspose(**ATTRS)(tx, tw, b, out=out) is out and out.tag == "mine"
    np.testing.assert_array_equal(out.view(np.ndarray), want)
    dd = np.ones_like(want).view(Tagged)
    bwd = ATTRS
    np.testing.assert_array_equal(oc.conv_transpose_backward_data(dd, tw, **bwd),
                                  oc.conv_transpose_backward_data(np.asarray(dd), w, **bwd))
    np.testing.assert_array_equal(oc.conv_transpose_backward_weights(tx, dd, np.array(w.shape).view(Tagged), **bwd),
                                  oc.conv_transpose_backward_weights(x, np.asarray(dd), np.array(w.shape), **bwd))
    bound = oc.ConvTranspose(**ATTRS).with_constant_weights(tw)
    np.testing.assert_array_equal(bound(tx, b), want)
    fused = oc.ConvTranspose(**ATTRS, post_ops=["ReLU", "Add"])
    np.testing.assert_allclose(fused(tx, tw, b, np.ones_like(want).view(Tagged)), np.maximum(want, 0) + 1, rtol=1e-6)


@pytest.mark.parametrize("where", ["src", "weights", "bias", "out", "bound src", "bound weights", "post-op"])
def test_masked_arrays_are_refused_naming_the_argument(where: str) -> None:
    x, w, b = data()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w, b)
    op(x, w, b)  # a fast path exists for these shapes: a masked array must not take it
    masked: Any = {"src": ma.masked_array(x), "weights": ma.masked_array(w), "bias": ma.masked_array(b)}
    name = {"bound src": "src", "bound weights": "weights", "post-op": "post_ops[0] (Add)"}.get(where, where)
    with pytest.raises(TypeError, match=rf"argument '{re.escape(name)}' is a masked array .*masks are not supported"):
        if where == "out":
            op(x, w, b, out=ma.masked_array(np.zeros((2, 3, 10, 10), np.float32)))
        elif where == "bound src":
            op.with_constant_weights(w)(ma.masked_array(x), b)
        elif where == "bound weights":
            op.with_constant_weights(ma.masked_array(w))
        elif where == "post-op":
            oc.ConvTranspose(**ATTRS, post_ops=["Add"])(x, w, b, ma.masked_array(np.ones((1,), np.float32)))
        else:
            args = [masked.get(n, v) if n == where else v for n, v in (("src", x), ("weights", w), ("bias", b))]
            op(*args)

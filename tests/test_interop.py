"""Arrays of other libraries: torch tensors and DLPack producers in, the same type out, the
same memory throughout (data pointers compared), against the NumPy reference.

The torch tests skip without torch, the JAX ones without JAX; the DLPack producer below is
neither, so those run everywhere.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from typing import Any

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import assert_close
from onednn_convt import interop

BF16 = np.dtype(ml_dtypes.bfloat16)
ATTRS = dict(strides=2, pads_begin=1, pads_end=0, groups=2, data_format="NCX", weights_format="IOX")


def problem(rng: np.random.Generator, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """src (2, 4, 5, 6), weights (4, 3, 3, 3) with 2 groups, bias (6,): small integers, exact in bf16."""
    def ints(*shape: int) -> np.ndarray:
        return rng.integers(-3, 4, shape).astype(dtype)
    return ints(2, 4, 5, 6), ints(4, 3, 3, 3), ints(6)


def reference(src: Any, w: Any, b: Any = None) -> np.ndarray:
    f64 = [None if a is None else np.asarray(a, np.float64) for a in (src, w, b)]
    return oc.reference.conv_transpose(*f64, **ATTRS)


# -- a DLPack producer that is neither NumPy nor torch ---------------------------------------
class Producer:
    """Holds a NumPy array and offers it only through DLPack and an array namespace."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a

    def __dlpack__(self, **kwargs: Any) -> Any:
        if self.a.dtype == BF16:  # NumPy cannot export bf16
            return interop._Exported(self.a).__dlpack__()
        return self.a.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __array_namespace__(self) -> Any:
        return NAMESPACE


def _namespace_from_dlpack(x: Any) -> Producer:
    if x.array.dtype == BF16:  # exported by the package: NumPy cannot read bf16 capsules
        return Producer(x.array)
    return Producer(np.from_dlpack(x))


NAMESPACE = types.SimpleNamespace(from_dlpack=_namespace_from_dlpack)


class OffCpu(Producer):
    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # CUDA


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
def test_dlpack_producer_in_and_out(dtype):
    src, w, b = problem(np.random.default_rng(1), dtype)
    got = oc.ConvTranspose(**ATTRS)(Producer(src), Producer(w), Producer(b))
    assert isinstance(got, Producer) and got.a.dtype == dtype
    np.testing.assert_array_equal(got.a.astype(np.float64), reference(src, w, b))


def test_dlpack_input_is_a_view_of_the_producers_memory():
    src = np.arange(2 * 4 * 5 * 6, dtype=np.float32).reshape(2, 4, 5, 6)[:, :, ::2, 1:]
    view = interop.to_numpy("op", "src", Producer(src))
    assert view.ctypes.data == src.ctypes.data and view.strides == src.strides
    src[0, 0, 0, 0] = -1.0
    assert view[0, 0, 0, 0] == -1.0


def test_dlpack_export_keeps_the_array_alive_until_the_consumer_frees_it():
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(BF16)
    address = a.ctypes.data
    capsule = interop._Exported(a).__dlpack__()
    del a
    array, read_only, device, versioned = oc._core.dlpack_import(capsule, interop._dtype_for)
    assert (array.ctypes.data, read_only, device, versioned) == (address, False, 1, False)
    np.testing.assert_array_equal(array.astype(np.float32), np.arange(12).reshape(3, 4))


def test_dlpack_strided_views_run_as_they_are():
    rng = np.random.default_rng(2)
    src, w, _ = problem(rng)
    wide = np.zeros((2, 4, 10, 6), np.float32)
    wide[:, :, ::2] = src
    got = oc.ConvTranspose(**ATTRS)(Producer(wide[:, :, ::2]), Producer(w))
    np.testing.assert_array_equal(got.a, reference(src, w))


def test_dlpack_off_cpu_memory_is_a_type_error():
    src, w, _ = problem(np.random.default_rng(3))
    with pytest.raises(TypeError, match=r"ConvTranspose: argument 'src' is a OffCpu in cuda memory; expected CPU"):
        oc.ConvTranspose(**ATTRS)(OffCpu(src), Producer(w))


def test_dlpack_read_only_out_is_refused():
    src, w, _ = problem(np.random.default_rng(4))
    out = np.zeros((2, 6, 10, 12), np.float32)
    out.flags.writeable = False  # NumPy exports it with DLPack 1.0's read-only flag
    with pytest.raises(ValueError, match="ConvTranspose: argument 'out' is read-only"):
        oc.ConvTranspose(**ATTRS)(Producer(src), Producer(w), out=Producer(out))


def test_dlpack_out_written_in_place():
    src, w, b = problem(np.random.default_rng(5))
    out = np.zeros((2, 6, 10, 12), np.float32)
    holder = Producer(out)
    assert oc.ConvTranspose(**ATTRS)(Producer(src), Producer(w), Producer(b), out=holder) is holder
    np.testing.assert_array_equal(out, reference(src, w, b))


def test_mixed_array_types_are_a_type_error():
    src, w, _ = problem(np.random.default_rng(6))
    with pytest.raises(TypeError, match="ConvTranspose: every tensor of a call must be of one array type, got src=test_interop, weights=numpy"):
        oc.ConvTranspose(**ATTRS)(Producer(src), w)
    out = np.zeros((2, 6, 10, 12), np.float32)
    with pytest.raises(TypeError, match="one array type.*out=numpy"):
        oc.ConvTranspose(**ATTRS)(Producer(src), Producer(w), out=out)


def test_dlpack_dtype_without_numpy_equivalent_is_a_type_error():
    class Complex(Producer):
        def __dlpack__(self, **kwargs: Any) -> Any:
            return np.zeros((2, 4, 5, 6), np.complex64).__dlpack__(**kwargs)

    src, w, _ = problem(np.random.default_rng(7))
    with pytest.raises(TypeError, match="ConvTranspose: argument 'src' expected dtype .* DLPack type code 5"):
        oc.ConvTranspose(**ATTRS)(Complex(src), Producer(w))


def test_numpy_calls_never_import_torch():
    code = textwrap.dedent("""
        import sys
        import numpy as np, onednn_convt as oc
        x = np.ones((1, 4, 5, 5), np.float32); w = np.ones((4, 3, 3, 3), np.float32)
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(x, w)
        assert "torch" not in sys.modules, "torch was imported"
        print("ok")
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


# -- torch ----------------------------------------------------------------------------------
def _torch() -> Any:
    return pytest.importorskip("torch")


TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "bf16": BF16}


@pytest.mark.parametrize("code", ["f32", "f16", "bf16"])
def test_torch_tensors_in_and_out(code):
    torch = _torch()
    src, w, b = problem(np.random.default_rng(10))
    tdtype = getattr(torch, TORCH_DTYPES[code])
    ts, tw, tb = (torch.from_numpy(a).to(tdtype) for a in (src, w, b))
    got = oc.conv_transpose(ts, tw, tb, **ATTRS)
    assert isinstance(got, torch.Tensor) and got.dtype == tdtype
    np.testing.assert_array_equal(got.float().numpy(), reference(src, w, b))  # integers: exact


@pytest.mark.parametrize("code", ["f32", "f16", "bf16"])
def test_torch_views_share_memory(code):
    torch = _torch()
    t = torch.arange(2 * 4 * 6 * 6, dtype=torch.float32).reshape(2, 4, 6, 6).to(getattr(torch, TORCH_DTYPES[code]))
    for view in (t, t[:, :, ::2, 1:], t.to(memory_format=torch.channels_last), t.permute(0, 2, 3, 1)):
        a = interop.to_numpy("op", "src", view)
        assert a.ctypes.data == view.data_ptr(), view.stride()
        assert a.dtype == NUMPY_DTYPES[code]
        assert a.strides == tuple(s * view.element_size() for s in view.stride())
        np.testing.assert_array_equal(a.astype(np.float32), view.float().numpy())


def test_torch_out_is_written_in_place():
    torch = _torch()
    src, w, b = problem(np.random.default_rng(11))
    out = torch.full((2, 6, 10, 12), 7.0, dtype=torch.bfloat16)
    pointer = out.data_ptr()
    got = oc.ConvTranspose(**ATTRS)(*(torch.from_numpy(a).bfloat16() for a in (src, w, b)), out=out)
    assert got is out and out.data_ptr() == pointer
    np.testing.assert_array_equal(out.float().numpy(), reference(src, w, b))


def test_torch_channels_last_and_strided_inputs():
    torch = _torch()
    src, w, _ = problem(np.random.default_rng(12))
    want = reference(src, w)
    ts = torch.from_numpy(src)
    nhwc = oc.conv_transpose(ts.to(memory_format=torch.channels_last), torch.from_numpy(w), **ATTRS)
    np.testing.assert_array_equal(nhwc.numpy(), want)
    # NXC: the channels-last tensor's memory, permuted to (N, H, W, C), with XOI weights
    xoi = torch.from_numpy(np.ascontiguousarray(np.moveaxis(w, (0, 1), (-1, -2))))
    attrs = dict(ATTRS, data_format="NXC", weights_format="XOI")
    nxc = oc.conv_transpose(ts.to(memory_format=torch.channels_last).permute(0, 2, 3, 1), xoi, **attrs)
    np.testing.assert_array_equal(np.moveaxis(nxc.numpy(), -1, 1), want)
    big = torch.zeros(2, 8, 5, 12)
    big[:, ::2, :, ::2] = ts
    np.testing.assert_array_equal(oc.conv_transpose(big[:, ::2, :, ::2], torch.from_numpy(w), **ATTRS).numpy(), want)


def test_torch_backward_ops_take_tensors():
    torch = _torch()
    rng = np.random.default_rng(13)
    src, w, _ = problem(rng)
    dd = rng.integers(-3, 4, (2, 6, 10, 12)).astype(np.float32)
    dx = oc.conv_transpose_backward_data(torch.from_numpy(dd), torch.from_numpy(w), **ATTRS)
    assert isinstance(dx, torch.Tensor)
    np.testing.assert_array_equal(
        dx.numpy(), oc.reference.conv_transpose_backward_data(dd.astype(np.float64), w.astype(np.float64), **ATTRS)
    )
    dw = oc.conv_transpose_backward_weights(torch.from_numpy(src), torch.from_numpy(dd), np.array(w.shape), **ATTRS)
    assert isinstance(dw, torch.Tensor)
    want = oc.reference.conv_transpose_backward_weights(src.astype(np.float64), dd.astype(np.float64), w.shape, **ATTRS)
    assert_close(dw.numpy(), want, "f32", 2 * 10 * 12)


def test_torch_constant_weights_take_tensors():
    torch = _torch()
    src, w, b = problem(np.random.default_rng(14))
    layer = oc.ConvTranspose(**ATTRS).with_constant_weights(torch.from_numpy(w).bfloat16())
    got = layer(torch.from_numpy(src).bfloat16(), torch.from_numpy(b).bfloat16())
    assert isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16
    np.testing.assert_array_equal(got.float().numpy(), reference(src, w, b))


def test_torch_errors_name_the_argument():
    torch = _torch()
    src, w, _ = problem(np.random.default_rng(15))
    op = oc.ConvTranspose(**ATTRS)
    with pytest.raises(TypeError, match="one array type, got src=torch, weights=numpy"):
        op(torch.from_numpy(src), w)
    with pytest.raises(TypeError, match="one array type, got src=numpy, weights=numpy, out=torch"):
        op(src, w, out=torch.zeros(2, 6, 10, 12))
    with pytest.raises(TypeError, match="argument 'weights' is a torch tensor that requires grad.*detach"):
        op(torch.from_numpy(src), torch.from_numpy(w).requires_grad_())
    with pytest.raises(TypeError, match="argument 'src' is a torch tensor on device meta"):
        op(torch.empty(2, 4, 5, 6, device="meta"), torch.from_numpy(w))
    with pytest.raises(TypeError, match="argument 'src' expected dtype .* got float64"):
        op(torch.from_numpy(src).double(), torch.from_numpy(w).double())
    with pytest.raises(TypeError, match="every float tensor of a call must have one dtype"):
        op(torch.from_numpy(src), torch.from_numpy(w).bfloat16())


def test_torch_result_outlives_the_call():
    torch = _torch()
    src, w, _ = problem(np.random.default_rng(16))
    results = [oc.conv_transpose(torch.from_numpy(src).bfloat16(), torch.from_numpy(w).bfloat16(), **ATTRS)
               for _ in range(3)]
    for r in results:
        np.testing.assert_array_equal(r.float().numpy(), reference(src, w))


# -- JAX ------------------------------------------------------------------------------------
@pytest.mark.parametrize("code", ["f32", "bf16"])
def test_jax_arrays_in_and_out(code):
    jnp = pytest.importorskip("jax.numpy")
    src, w, b = problem(np.random.default_rng(20), NUMPY_DTYPES[code])
    got = oc.conv_transpose(jnp.asarray(src), jnp.asarray(w), jnp.asarray(b), **ATTRS)
    assert type(got) is type(jnp.asarray(src)) and got.dtype == NUMPY_DTYPES[code]
    np.testing.assert_array_equal(np.asarray(got, np.float64), reference(src, w, b))


def test_jax_out_is_refused_as_immutable():
    jnp = pytest.importorskip("jax.numpy")
    src, w, _ = problem(np.random.default_rng(21))
    with pytest.raises(TypeError, match="argument 'out' .* cannot be written in place"):
        oc.conv_transpose(jnp.asarray(src), jnp.asarray(w), out=jnp.zeros((2, 6, 10, 12), jnp.float32), **ATTRS)

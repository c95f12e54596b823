"""Arrays of other libraries in and out of the ops, sharing memory (no copies).

The ops compute on NumPy arrays. An input that is not one, but a torch tensor or any
object with ``__dlpack__`` (JAX arrays, CuPy-style CPU arrays, ...), is viewed as a NumPy
array over the same memory, and the result is handed back as the inputs' array type:
torch in, torch out; with ``out=``, the caller's own ``out`` object, written in place.

* torch tensors go through ``Tensor.numpy()`` (bfloat16 as an int16 view): the same memory
  as DLPack gives, at a third of its cost per call. torch is never imported here: a
  tensor can only exist if the caller imported torch already.
* Other producers go through DLPack (versioned capsules where the producer has them, so a
  read-only buffer stays read-only), bfloat16 included, which NumPy's own
  ``from_dlpack`` refuses. Results go back through the producer's array namespace
  (``x.__array_namespace__().from_dlpack``), again without a copy.

One call takes one array type: a torch src with NumPy weights is a TypeError, as is memory
that is not the CPU's.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar

import numpy as np

from . import dtypes, native

#: DLPack device type codes, for messages (1, the CPU, is the one the ops run on).
_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
            10: "rocm", 13: "cuda_managed", 14: "oneapi"}
_CPU = 1

Wrap = Callable[[np.ndarray], Any]


class SupportsDLPack(Protocol):
    """An array the ops take as it is: NumPy, torch, JAX, any DLPack producer."""

    def __dlpack__(self, *, stream: Any = None) -> Any: ...


#: The array type of a call: its result has the type of its inputs.
Array = TypeVar("Array", bound=SupportsDLPack)


def foreign(inputs: Sequence[Any], out: Any) -> bool:
    """Whether a call holds anything but plain NumPy arrays, None and plain Python values:
    torch tensors, DLPack producers, and NumPy subclasses (``np.memmap``, a user's own),
    which :func:`adapt` views as plain arrays first."""
    for x in (*inputs, out):
        if x is not None and type(x) is not np.ndarray and (isinstance(x, np.ndarray) or hasattr(x, "__dlpack__")):
            return True
    return False


def plain(op_name: str, name: str, x: np.ndarray) -> np.ndarray:
    """An instance of an ndarray subclass as a plain ndarray over the same memory (flags
    kept: a read-only memmap stays read-only; ``out=`` is written through it). The ops
    compute on the memory, not through the subclass's methods.

    Raises:
        TypeError: ``x`` is a masked array: its mask cannot go to the library, and computing
            on the values under it would silently ignore it.
    """
    if type(x) is np.ndarray:
        return x
    ma = sys.modules.get("numpy.ma")  # only a program that imported numpy.ma has masked arrays
    if ma is not None and isinstance(x, ma.MaskedArray):
        how = (f"pass {name}.data to write the result into its values" if name == "out" else
               f"pass {name}.filled(value), or {name}.data to compute on every value")
        msg = f"{op_name}: argument '{name}' is a masked array (numpy.ma.MaskedArray): masks are not supported; {how}"
        raise TypeError(msg)
    return x.view(np.ndarray)


def _torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def family(x: Any) -> Optional[str]:
    """The array type a value belongs to: "numpy", "torch", another producer's top-level
    module name, or None for plain Python values (lists, numbers) that go through NumPy."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if _torch_tensor(x):
        return "torch"
    if hasattr(x, "__dlpack__"):
        return type(x).__module__.split(".")[0]
    return None


def _dtype_for(code: int, bits: int, lanes: int) -> np.dtype[Any]:
    dtype = dtypes.DLPACK_DTYPES.get((code, bits))
    if dtype is None or lanes != 1:
        msg = f"DLPack type code {code}, {bits} bits, {lanes} lanes has no NumPy dtype here"
        raise TypeError(msg)
    return dtype


def _from_torch(op_name: str, name: str, t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        msg = f"{op_name}: argument '{name}' is a torch tensor on device {t.device}; expected a CPU tensor"
        raise TypeError(msg)
    if t.requires_grad:
        msg = (
            f"{op_name}: argument '{name}' is a torch tensor that requires grad; the ops do not "
            "record autograd: use onednn_convt.torch (conv_transpose2d, ConvTranspose2d, ...) "
            f"for gradients, or pass {name}.detach()"
        )
        raise TypeError(msg)
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()  # a lazy view torch itself must materialize
    torch = sys.modules["torch"]
    if t.dtype == torch.bfloat16:
        a: np.ndarray = t.view(torch.int16).numpy().view(dtypes.FLOAT_DTYPES["bf16"])
        return a
    try:
        return t.numpy()  # type: ignore[no-any-return]
    except TypeError:  # a dtype NumPy lacks: say which in the ops' usual words
        msg = f"{op_name}: argument '{name}' expected dtype {dtypes.expected_names()}, got {t.dtype}"
        raise TypeError(msg) from None


def _device_type(op_name: str, name: str, x: Any) -> int:
    """The DLPack device type ``x.__dlpack_device__()`` reports (the CPU where it has none)."""
    if not hasattr(x, "__dlpack_device__"):
        return _CPU
    reported = x.__dlpack_device__()
    try:
        device = reported[0]
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)):
            raise TypeError
        return int(device)
    except (TypeError, IndexError, KeyError):
        msg = (f"{op_name}: argument '{name}' ({type(x).__name__}) reports its device as {reported!r}; "
               "expected a DLPack (device type, device id) pair of ints")
        raise TypeError(msg) from None


def _from_dlpack(op_name: str, name: str, x: Any, writable: bool) -> np.ndarray:
    device = _device_type(op_name, name, x)
    if device != _CPU:
        where = _DEVICES.get(device, f"DLPack device type {device}")
        msg = f"{op_name}: argument '{name}' is a {type(x).__name__} in {where} memory; expected CPU memory"
        raise TypeError(msg)
    try:
        try:
            capsule = x.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer older than DLPack 1.0
            capsule = x.__dlpack__()
    except BufferError as e:  # the producer cannot export this array (the DLPack protocol's error)
        msg = f"{op_name}: argument '{name}' ({type(x).__name__}) cannot be exported through DLPack: {e}"
        raise TypeError(msg) from None
    try:
        array, read_only, device, versioned = native.dlpack_import(capsule, _dtype_for)
    except TypeError as e:
        msg = f"{op_name}: argument '{name}' expected dtype {dtypes.expected_names()}, got {e}"
        raise TypeError(msg) from None
    if array is None:
        msg = f"{op_name}: argument '{name}' is not in CPU memory (DLPack device type {device})"
        raise TypeError(msg)
    if writable and not versioned:
        # a DLPack 0.x capsule cannot say read-only, and JAX's arrays, say, are immutable
        msg = (
            f"{op_name}: argument '{name}' ({type(x).__name__}) cannot be written in place: its "
            "DLPack export does not say its memory is writable (DLPack 1.0 flags); omit out="
        )
        raise TypeError(msg)
    if read_only:
        array.flags.writeable = False
    return array  # type: ignore[no-any-return]


def to_numpy(op_name: str, name: str, x: Any, writable: bool = False) -> np.ndarray:
    """A NumPy array over the memory of ``x`` (a torch tensor or a DLPack producer);
    ``writable``: for ``out=``, which a producer must say may be written (torch tensors may).

    Raises:
        TypeError: ``x`` is not in CPU memory, is a torch tensor that requires grad, has a
            dtype NumPy cannot hold, or (``writable``) may not be written.
    """
    if _torch_tensor(x):
        return _from_torch(op_name, name, x)
    return _from_dlpack(op_name, name, x, writable)


class _Exported:
    """A NumPy array offered to a DLPack consumer (``from_dlpack``), bfloat16 included."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __dlpack__(self, *, stream: Any = None, **_: Any) -> Any:
        key = dtypes.dlpack_type(self.array.dtype)
        assert key is not None  # results are f32, f16 or bf16
        return native.dlpack_export(self.array, *key)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_CPU, 0)


def to_torch(a: np.ndarray) -> Any:
    """A torch tensor over the memory of ``a`` (bf16 included); torch must be imported."""
    torch = sys.modules["torch"]
    if a.dtype == dtypes.FLOAT_DTYPES["bf16"]:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def adapt(
    op_name: str, names: Sequence[str], inputs: Sequence[Any], out: Any
) -> tuple[tuple[Any, ...], Optional[np.ndarray], Wrap]:
    """The call's inputs and ``out`` as NumPy arrays over the same memory, and the function
    that gives the result back as the inputs' array type.

    ``weights_shape`` (a shape, not a tensor) may be of any type.

    Raises:
        TypeError: the tensors (``out`` included) are of more than one array type, or one
            cannot be viewed (see :func:`to_numpy`).
    """
    kinds = {n: family(x) for n, x in zip(names, inputs) if x is not None and n != "weights_shape"}
    if out is not None:
        kinds["out"] = family(out) or type(out).__name__
    seen = {k for k in kinds.values() if k is not None}
    if len(seen) > 1:
        got = ", ".join(f"{n}={k or 'a Python value'}" for n, k in kinds.items())
        msg = f"{op_name}: every tensor of a call must be of one array type, got {got}"
        raise TypeError(msg)
    kind = next(iter(seen))
    arrays = tuple(
        plain(op_name, n, x) if isinstance(x, np.ndarray)
        else x if x is None or not hasattr(x, "__dlpack__") else to_numpy(op_name, n, x)
        for n, x in zip(names, inputs)
    )
    if out is not None:  # the caller's own object is the result, written in place
        out_array = plain(op_name, "out", out) if isinstance(out, np.ndarray) else to_numpy(
            op_name, "out", out, writable=True)
        return arrays, out_array, lambda _: out
    if kind == "numpy":  # a subclass such as np.memmap: a plain ndarray result
        return arrays, None, lambda a: a
    if kind == "torch":
        return arrays, None, to_torch
    first = next(x for n, x in zip(names, inputs) if kinds.get(n) == kind)
    if not hasattr(first, "__array_namespace__"):
        msg = (
            f"{op_name}: cannot give the result back as a {type(first).__name__}: it has no "
            "__array_namespace__ (pass NumPy arrays, or out= of your type)"
        )
        raise TypeError(msg)
    namespace = first.__array_namespace__()
    return arrays, None, lambda a: namespace.from_dlpack(_Exported(a))

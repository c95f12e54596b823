"""Safety limits checked before a call allocates or reaches the library, and a debug fill.

Memory: before a new input signature is compiled, the bytes the call will allocate are
estimated (the result, f32 copies when a dtype is emulated, copies of arrays oneDNN cannot
describe, and the working copies oneDNN makes when it reorders plain layouts to its blocked
ones) and compared with a limit. Over it, :class:`MemoryError` says how much and why,
instead of the process being killed by the OS halfway through. The limit is
:func:`set_memory_limit`, else the environment variable ``ONEDNN_CONVT_MEMORY_LIMIT`` (bytes,
or with a ``K``/``M``/``G``/``T`` suffix, powers of 1024), else the memory available now
(``MemAvailable`` in ``/proc/meminfo``, lowered by a cgroup limit if there is one; read
only for calls estimated at 1 MiB or more), and lowered again under an address-space or
data limit (``ulimit -v``, ``ulimit -d``) to what is left of it less
:func:`address_space_reserve`. The estimate follows oneDNN 3.2 as measured on this
package's ops; it is a guard against the impossible, not an exact budget.

Library range: oneDNN 3.2 computes the shape consistency of a (de)convolution in 32-bit
``int`` (``src/common/deconvolution.cpp``, ``convolution.cpp``): sizes, strides, dilated
kernels and pads of 2**31 and more overflow there (undefined behaviour; it usually ends in
``invalid_arguments``). They raise :class:`ValueError` here first.

Debug fill: with :func:`set_debug_fill` (or ``ONEDNN_CONVT_DEBUG_FILL=1``), every output
buffer is filled with NaN before the library writes it, so an element left unwritten shows
up as NaN. It turns off the per-call fast path while on; off, it costs one flag test.
"""

from __future__ import annotations

import math
import os
import re
import resource
import warnings
from decimal import Decimal, localcontext
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import environment, native, omp, shapes
from .strides import needs_copy

if TYPE_CHECKING:  # pragma: no cover
    from .lowering.base import Lowering
    from .problem import Problem

#: Largest value oneDNN's 32-bit shape arithmetic holds.
INT32_MAX = 2**31 - 1
_ENV_LIMIT = "ONEDNN_CONVT_MEMORY_LIMIT"
_ENV_FILL = "ONEDNN_CONVT_DEBUG_FILL"
_SUFFIXES = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
#: Files read for the default limit (tests point them elsewhere).
MEMINFO = "/proc/meminfo"
STATUS = "/proc/self/status"
#: Bytes of an address-space or data limit kept for oneDNN 3.2's compiles, which it does not
#: survive running out of: measured on an AMD Zen3 under ``ulimit -v``, a reorder primitive
#: whose creation failed (out_of_memory) failed again on every later call after the limit
#: was lifted, and clearing the library's caches then crashed the process (SIGSEGV). Small
#: problems compiled within 16 MiB. See :func:`address_space_reserve`.
COMPILE_RESERVE = 64 * 2**20
_ULIMIT_SOURCE = "what ulimit -v/-d leaves"
#: a thread's stack where RLIMIT_STACK is unlimited (glibc's default on x86-64)
_UNLIMITED_STACK = 32 * 2**20
CGROUP_V2 = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current")
CGROUP_V1 = (
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    "/sys/fs/cgroup/memory/memory.usage_in_bytes",
)


def parse_bytes(text: str) -> int:
    """A byte count from ``"123"``, ``"512M"``, ``"4G"``, ``"1.5T"`` (powers of 1024).

    Raises:
        ValueError: not a positive number with an optional K, M, G or T suffix.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    value = 0
    if m:  # exact at any length (float() made 400 digits inf, and int(inf) raised OverflowError)
        with localcontext() as exact:
            exact.prec = len(m.group(1)) + 16
            value = int(Decimal(m.group(1)) * _SUFFIXES[m.group(2).upper()])
    if value <= 0:
        msg = f"memory limit: expected a positive byte count such as 4096, 512M or 8G, got {text!r}"
        raise ValueError(msg)
    return value


def format_bytes(n: float) -> str:
    """``n`` bytes for people: ``"1.5 GiB"``, ``"512 B"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _limit_from_env() -> int | None:
    """``ONEDNN_CONVT_MEMORY_LIMIT`` in bytes; None (the default limit) when unset, and with a
    RuntimeWarning when it is no byte count (as the package's switches do with a value they
    do not know: the default limit, the memory available, still guards every call)."""
    text = os.environ.get(_ENV_LIMIT)
    if not text:
        return None
    try:
        return parse_bytes(text)
    except ValueError as e:
        msg = f"{_ENV_LIMIT}={text!r}: {e}; using the default (the memory available)"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return None


_limit: int | None = _limit_from_env()
#: whether debug fill is on (read it through debug_fill(); the call path reads it directly)
filling: bool = environment.switch(_ENV_FILL, False)


def set_memory_limit(limit: int | None) -> None:
    """Set the most bytes one call may allocate; over it, the call raises MemoryError.

    Args:
        limit: bytes (an int > 0), or None for the default: the memory available when a
            new input signature is planned (``MemAvailable``, or a lower cgroup limit).

    Raises:
        TypeError: ``limit`` is neither an int nor None.
        ValueError: ``limit`` is not positive.
    """
    global _limit
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)):
        msg = f"set_memory_limit: argument 'limit' expected an int (bytes) or None, got {limit!r}"
        raise TypeError(msg)
    if limit is not None and limit <= 0:
        msg = f"set_memory_limit: argument 'limit' expected a positive number of bytes, got {limit}"
        raise ValueError(msg)
    _limit = limit


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
        return int(text)
    except (OSError, ValueError):  # missing, or "max" (no cgroup limit)
        return None


def available_memory() -> int | None:
    """Bytes available to this process now, or None if the system does not say.

    ``MemAvailable`` from ``/proc/meminfo``, lowered to what is left under the cgroup's
    memory limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``) when there is one, and
    to :func:`address_space_left` less :func:`address_space_reserve` under a ``ulimit``.
    """
    avail, room = _system_available(), _ulimit_room()
    if room is not None:
        avail = room[0] if avail is None else min(avail, room[0])
    return avail


def _ulimit_room() -> tuple[int, int] | None:
    """(what ``ulimit -v``/``-d`` leaves less :func:`address_space_reserve`, that reserve),
    or None where neither limit is set."""
    left = address_space_left()
    if left is None:
        return None
    reserve = address_space_reserve()
    return max(0, left - reserve), reserve


def _system_available() -> int | None:
    """``MemAvailable``, lowered to what a cgroup's memory limit leaves; None if unknown."""
    avail = None
    try:
        with open(MEMINFO, "rb") as fh:
            for line in fh:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (CGROUP_V2, CGROUP_V1):
        cap, used = _read_int(limit_file), _read_int(usage_file)
        if cap is not None and used is not None and cap < 2**60:
            left = max(0, cap - used)
            avail = left if avail is None else min(avail, left)
            break
    return avail


def address_space_left() -> int | None:
    """Bytes this process may still map under its address-space limit (``ulimit -v``,
    RLIMIT_AS, against ``VmSize``) and its data limit (``ulimit -d``, RLIMIT_DATA, against
    ``VmData``), the smaller; None where neither is set or the system does not say."""
    left = None
    for which, field in ((resource.RLIMIT_AS, b"VmSize:"), (resource.RLIMIT_DATA, b"VmData:")):
        soft = resource.getrlimit(which)[0]
        if soft == resource.RLIM_INFINITY:
            continue
        used = _status_bytes(field)
        if used is not None:
            left = max(0, soft - used) if left is None else min(left, max(0, soft - used))
    return left


def address_space_reserve() -> int:
    """Bytes of what ``ulimit -v``/``-d`` leaves that no call may take: :data:`COMPILE_RESERVE`
    for the library's compiles, and a stack for each OpenMP thread (``OMP_STACKSIZE``, else
    the ``ulimit -s`` a new thread gets): libgomp ends the process ("Thread creation failed")
    when it cannot map one, measured with 2-8 MiB left before a process's first call."""
    return COMPILE_RESERVE + (omp.max_threads() or 1) * _thread_stack_bytes()


def _thread_stack_bytes() -> int:
    """The stack an OpenMP worker thread maps: ``OMP_STACKSIZE`` (``size[B|K|M|G]``, kilobytes
    without a unit), else RLIMIT_STACK (glibc's default for new threads)."""
    text = os.environ.get("OMP_STACKSIZE", "").strip()
    m = re.fullmatch(r"(\d{1,15})\s*([BKMG]?)", text, re.IGNORECASE)
    if m:
        return int(m.group(1)) * {"B": 1, "": 2**10, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return _UNLIMITED_STACK if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def _address_space_limited() -> bool:
    """Whether ``ulimit -v`` or ``ulimit -d`` bounds this process."""
    return any(resource.getrlimit(r)[0] != resource.RLIM_INFINITY for r in (resource.RLIMIT_AS, resource.RLIMIT_DATA))


def _status_bytes(field: bytes) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None."""
    try:
        with open(STATUS, "rb") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_limit() -> int | None:
    """The limit in force, in bytes: the one set, else :func:`available_memory` (may be
    None); under ``ulimit -v``/``-d``, at most what that leaves less
    :func:`address_space_reserve`."""
    return limit_in_force()[0]


def set_debug_fill(enabled: bool) -> None:
    """Fill every output with NaN before the library writes it (a check for unwritten outputs).

    Args:
        enabled: True to fill (slower: each call allocates and fills), False for normal runs.

    Raises:
        TypeError: ``enabled`` is not a bool (``"False"`` would read as True).
    """
    global filling
    if not isinstance(enabled, (bool, np.bool_)):
        msg = f"set_debug_fill: argument 'enabled' expected a bool (True or False), got {enabled!r}"
        raise TypeError(msg)
    filling = bool(enabled)


def debug_fill() -> bool:
    """Whether outputs are filled with NaN before each call (:func:`set_debug_fill`)."""
    return filling


def nan_filled(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """A new array of ``shape`` and ``dtype`` full of NaN (the debug fill)."""
    return np.full(tuple(shape), np.nan, dtype)


# -- checks made when a call is planned ---------------------------------------------------------
def check_library_range(op: str, low: Lowering, arrays: Sequence[Any]) -> None:
    """Raise ValueError where oneDNN's 32-bit shape arithmetic would overflow.

    Every tensor dim, every dilation, and per spatial dim the sum of the larger activation
    size, the dilated kernel extent, both pads, the stride and the output_padding, must stay
    below 2**31.
    """
    tensors = [tuple(arrays[i].shape) for i in low.inputs] + [tuple(low.out_shape)]
    for shape in tensors:
        if shape and max(shape) > INT32_MAX:
            msg = (
                f"{op}: a tensor of shape {shape} has a dimension of 2**31 or more; oneDNN "
                "computes shapes in 32-bit integers"
            )
            raise ValueError(msg)
    a = low.attrs
    if "strides" not in a:  # MatMul: no geometry
        return
    data_format, weights_format = a["data_format"], a["weights_format"]
    bwd_w = "weights_shape" in a  # a BackwardWeights op: its output is the weights
    weights = tuple(a["weights_shape"]) if bwd_w else tuple(arrays[low.inputs[1]].shape)
    src = tuple(arrays[low.inputs[0]].shape)
    dst = tuple(arrays[low.inputs[1]].shape) if bwd_w else tuple(low.out_shape)
    xs = shapes.split_activation(src, data_format)[2]
    ys = shapes.split_activation(dst, data_format)[2]
    kernel = weights[2:] if weights_format in ("IOX", "OIX") else weights[:-2]
    # a lifted 1-D call (lowering.lifted) has one more spatial dim than its arrays, first, of size 1
    xs, ys, kernel = (_lifted(v, len(a["strides"])) for v in (xs, ys, kernel))
    op_pad = a.get("output_padding") or [0] * len(kernel)
    for i, k in enumerate(kernel):
        _check_dim(op, i, max(xs[i], ys[i]), k, a["strides"][i], a["dilations"][i], a["pads_begin"][i],
                   a["pads_end"][i], op_pad[i])


def _lifted(sizes: Sequence[int], rank: int) -> tuple[int, ...]:
    """``sizes`` of a spatial dim each, with leading 1s up to ``rank`` dims."""
    return (1,) * (rank - len(sizes)) + tuple(sizes)


def check_problem_range(op: str, output_name: str, p: Problem) -> None:
    """Raise ValueError where a call's own result (``output_name``) is too large to address
    (:func:`check_addressable`), or its geometry (as given, before any lowering) is past
    oneDNN's 32-bit range: the sums :func:`check_library_range` checks, per spatial dim. A
    lowering may take the call out of that range (a strided 1x1 BackwardWeights runs at
    stride 1 under a guard of some CPUs, a polyphase one as stride-1 phases), so without
    this check the same call would run on one CPU or table and be refused on another."""
    check_addressable(op, output_name, p.out_shape)
    g = p.geometry
    for i, k in enumerate(p.kernel):
        _check_dim(op, i, max(p.src[i], p.dst[i]), k, g.strides[i], g.dilations[i], g.pads_begin[i],
                   g.pads_end[i], p.output_padding[i])


def check_addressable(op: str, output_name: str, shape: Sequence[int], library_shape: Sequence[int] = ()) -> None:
    """Raise ValueError where a result of ``shape``, or the library's view of it
    (``library_shape``), is too large to address in f32 (the widest computed dtype)."""
    for s in (shape, library_shape):
        if math.prod(s) * 4 > np.iinfo(np.intp).max:
            msg = f"{op}: {output_name} would have shape {tuple(shape)}, too large to address"
            raise ValueError(msg)


def _check_dim(op: str, i: int, size: int, k: int, s: int, d: int, pb: int, pe: int, op_pad: int) -> None:
    """Raise the ValueError of spatial dim ``i`` whose sizes and attributes overflow 32 bits."""
    ek = d * (k - 1) + 1
    need = size + ek + pb + pe + s + op_pad
    if max(d, need) > INT32_MAX:  # (a dilation past it is refused with the attributes, op_base._geometry)
        msg = (
            f"{op}: spatial dim {i} combines size {size}, kernel extent {ek} "
            f"(kernel {k}, dilation {d}), pads {pb}/{pe} and stride {s} into {need}; oneDNN "
            "computes these in 32-bit integers, so the dilation and the sum must stay below 2**31"
        )
        raise ValueError(msg)


def estimate(
    low: Lowering, arrays: Sequence[Any], out: np.ndarray | None, dtype: Any, emulated: bool
) -> dict[str, int]:
    """Bytes a call allocates, by purpose (see the module docstring). Only non-zero entries."""
    itemsize = np.dtype(dtype).itemsize
    compute = 4 if emulated else itemsize
    inputs = [arrays[i] for i in low.inputs]
    in_elems = sum(math.prod(a.shape) for a in inputs)
    out_elems = math.prod(low.out_shape)
    lib_elems = math.prod(low.library_out_shape)
    parts = {
        "result": 0 if out is not None else out_elems * itemsize,
        "copies of inputs oneDNN cannot describe": sum(
            a.nbytes if a.size else 0 for a in inputs if needs_copy(a)
        ),
        "f32 copies (emulated dtype)": (in_elems + lib_elems) * 4 if emulated else 0,
        "inputs prepared for the library": low.prepared_elems * compute,
        # (emulated: already among the f32 copies)
        "library output before finishing": lib_elems * compute if low.finish is not None and not emulated else 0,
        "finishing step": _finish_elems(low, out_elems, lib_elems, compute) * 4 if low.finish is not None else 0,
    }
    if low.finish_elems == 0 and out is None and not emulated:  # the result is a view of the library's output
        parts["library output before finishing"] = 0
    # oneDNN 3.2 reorders plain NCX activations (and any ConvTransposeBackwardWeights
    # problem) to its blocked layouts: one working copy of each tensor (measured: NXC
    # forward, BackwardData and ConvolutionBackwardWeights make none). Weights are small
    # and always counted.
    if "strides" in low.attrs:
        weights_elems = math.prod(low.attrs.get("weights_shape", inputs[1].shape))
        if low.attrs["data_format"] == "NCX" or low.kind == "ConvTransposeBackwardWeights":
            parts["library working copies"] = (in_elems + out_elems) * compute
        else:
            parts["library working copies"] = weights_elems * compute
    return {k: v for k, v in parts.items() if v}


def _finish_elems(low: Lowering, out_elems: int, lib_elems: int, compute: int) -> int:
    """f32 elements the lowering's finishing step allocates (:attr:`Lowering.finish_elems`);
    by default the 1-D MatMul forward's: the library output widened to f32 (native 16-bit
    dtypes), a padded f32 sum, the crop and the transpose."""
    if low.finish_elems is not None:
        return low.finish_elems
    return 3 * out_elems + (lib_elems if compute != 4 else 0)


def check_memory(
    op: str,
    low: Lowering,
    arrays: Sequence[Any],
    out: np.ndarray | None,
    dtype: Any,
    emulated: bool,
) -> None:
    """Raise MemoryError if the call's estimated allocation is over :func:`memory_limit`, or
    over what ``ulimit -v``/``-d`` leaves less :func:`address_space_reserve` (a limit set
    by the user included)."""
    parts = estimate(low, arrays, out, dtype, emulated)
    total = sum(parts.values())
    bounded = _address_space_limited()
    if _limit is None and total < 2**20 and not bounded:  # a small call: skip reading /proc
        return
    limit, source = limit_in_force()
    if limit is not None and total > limit and (_limit is None or bounded) and native.host_memory_info()["kept_bytes"]:
        # blocks kept for reuse (onednn_convt.host_memory_info) go back to the system first
        native.release_host_memory()
        limit, source = limit_in_force()
    if limit is None:
        return
    if total > limit:
        remedy = ("raise the process's ulimit" if source.startswith(_ULIMIT_SOURCE) else
                  f"raise it with onednn_convt.set_memory_limit(bytes) or {_ENV_LIMIT}")
        detail = ", ".join(f"{k} {format_bytes(v)}" for k, v in parts.items())
        msg = (
            f"{op}: this call would allocate about {format_bytes(total)} ({total} bytes: {detail}) "
            f"for an output of shape {tuple(low.out_shape)}, over the limit of {format_bytes(limit)} "
            f"({source}); {remedy}, or make the problem smaller"
        )
        raise MemoryError(msg)


def limit_in_force() -> tuple[int | None, str]:
    """(the bytes a call may allocate, where that limit comes from): the limit set, else the
    memory available (``MemAvailable``, or what a cgroup leaves), and under ``ulimit -v``/``-d``
    at most what that leaves less :func:`address_space_reserve`. (None, "nothing says") when
    nothing says."""
    candidates: list[tuple[int, str]] = []
    if _limit is not None:
        candidates.append((_limit, "set by set_memory_limit() or ONEDNN_CONVT_MEMORY_LIMIT"))
    else:
        avail = _system_available()
        if avail is not None:
            candidates.append((avail, "the memory available now: MemAvailable, or what a cgroup's limit leaves"))
    room = _ulimit_room()
    if room is not None:
        candidates.append((room[0], f"{_ULIMIT_SOURCE}, less {format_bytes(room[1])} kept for the library and its threads"))
    if not candidates:
        return None, "nothing says"
    return min(candidates, key=lambda c: (c[0], not c[1].startswith(_ULIMIT_SOURCE)))


def check_plan(
    op: str,
    low: Lowering,
    arrays: Sequence[Any],
    out: np.ndarray | None,
    dtype: Any,
    emulated: bool,
) -> None:
    """Both checks, in order: the library's 32-bit range (ValueError), then memory (MemoryError)."""
    check_library_range(op, low, arrays)
    check_memory(op, low, arrays, out, dtype, emulated)

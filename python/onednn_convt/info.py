"""What runs underneath: oneDNN version, CPU, threads, dtype support, compile cache."""

from __future__ import annotations

import functools
import numbers
import os
from typing import Any, Callable

import numpy as np

from . import arguments, dtypes, guards, limits, lowering, native, omp
from .lowering import autotune, rules, tuning_cache
from .errors import UnsupportedError

_RUNTIMES = {1: "sequential", 2: "OpenMP", 4: "TBB", 8: "threadpool"}


def omp_max_threads() -> int | None:
    """OpenMP's thread count for oneDNN (libgomp), or None if it cannot be read."""
    return omp.max_threads()


#: the ops :func:`dtype_support` reports on
_OPS = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")


def dtype_support() -> dict[str, dict[str, str]]:
    """For each op and dtype: ``"native"`` (oneDNN has a kernel on this CPU) or ``"emulated"``.

    Emulated means the op runs in f32 on values converted from the dtype, and the result is
    rounded to the dtype (spec D10). Found by compiling a tiny problem with ``strict=True``
    (once per process); ``"unknown"`` for each while a memory limit under the few hundred
    bytes of that problem refuses it.
    """
    try:
        return _probe_dtypes()
    except MemoryError:
        return {op: dict.fromkeys(dtypes.FLOAT_DTYPES, "unknown") for op in _OPS}


@functools.lru_cache(maxsize=None)
def _probe_dtypes() -> dict[str, dict[str, str]]:
    from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 3))  # NCX, 1-D
    w = rng.standard_normal((2, 2, 2))  # IOX
    y = rng.standard_normal((1, 2, 4))
    attrs: dict[str, Any] = dict(data_format="NCX", weights_format="IOX")
    Convert = Callable[[np.ndarray, Any], np.ndarray]
    calls: dict[str, Callable[[Convert, Any], np.ndarray]] = {
        "ConvTranspose": lambda c, t: ConvTranspose(strict=True, **attrs)(c(x, t), c(w, t)),
        "ConvTransposeBackwardData": lambda c, t: ConvTransposeBackwardData(strict=True, **attrs)(
            c(y, t), c(w, t)
        ),
        "ConvTransposeBackwardWeights": lambda c, t: ConvTransposeBackwardWeights(
            strict=True, weights_shape=(2, 2, 2), **attrs
        )(c(x, t), c(y, t)),
    }
    result: dict[str, dict[str, str]] = {}
    for op, call in calls.items():
        result[op] = {}
        for code, dtype in dtypes.FLOAT_DTYPES.items():
            try:
                call(lambda a, t: a.astype(t), dtype)
                result[op][code] = "native"
            except UnsupportedError:
                result[op][code] = "emulated"
    return result


def info() -> dict[str, Any]:
    """This package's version (``onednn_convt_version``), oneDNN version and commit, library path, CPU runtime, the ISA oneDNN dispatches to
    (``ONEDNN_MAX_CPU_ISA`` honoured), threads, dtype support, the guards active on that ISA
    (:mod:`onednn_convt.guards`), which measured rules pick the lowerings
    (:func:`onednn_convt.lowering.rules.report`, and ``measured_apart``:
    :func:`onednn_convt.lowering.measured_apart`), whether autotuning is on and where its choices are
    kept (:mod:`onednn_convt.lowering.autotune`), the compile cache counters, the
    library's kept temporary memory (:func:`host_memory_info`) and the memory limit a new
    call is checked against now (``memory_limit``: ``bytes``, None where nothing says, and
    where it comes from; :mod:`onednn_convt.limits`), and NumPy's BLAS beside it
    (:func:`numpy_blas_info`)."""
    from ._version import __version__

    v = native.version()
    path = native.LIBDNNL_PATH
    return {
        "onednn_convt_version": __version__,
        "onednn_version": native.onednn_version(),
        "onednn_commit": v["hash"],
        "libdnnl": os.path.realpath(path) if os.path.sep in path else path,
        "cpu_runtime": _RUNTIMES.get(v["cpu_runtime"], str(v["cpu_runtime"])),
        "cpu_isa": guards.dispatch_isa(),
        "threads": omp_max_threads(),
        "dtypes": dtype_support(),
        "guards": guards.report(),
        "rules": {**rules.report(), "measured_apart": lowering.measured_apart()},
        "autotune": {"enabled": autotune.enabled(), "cache_file": str(tuning_cache.path())},
        "cache": cache_info(),
        "host_memory": host_memory_info(),
        "memory_limit": dict(zip(("bytes", "from"), limits.limit_in_force())),
        "numpy_blas": numpy_blas_info(),
    }


#: the environment variables OpenBLAS reads for its thread pool, when it loads
OPENBLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OPENBLAS_THREAD_TIMEOUT")


def numpy_blas_info() -> dict[str, Any]:
    """NumPy's BLAS library (``library`` and ``version``, from ``numpy.show_config``; None
    where this NumPy does not say), the variables of :data:`OPENBLAS_VARIABLES` as set (None:
    unset), and ``spins``: whether its threads spin on the CPUs after each product (an
    OpenBLAS of more than one thread whose threads do not sleep at once: neither
    ``OPENBLAS_NUM_THREADS=1`` nor ``OPENBLAS_THREAD_TIMEOUT`` set). A program that
    alternates NumPy's products (``@``, ``np.matmul``, ``np.dot``) with this package's
    calls then has each thread pool spinning on the CPUs the other one needs: on a 2-CPU
    AMD Zen4, our calls ran 2.0-6.4x slower and the products 1.1-3.1x
    (``benchmarks/blas_neighbour.py``; docs: "Beside NumPy's matrix products")."""
    blas: dict[str, Any] = {}
    try:
        blas = dict(np.show_config(mode="dicts")["Build Dependencies"]["blas"])
    except Exception:  # noqa: BLE001 - a NumPy before 1.26, or one built otherwise: nothing said
        pass
    name = blas.get("name")
    found = {v: os.environ.get(v) for v in OPENBLAS_VARIABLES}
    one_thread = (found["OPENBLAS_NUM_THREADS"] or "").strip() == "1"
    spins = bool(name and "openblas" in str(name).lower() and not one_thread
                 and not found["OPENBLAS_THREAD_TIMEOUT"] and arguments.usable_cpus() > 1)
    return {"library": name, "version": blas.get("version"), **found, "spins": spins}


def cache_info() -> dict[str, int]:
    """Compiled-partition cache counters: hits, misses, size, capacity."""
    return dict(native.cache_info())


def host_memory_info() -> dict[str, int]:
    """The large blocks (1 MiB and more) of the temporary memory oneDNN takes at each
    execution (a partition's internal reorders and scratchpad) and of the arrays this
    package allocates (results, intermediates): ``kept_bytes`` and ``kept_blocks`` freed and
    kept for the next request (at most 256 MiB), ``reused`` and ``allocated`` (requests
    served from kept blocks, and from new memory). Kept blocks spare each call the page
    faults of fresh memory; :func:`clear_cache` frees them."""
    return dict(native.host_memory_info())


def set_cache_capacity(capacity: int) -> None:
    """Bound the compiled-partition cache (LRU) to ``capacity`` entries; 0 disables it.

    Raises:
        TypeError: ``capacity`` is not an int.
        ValueError: ``capacity`` is negative.
    """
    if not isinstance(capacity, numbers.Integral) or isinstance(capacity, (bool, np.bool_)):
        msg = f"set_cache_capacity: argument 'capacity' expected an int in [0, 2**63 - 1], got {capacity!r}"
        raise TypeError(msg)
    capacity = int(capacity)
    if not 0 <= capacity <= 2**63 - 1:
        msg = f"set_cache_capacity: argument 'capacity' expected an int in [0, 2**63 - 1], got {capacity!r}"
        raise ValueError(msg)
    native.set_cache_capacity(capacity)
    native.library_caches([capacity])


def clear_cache() -> None:
    """Drop every cached compiled partition (ours and oneDNN's own) and reset the counters,
    and free the f32 staging memory the calling thread keeps for emulated bf16/f16 calls
    (other threads free theirs when they end) and the library's kept temporary blocks
    (:func:`host_memory_info`)."""
    native.clear_cache()
    native.clear_staging()  # first: a large staging block goes back to the kept ones, freed next
    native.release_host_memory()
    native.clear_library_caches()


def add_arguments(parser: Any) -> None:
    """``onednn-convt info``: no options."""


def run(args: Any) -> int:
    """Print :func:`info` as JSON."""
    import json

    print(json.dumps(info(), indent=2))
    return 0

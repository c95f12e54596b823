"""oneDNN's OpenMP runtime (GNU OpenMP, ``libgomp.so.1``, loaded with the library): its
thread count, and compiling a partition for one thread.

oneDNN 3.2's kernels divide their work among ``omp_get_max_threads()`` threads when they are
compiled, and keep that split for every run. A partition compiled while the calling
thread's OpenMP thread count is 1 runs on that thread alone, with no fork and join of the
thread pool: :func:`one_thread` (the small problems of
:func:`onednn_convt.lowering.rules.single_threaded`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Iterator, Optional


@functools.lru_cache(maxsize=None)
def _gomp() -> Optional[ctypes.CDLL]:
    try:
        return ctypes.CDLL("libgomp.so.1")
    except OSError:
        return None


def max_threads() -> int | None:
    """OpenMP's thread count for oneDNN in the calling thread, or None if unknown."""
    lib = _gomp()
    return None if lib is None else int(lib.omp_get_max_threads())


def set_threads(n: int) -> None:
    """Set the calling thread's OpenMP thread count (no-op without libgomp)."""
    lib = _gomp()
    if lib is not None:
        lib.omp_set_num_threads(n)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Within the block, what this thread compiles runs on one thread (OpenMP's per-thread
    thread count set to 1, then restored)."""
    before = max_threads()
    if before is None or before <= 1:
        yield
        return
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)

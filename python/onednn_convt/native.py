"""The native core: the one module that imports ``_core`` (the C++ extension).

Loading it preloads oneDNN (:mod:`onednn_convt._loader`; :data:`LIBDNNL_PATH` says which
library file), then imports the extension and names its entry points here; every other
module reaches the core through this one. Also here: the oneDNN version text, oneDNN's own
cache capacities, and what a forked child must redo (:data:`fork_generation`).

Fork: oneDNN's wheel uses GNU OpenMP (libgomp), which keeps a pool of worker threads after
the first parallel region. A forked child inherits the pool's bookkeeping but not its
threads, so its first parallel region of more than one thread would wait for them forever.
A region of one thread never uses the pool, so in a child forked after the parent ran
oneDNN on more than one thread, the fork hook below sets the child's OpenMP thread count to
1, empties the compile caches (the package's and oneDNN's primitive cache: their partitions
were built for the parent's thread count) and advances :data:`fork_generation`; each op
object, and each cache of compiled plans, drops what it made in an earlier generation on
its next call. The child computes the same results on one thread (``spawn`` and
``forkserver`` start a fresh interpreter and keep every thread). The process has one
libgomp, shared with torch's CPU ops where torch is imported (:data:`OPENMP_PEERS`): a
parent that ran only torch's parallel ops has the pool too, and the child is treated the same
(its own torch ops then run on one thread as well, where they would hang otherwise). A parent
that had not run an op yet and imported no such module, or ran with ``OMP_NUM_THREADS=1``, has
no pool: its children are left alone. A fork
waits until no other thread is inside the library (the binding's fork gate), so the child
never inherits a lock the library or the binding held.
"""

from __future__ import annotations

import ctypes
import os
import sys

from . import omp
from ._loader import preload
from .errors import OneDNNError, UnsupportedError

#: the oneDNN library file loaded (a path, or the bare name found on the loader's path)
LIBDNNL_PATH = preload()

try:
    from . import _core
except ImportError as e:  # pragma: no cover - depends on the install
    e.add_note(
        "onednn_convt's native module failed to load. Reinstall with 'pip install .' (it needs "
        "onednn-cpu-gomp==2023.2.0 installed in the same environment) or set "
        "ONEDNN_CONVT_LIBDNNL to your libdnnl.so.3."
    )
    raise

# oneDNN's failures are raised as the package's exceptions, carrying its status
_core.set_error_types(OneDNNError, UnsupportedError)

# the core's entry points (documented in _core.pyi)
Executor = _core.Executor
PhasedExecutor = _core.PhasedExecutor
SignatureMismatch = _core.SignatureMismatch
compile = _core.compile  # noqa: A001 - the core's name
convert = _core.convert
fast_conversion: bool = _core.fast_conversion
all_finite = _core.all_finite
clear_staging = _core.clear_staging
cache_info = _core.cache_info
set_cache_capacity = _core.set_cache_capacity
clear_cache = _core.clear_cache
host_memory_info = _core.host_memory_info
release_host_memory = _core.release_host_memory
host_empty = _core.host_empty
host_kept_from: int = _core.host_kept_from
host_kept_bytes: int = _core.host_kept_bytes
cpu_isa = _core.cpu_isa
dlpack_import = _core.dlpack_import
dlpack_export = _core.dlpack_export
version = _core.version


def onednn_version() -> str:
    """oneDNN's version as "major.minor.patch" (the library loaded, not the one built against)."""
    v = _core.version()
    return f"{v['major']}.{v['minor']}.{v['patch']}"


# oneDNN keeps its own caches behind ours. Its compiled-partition cache (Graph API) never
# hits for us and would keep up to 1024 partitions we dropped alive, so the native module
# turns it off when it loads (module.cpp). Its primitive cache (1024 entries by default)
# follows our capacity, so it does not keep the JIT code of partitions our cache evicts
# either (with both of oneDNN's caches at their defaults, 400 evicted partitions kept
# ~70 MB).
_LIBRARY_CACHES = ("dnnl_{}_primitive_cache_capacity",)


def library_caches(capacities: list[int] | None = None) -> list[int]:
    """oneDNN's own cache capacities (its primitive cache), set to ``capacities``
    if given; returns the values before. Empty if this libdnnl lacks the entry points."""
    old: list[int] = []
    try:
        lib = ctypes.CDLL(LIBDNNL_PATH)
        for i, name in enumerate(_LIBRARY_CACHES):
            value = ctypes.c_int()
            getattr(lib, name.format("get"))(ctypes.byref(value))
            old.append(value.value)
            if capacities is not None:
                getattr(lib, name.format("set"))(ctypes.c_int(min(capacities[i], 2**31 - 1)))
    except (OSError, AttributeError):
        return []
    return old


def clear_library_caches() -> None:
    """Empty oneDNN's primitive cache, keeping its capacity."""
    old = library_caches([0])  # a capacity of 0 empties it; then the old capacity back
    if old:
        library_caches(old)


#: advanced in a forked child whose parent may have OpenMP threads (see the module
#: docstring): compiled plans made in an earlier generation must not run
fork_generation = 0


#: modules whose CPU ops run parallel regions on the process's one GNU OpenMP runtime (the
#: libgomp.so.1 oneDNN's wheel loads, shared by soname): imported, they may have made the
#: pool a forked child cannot use (a child of a parent that ran torch's own parallel ops
#: hung in its first op of ours, fuzz/fork.py)
OPENMP_PEERS = ("torch",)


def _after_fork_in_child() -> None:
    global fork_generation
    # no thread compiled or ran an op (as of the fork: the binding makes a fork wait for
    # every call in flight), and no module that shares the OpenMP runtime is imported: no
    # OpenMP pool to inherit
    if not _core.library_entered() and not any(m in sys.modules for m in OPENMP_PEERS):
        return
    threads = omp.max_threads()
    if threads is None or threads <= 1:
        return
    omp.set_threads(1)
    _core.clear_cache()
    clear_library_caches()
    fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)

"""Keep the package usable in a process forked after oneDNN has run (``multiprocessing``'s
``fork`` start method, ``os.fork``).

oneDNN's wheel uses GNU OpenMP (libgomp), which keeps a pool of worker threads after the
first parallel region. A forked child inherits the pool's bookkeeping but not its threads, so
its first parallel region of more than one thread waits for them forever: before this
module, an op called in such a child hung. A parallel region of one thread never uses the
pool, so in a child forked after the parent ran oneDNN on more than one thread, this module
(from an ``os.register_at_fork`` hook):

1. sets the child's OpenMP thread count to 1;
2. empties the compile caches (the package's and oneDNN's primitive cache), whose partitions were built
   for the parent's thread count;
3. makes each op object drop its compiled plans on its first call in the child.

The child then computes the same results on one thread (the ``spawn`` and ``forkserver``
start methods, which start a fresh interpreter, keep every thread). A parent that had not run
an op yet, or ran with ``OMP_NUM_THREADS=1``, has no pool: its children are left alone.

A fork waits until no other thread is inside the library (the binding's fork gate), so the
child never inherits a lock the library or the binding held; a parent with ops running on
other threads forks a little later than asked, by at most the calls in flight.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from . import _core, omp, ops
from .info import _library_caches, omp_max_threads

_original_call: Callable[..., Any] | None = None


def _call_in_forked_child(self: Any, inputs: tuple[Any, ...], out: Any) -> Any:
    """``_Op._call`` in a forked child: plans made before the fork are dropped first."""
    pid = os.getpid()
    if self.__dict__.get("_pid") != pid:
        self._plans = {}
        self._fast = None
        self._pid = pid
    assert _original_call is not None
    return _original_call(self, inputs, out)


def _after_fork_in_child() -> None:
    global _original_call
    # no thread compiled or ran an op (as of the fork: the binding makes a fork wait for
    # every call in flight): no OpenMP pool to inherit
    if not _core.library_entered():
        return
    threads = omp_max_threads()
    if threads is None or threads <= 1:
        return
    omp.set_threads(1)
    _core.clear_cache()
    old = _library_caches([0])
    if old:
        _library_caches(old)
    if _original_call is None:
        _original_call = ops._Op._call
    ops._Op._call = _call_in_forked_child  # type: ignore[method-assign]


os.register_at_fork(after_in_child=_after_fork_in_child)

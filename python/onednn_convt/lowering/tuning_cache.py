"""The autotuner's choices on disk, so that a second process pays nothing.

One JSON file, ``autotune.json`` in the user's cache directory (platformdirs; the directory
``ONEDNN_CONVT_CACHE_DIR`` names instead, if set)::

    {"format": 1,
     "contexts": {"<context>": {"<problem key>": {"name": ..., "candidates": [...],
                                                   "times_us": {name: us}, "rejected": {name: why},
                                                   "batch": n, "confirm_us": {name: us},
                                                   "checks": n, "recheck_us": {name: us}}}}}

The context names what a choice depends on besides the problem: oneDNN's version and
commit, the ISA it dispatches to (``ONEDNN_MAX_CPU_ISA`` honoured), the thread count and
this package's version. A file that is not valid JSON of this shape is ignored with a
:class:`TuningCacheWarning` (and replaced on the next write); an entry is used only when the
candidates it was measured among are today's for its problem, and its choice one of them.
Writes go to a temporary file renamed over the old one, merged with what another process
wrote meanwhile: a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Optional

FORMAT = 1
FILE_NAME = "autotune.json"


class TuningCacheWarning(UserWarning):
    """The autotuning cache file could not be used (it is then ignored)."""


def directory() -> Path:
    """Where the cache file lives: ``$ONEDNN_CONVT_CACHE_DIR``, else platformdirs' user cache
    directory for onednn-convt."""
    given = os.environ.get("ONEDNN_CONVT_CACHE_DIR")
    if given:
        return Path(given)
    import platformdirs

    return Path(platformdirs.user_cache_dir("onednn-convt", appauthor=False))


def path() -> Path:
    """The cache file."""
    return directory() / FILE_NAME


def context() -> str:
    """What the cached choices depend on besides the problem (see the module docstring)."""
    from .. import guards, native, omp
    from .._version import __version__

    return (
        f"oneDNN {native.onednn_version()} {native.version()['hash']}; isa {guards.dispatch_isa()}; "
        f"threads {omp.max_threads()}; onednn-convt {__version__}"
    )


_lock = threading.Lock()
#: path -> the contexts read from it (None: not read yet in this process)
_loaded: dict[Path, dict[str, dict[str, Any]]] = {}
#: (path, context, key) of each entry this process stored (until :func:`forget`)
_stored: set[tuple[Path, str, str]] = set()


def _read(file: Path, warn: bool = True) -> dict[str, dict[str, Any]]:
    """The file's contexts; {} (with a warning, unless ``warn`` is false: already given on
    the first read) when it cannot be trusted."""
    try:
        if file.exists() and not file.is_file():  # a FIFO would block the read, a device never end
            raise OSError(f"{file} is not a regular file")
        raw = file.read_bytes()
    except (FileNotFoundError, NotADirectoryError):  # nothing cached yet
        return {}
    except OSError as e:
        if warn:
            msg = f"onednn-convt: cannot read the autotuning cache {file} ({e}); tuning again"
            warnings.warn(msg, TuningCacheWarning, 3)
        return {}
    why = None
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # UnicodeDecodeError too
        why = f"not JSON ({e})"
    except RecursionError:
        why = "not JSON this reader can follow (arrays or objects nested too deep)"
    else:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            why = f"expected format {FORMAT}, found {found!r}"
        elif not isinstance(data.get("contexts"), dict) or not all(
            isinstance(entries, dict) and all(_valid(e) for e in entries.values())
            for entries in data["contexts"].values()
        ):
            why = "its entries are not those this version writes"
    if why is not None and not warn:
        return {}
    if why is not None:
        msg = f"onednn-convt: ignoring the autotuning cache {file}: {why}; it is rewritten on the next tuning"
        warnings.warn(msg, TuningCacheWarning, 3)
        return {}
    return dict(data["contexts"])


def _valid(entry: Any) -> bool:
    """Whether ``entry`` has the fields a lookup reads, each of its type (the optional ones,
    ``rejected``, ``batch``, ``confirm_us``, ``checks`` and ``recheck_us``, where present)."""
    def mapping(value: Any, kinds: tuple[type, ...]) -> bool:
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, kinds) and not isinstance(v, bool)
                                               for k, v in value.items())

    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("candidates"), list)
        and all(isinstance(c, str) for c in entry["candidates"])
        and mapping(entry.get("times_us"), (int, float))
        and mapping(entry.get("rejected", {}), (str,))
        and mapping(entry.get("confirm_us", {}), (int, float))
        and mapping(entry.get("recheck_us", {}), (int, float))
        and all(isinstance(entry.get(k, 1), int) and not isinstance(entry.get(k, 1), bool) for k in ("batch", "checks"))
    )


def _contexts(file: Path) -> dict[str, dict[str, Any]]:
    """What ``file`` holds, read once per process (until :func:`forget`)."""
    with _lock:
        if file not in _loaded:
            _loaded[file] = _read(file)
        return _loaded[file]


def preload() -> None:
    """Read the cache file now (locating the user's cache directory, parsing and checking
    the file: about 3 ms with platformdirs imported for it) and work out this process's
    context once (which loads the OpenMP runtime's query: 0.2 ms in a new process), so
    that the first call of a tuned signature pays for neither; autotuning calls this when
    it is turned on."""
    _contexts(path())
    context()


def lookup(key: str, candidates: list[str]) -> Optional[dict[str, Any]]:
    """The cached entry for problem ``key`` in this context, if it was measured among
    exactly ``candidates`` (in any order: another rules table may put another first) and
    chose one of them; else None."""
    entry = _contexts(path()).get(context(), {}).get(key)
    if entry is None or sorted(entry["candidates"]) != sorted(candidates) or entry["name"] not in candidates:
        return None
    return dict(entry)


def stored_here(key: str) -> bool:
    """Whether this process stored the entry for problem ``key`` in this context (since the
    last :func:`forget`): its own timing, which the autotuner does not check again."""
    with _lock:
        return (path(), context(), key) in _stored


def store(key: str, entry: dict[str, Any]) -> None:
    """Record ``entry`` for problem ``key`` in this context, in memory and on disk (a cache
    directory that cannot be written is warned about once per process and skipped)."""
    file = path()
    ctx = context()
    with _lock:
        contexts = _loaded.setdefault(file, {})
        contexts.setdefault(ctx, {})[key] = entry
        _stored.add((file, ctx, key))
        try:
            on_disk = _read(file, warn=False)  # another process's entries, merged in
            for c, entries in contexts.items():
                on_disk.setdefault(c, {}).update(entries)
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".autotune-", suffix=".json", dir=file.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "contexts": on_disk}, f, indent=1, sort_keys=True)
            os.replace(tmp, file)
            _loaded[file] = on_disk
        except OSError as e:
            if file not in _unwritable:
                _unwritable.add(file)
                msg = f"onednn-convt: cannot write the autotuning cache {file} ({e}); choices last this process only"
                warnings.warn(msg, TuningCacheWarning, 3)


_unwritable: set[Path] = set()


def forget() -> None:
    """Drop what this process read or wrote (the next lookup reads the file again)."""
    with _lock:
        _loaded.clear()
        _unwritable.clear()
        _stored.clear()


def clear() -> None:
    """Delete the cache file and what this process holds of it."""
    forget()
    try:
        path().unlink()
    except (FileNotFoundError, NotADirectoryError):  # no file (its folder may be a file)
        pass

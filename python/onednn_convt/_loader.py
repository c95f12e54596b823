"""Find and preload oneDNN's ``libdnnl.so.3`` before the native module is imported.

The ``onednn-cpu-gomp`` wheel installs the library under the environment's ``lib/``, not in
site-packages. The extension carries a relative RPATH for installed copies; editable
installs load ``_core`` from the build folder, where only this preload helps.

Set ``ONEDNN_CONVT_LIBDNNL`` to a library file to use a oneDNN (>= 3.2) of your own.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys
from pathlib import Path

LIBRARY = "libdnnl.so.3"
OVERRIDE_VARIABLE = "ONEDNN_CONVT_LIBDNNL"


def _candidates() -> list[Path]:
    override = os.environ.get(OVERRIDE_VARIABLE)
    if override:
        return [Path(override)]
    found: list[Path] = []
    try:
        for f in importlib.metadata.files("onednn-cpu-gomp") or []:
            if f.name == LIBRARY:
                found.append(Path(str(f.locate())).resolve())
    except importlib.metadata.PackageNotFoundError:
        pass
    for prefix in {sys.prefix, sys.base_prefix}:
        found.append(Path(prefix) / "lib" / LIBRARY)
    return found


def preload() -> str:
    """Load libdnnl with RTLD_GLOBAL and return the path that was loaded.

    Raises:
        ImportError: no candidate could be loaded; the message says how to fix it.
    """
    tried = []
    for path in _candidates():
        if path.is_file():
            try:
                ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
                return str(path)
            except OSError as e:
                tried.append(f"{path}: {e}")
        else:
            tried.append(f"{path}: not found")
    try:  # the system's search path (LD_LIBRARY_PATH, ldconfig)
        ctypes.CDLL(LIBRARY, mode=ctypes.RTLD_GLOBAL)
        return LIBRARY
    except OSError as e:
        tried.append(f"{LIBRARY} on the loader path: {e}")
    msg = (
        "onednn_convt could not load oneDNN (libdnnl.so.3). Install it with "
        "'pip install onednn-cpu-gomp==2023.2.0' in this environment, or set "
        f"{OVERRIDE_VARIABLE}=/path/to/libdnnl.so.3. Tried:\n  " + "\n  ".join(tried)
    )
    raise ImportError(msg)

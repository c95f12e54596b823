"""Print the folder holding dnnl-config.cmake from the onednn-devel-cpu-gomp wheel."""

import importlib.metadata
import sys

try:
    files = importlib.metadata.files("onednn-devel-cpu-gomp") or []
except importlib.metadata.PackageNotFoundError:
    sys.exit("onednn-devel-cpu-gomp is not installed; set dnnl_DIR or CMAKE_PREFIX_PATH")
for f in files:
    if f.name == "dnnl-config.cmake":
        print(f.locate().resolve().parent)
        break

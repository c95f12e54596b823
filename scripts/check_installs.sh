#!/usr/bin/env bash
# Install the package the two other ways the README promises, and import it from elsewhere
# with no environment variables set: a --user install (the base interpreter, user site under
# a temporary PYTHONUSERBASE) and an editable install (pip install -e . in a fresh venv). In
# both, `import onednn_convt` must find libdnnl.so.3 by itself (relative RPATH + preload)
# and run an op. (The venv install is the README's own first command.)
#
#   scripts/check_installs.sh        (about 2 minutes on 2 cores: two builds)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

probe='
import numpy as np, onednn_convt as oc
info = oc.info()
assert info["onednn_version"].startswith("3.2."), info
x = np.ones((1, 4, 5, 5), np.float32); w = np.ones((4, 3, 3, 3), np.float32)
y = oc.ConvTranspose(data_format="NCX", weights_format="IOX")(x, w)
assert y.shape == (1, 3, 7, 7) and y.max() == 36.0, y
print("ok:", oc.__file__, "with", info["libdnnl"])
'
clean_env=(env -u LD_LIBRARY_PATH -u ONEDNN_CONVT_LIBDNNL -u PYTHONPATH)

echo "+ --user install (PYTHONUSERBASE=$work/user)"
"${clean_env[@]}" PYTHONUSERBASE="$work/user" PIP_BREAK_SYSTEM_PACKAGES=1 \
  "$python" -m pip install -q --user "$root"
(cd "$work" && "${clean_env[@]}" PYTHONUSERBASE="$work/user" "$python" -c "$probe")

echo "+ editable install (pip install -e . in $work/venv)"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install -q -e "$root"
(cd "$work" && "${clean_env[@]}" "$work/venv/bin/python" -c "$probe")

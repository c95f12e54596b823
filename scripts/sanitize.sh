#!/usr/bin/env bash
# Build the native module with AddressSanitizer + UndefinedBehaviorSanitizer and run the test
# suite on it.
#
#   scripts/sanitize.sh [pytest arguments...]      (default: the whole default suite)
#
# The build goes to its own virtual environment and build directory (build/sanitize/), so the
# development install is untouched: CMake option ONEDNN_CONVT_SANITIZE=ON instruments
# src/cpp/*.cpp (-fsanitize=address,undefined). The interpreter and oneDNN are not
# instrumented, so libasan is preloaded (it must come first to intercept malloc and free);
# ASan then checks every access our code makes, and guards every heap block, oneDNN's too.
# Any ASan report or UBSan error aborts the process: a test fails (a child interpreter's
# abort is reported by the test that ran it). Suppressions: scripts/sanitizers/*.supp.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dir=${SANITIZE_DIR:-build/sanitize}
python=${PYTHON:-python3}

if [ ! -x "$dir/venv/bin/python" ]; then
  "$python" -m venv "$dir/venv"
fi
# shellcheck disable=SC1091
. "$dir/venv/bin/activate"
pip install -q --disable-pip-version-check \
  numpy ml_dtypes pytest hypothesis "scikit-build-core>=0.10" "pybind11>=2.12" \
  "onednn-cpu-gomp==2023.2.0" "onednn-devel-cpu-gomp==2023.2.0"
echo "+ building with ONEDNN_CONVT_SANITIZE=ON in $dir/cmake"
pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps . \
  -C cmake.define.ONEDNN_CONVT_SANITIZE=ON -C cmake.build-type=RelWithDebInfo \
  -C build-dir="$dir/cmake"
so=$(python -c "import importlib.util as u; print(u.find_spec('onednn_convt._core').origin)" 2>/dev/null \
  || find "$dir/venv" -name '_core*.so' | head -1)
if [ "$(ldd "$so" | grep -c libasan)" -eq 0 ]; then
  echo "sanitize.sh: $so is not linked against libasan" >&2
  exit 1
fi

libasan=$(${CXX:-g++} -print-file-name=libasan.so)
libstdcxx=$(${CXX:-g++} -print-file-name=libstdc++.so)
supp="$root/scripts/sanitizers"
# libstdc++ too: python itself does not link it, and ASan's __cxa_throw interceptor needs the
# real one loaded when ASan starts (else the first C++ exception aborts in a CHECK).
export LD_PRELOAD="$libasan:$libstdcxx"
# detect_leaks=0: LeakSanitizer would report the objects CPython never frees at exit (by
# design, thousands of them), burying anything else; leaks are tested by tests/test_memory.py
# (RSS over 100,000 calls and over compiling and evicting partitions) in the normal build.
# Reports also go to files: pytest captures stderr, and an abort loses what it captured.
reports="$root/$dir/reports"
rm -rf "$reports" && mkdir -p "$reports"
export ASAN_OPTIONS="log_path=$reports/asan:detect_leaks=0:abort_on_error=1:halt_on_error=1:check_initialization_order=1:strict_string_checks=1:detect_stack_use_after_return=1:suppressions=$supp/asan.supp"
export UBSAN_OPTIONS="log_path=$reports/ubsan:halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export PYTHONMALLOC=malloc  # every Python object through malloc too: ASan guards them as well

# The sanitizers are live: ASan must catch a use after free, and the module must carry UBSan.
if ASAN_OPTIONS="$ASAN_OPTIONS:abort_on_error=0:log_path=stderr" python -c "import ctypes; c = ctypes.CDLL(None); c.malloc.restype = ctypes.c_void_p; p = c.malloc(16); c.free(ctypes.c_void_p(p)); ctypes.string_at(p, 8)" 2>"$dir/selfcheck.log" \
   || [ "$(grep -c heap-use-after-free "$dir/selfcheck.log")" -eq 0 ]; then
  echo "sanitize.sh: AddressSanitizer did not report a use after free; see $dir/selfcheck.log" >&2
  exit 1
fi
if [ "$(nm -D "$so" | grep -c __ubsan_handle)" -eq 0 ]; then
  echo "sanitize.sh: $so has no UBSan checks" >&2
  exit 1
fi
echo "+ self-check: ASan reports a use after free; $so has ASan and UBSan"

# RSS-based tests measure memory, which ASan changes by design (quarantine of freed blocks,
# redzones, shadow memory); they run in the normal build. Everything else runs here.
deselect=(
  --deselect tests/test_memory.py::test_100k_calls_keep_rss_flat
  --deselect tests/test_memory.py::test_evicted_compiled_partitions_are_freed
  --deselect tests/test_memory.py::test_kept_compiled_partitions_are_what_the_measure_sees
  --deselect tests/test_constant_weights.py::test_dropped_objects_free_their_reordered_weights
)
echo "+ LD_PRELOAD=$LD_PRELOAD python -m pytest ${*:-tests}"
start=$(date +%s)
set +e
python -m pytest -p no:cacheprovider -q "${deselect[@]}" "${@:-tests}"
status=$?
set -e
found=$(find "$reports" -type f | wc -l)
for f in "$reports"/*; do
  [ -f "$f" ] && { echo "=== $f"; head -40 "$f"; }
done
echo "sanitize.sh: pytest exit status $status after $(( $(date +%s) - start )) s; $found sanitizer report(s) in $reports (ASan + UBSan, $so)"
if [ "$found" -ne 0 ] && [ "$status" -eq 0 ]; then
  status=1  # a report from a child interpreter whose test did not look at its exit
fi
exit $status

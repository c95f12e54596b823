"""The differential tests under every CPU ISA level this machine has.

oneDNN 3.2 picks different kernels (with different bugs) per ISA, and reads
``ONEDNN_MAX_CPU_ISA`` once per process, so each level runs in child interpreters capped
at it: an AMX machine stands in for AVX2, AVX-512, AVX-512 BF16 (Zen4-like) and
AVX-512 FP16 CPUs too. A level the CPU lacks is skipped, saying so, and the summary at the
end of the run lists the levels covered.

- :func:`test_random_scan`: the random differential scan of :mod:`isa_scan` (problems sized
  for the blocked and AMX kernels, each called twice and once with ``out=``), in batches of
  one process each, so a crash is a failure that names the problem. ``SCAN_PROBLEMS`` per
  level in the default run, ``SLOW_SCAN_PROBLEMS`` with ``-m slow``, of which at least
  ``SLOW_NATIVE`` on native kernels (not bf16/f16 emulated in f32).
- :func:`test_differential_suite`: the reference-comparison test files, whole, under each
  level; under AVX2 that also runs the tests that need an emulated dtype, which skip on a
  CPU with native bf16 and f16.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onednn_convt as oc
import pytest
from isa_scan import COVERAGE, COVERAGE_FILES, ISA_LEVELS, run_batch

HERE = Path(__file__).resolve().parent
SCAN_PROBLEMS = 400  # 4 batches: about 16 s on an AMD Zen3 (the default suite keeps under ten minutes)
SLOW_SCAN_PROBLEMS = 9300  # 93 batches of 100, 33 f32 problems in each: 3,069 native under AVX2
SLOW_NATIVE = 3000
BATCH = 100
#: the test files that compare every op, dtype and layout with the reference, and those
#: whose tests need an emulated dtype (skipped on a CPU with native bf16 and f16; under the
#: AVX2 cap both are emulated, so they run there)
DIFFERENTIAL_FILES = (
    "test_forward.py", "test_backward_data.py", "test_backward_weights.py", "test_dtypes.py",
    "test_emulated_fast_path.py", "test_numerics.py", "test_memory.py", "test_conformance_report.py",
    "test_fusion.py", "test_polyphase.py", "test_lowering_candidates.py", "test_phased_executor.py",
)


def _env(level: str) -> dict[str, str]:
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA=level)
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


_LEVELS: dict[str, str] = {}


def dispatched(level: str) -> str:
    """The ISA oneDNN dispatches to under the cap ``level`` on this CPU (once per level)."""
    if level not in _LEVELS:
        code = "import onednn_convt as oc; print(oc.guards.dispatch_isa())"
        out = subprocess.run([sys.executable, "-c", code], env=_env(level), capture_output=True, text=True, check=True)
        _LEVELS[level] = out.stdout.strip()
    return _LEVELS[level]


def require(level: str) -> None:
    got = dispatched(level)
    if got != ISA_LEVELS[level]:
        pytest.skip(f"this CPU lacks {level}: capped at it, oneDNN dispatches to {got}")


def scan(level: str, problems: int, seed0: int, native_needed: int = 0) -> None:
    require(level)
    failures, ran, native = [], 0, 0
    for b in range(problems // BATCH):
        result = run_batch(seed0 + b, BATCH, level)
        assert result.isa == ISA_LEVELS[level], f"batch ran on {result.isa}, expected {ISA_LEVELS[level]}"
        ran, native = ran + result.ran, native + result.native
        failures += result.failures
    COVERAGE.append((level, ran, native, len(failures)))
    assert not failures, f"{len(failures)} of {problems} problems failed under {level}:\n" + "\n".join(failures)
    assert native >= native_needed, f"only {native} of {ran} problems ran on native kernels under {level}"


@pytest.mark.parametrize("level", list(ISA_LEVELS))
def test_random_scan(level):
    scan(level, SCAN_PROBLEMS, seed0=1000 * list(ISA_LEVELS).index(level))


@pytest.mark.slow
@pytest.mark.parametrize("level", list(ISA_LEVELS))
def test_random_scan_many(level):
    """At least SLOW_NATIVE problems on native kernels per level (f32 only under AVX2: a
    third of the mix)."""
    scan(level, SLOW_SCAN_PROBLEMS, 100_000 + 10_000 * list(ISA_LEVELS).index(level), SLOW_NATIVE)


@pytest.mark.parametrize("level", list(ISA_LEVELS))
def test_differential_suite(level):
    """The files, whole, in a child pytest capped at ``level`` (a few seconds each). A level
    at which oneDNN dispatches as it does in this run is left out: this run covers it."""
    require(level)
    if dispatched(level) == oc.guards.dispatch_isa():
        pytest.skip(f"capped at {level}, oneDNN dispatches to {dispatched(level)} as in this run, which covers it")
    files = [str(HERE / f) for f in DIFFERENTIAL_FILES]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        env=_env(level), capture_output=True, text=True, check=False, cwd=HERE.parent,
    )
    assert proc.returncode == 0, f"under {level}:\n{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    summary = proc.stdout.strip().splitlines()[-1]
    COVERAGE_FILES.append((level, summary))

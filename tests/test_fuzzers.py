"""The fuzzers of ``fuzz/`` (see fuzz/README.md), at a small count in the default run and
much further under ``-m slow`` (SLOW_TRIALS), where they also run under every ``ONEDNN_MAX_CPU_ISA``
level this CPU has. Each trial runs in a child interpreter with a timeout; a failure's
message is the command that reproduces it. A fixed seed per run: the default run is
repeatable, and the slow run goes further on other trials."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))

import harness  # noqa: E402
from isa_scan import ISA_LEVELS  # noqa: E402
from test_isa_matrix import require  # noqa: E402

#: trials per fuzzer in the default run (the slow run: SLOW_TRIALS). The fuzzers whose trials
#: are processes or thread storms of their own (cli: 1 s a trial on an AMD Zen3; address_space:
#: 2-3 s; threads, fork: 5-6 s) and the torch ones keep a few, so that the default suite stays under ten minutes
CI_TRIALS = {"conformance": 60, "api": 40, "fused": 40, "plain": 60, "reuse": 40, "threads": 2, "fork": 2, "torch": 20,
             "torch_reuse": 20, "cli": 4, "address_space": 2}
#: trials per fuzzer in the slow run: 600 of the in-process fuzzers, 400 of the torch ones,
#: 80 of threads, fork and address_space (each a process, 3-6 s), 240 of cli (1-3 s)
SLOW_TRIALS = {"conformance": 600, "api": 600, "fused": 400, "plain": 600, "reuse": 400, "threads": 80, "fork": 80,
               "torch": 600, "torch_reuse": 400, "cli": 240, "address_space": 80}


def _check(report: harness.Report, trials: int) -> None:
    assert report.trials == trials, report.summary()
    assert not report.findings, f"{report.summary()}\n" + "\n".join(str(f) for f in report.findings)


def _require_modules(name: str) -> None:
    """Skip a fuzzer whose trials import a package that is not installed (torch)."""
    missing = harness.missing_modules(name)
    if missing:
        pytest.skip(f"the {name} fuzzer needs {', '.join(missing)}, which is not installed")


def test_every_fuzzer_has_a_ci_count() -> None:
    assert set(CI_TRIALS) == set(harness.FUZZERS)


@pytest.mark.parametrize("name", sorted(harness.FUZZERS))
def test_fuzzer_finds_nothing(name: str) -> None:
    _require_modules(name)
    _check(harness.run(name, seed=2026, trials=CI_TRIALS[name]), CI_TRIALS[name])


@pytest.mark.slow
@pytest.mark.parametrize("level", [None, *ISA_LEVELS])
@pytest.mark.parametrize("name", sorted(harness.FUZZERS))
def test_fuzzer_finds_nothing_further(name: str, level: str | None) -> None:
    _require_modules(name)
    if level is not None:
        if not getattr(harness.load(name), "ISA_DEPENDENT", True):
            pytest.skip(f"the {name} fuzzer's surfaces (options, files, environment) do not depend on the ISA")
        require(level)
    trials = SLOW_TRIALS[name]
    _check(harness.run(name, seed=7, trials=trials, isa=level), trials)


def test_the_harness_reports_a_crash_and_a_hang_with_the_command_that_repeats_them(tmp_path, monkeypatch) -> None:
    """A trial that kills its child, and one that never answers, are findings naming the trial."""
    (tmp_path / "selftest_fuzzer.py").write_text(
        "import os, signal, time\n"
        "NAME = 'selftest'\nPER_PROCESS = 3\nTIMEOUT = 2.0\n"
        "def trial(rng, index):\n"
        "    if index == 1:\n        os.kill(os.getpid(), signal.SIGSEGV)\n"
        "    if index == 3:\n        time.sleep(60)\n"
        "    if index == 4:\n        raise harness.Failure('a wrong value')\n"
        "    return 'fine'\n"
        "import harness\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    report = harness.run("selftest_fuzzer", seed=1, trials=6)
    kinds = {f.index: f.kind for f in report.findings}
    assert kinds == {1: "crashed", 3: "hung", 4: "failed"}, report.findings
    assert report.trials == 6
    assert report.findings[0].command() == "python fuzz/run.py selftest_fuzzer --seed 1 --trial 1"


def test_the_fused_fuzzer_flags_an_int8_kernel_without_vnni(monkeypatch) -> None:
    """The fused fuzzer's kernel check: verbose lines of oneDNN 3.2 (one saturating kernel,
    one VNNI kernel, an f32 one), and a live call that the library runs on its avx2 int8
    kernel once the guard that routes it away is off (where the CPU lacks AVX-VNNI)."""
    import fused_chains
    import numpy as np
    import onednn_convt as oc
    from onednn_convt import fused_plan
    from onednn_convt.post_ops import INT8_SUM_AFTER_POST_OP

    lines = ["onednn_verbose,exec,cpu,deconvolution,jit_uni_int8:avx2,forward_inference,src_u8::blocked:acdb::f0 "
             "wei_s8::blocked:Acdb8a::f0,attr-post-ops:sum:1:17:u8,,mb3_ic4oc12,0.1",
             "onednn_verbose,exec,cpu,deconvolution,jit_deconvolution:avx512_core_vnni,forward_inference,"
             "src_u8::blocked:acdb::f0,,,mb3,0.1",
             "onednn_verbose,exec,cpu,convolution,jit:avx2,forward_training,src_f32::blocked:abcd::f0,,,mb1,0.1"]
    assert fused_chains.saturating_kernels(lines) == ["deconvolution jit_uni_int8:avx2"]
    avx_vnni = "avx_vnni" in Path("/proc/cpuinfo").read_text()
    if oc.guards.dispatch_isa() not in INT8_SUM_AFTER_POST_OP or avx_vnni:
        pytest.skip("the live call needs oneDNN's avx2 int8 fallback: an AVX-512 VNNI/BF16 dispatch on a CPU "
                    "without AVX-VNNI (the verbose-line checks above ran)")
    monkeypatch.setattr(fused_plan, "INT8_SUM_ZERO_POINT_FEW_CHANNELS", 0)  # the guard off
    rng = np.random.default_rng(0)
    x = rng.integers(0, 40, (1, 4, 6, 5)).astype(np.uint8)  # values that do not saturate
    w = rng.integers(-127, 128, (4, 8, 3, 3)).astype(np.int8)
    op = oc.ConvTranspose(data_format="NCX", weights_format="IOX", src_dequantize=oc.Dequantize(scales=0.05),
                          weights_dequantize=oc.Dequantize(scales=0.01),
                          dst_quantize=oc.Quantize(scales=0.5, zps=3, dtype="u8"),
                          post_ops=[oc.PostOp("Add", dequantize=oc.Dequantize(scales=0.05, zps=17))])
    _, log = fused_chains.logged(lambda: op(x, w, None, np.zeros((1, 8, 8, 7), np.uint8)))
    assert op.fused and fused_chains.saturating_kernels(log) == ["deconvolution jit_uni_int8:avx2"]

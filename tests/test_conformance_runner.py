"""Running cases: verdicts against the reference, broken ops caught, fills as benchdnn's."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onednn_convt
import pytest
from onednn_convt import reference
from onednn_convt.cli import main
from onednn_convt.conformance import fill
from onednn_convt.conformance.collect import collect
from onednn_convt.conformance.harness import parse_text
from onednn_convt.conformance.judge import FAILED, PASSED, UNSUPPORTED, compare
from onednn_convt.conformance.runner import ERROR, run_case, run_cases
from onednn_convt.errors import OneDNNError
from test_conformance_harness import BASE, ONEDNN, needs_onednn_files

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")


def base_case(tmp_path: Path, options: str = "") -> Any:
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    [case] = parse_text(f"--reset {options} --case=fwd.json", base_dir=str(tmp_path))
    return case


def reference_of(case: Any) -> np.ndarray:
    src, weights = fill.make_inputs(case)
    return reference.conv_transpose(src, weights, **case.attrs)


# -- broken ops are caught ---------------------------------------------------------------------


class OffByOne(onednn_convt.ConvTranspose):
    """Adds 1 to the first element of the result."""

    def __call__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        out = super().__call__(*args, **kwargs)
        out[(0,) * out.ndim] += 1
        return out


def test_broken_op_is_failed_with_the_worst_element(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = base_case(tmp_path)
    assert run_case(case).outcome == PASSED
    monkeypatch.setattr(onednn_convt, "ConvTranspose", OffByOne)
    result = run_case(case)
    assert result.outcome == FAILED
    expected = reference_of(case).astype(np.float32)[0, 0, 0, 0]
    n = int(np.prod(case.output.shape))
    assert result.message == (
        f"1 of {n} elements differ; max |got - expected| = 1 at index (0, 0, 0, 0): "
        f"expected {expected:g}, got {expected + 1:g}"
    )


def test_failure_is_reported_with_a_repro_command_that_reproduces_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    harness = tmp_path / "harness_x"
    harness.write_text(
        "--reset --case=fwd.json\n--reset --op-attrs=0:auto_pad:VALID --case=fwd.json\n"
    )
    monkeypatch.setattr(onednn_convt, "ConvTranspose", OffByOne)
    assert main(["conformance", str(harness)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "0 passed, 2 failed, 0 skipped"
    repros = [line.split("repro: ", 1)[1] for line in out if "repro: " in line]
    assert len(repros) == 2
    argv = shlex.split(repros[1])
    assert argv[:2] == ["onednn-convt", "conformance"]
    assert main(argv[1:]) == 1  # the repro fails alone
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "0 passed, 1 failed, 0 skipped"
    assert "--reset --op-attrs=0:auto_pad:VALID --case=fwd.json" in out[0]
    monkeypatch.undo()
    assert main(argv[1:]) == 0  # and passes once the op is fixed


def test_op_ignoring_an_attribute_is_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoDilation(onednn_convt.ConvTransposeBackwardData):
        def __init__(self, **attrs: Any) -> None:
            super().__init__(**{**attrs, "dilations": 1})

    suite = os.path.join(
        os.path.dirname(onednn_convt.__file__), "conformance", "suite", "cases", "bwd_d_1d.json"
    )
    [case] = collect([suite])
    assert case.attrs["dilations"] == (2,)
    assert run_case(case).outcome == PASSED
    monkeypatch.setattr(onednn_convt, "ConvTransposeBackwardData", NoDilation)
    result = run_case(case)
    # undilated, the op gives another output shape (or other values): FAILED, never PASSED
    assert result.outcome == FAILED, result.message


def test_op_not_writing_out_is_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class NewArray(onednn_convt.ConvTranspose):
        def __call__(
            self, src: Any, weights: Any, bias: Any = None, *, out: Any = None
        ) -> np.ndarray:
            return super().__call__(src, weights, bias)

    monkeypatch.setattr(onednn_convt, "ConvTranspose", NewArray)
    result = run_case(base_case(tmp_path))
    assert result.outcome == FAILED
    assert result.message.startswith("the op returned a new array instead of out=; out: ")
    assert "elements differ" in result.message and "got nan" in result.message


def test_library_errors_and_crashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Refuses(onednn_convt.ConvTranspose):
        def __call__(self, *a: Any, **k: Any) -> np.ndarray:
            raise OneDNNError("compile failed", 2)

    class Crashes(onednn_convt.ConvTranspose):
        def __call__(self, *a: Any, **k: Any) -> np.ndarray:
            raise IndexError("oops")

    case = base_case(tmp_path)
    monkeypatch.setattr(onednn_convt, "ConvTranspose", Refuses)
    result = run_case(case)
    assert (
        result.outcome == FAILED
        and "the library refused a case the spec allows: compile failed" in result.message
    )
    monkeypatch.setattr(onednn_convt, "ConvTranspose", Crashes)
    result = run_case(case)
    assert result.outcome == ERROR and "IndexError: oops" in result.message


# -- dtypes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_emulated_dtypes_pass_and_are_unsupported_when_strict(tmp_path: Path, dt: str) -> None:
    case = base_case(tmp_path, f"--dt={dt}")
    result = run_case(case)
    assert result.outcome == PASSED, result.message
    native = onednn_convt.info()["dtypes"]["ConvTranspose"][dt] == "native"
    assert result.details["emulated"] is (not native)
    strict = run_case(case, strict_dtypes=True)
    assert strict.outcome == (PASSED if native else UNSUPPORTED)
    if not native:
        assert "no " + dt + " kernel" in strict.message


def test_compare_is_exact_in_the_output_dtype() -> None:
    ref = np.array([[1.0, 2.0], [257.0, np.inf]])
    got = ref.astype(ml_dtypes.bfloat16)  # 257 rounds to 256 in bf16
    assert compare(got, ref, got.dtype) is None
    bad = got.copy()
    bad[1, 0] = 258
    assert compare(bad, ref, got.dtype) == (
        "1 of 4 elements differ; max |got - expected| = 2 at index (1, 0): expected 256, got 258"
    )
    nan = got.copy()
    nan[0, 1] = np.nan
    assert "at index (0, 1): expected 2, got nan" in compare(nan, ref, got.dtype)
    f32 = ref.astype(np.float32)
    f32[0, 0] = np.nextafter(np.float32(1), np.float32(2))
    assert compare(f32, ref, np.float32) is not None  # one ulp is a failure


# -- the fills ----------------------------------------------------------------------------------


def test_fill_ranges_density_and_determinism(tmp_path: Path) -> None:
    for dt, (src_max, wei_max) in {"f32": (32, 32), "bf16": (4, 8), "f16": (4, 2)}.items():
        case = base_case(tmp_path, f"--dt={dt}")
        p = fill.plan(case)
        assert p.ranges["src"] == (-src_max, src_max) and p.ranges["wei"] == (-wei_max, wei_max)
        assert p.n_acc == 4 * 9  # IC/G * kernel
        digits = {"f32": 24, "bf16": 8, "f16": 11}[dt]
        assert p.safe_n_acc == 2**digits // (src_max * wei_max)
        assert p.density == min(1.0, p.safe_n_acc / p.n_acc)
        src, weights = fill.make_inputs(case)
        assert src.dtype == onednn_convt.dtypes.FLOAT_DTYPES[dt]
        values = src.astype(np.float64)
        assert np.all(values == np.round(values)) and np.abs(values).max() <= src_max
        assert values.ravel()[0] > 0
        again = fill.make_inputs(case)
        assert np.array_equal(again[0], src) and np.array_equal(again[1], weights)


def test_sparse_fill_for_a_long_accumulation() -> None:
    values = fill.integers((4, 64 * 8), -4, 4, 0.1, [1])
    nonzero = np.count_nonzero(values) / values.size
    assert 0.05 < nonzero < 0.2
    assert np.all(values.ravel()[:: fill.CHUNK] > 0)  # the first of every 64


def test_fill_memory_order(tmp_path: Path) -> None:
    case = base_case(tmp_path, "--in-shapes=0:1x4x3x3*acdb")
    src, _ = fill.make_inputs(case)
    assert src.shape == (1, 4, 3, 3)
    assert src.strides == tuple(s * 4 for s in (36, 1, 12, 4))  # channels innermost
    assert run_case(case).outcome == PASSED


# -- oneDNN's own cases --------------------------------------------------------------------------


@needs_onednn_files
def test_onednn_cases_all_pass() -> None:
    names = [
        "harness_f32",
        "harness_bf16",
        "harness_f16",
        "harness_bf16_v3.2",
        "harness_f16_v3.2",
        "op",
    ]
    cases = collect([os.path.join(ONEDNN, n) for n in names])
    assert len(cases) == 37 + 4 * 21 + 9
    results = run_cases(cases, jobs=2)  # worker processes with one BLAS and one OpenMP thread each
    failed = [
        f"{r.case.location} {r.case.id}: {r.outcome} {r.message}"
        for r in results
        if r.outcome != PASSED
    ]
    assert failed == []
    # which library op runs each case is the measured rules' choice on this CPU (the D9
    # Convolution for BackwardData where the table picks it; the dilated bundled cases
    # always take it; a grouped case per group where the table has grouped layers like it;
    # a 3-D depthwise BackwardData its depth taps on AVX2)
    kinds = {r.details["lowering"] for r in results}
    assert kinds <= {"ConvTranspose", "ConvolutionBackwardData", "Convolution", "ConvTransposeBackwardData",
                     "ConvTransposeBackwardWeights", "ConvolutionBackwardWeights", "MatMul", "Polyphase",
                     "Per group", "Depth taps"}, kinds


def test_bundled_suite_passes_in_two_worker_processes() -> None:
    cases = [c for c in collect() if "3d" in c.id]
    assert len(cases) >= 20
    serial = run_cases(cases)
    parallel = run_cases(cases, jobs=2)
    assert [r.case.id for r in parallel] == [c.id for c in cases]
    assert [r.outcome for r in parallel] == [r.outcome for r in serial] == [PASSED] * len(cases)

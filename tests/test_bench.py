"""The benchmark harness (``onednn-convt bench``): a quick tiny run produces a table, CSV,
JSON and Markdown that agree with each other, and the values that are not timings hold
(no recompiles, results match the reference and PyTorch). Timings are never asserted."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import statistics
from pathlib import Path

import numpy as np
import pytest
from helpers import bench_main
from onednn_convt.bench import report, runner, suites
from onednn_convt.cli import main


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench")
    code, stdout, stderr = bench_main(["bench", "--suite", "tiny", "--quick", "--budget", "0.01", "--out", str(out),
                                       "--name", "run"])
    return {"code": code, "out": out, "stdout": stdout, "stderr": stderr}


def test_run_succeeds_and_writes_files(tiny_run: dict) -> None:
    assert tiny_run["code"] == 0, tiny_run["stdout"] + tiny_run["stderr"]
    for ext in ("json", "csv", "md"):
        assert (tiny_run["out"] / f"run.{ext}").stat().st_size > 0
    png = tiny_run["out"] / "run.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not png.exists()
    else:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_configuration_in_table_csv_and_json(tiny_run: dict) -> None:
    doc = json.loads((tiny_run["out"] / "run.json").read_text())
    expected = {c.key for c in suites.configs("tiny")}
    assert len(expected) == 3 * 3 * 2
    results = doc["results"]
    assert {r["key"] for r in results} == expected
    assert not [r for r in results if r.get("error")]

    with open(tiny_run["out"] / "run.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [row["key"] for row in rows] == [r["key"] for r in results]
    for row, r in zip(rows, results):
        assert float(row["median_ms"]) == pytest.approx(r["median_ms"], rel=1e-12)
        assert float(row["gflops"]) == pytest.approx(r["gflops"], rel=1e-12)

    table = [ln.split() for ln in tiny_run["stdout"].splitlines()]
    for r in results:
        line = [r["layer"], r["op"], r["dtype"], r["format"]]
        assert any(cells[:4] == line for cells in table), line
    md = (tiny_run["out"] / "run.md").read_text()
    assert md.count("\n| tiny ") == len(results)
    assert "oneDNN " + doc["meta"]["onednn_version"] in tiny_run["stdout"]
    # which rules table chose the lowerings, as info() says
    from onednn_convt.lowering import rules

    table = doc["meta"]["rules_table"]
    assert table == {k: rules.report()[k] for k in ("table", "table_sha256", "why")} == rules.result_record()
    assert table["table"] is None or f"rules table: {table['table']}" in md


def test_derived_figures_are_consistent(tiny_run: dict) -> None:
    results = json.loads((tiny_run["out"] / "run.json").read_text())["results"]
    for r in results:
        assert r["flops"] == 2 * 1 * 4 * 3 * 25 * 9
        assert r["gflops"] == pytest.approx(r["flops"] / r["median_ms"] / 1e6)
        pairs = sorted(r["overhead_pairs_us"])  # paired out= - native samples
        assert len(pairs) >= 3
        assert r["overhead_us"] == pytest.approx(statistics.median(pairs))
        assert r["emulated"] == (r["dtype"] != "f32" and r["lowering"].endswith("(f32 emulation)"))
        if r.get("torch_ms") is not None:
            assert r["vs_torch"] == pytest.approx(r["torch_ms"] / r["median_ms"])


def test_no_recompile_and_no_allocation_with_out(tiny_run: dict) -> None:
    results = json.loads((tiny_run["out"] / "run.json").read_text())["results"]
    for r in results:
        assert r["compile_misses"] >= 1, r["key"]  # the first call compiled (cache cleared)
        assert r["repeat_misses"] == 0, r["key"]
        if not r["emulated"]:
            assert r["alloc_out_bytes"] <= 1024, r["key"]
            # without out= the result (1x3x7x7 for fwd) is allocated: at least its size is traced
            itemsize = 4 if r["dtype"] == "f32" else 2
            assert r["alloc_bytes"] >= itemsize * 3 * 7 * 7 or r["op"] == "bwd_w"


def test_constant_weights_measured_where_the_op_has_weights(tiny_run: dict) -> None:
    """fwd and bwd_d are also timed with their weights bound as constant, and wrote the same
    bytes as the plain call; bwd_w has no weights input."""
    results = json.loads((tiny_run["out"] / "run.json").read_text())["results"]
    for r in results:
        if r["op"] == "bwd_w":
            assert "const_gain" not in r, r["key"]
            continue
        assert r["const_equal"] is True, r["key"]
        assert r["const_out_ms"] > 0 and r["const_gain"] > 0, r["key"]
    table = tiny_run["stdout"]
    assert "const w" in table


def test_results_match_reference_and_torch(tiny_run: dict) -> None:
    results = json.loads((tiny_run["out"] / "run.json").read_text())["results"]
    for r in results:
        assert r["ref_err"] <= runner.TOLERANCE[r["dtype"]], r["key"]
        if r.get("torch_err") is not None:  # PyTorch computes the same thing we time
            assert r["torch_err"] <= 2 * runner.TOLERANCE[r["dtype"]], r["key"]


def test_targets_listed(tiny_run: dict) -> None:
    doc = json.loads((tiny_run["out"] / "run.json").read_text())
    assert [t["id"] for t in doc["targets"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    by_id = {t["id"]: t for t in doc["targets"]}
    assert all(by_id[i]["met"] is None for i in (1, 3, 7, 8))  # no models suite
    assert by_id[6]["met"] is True  # no recompiles, out= allocation-free (not a timing)
    # stdout reports the figures plainly: no goals or verdicts meant for the developers
    stdout = tiny_run["stdout"]
    assert "Summary:" in stdout and "Targets" not in stdout and "issue" not in stdout
    assert "[MET" not in stdout and "[MISSED]" not in stdout
    for t in doc["targets"]:
        figure = t["figure"].replace("; istft not compared", "")  # (a layer the tiny suite lacks)
        assert (f": {figure}" in stdout) == (t["figure"] != "not run"), t


def test_a_skipped_chart_is_noted(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without matplotlib the run says that it drew no chart, and why."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(report, "chart", lambda records, path: False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, _, stderr = bench_main(["bench", "--suite", "tiny", "--quick", "--budget", "0.01", "--repeat", "3",
                                   "--ops", "fwd", "--dtypes", "f32", "--formats", "NCX", "--no-torch",
                                   "--no-reference", "--out", str(tmp_path)])
    assert code == 0
    assert "no chart drawn: matplotlib is not installed" in stderr


_ONE_FWD = ["bench", "--suite", "tiny", "--quick", "--budget", "0.01", "--repeat", "3", "--ops", "fwd",
            "--dtypes", "f32", "--formats", "NCX"]


def _fails_with(code: int, stdout: str, stderr: str, words: str) -> None:
    assert code == 1, stdout + stderr
    assert "WRONG RESULTS in 1 of 1 configurations" in stdout and words in stdout
    assert "WRONG: " + words in stderr  # beside the progress line too


def test_a_result_off_the_reference_fails_the_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onednn_convt.bench import peers

    real = peers.reference_call
    monkeypatch.setattr(peers, "reference_call", lambda case: (lambda: real(case)() * 1.5))
    code, stdout, stderr = bench_main([*_ONE_FWD, "--no-torch", "--out", str(tmp_path)])
    _fails_with(code, stdout, stderr, "our result is 3.3e-01 from the float64 reference")
    [r] = json.loads((tmp_path / "tiny.json").read_text())["results"]
    assert runner.wrong(r) and r["ref_err"] == pytest.approx(1 / 3, rel=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("reference", [False, True])
def test_pytorch_disagreeing_fails_a_run_without_the_reference(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                                                 reference: bool) -> None:
    """With --no-reference, PyTorch's result is the check; with the reference, a PyTorch
    that alone differs is marked in its column and fails nothing."""
    from onednn_convt.bench import peers

    real = peers.torch_to_numpy
    monkeypatch.setattr(peers, "torch_to_numpy", lambda case, result: real(case, result) + 1.0)
    code, stdout, stderr = bench_main([*_ONE_FWD, *([] if reference else ["--no-reference"]), "--out", str(tmp_path)])
    [r] = json.loads((tmp_path / "tiny.json").read_text())["results"]
    assert runner.torch_disagrees(r)
    if reference:
        assert code == 0 and not runner.wrong(r) and "WRONG" not in stdout + stderr
    else:
        _fails_with(code, stdout, stderr, "our result and PyTorch's are")
    row = next(ln for ln in stdout.splitlines() if ln.startswith("tiny "))
    assert f"{r['torch_ms']:.3g} !" in row


def test_a_run_that_checks_nothing_says_so(tmp_path) -> None:
    """Without the reference and PyTorch no result is checked but the constant-weights
    call's against the plain one: the run says how many went unchecked."""
    code, stdout, _ = bench_main([*_ONE_FWD, "--no-torch", "--no-reference", "--out", str(tmp_path)])
    assert code == 0
    assert "NOTE: 1 of 1 configurations' results were checked against neither the reference" in stdout
    code, stdout, _ = bench_main([*_ONE_FWD, "--no-torch", "--out", str(tmp_path)])
    assert code == 0 and "checked against neither" not in stdout


def test_constant_weights_giving_another_result_fail_the_run(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onednn_convt import ops

    real = ops.ConvTranspose.with_constant_weights
    monkeypatch.setattr(ops.ConvTranspose, "with_constant_weights", lambda self, w: real(self, np.asarray(w) * 2))
    code, stdout, stderr = bench_main([*_ONE_FWD, "--no-torch", "--no-reference", "--out", str(tmp_path)])
    _fails_with(code, stdout, stderr, "the call with the weights bound as constant (")
    [r] = json.loads((tmp_path / "tiny.json").read_text())["results"]
    assert r["const_err"] == pytest.approx(1.0, rel=1e-6) and r["const_equal"] is False
    assert report._const(r).endswith("!")


@pytest.mark.parametrize("equal, err, mark", [(True, 0.0, ""), (False, 1e-6, "~"), (False, 5e-4, "!"),
                                              (False, float("nan"), "!"), (False, None, "?")])
def test_constant_weights_column_marks(equal: bool, err: float | None, mark: str) -> None:
    """Different bytes within tolerance (another lowering or kernel) read ``~``, beyond it
    ``!``; an older run's record, with no ``const_err``, ``?``."""
    r = {"dtype": "f32", "const_gain": 1.25, "const_equal": equal, "const_err": err}
    assert report._const(r) == "1.25" + mark
    assert bool(runner.wrong(r)) == (mark == "!")


def test_compare_with_itself(tiny_run: dict) -> None:
    doc = report.read_json(tiny_run["out"] / "run.json")
    text = report.compare(doc, doc["results"])
    lines = text.splitlines()
    assert len(lines) == 1 + len(doc["results"]) + 1
    assert all(ln.endswith(" 1.00x") for ln in lines[1:-1])
    assert lines[-1].startswith("geomean speed-up 1.00x over 18")


@pytest.mark.parametrize("content", ['{"a": 1}', "[" * 100_000, "{not json", '{"results": [1, 2]}',
                                     '{"results": [{"key": "k", "median_ms": "3"}]}',
                                     '{"results": [{"key": 7, "median_ms": 3}]}',
                                     '{"results": [{"key": "k", "median_ms": NaN}]}',
                                     '{"results": [{"key": "k", "median_ms": 1' + '0' * 400 + '}]}',
                                     '{"meta": [], "results": [{"key": "k", "median_ms": 1}]}',
                                     b"\xff\xfe{\x00}\x00", None, "/dev/zero"])
def test_compare_rejects_what_it_cannot_compare(tmp_path, content) -> None:
    bad = tmp_path / "x.json"
    if content == "/dev/zero":  # endless: refused at 64 MiB
        bad = Path(content)
    elif isinstance(content, bytes):
        bad.write_bytes(content)
    elif content is not None:  # None: no such file
        bad.write_text(content)
    with pytest.raises(ValueError, match="--compare .*expected a JSON result file"):
        report.read_json(bad)


def test_bench_refuses_a_bad_compare_file_before_measuring(tmp_path, capsys, monkeypatch) -> None:
    from onednn_convt.bench import cli as bench_cli

    monkeypatch.setattr(bench_cli, "measure_peak_for", lambda quick: pytest.fail("measured first"))
    bad = tmp_path / "x.json"
    bad.write_text('{"results": [{"key": 7}]}')
    assert main(["bench", "--suite", "tiny", "--dtypes", "f32", "--compare", str(bad), "--out", str(tmp_path)]) == 2
    assert "--compare" in capsys.readouterr().err


def test_models_suite_is_the_issue_list() -> None:
    lays = {lay.name: lay for lay in suites.layers("models")}
    assert set(lays) == {"dcgan1", "dcgan2", "unet", "conv3d", "hifigan", "depthwise", "istft"}
    d = lays["dcgan1"]
    assert (d.n, d.ic, d.oc, d.spatial, d.kernel, d.stride, d.pad) == (16, 512, 256, (4, 4), (4, 4), 2, 1)
    assert lays["depthwise"].groups == 128
    s = lays["istft"]
    assert s.slow and (s.ic, s.oc, s.spatial, s.kernel, s.stride) == (1026, 1, (224,), (1024,), 256)
    assert s.flops == 2 * 1026 * 224 * 1024
    assert len(suites.configs("models")) == 7 * 3 * 3 * 2
    assert "istft" not in {c.layer.name for c in suites.configs("models", skip_slow=True)}
    sweep = suites.layers("sweep")
    assert {lay.sweep[0] for lay in sweep} == {"n", "c", "x"}
    assert len({(lay.n, lay.ic, lay.spatial) for lay in sweep}) == len(sweep)


@pytest.mark.parametrize("argv", [["--suite", "huge"], ["--ops", "fwd,nope"], ["--threads", "0"],
                                  ["--dtypes", "f64"], ["--threads", "100000"], ["--threads", "9" * 400],
                                  ["--budget", "9" * 400], ["--repeat", "1e3"], ["--name", "x" * 300],
                                  ["--out=--"]])
def test_bad_options_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv])
    assert e.value.code == 2
    assert "expected" in capsys.readouterr().err


def test_geomean_helper() -> None:
    assert report.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isclose(report.geomean([1.0]), 1.0)


def test_measure_difference_alternates_and_pairs_samples() -> None:
    """Batches alternate a, b, a, b, each sized to take about the same time (so a fast call
    paired with a slow one is still averaged over many calls), and each difference pairs the
    two samples taken side by side (a drift that hits both cancels out)."""
    from onednn_convt.bench import timing

    calls: list[tuple[str, int]] = []
    drift = [0.0]

    def runner(name: str, cost: float) -> timing.BatchRunner:
        def run(k: int) -> float:
            calls.append((name, k))
            drift[0] += 1e-7  # the machine gets slower every batch
            return k * (cost + drift[0])

        return run

    ta, tb, pairs = timing.measure_difference(runner("a", 3e-4), runner("b", 1e-4), repeat=5, budget=20.0)
    names = [n for n, _ in calls[2:]]  # after one timing call of each
    assert names == ["a", "b"] * 5
    batches = {n: {k for m, k in calls[2:] if m == n} for n in "ab"}
    assert len(batches["a"]) == len(batches["b"]) == 1
    [ka], [kb] = batches["a"], batches["b"]
    assert kb == pytest.approx(3 * ka, rel=0.01)  # b's call is 3x quicker
    assert pairs == pytest.approx([2e-4 - 1e-7] * 5)  # b ran one drift step later than its a
    assert ta.samples == tb.samples == 5 and ta.median > tb.median


def test_measure_rounds_alternates_with_gaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds run one batch of each runner in order, each batch sized from its own call, and
    sleep only before the runners given a gap; samples line up by round."""
    from onednn_convt.bench import timing

    calls: list[str] = []
    slept: list[tuple[str, float]] = []

    def runner(name: str, cost: float) -> timing.BatchRunner:
        def run(k: int) -> float:
            calls.append(name)
            return k * cost

        return run

    monkeypatch.setattr(timing, "settle", lambda s: slept.append((calls[-1], s)))
    ts, samples = timing.measure_rounds([runner("a", 1e-3), runner("b", 1e-4), runner("c", 1e-5)], repeat=4,
                                        budget=10.0, gaps=[0.5, 0.0, 0.0])
    assert calls[3:] == ["a", "b", "c"] * 4  # after one sizing call each
    assert [t.samples for t in ts] == [4, 4, 4] and [len(s) for s in samples] == [4, 4, 4]
    assert ts[1].batch == pytest.approx(10 * ts[0].batch, rel=0.01)
    assert samples[2] == pytest.approx([1e-5] * 4)
    assert [s for _, s in slept] == [0.5] * 4  # before each of a's batches only
    assert [name for name, _ in slept] == ["c", "c", "c", "c"]  # i.e. after the previous round's c


def test_retry_criteria():
    """--retry-busy and --retry-noisy pick rows by other processes' CPU use and by the
    spread of our samples; a failed row (no timing) is never picked."""
    from onednn_convt.bench import cli

    assert cli._spread({"median_ms": 2.0, "iqr_ms": 1.0}) == 0.5
    assert cli._spread({"error": "ValueError: x"}) == 0.0
    assert cli._busy({"others_cpu": 0.7}) == 0.7 and cli._busy({"others_cpu": None}) == 0.0
    assert cli._spread({"median_ms": 1.0, "iqr_ms": 0.3}) > cli.NOISY > cli._spread({"median_ms": 1.0, "iqr_ms": 0.1})


# -- the fused suite (bench --suite fused) ----------------------------------------------------
@pytest.fixture(scope="module")
def fused_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The fused suite on the tiny layer, both formats, a few milliseconds per row."""
    out = tmp_path_factory.mktemp("fused")
    code, stdout, stderr = bench_main(["bench", "--suite", "fused", "--quick", "--budget", "0.01", "--layers", "tiny",
                                        "--formats", "NCX,NXC", "--out", str(out)])
    doc = json.loads((out / "fused.json").read_text())
    return {"code": code, "out": out, "stdout": stdout, "stderr": stderr, "doc": doc}


def test_fused_suite_rows_and_files(fused_run: dict) -> None:
    from onednn_convt.bench import fused

    assert fused_run["code"] == 0, fused_run["stdout"] + fused_run["stderr"]
    results = fused_run["doc"]["results"]
    expected = {f"fused/tiny/{c.name}/{dt}/{fmt}" for c in fused.CASES for dt in ("f32", "bf16") for fmt in ("NCX", "NXC")}
    expected |= {f"fused/tiny/{fused.INT8_CASE}/int8/{fmt}" for fmt in ("NCX", "NXC")}
    assert {r["key"] for r in results} == expected
    assert not [r for r in results if r.get("error")]
    md = (fused_run["out"] / "fused.md").read_text()
    assert md.count("\n| tiny |") == len(results)
    assert "oneDNN " + fused_run["doc"]["meta"]["onednn_version"] in md
    assert "/" not in fused_run["doc"]["meta"]["libdnnl"]  # no machine paths in result files
    assert os.getcwd() not in md and os.getcwd() not in json.dumps(fused_run["doc"])
    assert [s["dtype"] for s in fused_run["doc"]["summary"]] == ["f32", "bf16", "int8"]


def test_fused_suite_checked_every_row(fused_run: dict) -> None:
    """Each row ran in the library as its lowering says (one fused partition, or the op and
    then the rest: the stride-1 speed rule where the measured rules run this float layer on
    the deconvolution; int8 on a CPU without VNNI: the int8_without_vnni guard's f32 route),
    and its result was checked against the unfused one (and PyTorch's where installed) before
    it was timed."""
    from helpers import int8_fuses
    from onednn_convt.bench import fused, fused_checks

    torch = runner.peers.torch_module()
    int8_unfused = not int8_fuses()  # the int8_without_vnni guard's route
    for r in fused_run["doc"]["results"]:
        if ", then the rest: oneDNN 3.2's stride-1 deconvolution is slow with them fused)" in r["lowering"]:
            assert r["dtype"] != "int8" and r["fused"] is False and r["partitions"] >= 2, r["key"]
        elif r["dtype"] == "int8" and int8_unfused:
            assert r["fused"] is False and r["lowering"].startswith("Dequantize in NumPy, ConvTranspose (f32)"), r["key"]
            assert "int8 kernels without VNNI" in r["lowering"], r["key"]
        else:
            assert r["fused"] is True and r["partitions"] == 1, r["key"]
            assert "1 fused partition" in r["lowering"], r["key"]
        if not (r["dtype"] == "int8" and int8_unfused):
            assert "in NumPy" not in r["lowering"], r["key"]
        if r["dtype"] == "int8":
            assert r["lsb_unfused"] <= fused_checks.INT8_LSB and r["lsb_f32"] <= fused_checks.INT8_LSB, r["key"]
            if torch is not None:  # a PyTorch engine passed its check, or the row says why none did
                assert r.get("lsb_torch", 0) <= fused_checks.TORCH_INT8_LSB or r.get("torch_error"), r["key"]
                # and none failed for a reason of ours (an engine may give wrong values: Mismatch)
                for engine in ("x86", "onednn", "fbgemm"):
                    assert f"{engine}: " not in r.get("torch_error", "") or f"{engine}: Mismatch" in r["torch_error"], r["torch_error"]
            continue
        assert r["err_unfused"] <= runner.TOLERANCE[r["dtype"]], r["key"]
        assert r["err_alloc"] == 0.0, r["key"]
        if torch is not None:
            assert r["err_torch"] <= 2 * runner.TOLERANCE[r["dtype"]], r["key"]


def test_fused_suite_derived_figures(fused_run: dict) -> None:
    for r in fused_run["doc"]["results"]:
        assert r["fused_vs_unfused"] == pytest.approx(r["fused_ms"] / r["unfused_ms"])
        assert r["saved_vs_pass"] == pytest.approx(r["saved_ms"] / r["pass_ms"])
        assert r["saved_vs_post"] == pytest.approx(r["saved_ms"] / r["post_ms"])
        assert r["samples"] >= 3
        residual_first = r["dtype"] != "int8" and r["case"] in ("bias+Add", "bias+Add+ReLU+Mul")
        assert ("fused_inplace_ms" in r) == residual_first, r["key"]
        if residual_first:  # out= the residual: the same values, timed as a call of its own
            assert r["err_inplace"] == 0.0, r["key"]
            assert r["saved_inplace_vs_pass"] == pytest.approx(r["saved_inplace_ms"] / r["pass_ms"])
        best = max(r["saved_vs_pass"], r.get("saved_inplace_vs_pass", -math.inf))
        assert r["best_saved_vs_pass"] == best
        assert r["best_saved_vs_pass_q1"] <= r["best_saved_vs_pass_q3"]
        if r.get("torch_vs_fused") is not None:
            assert r["torch_vs_fused"] == pytest.approx(r["torch_ms"] / r["fused_alloc_ms"])
    for s in fused_run["doc"]["summary"]:
        rows = [r for r in fused_run["doc"]["results"] if r["dtype"] == s["dtype"]]
        assert s["rows"] == len(rows)
        assert s["fused_vs_unfused"] == pytest.approx(report.geomean([r["fused_vs_unfused"] for r in rows]))


def test_fused_suite_fails_loudly_on_a_wrong_result(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused result that differs from the unfused one is an error row (not timed) and exit 1."""
    from onednn_convt.bench import fused

    real = fused.numpy_post

    def off_by_one(src, dst, kinds, operands, tmp) -> None:
        real(src, dst, kinds, operands, tmp)
        dst += 1

    monkeypatch.setattr(fused, "numpy_post", off_by_one)
    code, stdout, _ = bench_main(["bench", "--suite", "fused", "--quick", "--budget", "0.01", "--layers", "tiny",
                                   "--dtypes", "f32", "--no-torch", "--out", str(tmp_path)])
    assert code == 1
    results = json.loads((tmp_path / "fused.json").read_text())["results"]
    float_rows = [r for r in results if r["dtype"] == "f32"]
    assert len(float_rows) == len(fused.CASES)
    for r in float_rows:
        assert r["error"].startswith("Mismatch:") and "fused against unfused" in r["error"], r
        assert "fused_ms" not in r
    assert [r for r in results if r["dtype"] == "int8" and not r.get("error")]  # its own unfused form
    assert "FAILED" in stdout


@pytest.mark.parametrize("layers", ["dcgan1", pytest.param("dcgan1,dcgan2", marks=pytest.mark.slow)])
def test_fused_bench_checks_pass_on_model_sized_layers(tmp_path, layers: str) -> None:
    """The fused suite's checks (fused against unfused, int8 against its f32 form) on the
    DCGAN layers (512 and 256 input channels): on an AMD Zen4 they failed 24 rows (f32, bf16
    and int8, errors 0.06-3.2) where oneDNN 3.2's strided deconvolution applied the bias and
    post-ops once per tap (the guard strided_deconvolution_epilogue, seen on every k4 s2 p1
    layer of 512-1024 input channels). Timings unused. The default run takes dcgan1, the
    512-channel one (12 s on an AMD Zen3); the slow run both (28 s)."""
    code, stdout, stderr = bench_main(["bench", "--suite", "fused", "--quick", "--budget", "0.01", "--repeat", "1",
                                        "--layers", layers, "--formats", "NCX,NXC", "--no-torch",
                                        "--no-chart", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "fused.json").read_text())["results"]
    failed = [f"{r['key']}: {r['error']}" for r in results if r.get("error")]
    assert code == 0 and not failed, "\n".join(failed) or stderr[-2000:]
    assert {r["dtype"] for r in results} == {"f32", "bf16", "int8"}


def test_fused_checks() -> None:
    import numpy as np
    from onednn_convt.bench import fused_checks as fused

    a = np.ones((2, 3), np.float32)
    assert fused.check_close("x", a, a, 0.0) == 0.0
    with pytest.raises(fused.Mismatch, match="x: relative error"):
        fused.check_close("x", a * 1.01, a, 1e-3)
    with pytest.raises(fused.Mismatch):
        fused.check_close("nan", a * np.nan, a, 1.0)
    q = np.arange(100, dtype=np.uint8)
    assert fused.check_u8("q", q, q, 0, 0.0) == (0, 0.0)
    r = q.copy()
    r[0] += 1
    assert fused.check_u8("q", r, q, 1, 0.01) == (1, 0.01)
    with pytest.raises(fused.Mismatch):
        fused.check_u8("q", r, q, 0, 1.0)
    with pytest.raises(ValueError, match="unknown layer"):
        fused.layers(["nope"])
    assert "istft" not in {lay.name for lay in fused.layers()}
    assert {lay.name for lay in fused.layers()} == {lay.name for lay in suites.layers("models")} - {"istft"}


def test_fused_suite_runs_alone() -> None:
    code, _, stderr = bench_main(["bench", "--suite", "fused,tiny"])
    assert code == 2 and "runs alone" in stderr
    code, _, stderr = bench_main(["bench", "--suite", "fused", "--dtypes", "f16"])
    assert code == 2 and "not f16" in stderr


def test_allocation_target_leaves_out_matmul_plans_tuned_or_not() -> None:
    """Target 6 holds native plans to 1 KiB per out= call; MatMul lowerings copy in Python by
    design, whether the rules or the tuner chose them, and so do emulated dtypes."""
    def row(lowering: str, emulated: bool = False) -> dict:
        return {"lowering": lowering, "emulated": emulated}

    assert report.copies_by_design(row("MatMul"))
    assert report.copies_by_design(row("MatMul (tuned: MatMul (frames))"))
    assert report.copies_by_design(row("ConvTranspose", emulated=True))
    assert not report.copies_by_design(row("ConvTranspose (tuned: ConvTranspose)"))
    assert not report.copies_by_design(row("Convolution (tuned: MatMul (frames))"))


def test_first_calls_of_a_tuned_and_an_untuned_process(tmp_path, monkeypatch) -> None:
    from onednn_convt import tune
    from onednn_convt.lowering import autotune, tuning_cache

    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(tmp_path))
    tuning_cache.forget()
    was = autotune.enabled()
    try:
        cfg = next(c for c in suites.configs("tiny") if c.op == "fwd" and c.dtype == "f32")
        autotune.set_autotune(True)
        tuned = tune.tune_config(cfg)
        rec: dict = {}
        runner.measure_first_calls(cfg, rec, pairs=2)
    finally:
        autotune.set_autotune(was)
        tuning_cache.forget()
    assert autotune.enabled() is was
    assert rec["first_tuned_lowering"].endswith(f"(tuned: {tuned['chosen']})")
    assert rec["first_tuned_ms"] > 0 and rec["first_untuned_ms"] > 0 and rec["cache_read_ms"] > 0
    assert rec["first_tuned_vs_untuned"] == rec["first_tuned_ms"] / rec["first_untuned_ms"]


@pytest.mark.parametrize("op", ["fwd", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("fmt", ["NCX", "NXC"])
@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("stride", [2, 4])
def test_native_loop_runs_every_phase_of_a_polyphase_plan(op: str, fmt: str, code: str, stride: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The native loop of a polyphase plan runs each phase's partition on its views (as
    compiled: a phase writing a strided view of dst gets that view; one adding to it, where
    the library fuses the sum, that fused op), and says it leaves the fills and NumPy's
    sums out; in bf16 the polyphase form computed in f32, whose loop runs the f32 phases on
    f32 copies and says so. Stride 4, 1-D: an NCX phase's view of dst is spaced 4 elements
    apart along its last dim, which oneDNN 3.2 writes wrongly, so the call compiles its
    partition for a dense result (:func:`onednn_convt.strides.writable`); the loop must
    pass one too (the holdout bench's HiFi-GAN k16 s8 bf16 NCX forward failed with
    the loop passing the view)."""
    from onednn_convt import lowering
    from onednn_convt.bench import peers
    from onednn_convt.lowering import base, polyphase

    name = base.POLYPHASE if code == "f32" else base.POLYPHASE + lowering.IN_F32
    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: name if polyphase.fits(p) and p.dtype == code
                        else lowering.candidates(p)[0])
    layer = suites.Layer("t", 2, 8, 6, (5, 4), (3, 4), 2, 1) if stride == 2 else suites.Layer("t", 2, 8, 6, (5,), (8,), 4, 2)
    case = suites.Config("test", layer, op, code, fmt).build()
    case.op(*case.args)
    assert case.op.lowering.startswith("Polyphase"), case.op.lowering
    assert case.op.lowering.endswith(" (f32 emulation)") == (code != "f32"), case.op.lowering
    run, note = peers.native_runner(case)
    assert "phases only" in note
    assert ("f32 kernels only" in note) == (code != "f32"), note
    calls: list[int] = []
    plan = case.op.last_plan
    for holder in plan.plans + plan.sums:  # a phase that adds: its op fused with the sum
        if holder is not None:  # count the partition runs: each phase's loop runs k times
            real = holder.compiled
            monkeypatch.setattr(holder, "compiled", type("Counted", (), {
                "time_loop": lambda self, a, o, k, real=real: (calls.append(k), real.time_loop(a, o, k))[1]})())
    run, _ = peers.native_runner(case)
    assert run(3) >= 0.0
    assert calls == [3] * sum(p is not None for p in plan.plans) and len(calls) > 1


@pytest.fixture(scope="module")
def step_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The step suite (onednn_convt.torch against torch), a few milliseconds per row, its
    DCGAN at batch 2 (the bench's 16: 78 s of this suite on an AMD Zen3, where torch's bf16
    step alone takes 3.8 s)."""
    pytest.importorskip("torch")
    from onednn_convt.bench import training_step

    out = tmp_path_factory.mktemp("step")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(training_step.NETWORKS, "dcgan", (2, *training_step.NETWORKS["dcgan"][1:]))
        code, stdout, stderr = bench_main(["bench", "--suite", "step", "--quick", "--budget", "0.01", "--repeat", "3",
                                            "--out", str(out)])
    doc = json.loads((out / "step.json").read_text())
    return {"code": code, "out": out, "stdout": stdout, "stderr": stderr, "doc": doc}


def test_step_suite_rows_checks_and_targets(step_run: dict) -> None:
    from onednn_convt.bench import training_step

    assert step_run["code"] == 0, step_run["stdout"] + step_run["stderr"]
    doc = step_run["doc"]
    steps = {(r["network"], r["dtype"], r["layout"]) for r in doc["results"]}
    assert {r["batch"] for r in doc["results"] if r["network"] == "dcgan"} == {2}
    assert steps == {(n, d, lay) for n in ("dcgan", "small") for d in ("f32", "bf16") for lay in ("NCHW", "channels_last")}
    for r in doc["results"]:  # gradients checked against the float64 network before timing
        assert r["grad_err"] <= max(training_step.TOLERANCE[r["dtype"]], 2 * r["torch_grad_err"]), r
        assert r["vs_torch"] == pytest.approx(r["torch_ms"] / r["ours_ms"])
    assert {(r["dtype"], r["mode"]) for r in doc["calls"]} == {
        (d, m) for d in ("f32", "bf16") for m in ("inference", "training")}
    assert {(r["dtype"], r["side"]) for r in doc["weights"]} == {
        (d, s) for d in ("f32", "bf16") for s in ("onednn_convt.torch", "torch")}
    md = (step_run["out"] / "step.md").read_text()
    assert md.count("\n| dcgan |") == 4 and md.count("\n| small |") == 4
    lines = training_step.target_lines(doc["results"], doc["calls"])
    assert len(lines) == 3 and all(line in md for line in lines)


def test_step_targets_name_the_worst_row() -> None:
    from onednn_convt.bench import training_step

    def step(network: str, ratio: float, dtype: str = "f32") -> dict:
        return {"network": network, "dtype": dtype, "layout": "NCHW", "vs_torch": ratio}

    steps = [step("dcgan", 1.2), step("dcgan", 1.05, "bf16"), step("small", 1.0)]
    calls = [{"dtype": "f32", "mode": "training", "vs_torch": 0.5}, {"dtype": "bf16", "mode": "inference", "vs_torch": 0.4}]
    dcgan, small, call = training_step.target_lines(steps, calls)
    assert "worst 1.05 (bf16 NCHW): MISSED" in dcgan
    assert small.endswith(": met")
    assert "worst 2.50 (bf16 inference): MISSED" in call


def test_bias_rows_give_every_side_the_bias(tmp_path) -> None:
    """``--bias``: each forward takes a bias (keys end in /bias, the backward ops are as
    before), and ours, PyTorch's and the reference's results agree on it."""
    pytest.importorskip("torch")
    code, _, stderr = bench_main(["bench", "--suite", "tiny", "--quick", "--budget", "0.01", "--repeat", "3",
                                   "--bias", "--dtypes", "f32", "--formats", "NCX,NXC", "--out", str(tmp_path),
                                   "--name", "biased"])
    assert code == 0, stderr
    rows = json.loads((tmp_path / "biased.json").read_text())["results"]
    assert {(r["op"], r["bias"]) for r in rows} == {("fwd", True), ("bwd_d", False), ("bwd_w", False)}
    for r in rows:
        assert r["key"].endswith("/bias") == r["bias"] and "error" not in r, r
        assert r["ref_err"] < 1e-5 and r["torch_err"] < 1e-5, r
    fwd = [r for r in rows if r["bias"]]
    assert all(r["lowering"].endswith("+bias (core)") for r in fwd), fwd  # a small f32 result


def test_a_biased_config_builds_three_inputs() -> None:
    layer = suites.Layer("t", 2, 8, 6, (5, 4), (3, 4), 2, 1)
    case = suites.Config("test", layer, "fwd", "f32", "NXC", bias=True).build()
    assert case.input_names == ("src", "weights", "bias") and case.args[2].shape == (6,)
    from onednn_convt.bench import peers

    ref = peers.reference_call(case)
    assert ref is not None
    want = ref()
    got = case.op(*case.args)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    unbiased = suites.Config("test", layer, "fwd", "f32", "NXC").build()
    assert not np.allclose(unbiased.op(*unbiased.args), want, atol=1e-3)  # the bias is in the reference's


@pytest.mark.parametrize("args, message", [
    (["--budget", "nan"], "--budget: expected a positive float"),
    (["--budget", "inf"], "--budget: expected a positive float"),
    (["--repeat", "0"], "--repeat: expected a positive int"),
    (["--wait-idle", "nan"], "--wait-idle: expected a non-negative float"),
    (["--torch-limit", "-5"], "--torch-limit: expected a non-negative float"),
    (["--retry-busy", "-1"], "--retry-busy: expected a non-negative int"),
    (["--name", "../x"], "--name: expected a file name without directories"),
    (["--name", ""], "--name: expected a file name without directories"),
])
def test_bench_refuses_bad_option_values(capsys, args, message) -> None:
    with pytest.raises(SystemExit) as e:
        main(["bench", "--suite", "tiny", *args])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("suite", ["tiny", "fused", "step"])
def test_bench_refuses_an_out_it_cannot_write_before_measuring(tmp_path, capsys, monkeypatch, suite) -> None:
    from onednn_convt.bench import cli as bench_cli

    monkeypatch.setattr(bench_cli, "_meta", lambda *a: pytest.fail("started"))
    monkeypatch.setattr(bench_cli, "measure_peak_for", lambda quick: pytest.fail("measured first"))
    a_file = tmp_path / "f"
    a_file.write_text("")
    for out, why in ((a_file, "not a directory"), (a_file / "sub", "cannot create this directory")):
        assert main(["bench", "--suite", suite, "--out", str(out)]) == 2
        assert f"--out {out}: {why}" in capsys.readouterr().err


def test_bench_times_the_layers_of_a_file(tmp_path) -> None:
    """``--layers-json``: the layers of a file (tune's format) as suite ``custom``, each
    configuration checked against the reference; a malformed file is refused before any
    measuring."""
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps([{"name": "up", "n": 2, "ic": 8, "oc": 4, "spatial": [5, 5], "kernel": [4, 4],
                                   "stride": 2, "pad": 1, "groups": 2},
                                  {"name": "other", "n": 1, "ic": 3, "oc": 3, "spatial": [6], "kernel": [3]}]))
    code, stdout, stderr = bench_main(["bench", "--layers-json", str(layers), "--layers", "up", "--quick",
                                        "--budget", "0.01", "--repeat", "3", "--dtypes", "f32", "--no-torch",
                                        "--no-chart", "--out", str(tmp_path), "--name", "mine"])
    assert code == 0, stdout + stderr
    rows = json.loads((tmp_path / "mine.json").read_text())["results"]
    code, _, stderr = bench_main(["bench", "--layers-json", str(layers), "--suite", "step", "--out", str(tmp_path)])
    assert code == 2 and "--layers-json" in stderr and "step" in stderr  # not silently the step suite
    assert sorted(r["key"] for r in rows) == sorted(f"custom/up/{op}/f32/{fmt}" for op in suites.OPS
                                                    for fmt in suites.FORMATS)
    assert all(r["ref_err"] < 1e-5 and r["median_ms"] > 0 for r in rows), rows
    layers.write_text(json.dumps([{"name": "up", "n": 2, "ic": 8, "oc": 4, "spatial": [5, 5], "kernel": [4, 4],
                                   "groups": 3}]))
    code, _, stderr = bench_main(["bench", "--layers-json", str(layers), "--out", str(tmp_path)])
    assert code == 2 and "bench: --layers-json" in stderr and "divisible by groups" in stderr


def test_result_files_keep_no_machine_paths() -> None:
    """The run's argv as recorded: a file or folder option's value cut to its last part."""
    from onednn_convt.bench.cli import _without_paths

    argv = ["--layers-json", "/home/me/layers.json", "--out=/tmp/x/results/", "--compare", "old/run.json",
            "--suite", "tiny", "--name", "a/b"]
    assert _without_paths(argv) == ["--layers-json", "layers.json", "--out=results", "--compare", "run.json",
                                    "--suite", "tiny", "--name", "a/b"]


@pytest.mark.parametrize("op", ["bwd_d", "bwd_w"])
def test_the_reference_checks_gradients_of_layers_with_output_padding(op: str) -> None:
    """The gradients' reference takes no output_padding (their shapes carry it): a small
    layer with one (CycleGAN's k3 s2 op1) is checked, not an error row."""
    layer = suites.Layer("op1", 2, 6, 4, (5, 5), (3, 3), 2, 1, output_padding=1)
    opts = runner.Options(repeat=3, budget=0.01, torch=False, memory=False)
    rec = runner.run_config(suites.Config("test", layer, op, "f32", "NCX"), opts, {})
    assert "error" not in rec, rec
    assert rec["ref_err"] < 1e-5


@pytest.mark.parametrize("holds", [True, False])
def test_an_autotuned_row_is_timed_as_a_second_process_that_checks_a_change(tmp_path, monkeypatch, holds) -> None:
    """bench --autotune tunes a configuration, then times it as a second process: where the
    tuner replaced the rules' lowering, that process times the two once more (autotune.CHECKS)
    before it keeps the change, and the row records that timing (``recheck_us``)."""
    from onednn_convt.bench import cli as bench_cli
    from onednn_convt.lowering import autotune, tuning_cache

    timings: list[int] = []

    def fake_time(runs, once):  # the rules' choice 1 ms; another 0.5 ms while tuning, then 0.5 or 1.5 ms
        timings.append(len(runs))
        rule = names[0]
        other = 0.5e-3 if holds or len(timings) <= 2 else 1.5e-3
        return {name: 1e-3 if name == rule else other for name in runs}

    cfg = next(c for c in suites.configs("tiny") if c.op == "fwd" and c.dtype == "f32" and c.data_format == "NCX")
    case = cfg.build()
    names = autotune.candidates(case.op._problem(list(case.args) + [None] * (3 - len(case.args)), "f32"))
    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(tmp_path))
    tuning_cache.forget()
    was = autotune.enabled()
    try:
        tuned = bench_cli._tune(cfg)
        rec = runner.run_config(cfg, runner.Options(repeat=3, budget=0.01, torch=False, memory=False), {})
    finally:
        autotune.set_autotune(was)
        tuning_cache.forget()
    assert tuned["chosen"] != tuned["rule"] == names[0] and tuned["checks"] == 1
    # every candidate, the two confirmed, the two again in the row's first call (then the
    # row's constant-weights call tunes its own signature)
    assert timings[:3] == [len(names), 2, 2] and rec["recheck_us"][names[0]] == 1000.0
    assert rec["lowering"].endswith(f"(tuned: {tuned['chosen'] if holds else names[0]})")
    assert "error" not in rec

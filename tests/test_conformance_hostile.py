"""Hostile inputs to the conformance runner: one test per defect found by fuzzing.

The runner's contract (docs/guide/conformance.md): a malformed input is INVALID with the
file and the reason; a case the library refuses is SKIPPED or INVALID, never ERROR (ERROR is
a bug of this package); no input makes it hang, crash or exceed the memory limit, and one
bad file never stops the other cases. The inputs that hung run in a subprocess with a
generous timeout; nothing here asserts on time.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import onednn_convt
import pytest
from onednn_convt.cli import main
from onednn_convt.conformance import graph_json, report
from onednn_convt.conformance import harness as harness_module
from onednn_convt.conformance.collect import collect
from onednn_convt.conformance.model import INVALID, SKIPPED
from onednn_convt.conformance.judge import PASSED
from onednn_convt.conformance.runner import ERROR, run_case, run_cases

DATA = Path(__file__).resolve().parent / "data" / "conformance_hostile"
#: seconds a subprocess run may take before it counts as a hang (they take about one)
HANG_TIMEOUT = 120


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """(exit status, the JSON report's cases, stderr) of ``onednn-convt conformance ARGS``
    in a subprocess; a run that does not finish fails the test."""
    report = (
        Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile_{os.getpid()}_{abs(hash(args))}.json"
    )
    cmd = [sys.executable, "-m", "onednn_convt", "conformance", *args, "--json", str(report)]
    try:
        proc = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=HANG_TIMEOUT,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args)} did not finish in {HANG_TIMEOUT} s (a hang)")
    try:
        cases = json.loads(report.read_text())["cases"] if report.exists() else []
    finally:
        report.unlink(missing_ok=True)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, cases, proc.stderr


def outcomes(cases: list[dict[str, Any]]) -> list[str]:
    return [c["outcome"] for c in cases]


def run_file(path: Path | str) -> Any:
    [case] = collect([str(path)])
    return run_case(case)


# -- 1. cycles ---------------------------------------------------------------------------------


def test_cyclic_pattern_graph_is_invalid_naming_the_cycle() -> None:
    code, cases, _ = run_cli(
        str(DATA / "hang_square_selfloop.json"), str(DATA / "hang_two_op_cycle.json")
    )
    assert code == 1 and outcomes(cases) == [INVALID, INVALID]
    self_loop, two_ops = (c["message"] for c in cases)
    assert "hang_square_selfloop.json" in self_loop
    assert "cycle: op 3 (Square) takes its own output as an input" in self_loop
    assert "hang_two_op_cycle.json" in two_ops
    assert "cycle: op 1 (Add) -> op 2 (ReLU) -> op 1 (Add)" in two_ops


# -- 2. --batch bombs ------------------------------------------------------------------------


def test_self_including_batch_file_is_invalid_and_expansion_is_capped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, cases, _ = run_cli(str(DATA / "harness_bomb"), str(DATA / "harness_bomb3"))
    assert outcomes(cases) == [INVALID] * 2 + [PASSED] + [INVALID] * 3 + [PASSED]
    assert code == 1
    first = cases[0]["message"]
    assert "harness_bomb:1: --batch=harness_bomb:" in first and "is already being read" in first
    # a chain without a cycle that doubles at each level: the total is capped, not the depth
    shutil.copy(DATA / "fwd_1d.json", tmp_path)
    for level in range(12):
        (tmp_path / f"h{level}").write_text(f"--batch=h{level + 1}\n--batch=h{level + 1}\n")
    (tmp_path / "h12").write_text("--reset --mb=1,2 --case=fwd_1d.json\n")
    monkeypatch.setattr(onednn_convt.conformance.cases, "MAX_CASES", 100)
    monkeypatch.setattr(harness_module, "MAX_CASES", 100)
    found = collect([str(tmp_path / "h0")])
    assert len(found) == 101 and all(c.status is None for c in found[:100])
    assert (
        found[-1].status == INVALID
        and f"reading {tmp_path / 'h0'} stopped here" in found[-1].reason
    )
    assert "(at most 100 in all)" in found[-1].reason
    monkeypatch.setattr(onednn_convt.conformance.cases, "MAX_HARNESS_FILES", 20)
    monkeypatch.setattr(harness_module, "MAX_HARNESS_FILES", 20)
    found = collect([str(tmp_path / "h0")])
    assert found[-1].status == INVALID and "include more than 20 files" in found[-1].reason
    # a sweep whose product is over the cap is refused before it is expanded
    mbs = ",".join(str(i) for i in range(1, 200))
    (tmp_path / "harness_sweep").write_text(
        f"--reset --mb={mbs} --dt=f32,bf16 --case=fwd_1d.json\n"
    )
    [stopped] = collect([str(tmp_path / "harness_sweep")])
    assert stopped.status == INVALID and "expand to 2 x 199 x 1 x 1 cases" in stopped.reason


# -- 3. memory ------------------------------------------------------------------------------------


def test_memory_limit_is_applied_before_the_inputs_are_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, cases, _ = run_cli(str(DATA / "harness_big"), env={"ONEDNN_CONVT_MEMORY_LIMIT": "1G"})
    [big] = cases
    assert big["outcome"] == SKIPPED and code == 0
    assert "over the memory limit of 1.0 GiB" in big["message"]
    assert "inputs 381.5 MiB" in big["message"] and "output 762.9 MiB" in big["message"]
    monkeypatch.setattr(onednn_convt.limits, "_limit", 2 << 30)
    result = run_file(DATA / "runner_out_alloc_traceback.json")
    assert result.outcome == SKIPPED and "over the memory limit of 2.0 GiB" in result.message
    # sizes no process can hold are INVALID
    text = (DATA / "fwd_1d.json").read_text()
    [case] = collect(lines=["--reset --mb=2000000000 --case=fwd_1d.json"], cases_root=str(DATA))
    assert text and run_case(case).outcome == SKIPPED
    [case] = collect(
        lines=["--reset --in-shapes=0:2x4x3000000000 --case=fwd_1d.json"], cases_root=str(DATA)
    )
    result = run_case(case)
    assert result.outcome == INVALID and "a dim of 2**31 or more" in result.message


def test_running_out_of_memory_while_allocating_is_skipped_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_memory(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("Unable to allocate 9.31 GiB for an array")

    [case] = collect([str(DATA / "fwd_1d.json")])
    monkeypatch.setattr(onednn_convt.conformance.fill, "make_inputs", no_memory)
    result = run_case(case)
    assert result.outcome == SKIPPED
    assert result.message.startswith("out of memory filling the inputs")
    monkeypatch.undo()
    monkeypatch.setattr(onednn_convt.conformance.runner.np, "full", no_memory)
    result = run_case(case)
    assert result.outcome == SKIPPED and "allocating the output" in result.message


# -- 4. one bad file ---------------------------------------------------------------------------


def test_one_bad_file_is_invalid_and_the_others_run(tmp_path: Path) -> None:
    cases_dir = tmp_path / "dir"
    cases_dir.mkdir()
    shutil.copy(DATA / "fwd_1d.json", cases_dir / "a_good.json")
    graph = json.loads((DATA / "fwd_1d.json").read_text())
    text = json.dumps(graph).replace('"id": 0,', '"id": ' + "9" * 5000 + ",", 1)
    (cases_dir / "huge_int_id.json").write_text(text)
    (cases_dir / "harness_nonutf8").write_bytes(b"--reset --case=a_good.json\n\xff\xfe\n")
    (tmp_path / "inner_bad").write_bytes(b"--reset --case=x.json\n\xff\xfe\n")
    (tmp_path / "harness_outer").write_text("--batch=inner_bad\n--reset --case=dir/a_good.json\n")
    code, cases, _ = run_cli(str(cases_dir), str(tmp_path / "harness_outer"))
    assert code == 1  # errors (INVALID), not a usage error (2)
    by_location = {c["location"].rsplit("/", 1)[-1]: c for c in cases}
    assert by_location["a_good.json"]["outcome"] == PASSED
    bigint = by_location["huge_int_id.json"]
    assert (
        bigint["outcome"] == INVALID
        and "huge_int_id.json: not valid JSON here" in bigint["message"]
    )
    nonutf8 = by_location["harness_nonutf8"]
    assert nonutf8["outcome"] == INVALID and "harness_nonutf8: not UTF-8 text" in nonutf8["message"]
    batch = by_location["harness_outer:1"]
    assert batch["outcome"] == INVALID and "inner_bad: not UTF-8 text" in batch["message"]
    assert by_location["harness_outer:2"]["outcome"] == PASSED


# -- 5. deep nesting ---------------------------------------------------------------------------


def test_deeply_nested_json_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"graph": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = run_file(path)
    assert result.outcome == INVALID and "nest deeper than 32 levels" in result.message
    assert str(path) in result.message
    shallow = tmp_path / "deep40.json"  # parses, but is still deeper than any graph file
    shallow.write_text('{"graph": [], "x": ' + "[" * 40 + "]" * 40 + "}")
    result = run_file(shallow)
    assert result.outcome == INVALID and "nest deeper than 32 levels" in result.message


# -- 6. malformed tensors -------------------------------------------------------------------------


def test_rank0_weights_and_one_id_declared_as_two_tensors_are_invalid() -> None:
    result = run_file(DATA / "weights_rank0.json")
    assert result.outcome == INVALID
    assert (
        result.message
        == "weights has shape [] (rank 0); ConvTranspose takes weights of rank 4 like src"
    )
    result = run_file(DATA / "dup_tensor_id_s32.json")
    assert result.outcome == INVALID
    assert (
        "tensor 1 is f32 [1, 2, 4, 5, 3] at graph[0].inputs[1] and s32 [5] at graph[0].inputs[2]"
        in result.message
    )


def test_one_tensor_as_two_inputs_of_an_op_is_skipped(tmp_path: Path) -> None:
    graph = json.loads((DATA / "fwd_1d.json").read_text())
    op = graph["graph"][0]
    op["inputs"][1] = dict(op["inputs"][0])  # src as weights too
    path = tmp_path / "same.json"
    path.write_text(json.dumps(graph))
    result = run_file(path)
    assert (
        result.outcome == SKIPPED
        and "tensor 0 is src, weights of the ConvTranspose" in result.message
    )


# -- 7. intermediate tensors of a pattern -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pat_conv_out_shape_nonsense.json", "tensor 4 is f32 [7, 7, 7, 7] at graph[2].outputs[0]"),
        ("pat_dequant_out_u8.json", "tensor 2 is u8 [2, 4, 4, 4] at graph[0].outputs[0]"),
        ("pat_square_out_shape1_bf16.json", "tensor 5 is bf16 [1] at graph[3].outputs[0]"),
    ],
)
def test_pattern_intermediate_tensors_are_checked(name: str, reason: str) -> None:
    result = run_file(DATA / name)
    assert result.outcome == INVALID and reason in result.message


def declared_everywhere(graph: dict[str, Any], tid: int, **changes: Any) -> dict[str, Any]:
    """The graph with every entry of tensor ``tid`` changed alike (consistent, but wrong)."""
    g = copy.deepcopy(graph)
    for op in g["graph"]:
        for t in op["inputs"] + op["outputs"]:
            if t["id"] == tid:
                t.update(changes)
    return g


@pytest.mark.parametrize(
    ("tid", "changes", "reason"),
    [
        (
            4,
            {"shape": [7, 7, 7, 7]},
            "tensor 4 (the output of op 2, ConvTranspose) has shape [7, 7, 7, 7]",
        ),
        (5, {"shape": [2, 5, 5]}, "tensor 5 (the output of op 3, Square) has shape [2, 5, 5]"),
        (2, {"dtype": "u8"}, "the Dequantize (op 0) of src gives u8; Dequantize gives f32"),
        (4, {"dtype": "s32"}, "tensor 4 of the chain is s32"),
        (
            2,
            {"shape": [2, 4, 4, 3]},
            "the Dequantize (op 0) of src has input shape [2, 4, 4, 4] and output shape [2, 4, 4, 3]",
        ),
    ],
)
def test_pattern_intermediate_tensors_declared_alike_are_checked_against_the_ops(
    tmp_path: Path, tid: int, changes: dict[str, Any], reason: str
) -> None:
    good = json.loads((DATA / "hang_square_selfloop.json").read_text())
    square = next(op for op in good["graph"] if op["kind"] == "Square")
    square["outputs"][0]["id"] = 5  # the well-formed graph the reproducer was made from
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good))
    assert run_file(path).outcome == PASSED
    path.write_text(json.dumps(declared_everywhere(good, tid, **changes)))
    result = run_file(path)
    assert result.outcome == INVALID and reason in result.message, result.message


# -- 8. --dump ------------------------------------------------------------------------------------


def test_dump_refuses_huge_and_negative_shapes_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    call = 'ConvTranspose(strides=2, data_format="NCX", weights_format="IOX")'
    bwd_w = 'ConvTransposeBackwardWeights(strides=2, data_format="NCX", weights_format="IOX")'
    out = tmp_path / "case.json"
    for argv, says in [
        (
            [call, "--shapes", "100000x100000x100000x100000", "100000x4x3x3"],
            "too large to describe",
        ),
        ([call, "--shapes", "1x8x5x5", "8x4x3x" + "9" * 30], "each from 1 to 2**31 - 1"),
        ([bwd_w, "--shapes", "1x8x5x5", "1x4x11x11", "ws:-8x4x3x3"], "each from 1 to 2**31 - 1"),
        (
            [
                'ConvTranspose(pads_end=100, data_format="NCX", weights_format="IOX")',
                "--shapes",
                "1x8x5x5",
                "8x4x3x3",
            ],
            "would have an output of shape [1, 4, -93, -93]",
        ),
    ]:
        assert main(["conformance", "--dump", *argv, "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err
        assert not out.exists()
    # a huge but valid call is written without allocating it
    assert (
        main(
            [
                "conformance",
                "--dump",
                call,
                "--shapes",
                "1x8x60000x60000",
                "8x4x3x3",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    [op] = json.loads(out.read_text())["graph"]
    assert op["outputs"][0]["shape"] == [1, 4, 120001, 120001]
    assert min(min(t["shape"]) for t in op["inputs"] + op["outputs"]) >= 1


# -- the whole contract on the reproducers together -------------------------------------------


def test_no_reproducer_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onednn_convt.limits, "_limit", 1 << 30)  # harness_big is SKIPPED
    cases = collect([str(DATA)])
    assert len(cases) >= 15
    results = run_cases(cases)
    assert [r for r in results if r.outcome == ERROR] == []
    assert {r.outcome for r in results} <= {PASSED, SKIPPED, INVALID}


def test_junit_report_of_control_characters_parses(tmp_path: Path) -> None:
    """Found by the fuzzer: case lines are the files' text, control characters included."""
    harness = tmp_path / "harness_ctrl"
    harness.write_text("--reset --case=a\x01b.json\n--reset --bo\x1bgus=1\n")
    results = run_cases(collect([str(harness)]))
    assert [r.outcome for r in results] == [INVALID, INVALID]
    path = tmp_path / "report.xml"
    report.write_junit(str(path), results, 0.0)
    names = [tc.get("name") for tc in ET.parse(path).iter("testcase")]
    assert names == ["--reset --case=a\\x01b.json", "--reset --bo\\x1bgus=1"]


def test_graph_json_reading_limits(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(" " * (graph_json.MAX_JSON_BYTES + 1))
    result = run_file(big)
    assert result.outcome == SKIPPED and "at most 4194304 bytes" in result.message
    fifo = tmp_path / "harness_fifo"
    os.mkfifo(fifo)
    [case] = collect([str(fifo)])  # would block reading
    assert case.status == INVALID and "not a regular file" in case.reason
    graph = json.loads((DATA / "fwd_1d.json").read_text())
    graph["graph"][0]["inputs"][0]["shape"] = [1] * 13
    path = tmp_path / "ndims.json"
    path.write_text(json.dumps(graph))
    result = run_file(path)
    assert (
        result.outcome == INVALID and "13 dims; a logical tensor has at most 12" in result.message
    )


def test_report_paths_are_checked_before_any_case_runs(tmp_path: Path, capsys) -> None:
    """A report or dump path that cannot be written is refused up front (exit 2, a message
    naming the option), not with a traceback after the run; a missing folder is created."""
    from onednn_convt.cli import main
    from onednn_convt.conformance.collect import bundled_suite

    case = str(Path(bundled_suite()) / "cases" / "pattern_f32_eltwise.json")
    (tmp_path / "a file").write_text("")
    for option, path, says in [
        ("--junit-xml", tmp_path, "--junit-xml " + str(tmp_path) + ": expected a file name, got a directory"),
        ("--json", tmp_path / "a file" / "r.json", "--json " + str(tmp_path / "a file") + ": not a directory"),
        ("--dump-failures", tmp_path / "a file", "--dump-failures " + str(tmp_path / "a file") + ": not a directory"),
        ("--json", "", "--json: expected a file name, got ''"),
    ]:
        assert main(["conformance", case, option, str(path)]) == 2
        captured = capsys.readouterr()
        assert says in captured.err and "Traceback" not in captured.err, captured.err
        assert "passed" not in captured.out  # refused before running
    report = tmp_path / "new" / "folder" / "r.xml"
    assert main(["conformance", case, "--junit-xml", str(report)]) == 0
    assert ET.parse(report).getroot().tag in ("testsuites", "testsuite")


@pytest.mark.parametrize("jobs", ["0", "-1", "100000", "9" * 400, "two"])
def test_a_worker_count_past_the_cpus_is_refused(jobs: str, capsys) -> None:
    """-j 100000 would start that many processes; -j 0 none: both refused by the parser."""
    from onednn_convt.cli import main

    with pytest.raises(SystemExit) as e:
        main(["conformance", "--list", "-j", jobs])
    assert e.value.code == 2
    says = "a worker process count from 1 to" if jobs == "100000" else "expected a positive int"
    assert says in capsys.readouterr().err

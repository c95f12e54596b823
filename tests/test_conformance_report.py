"""The CLI's reports: summary line, exit status, JUnit XML, JSON, progress, filters, shards."""

from __future__ import annotations

import copy
import io
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import onednn_convt
import pytest
from onednn_convt.cli import main
from onednn_convt.conformance.collect import collect
from onednn_convt.conformance.report import Reporter, summary_line, tally
from onednn_convt.conformance.runner import run_cases
from test_conformance_harness import BASE
from test_conformance_runner import OffByOne

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """A harness with 2 passing, 1 skipped, 1 invalid case, and a fwd case to break."""
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    relu = copy.deepcopy(BASE)
    relu["graph"][0]["kind"] = "ReLU"
    (tmp_path / "relu.json").write_text(json.dumps(relu))
    (tmp_path / "broken.json").write_text("{")
    harness = tmp_path / "harness_mixed"
    harness.write_text(
        "--reset --case=fwd.json\n"
        "--reset --dt=f16 --op-attrs=0:auto_pad:SAME_LOWER --case=fwd.json\n"
        "--reset --case=relu.json\n"
        "--reset --case=broken.json\n"
    )
    return harness


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = main(["conformance", *args])
    return code, capsys.readouterr().out.splitlines()


def test_summary_line_and_exit_status(
    mixed: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert (
        summary_line({"passed": 3, "failed": 1, "skipped": 2, "errors": 0})
        == "3 passed, 1 failed, 2 skipped"
    )
    assert (
        summary_line({"passed": 0, "failed": 0, "skipped": 0, "errors": 4})
        == "0 passed, 0 failed, 0 skipped, 4 errors"
    )
    code, out = run_cli(capsys, str(mixed))
    assert code == 1  # an INVALID case is an error
    assert out[-1] == "2 passed, 0 failed, 1 skipped, 1 errors"
    assert (
        len([line for line in out if line.startswith(("PASSED", "SKIPPED", "INVALID"))]) == 4
    )  # one line per case
    code, out = run_cli(capsys, str(mixed), "-k", "fwd.json")
    assert code == 0 and out[-1] == "2 passed, 0 failed, 0 skipped"
    monkeypatch.setattr(onednn_convt, "ConvTranspose", OffByOne)
    code, out = run_cli(capsys, str(mixed), "-k", "fwd.json", "--dt", "f16")
    assert code == 1 and out[-1] == "0 passed, 1 failed, 0 skipped"


def test_junit_xml_and_json_counts_match(
    mixed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onednn_convt, "ConvTranspose", OffByOne)
    xml_path, json_path = tmp_path / "r.xml", tmp_path / "r.json"
    code, out = run_cli(capsys, str(mixed), "--junit-xml", str(xml_path), "--json", str(json_path))
    assert code == 1 and out[-1] == "0 passed, 2 failed, 1 skipped, 1 errors"
    root = ET.parse(xml_path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests")) == 4
    for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
        assert (
            sum(1 for c in cases if c.find(tag) is not None)
            == int(suite.get(attr))
            == int(root.get(attr))
        )
    assert cases[0].get("name") == "--reset --case=fwd.json" and cases[0].get("classname") == str(
        mixed
    ).replace("/", ".").strip(".")
    failure = cases[0].find("failure")
    assert (
        "elements differ" in failure.get("message")
        and "repro: onednn-convt conformance" in failure.text
    )
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["onednn_version"] == onednn_convt.info()["onednn_version"]
    report = json.loads(json_path.read_text())
    assert report["summary"] == {
        **report["summary"],
        "passed": 0,
        "failed": 2,
        "skipped": 1,
        "errors": 1,
        "total": 4,
    }
    assert [c["outcome"] for c in report["cases"]] == ["FAILED", "FAILED", "SKIPPED", "INVALID"]
    assert report["cases"][1]["dtype"] == "f16" and report["cases"][1]["details"]["emulated"] in (
        True,
        False,
    )


def test_unsupported_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if onednn_convt.info()["dtypes"]["ConvTranspose"]["f16"] == "native":
        pytest.skip("f16 is native on this CPU")  # pragma: no cover - not on the project's machines
    (tmp_path / "fwd.json").write_text(json.dumps(BASE))
    line = "--reset --dt=f16 --case=fwd.json"
    code, out = run_cli(capsys, "--cases-root", str(tmp_path), "--line", line, "--strict-dtypes")
    assert code == 0 and out[-1] == "0 passed, 0 failed, 1 skipped"
    assert out[0].startswith("UNSUPPORTED")
    code, out = run_cli(
        capsys,
        "--cases-root",
        str(tmp_path),
        "--line",
        line,
        "--strict-dtypes",
        "--fail-on-unsupported",
    )
    assert code == 1 and out[-1] == "0 passed, 1 failed, 0 skipped"


def test_shards_partition_the_cases(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_cli(capsys, "--list")
    assert code == 0
    everything = out[:-1]
    assert out[-1] == f"{len(everything)} cases" and len(everything) == len(collect())
    for n in (1, 2, 3, 7):
        shards = []
        for i in range(1, n + 1):
            code, out = run_cli(capsys, "--list", "--shard", f"{i}/{n}")
            shards.append(out[:-1])
        assert sorted(sum(shards, [])) == sorted(everything)  # every case exactly once
        assert max(map(len, shards)) - min(map(len, shards)) <= 1


def test_filters(capsys: pytest.CaptureFixture[str]) -> None:
    _, bf16 = run_cli(capsys, "--list", "--dt", "bf16")
    assert bf16[:-1] and all("--dt=bf16" in line or "bf16.json" in line for line in bf16[:-1])
    _, words = run_cli(capsys, "--list", "-k", "BWD_W_3D", "-k", "depthwise")
    assert words[:-1] and all("bwd_w_3d" in line or "depthwise" in line for line in words[:-1])


def test_usage_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["conformance", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["conformance", "--dt", "f64"]) == 2
    with pytest.raises(SystemExit):
        main(["conformance", "--shard", "0/2"])
    assert "shards are numbered from 1" in capsys.readouterr().err


def test_progress_bar_on_a_terminal(mixed: Path) -> None:
    cases = collect([str(mixed)])
    stream = io.StringIO()
    reporter = Reporter(len(cases), stream=stream, tty=True)
    results = run_cases(cases, on_result=lambda i, r: reporter.add(r))
    counts = reporter.finish(1.0)
    text = stream.getvalue()
    assert "\r\033[K[" in text and f"] {len(cases)}/{len(cases)}" in text
    assert "INVALID" in text and "PASSED  " not in text  # only problems are printed in full
    assert text.endswith(summary_line(counts) + "\n")
    assert counts == tally(results)


def test_dump_failures_writes_loadable_cases(
    mixed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(onednn_convt, "ConvTranspose", OffByOne)
    out_dir = tmp_path / "failures"
    code, out = run_cli(capsys, str(mixed), "-k", "f16", "--dump-failures", str(out_dir))
    assert code == 1
    [written] = sorted(out_dir.iterdir())
    monkeypatch.undo()
    # the overrides are applied in the dump: it runs alone as the same problem
    code, out = run_cli(capsys, str(written))
    assert code == 0 and out[-1] == "1 passed, 0 failed, 0 skipped"
    data: Any = json.loads(written.read_text())
    attrs = data["graph"][0]["attrs"]
    assert attrs["auto_pad"] == {"type": "string", "value": "SAME_LOWER"}
    assert {t["dtype"] for t in data["graph"][0]["inputs"]} == {"f16"}

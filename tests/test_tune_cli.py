"""``onednn-convt tune``: tunes every configuration it names into the cache file, reports the
choices, and refuses a malformed layers file with a message. The tuner runs on a fake clock
(``autotune.clock``): nothing here depends on the machine's load."""

from __future__ import annotations

import json
import os

import pytest
from helpers import benchmark_script

from onednn_convt import cli
from onednn_convt.lowering import autotune, rules, tuning_cache


class FakeClock:
    """The tuner's clock here: each reading 1 ms after the one before, so what the tuner
    measures (and chooses) does not depend on the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1e-3
        return self.now


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(autotune, "clock", FakeClock())
    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(tmp_path / "cache"))
    tuning_cache.forget()
    before = autotune.enabled()
    yield tmp_path / "cache"
    autotune.set_autotune(before)
    tuning_cache.forget()


def test_tune_a_suite(cache_dir, tmp_path, capsys):
    out = tmp_path / "choices.json"
    assert cli.main(["tune", "--suite", "tiny", "--dtypes", "f32", "--formats", "NCX", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    records = doc["records"]
    assert [r["key"] for r in records] == [f"tiny/tiny/{op}/f32/NCX" for op in ("fwd", "bwd_d", "bwd_w")]
    # the table whose choices the "rule" column holds
    assert doc["rules_table"] == {k: rules.report()[k] for k in ("table", "table_sha256", "why")}
    for r in records:  # tiny (k3 s1, groups 1): every op has several candidates
        assert r["chosen"] in r["times_us"] and r["rule"] in r["times_us"] and not r["cached"]
    cached = json.loads((cache_dir / tuning_cache.FILE_NAME).read_text())["contexts"][tuning_cache.context()]
    assert len(cached) == 3
    table = capsys.readouterr().out
    assert "tiny/tiny/fwd/f32/NCX" in table and "choices cached in" in table
    # a second run reads the cache
    assert cli.main(["tune", "--suite", "tiny", "--dtypes", "f32", "--formats", "NCX", "--json", str(out)]) == 0
    assert all(r["cached"] for r in json.loads(out.read_text())["records"])


@pytest.mark.parametrize("holds", [True, False])
def test_tune_times_each_change_again_after_the_others_so_the_cache_is_settled(cache_dir, tmp_path, monkeypatch,
                                                                                holds):
    """A change from the rules' lowering is timed a second time after every configuration
    (autotune.CHECKS), as the next process would: the cache then holds settled choices, and
    a later run of tune (or a deployed process) only reads them."""
    timings: list[list[str]] = []
    rules: set[str] = set()  # each configuration's rules' choice: first in its first timing

    def fake_time(runs, once):  # the rules' choice 1 ms; any other 0.5 ms, then 1.5 ms unless it holds
        timings.append(sorted(runs))
        rule = next((name for name in runs if name in rules), None) or next(iter(runs))
        rules.add(rule)
        rechecking = len(timings) > 6  # 3 configurations, each timed in full and confirmed first
        other = 0.5e-3 if holds or not rechecking else 1.5e-3
        return {name: 1e-3 if name == rule else other for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    out = tmp_path / "choices.json"
    argv = ["tune", "--suite", "tiny", "--dtypes", "f32", "--formats", "NCX", "--json", str(out)]
    assert cli.main(argv) == 0
    records = json.loads(out.read_text())["records"]
    assert len(timings) == 9  # each configuration: all candidates, the two confirmed, the two rechecked
    for r in records:
        assert r["settled"] and r["recheck_us"] and (r["chosen"] != r["rule"]) == holds
        assert r["checks"] == (autotune.CHECKS if holds else 0)
    assert cli.main(argv) == 0  # a second run: every choice from the cache, untimed
    assert len(timings) == 9 and all(r["cached"] for r in json.loads(out.read_text())["records"])


def test_tune_layers_from_a_file(cache_dir, tmp_path):
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps([{"name": "up", "n": 2, "ic": 8, "oc": 4, "spatial": [5, 5], "kernel": [4, 4],
                                   "stride": 2, "pad": 1}]))
    out = tmp_path / "choices.json"
    assert cli.main(["tune", "--layers-json", str(layers), "--ops", "fwd", "--dtypes", "f32,bf16",
                     "--formats", "NXC", "--json", str(out)]) == 0
    records = json.loads(out.read_text())["records"]
    assert [r["key"] for r in records] == ["custom/up/fwd/f32/NXC", "custom/up/fwd/bf16/NXC"]
    # each record carries the layer's shape (no suite names it), and the rules' generator
    # keeps its configurations as measured layers of that shape
    shape = {"n": 2, "ic": 8, "oc": 4, "groups": 1, "spatial": [5, 5], "kernel": [4, 4], "stride": 2, "pad": 1}
    assert all(r["layer"] == shape for r in records)
    from onednn_convt.lowering import rules_table

    gen = benchmark_script("make_rules")
    assert gen.main([str(out), "--out", str(tmp_path / "tables"), "--cpu", "zen9"]) == 0  # (where the run names none)
    [table] = (tmp_path / "tables").glob("*.json")
    kept = rules_table.read(table).layers
    timed = sorted(r["dtype"] for r in records if len(r.get("times_us") or {}) >= 2)
    assert [(m.layer, m.dtype, m.data_format) for m in kept] == [("custom/up", dt, "NXC") for dt in timed]
    assert all((m.n, m.ic, m.oc, m.groups, m.src, m.kernel, m.strides) == (2, 8, 4, 1, (5, 5), (4, 4), (2, 2))
               for m in kept)
    assert not any(m.phases for m in kept)  # they do not choose polyphase phases (a suite layer does)


_GOOD = {"name": "up", "n": 2, "ic": 8, "oc": 4, "spatial": [5, 5], "kernel": [4, 4], "stride": 2, "pad": 1}


@pytest.mark.parametrize("content", ["{}", "[{\"name\": \"x\"}]", "not json", "[" * 100_000,
                                     json.dumps([{**_GOOD, "n": 2.5}]), json.dumps([{**_GOOD, "ic": True}]),
                                     json.dumps([{**_GOOD, "kernel": ["4", 4]}])])
def test_a_malformed_layers_file_is_refused(cache_dir, tmp_path, capsys, content):
    layers = tmp_path / "layers.json"
    layers.write_text(content)
    assert cli.main(["tune", "--layers-json", str(layers)]) == 2
    assert "expected a JSON list of layers" in capsys.readouterr().err



@pytest.mark.parametrize(("change", "why"), [
    ({"n": -1}, "expected positive values, got n = -1"),
    ({"ic": 0}, "got ic = 0"),
    ({"stride": 0}, "got stride = 0"),
    ({"kernel": [4, 0]}, "got kernel (4, 0)"),
    ({"pad": -1}, "expected pad >= 0"),
    ({"spatial": [5]}, "spatial and kernel of the same length"),
    ({"spatial": [], "kernel": []}, "spatial and kernel of the same length"),
    ({"spatial": [5] * 4, "kernel": [4] * 4}, "spatial and kernel of the same length"),
    ({"groups": 4, "oc": 6}, "divisible by groups = 4"),
    ({"spatial": [2, 2], "pad": 9}, "non-empty output"),
    ({"n": 10**5, "ic": 4000, "spatial": [500, 500]}, "expected at most the memory limit"),
])
def test_a_layer_that_is_no_problem_is_refused_before_tuning(cache_dir, tmp_path, capsys, change, why):
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps([_GOOD, {**_GOOD, "name": "bad", **change}]))
    assert cli.main(["tune", "--layers-json", str(layers)]) == 2
    err = capsys.readouterr().err
    assert "layer 'bad'" in err and why in err
    assert not (cache_dir / "autotune.json").exists()  # nothing tuned: the good layer waits too


def test_a_json_file_that_cannot_be_written_is_refused_before_tuning(cache_dir, tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("")
    for target, why in ((a_file / "x.json", "not a directory"), (tmp_path, "expected a file name, got a directory")):
        assert cli.main(["tune", "--suite", "tiny", "--json", str(target)]) == 2
        assert why in capsys.readouterr().err
    assert not (cache_dir / "autotune.json").exists()
    out = tmp_path / "new" / "dir" / "choices.json"  # missing parents are made
    assert cli.main(["tune", "--suite", "tiny", "--dtypes", "f32", "--formats", "NCX", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["records"]


@pytest.mark.parametrize("retune", [[], ["--retune"]])
def test_a_cache_folder_that_is_a_file_is_refused_before_tuning(tmp_path, monkeypatch, capsys, retune):
    """tune's choices go to the cache file: where it cannot be written (its folder is a file),
    tune says so and tunes nothing, rather than tuning, warning and printing "choices cached"."""
    a_file = tmp_path / "f"
    a_file.write_text("")
    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(a_file))
    tuning_cache.forget()
    try:
        assert cli.main(["tune", "--suite", "tiny", *retune]) == 2
    finally:
        tuning_cache.forget()
    captured = capsys.readouterr()
    assert f"tune: the autotuning cache file (in $ONEDNN_CONVT_CACHE_DIR or the user cache directory) {a_file}: not a directory" in captured.err
    assert "choices cached" not in captured.out and a_file.read_text() == ""
    tuning_cache.clear()  # no file to delete under a file: nothing to do, no error


def test_an_endless_layers_file_is_refused_at_its_size_and_a_pipe_is_read(cache_dir, capsys):
    """/dev/zero is read to 64 MiB and refused (not until memory runs out); a pipe (as from
    the shell's <(...)) is a fair file."""
    assert cli.main(["tune", "--layers-json", "/dev/zero"]) == 2
    assert "larger than 67108864 bytes" in capsys.readouterr().err
    read, write = os.pipe()
    os.write(write, b'[{"name": "p", "n": 1, "ic": 4, "oc": 2, "spatial": [3], "kernel": [2]}]')
    os.close(write)
    try:
        assert cli.main(["tune", "--layers-json", f"/dev/fd/{read}", "--ops", "fwd", "--dtypes", "f32",
                         "--formats", "NCX"]) == 0
    finally:
        os.close(read)
    assert "custom/p/fwd/f32/NCX" in capsys.readouterr().out


def test_a_configuration_over_the_memory_limit_is_an_error_row(cache_dir, tmp_path, monkeypatch, capsys):
    """A configuration over the memory limit is an error row (exit 1), not a traceback that
    loses the others."""
    from onednn_convt import limits

    monkeypatch.setattr(limits, "_limit", 1024)  # under the tiny layer's 2 KiB forward
    out = tmp_path / "choices.json"
    assert cli.main(["tune", "--suite", "tiny", "--dtypes", "f32", "--formats", "NCX", "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "tiny/tiny/fwd/f32/NCX" in printed and "ERROR MemoryError: ConvTranspose:" in printed
    records = {r["key"]: r for r in json.loads(out.read_text())["records"]}
    assert records["tiny/tiny/fwd/f32/NCX"]["error"].startswith("MemoryError")
    assert len(records) == 3  # every op's row, each tried


def test_output_names_too_long_are_refused_before_tuning(cache_dir, tmp_path, capsys):
    """A --json name or folder past the file system's 255 bytes is refused up front (it
    raised OSError after tuning), and so is --json=-- (argparse hands over [] for it)."""
    for target in (tmp_path / ("x" * 300), tmp_path / ("x" * 300) / "c.json"):
        assert cli.main(["tune", "--suite", "tiny", "--json", str(target)]) == 2
        assert "tune: --json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--suite", "tiny", "--json=--"])
    assert e.value.code == 2 and "argument --json: expected a value, got '--'" in capsys.readouterr().err
    assert not (cache_dir / "autotune.json").exists()

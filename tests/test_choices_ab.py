"""benchmarks/choices_ab.py: the rules' choices of two checkouts dumped, the differing
configurations run forced to each side's choice and timed alternated (a fake clock here)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import benchmark_script

from onednn_convt import lowering, tune
from onednn_convt.bench import suites

LAYER = {"name": "up", "n": 2, "ic": 8, "oc": 8, "spatial": [6, 6], "kernel": [4, 4], "stride": 2, "pad": 1}
ARGS = ["--ops", "fwd", "--dtypes", "f32", "--formats", "NCX,NXC"]


@pytest.fixture
def layers(tmp_path):
    path = tmp_path / "layers.json"
    path.write_text(json.dumps([LAYER]))
    return str(path)


def test_a_dump_holds_each_configurations_rules_choice(tmp_path, layers, capsys):
    ab = _script()
    out = tmp_path / "now.json"
    assert ab.main(["dump", str(out), "--layers-json", layers, *ARGS]) == 0
    got = json.loads(out.read_text())
    assert set(got) == {"custom/up/fwd/f32/NCX", "custom/up/fwd/f32/NXC"}
    for cfg in suites.configs(suites.CUSTOM, ["fwd"], ["f32"], ["NCX", "NXC"],
                              custom=tune.layers_from_json(out.parent / "layers.json")):
        p = ab.problem(cfg)
        assert got[cfg.key]["name"] == lowering.rule(p)
    assert "wrote 2 choices" in capsys.readouterr().out


def test_only_the_differing_configurations_are_timed_each_as_its_sides_choice(tmp_path, layers, capsys, monkeypatch):
    ab = _script()
    now = tmp_path / "now.json"
    assert ab.main(["dump", str(now), "--layers-json", layers, *ARGS]) == 0
    old = json.loads(now.read_text())
    key = "custom/up/fwd/f32/NCX"
    other = next(n for n in lowering.candidates(ab.problem(_config(tmp_path, key))) if n != old[key]["name"])
    new = json.loads(now.read_text())
    new[key] = {"name": other, "described": other + " (changed)"}
    (tmp_path / "new.json").write_text(json.dumps(new))
    ran = []

    def fake_pair(cfg, a, b, forced):
        ran.append((cfg.key, a, b))
        return 0.002, 0.001

    monkeypatch.setattr(ab, "time_pair", fake_pair)
    monkeypatch.setattr(lowering, "rule", lowering.rule)  # the time command wraps it: put back after
    out = tmp_path / "ab.json"
    assert ab.main(["time", str(now), str(tmp_path / "new.json"), "--layers-json", layers, *ARGS,
                    "--json", str(out)]) == 0
    assert ran == [(key, old[key]["name"], other)]
    text = capsys.readouterr().out
    assert "1 of 2 configurations run differently" in text and "old over new: geomean 2.000 over 1" in text
    assert json.loads(out.read_text())[key]["new"] == other + " (changed)"


def test_a_forced_pair_runs_each_choice_and_alternates_them(tmp_path, layers, monkeypatch):
    ab = _script()
    cfg = _config(tmp_path, "custom/up/fwd/f32/NCX")
    a, b = lowering.candidates(ab.problem(cfg))[:2]
    monkeypatch.setattr(lowering, "rule", lowering.rule)  # force_lowerings() wraps it: put back after
    forced = ab.force_lowerings()
    made = []
    real_build = suites.Config.build

    def build(self):
        case = real_build(self)
        made.append(case.op)
        return case

    monkeypatch.setattr(suites.Config, "build", build)
    ticks = iter(np.arange(0.0, 1000.0, 0.5))  # every sample 0.5 fake seconds: the 3-round pace
    got = ab.time_pair(cfg, a, b, forced, clock=lambda: float(next(ticks)))
    assert got == (0.5, 0.5) and forced["name"] is None
    assert next(ticks) == 0.5 * 2 * (1 + 2 * 3)  # the first sample, then 3 rounds of both
    # the arrays' case, then an op planned as a, one as b
    assert [op.last_plan.lowering.name for op in made[1:]] == [a, b]
    assert lowering.rule(ab.problem(cfg)) == lowering.candidates(ab.problem(cfg))[0]  # unforced again


def _script():
    benchmark_script("table_ab")  # imported by choices_ab, from its folder
    benchmark_script("verbose_kernels")
    return benchmark_script("choices_ab")


def _config(tmp_path, key):
    return next(c for c in suites.configs(suites.CUSTOM, ["fwd"], ["f32"], ["NCX", "NXC"],
                                          custom=tune.layers_from_json(tmp_path / "layers.json")) if c.key == key)


"""benchmarks/table_ab.py: which configurations two rules tables run differently, a
polyphase lowering's phases included, and their times alternated (a fake clock here)."""

from __future__ import annotations

import json

import numpy as np
from helpers import benchmark_script

from onednn_convt import tune
from onednn_convt.bench import suites
from onednn_convt.lowering import rules_table
from onednn_convt.problem import FORWARD

LAYER = {"name": "up", "n": 2, "ic": 8, "oc": 8, "spatial": [6, 6], "kernel": [4, 4], "stride": 2, "pad": 1}


def _layer(ratios, kernel=(4, 4), strides=(2, 2), ic=8, **flags):
    return {"layer": "models/x", "op": FORWARD, "dtype": "f32", "data_format": "NCX", "n": 2, "ic": ic, "oc": 8,
            "groups": 1, "src": [6, 6], "kernel": list(kernel), "strides": list(strides), "ratios": ratios} | flags


def _table(path, *layers):
    path.write_text(json.dumps({"format": rules_table.FORMAT, "cpu": "t", "isa": "avx2", "layers": list(layers)}))
    return str(path)


def _run(tmp_path, capsys, old, new, *more):
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps([LAYER]))
    ab = benchmark_script("table_ab")
    out = tmp_path / "ab.json"
    argv = [old, new, "--layers-json", str(layers), "--ops", "fwd", "--dtypes", "f32", "--formats", "NCX",
            "--json", str(out), *more]
    assert ab.main(argv) == 0
    return capsys.readouterr().out, json.loads(out.read_text())


def test_a_changed_choice_is_listed(tmp_path, capsys):
    old = _table(tmp_path / "old.json", _layer({"ConvTranspose": 1.0, "ConvolutionBackwardData": 2.0}))
    new = _table(tmp_path / "new.json", _layer({"ConvTranspose": 2.0, "ConvolutionBackwardData": 1.0}))
    text, found = _run(tmp_path, capsys, old, new)
    assert "1 of 1 configurations run differently" in text
    assert found == {"custom/up/fwd/f32/NCX": {"old_lowering": "ConvTranspose",
                                               "new_lowering": "ConvolutionBackwardData"}}
    text, found = _run(tmp_path, capsys, old, old)
    assert "0 of 1 configurations" in text and found == {}


def test_a_moved_phase_is_listed_unless_the_layer_does_not_choose_phases(tmp_path, capsys):
    """The strided call runs polyphase under both tables; a stride-1 layer near its phases,
    added, changes the phases' lowering, and marked ``"phases": false`` does not."""
    strided = _layer({"Polyphase": 1.0, "ConvTranspose": 2.0})
    far = _layer({"ConvTranspose": 1.0, "ConvolutionBackwardData": 2.0}, kernel=(2, 2), strides=(1, 1), ic=512)
    near = _layer({"ConvTranspose": 2.0, "ConvolutionBackwardData": 1.0}, kernel=(2, 2), strides=(1, 1))
    old = _table(tmp_path / "old.json", strided, far)
    text, found = _run(tmp_path, capsys, old, _table(tmp_path / "new.json", strided, far, near))
    [(key, what)] = found.items()
    assert what["old_lowering"].startswith("Polyphase[ConvTranspose,")
    assert what["new_lowering"].startswith("Polyphase[ConvolutionBackwardData,")
    text, found = _run(tmp_path, capsys, old, _table(tmp_path / "new.json", strided, far, near | {"phases": False}))
    assert found == {}


def test_the_timing_alternates_the_two_and_takes_medians(tmp_path):
    ab = benchmark_script("table_ab")
    old = rules_table.parse({"format": 2, "cpu": "t", "isa": "avx2",
                             "layers": [_layer({"ConvTranspose": 1.0, "ConvolutionBackwardData": 2.0})]}, "old")
    new = rules_table.parse({"format": 2, "cpu": "t", "isa": "avx2",
                             "layers": [_layer({"ConvTranspose": 2.0, "ConvolutionBackwardData": 1.0})]}, "new")
    path = tmp_path / "layers.json"
    path.write_text(json.dumps([LAYER]))
    [cfg] = suites.configs(suites.CUSTOM, ["fwd"], ["f32"], ["NCX"], custom=tune.layers_from_json(path))
    ticks = iter(np.arange(0.0, 1000.0, 0.5))  # every call takes 0.5 fake seconds: the 3-round pace
    got = ab.time_pair(cfg, old, new, clock=lambda: float(next(ticks)))
    assert got == {"old": "ConvTranspose", "new": "ConvolutionBackwardData", "old_ms": 500.0, "new_ms": 500.0}
    assert next(ticks) == 0.5 * 2 * (1 + 2 * 3)  # two clock reads a call: the first, then 3 rounds of both

"""benchmarks/random_layers.py: seeded layers the tuner accepts, and the report of what the
rules' choices cost on them (from tuning records: no timing here)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers import benchmark_script

from onednn_convt import tune


def test_drawn_layers_are_seeded_valid_and_bounded(tmp_path, capsys):
    gen = benchmark_script("random_layers")
    assert gen.main(["draw", "--seed", "7", "--count", "60"]) == 0
    text = capsys.readouterr().out
    assert gen.main(["draw", "--seed", "7", "--count", "60"]) == 0
    assert capsys.readouterr().out == text  # the seed decides every layer
    path = tmp_path / "layers.json"
    path.write_text(text)
    layers = tune.layers_from_json(path)  # each one a valid problem the tuner takes
    assert len(layers) == 60 and len({x.name for x in layers}) == 60
    assert all(x.name.startswith("s7r") for x in layers)  # seeds' layers merge without clashes
    for x in layers:
        out = [(s - 1) * x.stride + k - 2 * x.pad for s, k in zip(x.spatial, x.kernel)]
        # the square size is bounded; a non-square input (halved and doubled sides) a little over
        assert x.n * max(x.ic, x.oc) * max(math.prod(x.spatial), math.prod(out)) <= 1.1 * gen.MAX_ELEMENTS, x
        assert 1 <= len(x.spatial) <= 3 and x.ic % x.groups == 0 and x.oc % x.groups == 0
    assert {gen.kind_of({"name": x.name}) for x in layers} == set(gen.KINDS)  # 60 draws: every kind
    other = [layer["name"] for layer in gen_layers(gen, 8, 60)]
    assert other != [x.name for x in layers]


def test_small_layers_are_seeded_valid_and_small(tmp_path, capsys):
    gen = benchmark_script("random_layers")
    assert gen.main(["draw", "--seed", "20", "--count", "60", "--small"]) == 0
    path = tmp_path / "small.json"
    path.write_text(capsys.readouterr().out)
    layers = tune.layers_from_json(path)
    assert len({x.name for x in layers}) == 60 and all(x.name.startswith("t20r") for x in layers)
    lo, hi = gen.MACS[True]
    for x in layers:
        out = [(s - 1) * x.stride + k - 2 * x.pad for s, k in zip(x.spatial, x.kernel)]
        macs = x.n * x.ic * (x.oc // x.groups) * math.prod(x.kernel) * math.prod(x.spatial)
        assert x.n <= gen.SMALL_BATCH and max(x.ic, x.oc) <= gen.SMALL_CHANNELS, x
        assert x.ic % x.groups == 0 and x.oc % x.groups == 0 and min(out) >= 1, x
        # the drawn work, unless the side's bounds (at least 1, at most MAX_SIDE) moved it
        assert macs <= 4 * hi and (macs >= lo / 4 or all(s == 1 for s in x.spatial)), x
    kinds = {gen.kind_of({"name": x.name}) for x in layers}
    assert kinds == set(gen.KINDS)  # halving the channels keeps each kind
    for x in layers:  # and a kind's groups
        kind = gen.kind_of({"name": x.name})
        assert (x.groups == x.ic == x.oc) == (kind == "depthwise"), x
        assert (x.groups > 1) == (kind in ("grouped", "depthwise")), x
    normal = [layer["name"] for layer in gen_layers(gen, 20, 60)]
    assert normal != [x.name for x in layers]


def test_kinds_keep_the_seeds_own_layers_of_those_kinds(capsys):
    gen = benchmark_script("random_layers")
    everything = gen_layers(gen, 9, 200)
    assert gen.main(["draw", "--seed", "9", "--count", "12", "--kinds", "grouped,one-in"]) == 0
    kept = json.loads(capsys.readouterr().out)
    wanted = [x for x in everything if "-grouped-" in x["name"] or "-one-in-" in x["name"]][:12]
    assert kept == wanted and len(kept) == 12  # the same draws, the others left out, names kept
    assert {gen.kind_of(x) for x in kept} == {"grouped", "one-in"}


def test_unknown_kinds_are_refused(capsys):
    gen = benchmark_script("random_layers")
    with pytest.raises(SystemExit) as refused:
        gen.main(["draw", "--kinds", "dense,sparse"])
    assert refused.value.code == 2
    assert "expected some of dense, grouped, depthwise, one-out, one-in, got 'dense,sparse'" in capsys.readouterr().err


def gen_layers(gen, seed, count):
    rng = np.random.default_rng(seed)
    return [gen.draw_layer(rng, seed, i) for i in range(count)]


def test_the_report_divides_the_rules_time_by_the_fastest_and_the_library_ops(tmp_path, capsys):
    gen = benchmark_script("random_layers")

    def record(key, op, rule, times):
        return {"key": key, "op": op, "rule": rule, "times_us": times}

    run = {"cpu": {"name": "Zen9"}, "isa": "avx2", "records": [
        record("custom/a/fwd/f32/NCX", "fwd", "Polyphase", {"Polyphase": 300.0, "ConvTranspose": 100.0}),
        record("custom/a/bwd_d/f32/NCX", "bwd_d", "Convolution",
               {"Convolution": 100.0, "ConvTransposeBackwardData": 200.0, "MatMul (tiles)": 100.0}),
        {"key": "custom/a/bwd_w/f32/NCX", "op": "bwd_w", "chosen": None},  # one candidate: not counted
    ]}
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(run))
    assert gen.main(["report", str(path), "--limit", "2.5"]) == 0
    out = capsys.readouterr().out
    assert "Zen9, avx2: 2 configurations" in out
    assert f"rules / fastest: geomean {math.sqrt(3.0):.3f}, worst 3.00; above 2.5: 1" in out
    assert f"rules / library op: geomean {math.sqrt(1.5):.3f}, worst 3.00, 1 above 1.10" in out
    assert "3.00x  custom/a/fwd/f32/NCX: Polyphase 0.30 ms, ConvTranspose 0.10 ms" in out

"""The measured rules table: its generator (benchmarks/make_rules.py) picks, per ISA class and
problem class, the candidate with the lowest geometric-mean time over the row's fastest;
the rules follow the table where it has the problem's class and the name can run the
problem, and the hand-written fallback elsewhere."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close

import onednn_convt as oc
from onednn_convt import guards, lowering, reference
from onednn_convt.lowering import base, rules, rules_table
from onednn_convt.problem import BACKWARD_DATA, FORWARD, SHAPE_CLASSES, TINY_FLOPS, shape_class

ROOT = Path(__file__).resolve().parents[1]
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")


def make_rules():
    spec = importlib.util.spec_from_file_location("make_rules", ROOT / "benchmarks" / "make_rules.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shape_classes():
    img, n = (16, 16), 8
    assert shape_class((16,), (8,), 1, 512, 256, (1024,), n) == "1d"
    assert shape_class((3, 3), (1, 1), 128, 128, 128, img, n) == "depthwise"
    assert shape_class((3, 3), (1, 1), 4, 128, 64, img, n) == "grouped"
    assert shape_class((2, 2), (2, 2), 1, 128, 64, img, n) == "tiled"
    assert shape_class((2, 2, 2), (2, 2, 3), 1, 32, 32, (8, 8, 8), n) == "3d"  # rank first, then the taps
    assert shape_class((3, 3, 3), (1, 1, 1), 32, 32, 32, (8, 8, 8), n) == "depthwise"
    assert shape_class((2, 2), (2, 3), 1, 64, 64, img, n) == "tiled"
    assert shape_class((4, 4), (2, 2), 1, 256, 128, img, n) == "dense"
    assert shape_class((2, 3), (2, 2), 1, 64, 64, img, n) == "dense"  # one dim overlaps
    # a small src: up to SMALL_SRC positions (DCGAN's 4x4 first layers), in any aspect
    assert shape_class((4, 4), (2, 2), 1, 512, 256, (4, 4), n) == "small"
    assert shape_class((4, 4), (2, 2), 1, 512, 256, (8, 8), n) == "small"
    assert shape_class((4, 4), (2, 2), 1, 512, 256, (1, 64), n) == "small"
    assert shape_class((4, 4), (2, 2), 1, 512, 256, (8, 9), n) == "dense"
    assert shape_class((2, 2), (2, 2), 1, 512, 256, (4, 4), n) == "tiled"  # the taps first
    # under TINY_FLOPS (2 x multiply-adds) any shape is tiny: 2*1*4*3*9*25 = 5,400
    assert shape_class((3, 3), (1, 1), 1, 4, 3, (5, 5), 1) == "tiny"
    assert shape_class((16,), (8,), 1, 4, 4, (64,), 1) == "tiny"
    assert shape_class((3, 3), (1, 1), 2, 64, 64, (16, 16), 1) == "grouped"  # 2*64*32*9*256 = 9.4M


def test_isa_classes():
    assert rules.isa_class("avx512_core_amx_fp16") == "avx512_core_amx"
    assert rules.isa_class("avx512_core_vnni") == "avx512_core"
    assert rules.isa_class("avx2_vnni") == "avx2"
    assert rules.isa_class("sse41") is None


def test_the_shipped_table_names_candidates_of_known_classes():
    names = {getattr(base, n) for n in dir(base) if n.isupper() and isinstance(getattr(base, n), str)}
    assert rules_table.TABLE, "the table is generated from tuning runs and shipped"
    for cls, entries in rules_table.TABLE.items():
        assert cls in rules.ISA_CLASSES.values()
        for (op, dtype, fmt, shape), name in entries.items():
            assert op in ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
            assert dtype in ("f32", "bf16", "f16") and fmt in ("NCX", "NXC") and shape in SHAPE_CLASSES
            assert name.removesuffix(lowering.IN_F32) in names, name


def _problem(op, x, w):
    return op._problem([x, w, None], "f32")


def test_the_rules_follow_the_table_where_it_can_run_the_problem(monkeypatch):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 32, 9, 9)).astype(np.float32), rng.standard_normal((32, 16, 4, 4)).astype(np.float32)
    cls = rules.isa_class(guards.dispatch_isa())
    if cls is None:
        pytest.skip("this ISA has no class in the table")
    key = (FORWARD, "f32", "NCX", "dense")
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)
    for name in (base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA):
        monkeypatch.setitem(rules_table.TABLE, cls, {key: name})
        op = oc.ConvTranspose(**ATTRS)
        assert lowering.rule(_problem(op, x, w)) == name
        assert_close(op(x, w), want, "f32", 32 * 16)
        assert op.lowering == name
    # a name that cannot run the problem (no stride-1 flip here): the fallback rules
    monkeypatch.setitem(rules_table.TABLE, cls, {key: base.FLIPPED_CONVOLUTION})
    op = oc.ConvTranspose(**ATTRS)
    assert lowering.rule(_problem(op, x, w)) == rules.fallback(_problem(op, x, w))
    # another class has no entry: the fallback too
    monkeypatch.setitem(rules_table.TABLE, cls, {(BACKWARD_DATA, "f32", "NCX", "dense"): base.CONVOLUTION})
    assert lowering.rule(_problem(op, x, w)) == rules.fallback(_problem(op, x, w))


def test_tiny_problems_have_their_own_class():
    """A call bound by its per-call overhead is not ruled by entries measured on large layers."""
    rng = np.random.default_rng(0)
    op = oc.ConvTranspose(**ATTRS)
    small = _problem(op, rng.standard_normal((1, 4, 5, 5)).astype(np.float32),
                     rng.standard_normal((4, 3, 4, 4)).astype(np.float32))
    assert small.flops < TINY_FLOPS and small.shape_class == "tiny"
    big = _problem(op, rng.standard_normal((2, 32, 9, 9)).astype(np.float32),
                   rng.standard_normal((32, 16, 4, 4)).astype(np.float32))
    assert big.flops >= TINY_FLOPS and big.shape_class == "dense"


def _record(op, dtype, fmt, cls, layer, times, rejected=None):
    return {"key": f"models/{layer}/{op}/{dtype}/{fmt}", "op": op, "dtype": dtype, "data_format": fmt,
            "shape_class": cls, "chosen": min(times, key=times.get), "times_us": times, "rejected": rejected or {}}


def test_the_generator_picks_the_lowest_geometric_mean(tmp_path):
    records = [
        # A wins one row by 2x, B wins the other by 1.1x: A's geomean 1.05, B's 1.41
        _record("fwd", "f32", "NCX", "dense", "one", {"A": 100.0, "B": 200.0}),
        _record("fwd", "f32", "NCX", "dense", "two", {"A": 110.0, "B": 100.0}),
        # C is fastest but refused in the other row: it cannot be the class's rule
        _record("bwd_d", "bf16", "NXC", "tiled", "one", {"C": 1.0, "D": 5.0, "E": 6.0}),
        _record("bwd_d", "bf16", "NXC", "tiled", "two", {"D": 5.0, "E": 4.5}, {"C": "refused"}),
        # one candidate (a guard's route): no entry
        {"key": "models/x/bwd_w/f16/NCX", "op": "bwd_w", "dtype": "f16", "data_format": "NCX",
         "shape_class": "1d", "chosen": None},
    ]
    run = tmp_path / "tune.json"
    run.write_text(json.dumps({"context": "oneDNN 3.2.0 x; isa avx2; threads 2; onednn-convt 0.1.0",
                               "isa": "avx2_vnni", "records": records}))
    out = tmp_path / "table.py"
    assert make_rules().main([str(run), "--out", str(out)]) == 0
    namespace: dict = {}
    exec(out.read_text(), namespace)
    assert namespace["TABLE"] == {"avx2": {
        ("ConvTranspose", "f32", "NCX", "dense"): "A",
        ("ConvTransposeBackwardData", "bf16", "NXC", "tiled"): "D",  # geomean 1.05 against E's 1.10
    }}
    assert "one, two: 1.05; next B 1.41" in out.read_text()


def test_the_generator_classes_suite_layers_by_todays_shape_class():
    """A run recorded before a class existed (the 3-D U-Net layer as "tiled") is grouped by
    the class its layer has now; a layer not in the suites keeps its recorded class."""
    gen = make_rules()
    old = _record("bwd_d", "f32", "NCX", "tiled", "conv3d", {"A": 1.0, "B": 2.0})
    assert gen.record_class(old) == "3d"
    assert gen.record_class(_record("bwd_d", "f32", "NCX", "tiled", "unet", {"A": 1.0})) == "tiled"
    assert gen.record_class(_record("bwd_d", "f32", "NCX", "dense", "one", {"A": 1.0})) == "dense"
    assert list(gen.entries([old])) == [("ConvTransposeBackwardData", "f32", "NCX", "3d")]


def test_the_generator_merges_the_runs_of_one_isa_class(tmp_path, capsys):
    """A models run and a tiny run of one ISA level make one class's entries; a
    configuration tuned in two runs of a class is refused (which one would count?)."""
    def run(name, records):
        path = tmp_path / name
        path.write_text(json.dumps({"context": "oneDNN 3.2.0 x; isa avx2; threads 2; onednn-convt 0.1.0",
                                    "isa": "avx2", "records": records}))
        return str(path)

    models = run("tune_avx2.json", [_record("fwd", "f32", "NCX", "dense", "one", {"A": 1.0, "B": 2.0})])
    tiny = run("tune_tiny_avx2.json", [
        {**_record("fwd", "f32", "NCX", "tiny", "tiny", {"A": 2.0, "B": 1.0}), "key": "tiny/tiny/fwd/f32/NCX"}])
    out = tmp_path / "table.py"
    assert make_rules().main([models, tiny, "--out", str(out)]) == 0
    namespace: dict = {}
    exec(out.read_text(), namespace)
    assert namespace["TABLE"] == {"avx2": {
        ("ConvTranspose", "f32", "NCX", "dense"): "A", ("ConvTranspose", "f32", "NCX", "tiny"): "B"}}
    again = run("again.json", [_record("fwd", "f32", "NCX", "dense", "one", {"A": 3.0, "B": 1.0})])
    assert make_rules().main([models, again, "--out", str(out)]) == 2
    assert "models/one/fwd/f32/NCX was tuned in another run" in capsys.readouterr().err

"""The measured rules table: its generator (benchmarks/make_rules.py) picks, per ISA class and
problem class, the candidate with the lowest geometric-mean time over the row's fastest;
the rules follow the table where it has the problem's class and the name can run the
problem, and the hand-written fallback elsewhere."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
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
    assert shape_class((16,), (8,), 1, 64, 16, (1024,), n) == "1d-thin"  # under THIN_CHANNELS out
    assert shape_class((3, 3), (1, 1), 128, 128, 128, img, n) == "depthwise"
    assert shape_class((4, 4), (2, 2), 128, 128, 128, img, n) == "depthwise-strided"
    assert shape_class((3, 3), (1, 1), 4, 128, 64, img, n) == "grouped"
    assert shape_class((2, 2), (2, 2), 1, 128, 64, img, n) == "tiled"
    assert shape_class((2, 2, 2), (2, 2, 3), 1, 32, 32, (8, 8, 8), n) == "3d-tiled"  # rank, then the taps
    assert shape_class((3, 3, 3), (2, 2, 2), 1, 32, 32, (8, 8, 8), n) == "3d"
    assert shape_class((3, 3, 3), (1, 1, 1), 32, 32, 32, (8, 8, 8), n) == "depthwise"  # groups before rank
    assert shape_class((2, 2), (2, 3), 1, 64, 64, img, n) == "tiled"
    assert shape_class((4, 4), (2, 2), 1, 256, 128, img, n) == "dense"
    assert shape_class((2, 3), (2, 2), 1, 64, 64, img, n) == "dense"  # one dim overlaps
    assert shape_class((3, 3), (1, 1), 1, 256, 128, img, n) == "stride1"
    assert shape_class((3, 3), (1, 1), 1, 256, 3, img, n) == "stride1"  # stride 1 before thin
    assert shape_class((4, 4), (2, 2), 1, 64, 3, img, n) == "thin"
    assert shape_class((4, 4), (2, 2), 1, 31, 64, img, n) == "thin"
    assert shape_class((4, 4), (2, 2), 1, 32, 64, img, n) == "dense"  # THIN_CHANNELS is exclusive
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


def test_the_shipped_tables_name_candidates_of_known_classes():
    names = {getattr(base, n) for n in dir(base) if n.isupper() and isinstance(getattr(base, n), str)}
    tables = rules_table.tables()
    assert tables and rules_table.default() is not None, "the tables are made from tuning runs and shipped"
    for (cpu, isa), table in [*tables.items(), (("default", "any"), rules_table.default())]:
        assert table.cpu == cpu and table.isa == isa and table.name == (cpu if cpu == "default" else f"{cpu}-{isa}")
        assert isa in rules.ISA_CLASSES.values() or cpu == "default"
        for key in ("date", "note"):
            assert table.provenance.get(key), (table.name, key)
        if cpu != "default":
            assert table.provenance["cpu_name"] and table.provenance["onednn"].startswith("3.2.0")
            assert all(src.startswith("benchmarks/results/") for src in table.provenance["sources"])
        for (op, dtype, fmt, shape), name in table.entries.items():
            assert op in ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
            assert dtype in ("f32", "bf16", "f16") and fmt in ("NCX", "NXC") and shape in SHAPE_CLASSES
            assert name.removesuffix(lowering.IN_F32) in names, name


def test_the_default_keeps_the_library_op_unless_a_rival_won_everywhere():
    """The conservative table: the op's own library op in the native dtype, except where one
    other lowering won by the margin in every native table that has the class."""
    default = rules_table.default()
    assert default is not None
    native = [t for t in rules_table.tables().values() if not t.provenance.get("capped")]
    assert set(default.provenance["made_from"]) == {t.name for t in native}
    margin = default.provenance["margin"]
    gen = make_rules()
    for key, name in default.entries.items():
        own = gen.LIBRARY_OP[key[0]]
        assert not name.endswith(lowering.IN_F32)
        if name != own:
            having = [t for t in native if key in t.scores]
            assert having and all(t.scores[key][own] >= margin * t.scores[key][name] for t in having), (key, name)


def test_tables_are_chosen_by_cpu_and_isa(monkeypatch):
    """This CPU's own table where one was measured on it at its dispatch ISA; else the
    conservative default, and info() says which and why."""
    from onednn_convt import cpu

    tables = rules_table.tables()
    (arch, isa), table = next(iter(sorted(tables.items())))
    chosen, why = rules_table.select(arch, isa)
    assert chosen is table and "this CPU's own table" in why
    chosen, why = rules_table.select("unknown", isa)
    assert chosen is rules_table.default() and "no table for unknown" in why and "conservative default" in why
    report = rules.report()
    assert set(report) == {"cpu", "table", "why", "fallback_measured_on"}
    assert report["cpu"] == cpu.detect().name


def test_a_cpu_without_a_table_gets_the_default_and_says_so():
    code = ("import json, onednn_convt as oc; r = oc.info()['rules']; "
            "print(json.dumps([r['table'], r['why'], r['cpu']]))")
    env = dict(os.environ, ONEDNN_CONVT_CPU="martian")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    table, why, name = json.loads(out.stdout)
    assert table == "default" and "no table for martian" in why and name.endswith("(ONEDNN_CONVT_CPU)")


def test_cpu_names_follow_vendor_family_and_model():
    from onednn_convt import cpu

    assert cpu.microarchitecture("AuthenticAMD", 25, 17) == "zen4"  # Genoa
    assert cpu.microarchitecture("AuthenticAMD", 25, 1) == "zen3"  # Milan
    assert cpu.microarchitecture("AuthenticAMD", 26, 2) == "zen5"  # Turin
    assert cpu.microarchitecture("GenuineIntel", 6, 143) == "sapphirerapids"
    assert cpu.microarchitecture("GenuineIntel", 6, 207) == "emeraldrapids"
    assert cpu.microarchitecture("GenuineIntel", 6, 1) == "unknown"
    assert cpu.microarchitecture("HygonGenuine", 24, 1) == "unknown"


def _problem(op, x, w):
    return op._problem([x, w, None], "f32")


def test_the_rules_follow_the_table_where_it_can_run_the_problem(monkeypatch):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 32, 9, 9)).astype(np.float32), rng.standard_normal((32, 32, 4, 4)).astype(np.float32)
    key = (FORWARD, "f32", "NCX", "dense")
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)

    def use(entries):
        table = rules_table.Table("test", "test", "test", {}, entries)
        monkeypatch.setattr(rules, "table", lambda: (table, "a test's"))

    for name in (base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA):
        use({key: name})
        op = oc.ConvTranspose(**ATTRS)
        assert lowering.rule(_problem(op, x, w)) == name
        assert_close(op(x, w), want, "f32", 32 * 16)
        assert op.lowering == name
    # a name that cannot run the problem (no stride-1 flip here): the fallback rules
    use({key: base.FLIPPED_CONVOLUTION})
    op = oc.ConvTranspose(**ATTRS)
    assert lowering.rule(_problem(op, x, w)) == rules.fallback(_problem(op, x, w))
    # another class has no entry: the fallback too
    use({(BACKWARD_DATA, "f32", "NCX", "dense"): base.CONVOLUTION})
    assert lowering.rule(_problem(op, x, w)) == rules.fallback(_problem(op, x, w))


def test_tiny_problems_have_their_own_class():
    """A call bound by its per-call overhead is not ruled by entries measured on large layers."""
    rng = np.random.default_rng(0)
    op = oc.ConvTranspose(**ATTRS)
    small = _problem(op, rng.standard_normal((1, 4, 5, 5)).astype(np.float32),
                     rng.standard_normal((4, 3, 4, 4)).astype(np.float32))
    assert small.flops < TINY_FLOPS and small.shape_class == "tiny"
    big = _problem(op, rng.standard_normal((2, 32, 9, 9)).astype(np.float32),
                   rng.standard_normal((32, 32, 4, 4)).astype(np.float32))
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
                               "cpu": {"microarchitecture": "zen9", "name": "Zen9"},
                               "isa": "avx2_vnni", "records": records}))
    assert make_rules().main([str(run), "--out", str(tmp_path), "--note", "a test"]) == 0
    table = rules_table.read(tmp_path / "zen9-avx2.json")
    assert (table.cpu, table.isa, table.provenance["cpu_name"], table.provenance["note"]) == ("zen9", "avx2", "Zen9", "a test")
    assert table.entries == {
        ("ConvTranspose", "f32", "NCX", "dense"): "A",
        ("ConvTransposeBackwardData", "bf16", "NXC", "tiled"): "D",  # geomean 1.05 against E's 1.10
    }
    assert table.scores[("ConvTranspose", "f32", "NCX", "dense")] == {"A": 1.0488, "B": 1.4142}


def test_the_generator_classes_suite_layers_by_todays_shape_class():
    """A run recorded before a class existed (the 3-D U-Net layer, k2 s2, as "tiled") is
    grouped by the class its layer has now; a layer not in the suites keeps its recorded class."""
    gen = make_rules()
    old = _record("bwd_d", "f32", "NCX", "tiled", "conv3d", {"A": 1.0, "B": 2.0})
    assert gen.record_class(old) == "3d-tiled"
    assert gen.record_class(_record("bwd_d", "f32", "NCX", "tiled", "unet", {"A": 1.0})) == "tiled"
    assert gen.record_class(_record("bwd_d", "f32", "NCX", "dense", "one", {"A": 1.0})) == "dense"
    assert [r["shape_class"] for r in gen.rules([old])] == ["3d-tiled"]


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
    out = tmp_path / "tables"
    assert make_rules().main([models, tiny, "--out", str(out), "--cpu", "zen9"]) == 0
    assert rules_table.read(out / "zen9-avx2.json").entries == {
        ("ConvTranspose", "f32", "NCX", "dense"): "A", ("ConvTranspose", "f32", "NCX", "tiny"): "B"}
    again = run("again.json", [_record("fwd", "f32", "NCX", "dense", "one", {"A": 3.0, "B": 1.0})])
    assert make_rules().main([models, again, "--out", str(out), "--cpu", "zen9"]) == 2
    assert "models/one/fwd/f32/NCX was tuned in another run" in capsys.readouterr().err
    assert make_rules().main([models, "--out", str(out)]) == 2  # no CPU named: refused


def test_the_default_generator(tmp_path):
    """A rival wins the default only by the margin on every native table with the class;
    a capped table does not count."""
    def table(name, capped, scores):
        rules = [{"op": "ConvTranspose", "dtype": "f32", "data_format": "NCX", "shape_class": cls,
                  "lowering": min(sc, key=sc.get), "rows": [], "scores": sc} for cls, sc in scores.items()]
        doc = {"format": 1, "cpu": name, "cpu_name": name, "isa": "avx2", "capped": capped, "rules": rules}
        (tmp_path / f"{name}-avx2.json").write_text(json.dumps(doc))

    table("a", False, {"dense": {"ConvTranspose": 1.3, "X": 1.0}, "tiled": {"ConvTranspose": 1.3, "X": 1.0},
                       "1d": {"ConvTranspose": 1.0, "X in f32": 1.0}})
    table("b", False, {"dense": {"ConvTranspose": 1.2, "X": 1.0}, "tiled": {"ConvTranspose": 1.05, "X": 1.0}})
    table("c", True, {"dense": {"ConvTranspose": 1.0, "X": 2.0}})  # capped: ignored
    assert make_rules().main(["--default", "--out", str(tmp_path)]) == 0
    default = rules_table.read(tmp_path / "default.json")
    assert default.cpu == "default" and default.provenance["made_from"] == ["a-avx2", "b-avx2"]
    assert default.entries == {("ConvTranspose", "f32", "NCX", "dense"): "X",  # 1.3x and 1.2x
                               ("ConvTranspose", "f32", "NCX", "tiled"): "ConvTranspose",  # 1.05x on b
                               ("ConvTranspose", "f32", "NCX", "1d"): "ConvTranspose"}  # never '... in f32'

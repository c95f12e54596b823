"""The measured rules tables: their generator (benchmarks/make_rules.py) keeps each tuned
configuration as a measured layer (and makes the default's class rules); a problem runs as
its nearest measured layers ran fastest, among the lowerings that can run it, and by the
hand-written fallback where the table cannot say."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_close, benchmark_script

import onednn_convt as oc
from onednn_convt import lowering, reference
from onednn_convt.lowering import base, depth_taps, rules, rules_table
from onednn_convt.problem import BACKWARD_DATA, FORWARD, SHAPE_CLASSES, TINY_FLOPS, shape_class

ROOT = Path(__file__).resolve().parents[1]
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")


def make_rules():
    return benchmark_script("make_rules")


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
            assert table.layers and not table.entries, table.name  # a CPU's table: measured layers
        else:
            assert table.entries and not table.layers
        ops = ("ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights")
        for (op, dtype, fmt, shape), name in table.entries.items():
            assert op in ops and dtype in ("f32", "bf16", "f16") and fmt in ("NCX", "NXC") and shape in SHAPE_CLASSES
            assert name.removesuffix(lowering.IN_F32) in names, name
        for m in table.layers:
            assert m.op in ops and m.dtype in ("f32", "bf16", "f16") and m.data_format in ("NCX", "NXC")
            assert min(m.ratios.values()) == 1.0 and len(m.ratios) >= 2, m
            assert all(n.removesuffix(lowering.IN_F32) in names for n in m.ratios), m


def test_the_default_keeps_the_library_op_unless_a_rival_won_everywhere():
    """The conservative table: the op's own library op in the native dtype, except where one
    other lowering won by the margin in every native table that has the class and whose CPU
    can run it (the native-bf16 polyphase is no candidate where bf16 is computed in f32), at
    least ``min_cpus`` of them; such a choice exists and another CPU measured the class
    without it."""
    default = rules_table.default()
    assert default is not None
    native = [t for t in rules_table.tables().values() if not t.provenance.get("capped")]
    assert set(default.provenance["made_from"]) == {t.name for t in native}
    margin = default.provenance["margin"]
    gen = make_rules()
    scored = {t.name: gen.class_scores(t.call_layers) for t in native}
    worst = {t.name: gen.class_worst(t.call_layers) for t in native}
    for key, name in default.entries.items():
        own = gen.LIBRARY_OP[key[0]]
        assert not name.endswith(lowering.IN_F32)
        if name != own:
            judges = [t for t in native if key in scored[t.name] and not gen.cannot_run(t, key, name)]
            having = [scored[t.name][key] for t in judges]
            assert len(having) >= default.provenance["min_cpus"], (key, name)
            assert all(sc[own] >= margin * sc[name] for sc in having), (key, name)
            limits = [worst[t.name][key][name] for t in judges]
            assert max(limits) <= default.provenance["row_limit"], (key, name, limits)
            for t in native:  # a CPU without the rival: only where it cannot run it
                if key in scored[t.name] and t not in judges:
                    assert key[1] == "bf16" and name == "Polyphase" and t.isa == "avx2", (key, name, t.name)


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
    assert set(report) == {"cpu", "table", "table_sha256", "why", "small_calls", "fallback_measured_on"}
    assert report["cpu"] == cpu.detect().name


def test_a_shipped_table_carries_its_files_sha256_and_a_made_one_none(monkeypatch):
    """The digest that bench and tune results record: the SHA-256 of the table's file."""
    import hashlib

    path = next(iter(sorted(rules_table.DIRECTORY.glob("*.json"))))
    assert rules_table.read(path).digest == hashlib.sha256(path.read_bytes()).hexdigest()
    chosen, _ = rules.table()
    report = rules.report()
    if chosen is not None:
        want = hashlib.sha256((rules_table.DIRECTORY / f"{chosen.name}.json").read_bytes()).hexdigest()
        assert report["table"] == chosen.name and report["table_sha256"] == want
    made = rules_table.Table("test", "test", "test", {}, {})
    monkeypatch.setattr(rules, "table", lambda: (made, "a test's"))
    assert rules.report()["table"] == "test" and rules.report()["table_sha256"] is None


def test_a_cpu_without_a_table_gets_the_default_and_says_so():
    code = ("import json, onednn_convt as oc; r = oc.info()['rules']; "
            "print(json.dumps([r['table'], r['why'], r['cpu']]))")
    env = dict(os.environ, ONEDNN_CONVT_CPU="martian")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    table, why, name = json.loads(out.stdout)
    assert table == "default" and "no table for martian" in why and name.endswith("(ONEDNN_CONVT_CPU)")


@pytest.mark.parametrize("name", ["9" * 400, "../tables/zen3", "/etc/passwd", "zen3-avx2", "a b\tc"])
def test_any_text_in_onednn_convt_cpu_is_a_cpu_without_a_table(name):
    """ONEDNN_CONVT_CPU names a table's file only where it is one's name: a name too long
    for a path (the cli fuzzer's 400 digits raised OSError from info and from every op's
    first call), a path, or a file's whole stem get the default, and ops still run."""
    code = ("import json, numpy as np, onednn_convt as oc; r = oc.info()['rules']; "
            "rng = np.random.default_rng(0); x = rng.random((1, 2, 3, 3), np.float32); "
            "w = rng.random((2, 2, 3, 3), np.float32); "
            "y = oc.ConvTranspose(data_format='NCX', weights_format='IOX')(x, w); "
            "want = oc.reference.conv_transpose(x, w, data_format='NCX', weights_format='IOX'); "
            "print(json.dumps([r['table'], r['why'], float(np.abs(y - want).max() / np.abs(want).max())]))")
    env = dict(os.environ, ONEDNN_CONVT_CPU=name)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    table, why, error = json.loads(out.stdout)
    assert table == "default" and f"no table for {name.strip().lower()} at " in why
    assert error < 1e-6  # against the float64 reference


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


def _record(op, dtype, fmt, layer, times, rejected=None, suite="models"):
    return {"key": f"{suite}/{layer}/{op}/{dtype}/{fmt}", "op": op, "dtype": dtype, "data_format": fmt,
            "shape_class": "recorded", "chosen": min(times, key=times.get), "times_us": times,
            "rejected": rejected or {}}


def _tune_run(path, records):
    """An avx2 ``onednn-convt tune --json`` file of these records, at ``path``; its name."""
    path.write_text(json.dumps({"context": "oneDNN 3.2.0 x; isa avx2; threads 2; onednn-convt 0.1.0",
                                "isa": "avx2", "records": records}))
    return str(path)


def _measured(layer, ratios, op=FORWARD, **shape):
    geometry = dict(n=8, ic=64, oc=64, groups=1, src=(16, 16), kernel=(4, 4), strides=(2, 2)) | shape
    return rules_table.Measured(layer, op, "f32", "NCX", ratios=ratios, **geometry)


def _fwd_problem(n=8, ic=64, out_channels=64, src=(16, 16), kernel=(4, 4), strides=(2, 2), groups=1):
    """A ConvTranspose problem of these sizes (pads 0)."""
    op = oc.ConvTranspose(strides=list(strides), groups=groups, data_format="NCX", weights_format="IOX")
    x = np.zeros((n, ic, *src), np.float32)
    w = np.zeros((ic, out_channels // groups, *kernel), np.float32)
    return op._problem([x, w, None], "f32")


def test_the_nearest_measured_layers_choose():
    """Among the three nearest layers of the op, dtype and data format, the candidate with the
    lowest weighted mean of log time ratios (weights 1, 1/2, 1/3 from the nearest; 2.0 where
    it was not measured) wins. ("same" layers here have the problem's features, but src
    8x32 where the problem's is 16x16: not its shape.)"""
    p = _fwd_problem()
    same = _measured("same", {"A": 1.0, "B": 1.5}, src=(8, 32))  # distance 0
    batch = _measured("batch", {"A": 1.4, "B": 1.0}, n=16)  # one doubling away
    channels = _measured("channels", {"A": 1.5, "B": 1.0}, ic=256)  # two doublings
    far = _measured("far", {"A": 9.0, "B": 1.0}, ic=4096)  # not among the three nearest
    other_op = _measured("bwd", {"A": 9.0, "B": 1.0}, op=BACKWARD_DATA)
    table = rules_table.Table("t", "t", "t", {}, layers=(far, channels, batch, same, other_op))
    # A: (log 1 + log 1.4 / 2 + log 1.5 / 3) / (11/6) = 0.165; B: log 1.5 / (11/6) = 0.221
    assert table.choose(p, ["A", "B"]) == "A"
    assert table.choose(p, ["B", "C"]) == "B"  # only what can run the problem
    assert table.choose(p, ["C"]) is None
    # the nearer layers' verdict weighs more: B twice as fast on the second and third
    table = rules_table.Table("t", "t", "t", {}, layers=(same, _measured("batch", {"A": 2.0, "B": 1.0}, n=16),
                                                         _measured("ch", {"A": 2.0, "B": 1.0}, ic=256)))
    assert table.choose(p, ["A", "B"]) == "B"  # A: (0 + 0.347 + 0.231) / (11/6) = 0.315 > B's 0.221
    # a candidate not measured on a neighbour counts as twice the fastest there: P (0.126)
    # against B (0.600); the exact neighbour's verdict is not lost to the others' gaps
    table = rules_table.Table("t", "t", "t", {}, layers=(
        _measured("same", {"P": 1.0, "A": 3.0}, src=(8, 32)), _measured("batch", {"P": 1.0, "A": 2.0}, n=16),
        _measured("ch", {"A": 1.0, "B": 1.2}, ic=256)))
    assert table.choose(p, ["P", "B"]) == "P"
    table = rules_table.Table("t", "t", "t", {}, layers=(
        _measured("same", {"F": 1.0, "C": 2.5}, src=(8, 32)), _measured("batch", {"C": 1.0, "P": 4.0}, n=16),
        _measured("ch", {"C": 1.0, "P": 1.1}, ic=256)))
    assert table.choose(p, ["C", "F"]) == "F"  # F: 0.315, C: (0.916 + 0 + 0) / (11/6) = 0.500
    assert rules_table.Table("t", "t", "t", {}).choose(p, ["A"]) is None  # no layers, no entries


def test_small_calls_choose_from_small_layers_and_larger_calls_from_larger_ones(monkeypatch):
    """A problem of at most SMALL_CALL_FLOPS chooses from the measured layers that small,
    a larger one from the larger layers, where the table holds SIDE_LAYERS on each side
    (one here); else from every layer. A polyphase phase's choice looks at every layer."""
    monkeypatch.setattr(rules_table, "SIDE_LAYERS", 1)
    big = _fwd_problem()
    small = _fwd_problem(n=1, ic=8, out_channels=8, src=(4, 4))
    assert big.flops > rules_table.SMALL_CALL_FLOPS >= small.flops
    tiny_layer = _measured("tiny", {"A": 3.0, "B": 1.0}, n=1, ic=8, oc=8, src=(4, 4), strides=(1, 2))
    big_layers = (_measured("big", {"A": 1.0, "B": 9.0}, n=16), _measured("wide", {"A": 1.0, "B": 9.0}, ic=128))
    assert tiny_layer.small_call and not any(m.small_call for m in big_layers)
    table = rules_table.Table("t", "t", "t", {}, layers=(*big_layers, tiny_layer))
    # all three, as before the split, would say A: (log 3 + 0 + 0) / (11/6) = 0.60 against
    # B's (0 + log 9 / 2 + log 9 / 3) / (11/6) = 1.00
    shape = (1, 8, 8, 1, (4, 4), (4, 4), (2, 2))
    unsplit = rules_table.nearest_choice(table.layers, ("ConvTranspose", "f32", "NCX"), shape, small.features,
                                         ["A", "B"], by_size=False)
    assert unsplit == "A"
    assert table.choose(small, ["A", "B"]) == "B"  # the small layer alone
    assert table.choose(small, ["A", "B"], phase=True) == "A"  # a phase: every layer
    assert table.choose(big, ["A", "B"]) == "A"  # the big layers alone
    # the big problem with a small layer nearer than the other side's: still its own side
    near_small = (_measured("t1", {"A": 9.0, "B": 1.0}, n=1, ic=8, oc=8, src=(4, 4)),
                  _measured("t2", {"A": 9.0, "B": 1.0}, n=2, ic=8, oc=8, src=(4, 4)))
    mixed = rules_table.Table("t", "t", "t", {}, layers=(_measured("b", {"A": 1.0, "B": 1.1}, n=16), *near_small))
    assert mixed.choose(big, ["A", "B"]) == "A"
    # no layer on the problem's side, or on the other: every layer decides
    assert rules_table.Table("t", "t", "t", {}, layers=big_layers).choose(small, ["A", "B"]) == "A"
    assert rules_table.Table("t", "t", "t", {}, layers=near_small).choose(big, ["A", "B"]) == "B"
    # fewer than SIDE_LAYERS on a side (a table whose small layers are a few suite layers)
    monkeypatch.setattr(rules_table, "SIDE_LAYERS", 2)
    assert table.choose(small, ["A", "B"]) == "A" and mixed.choose(big, ["A", "B"]) == "B"
    more = rules_table.Table("t", "t", "t", {}, layers=(*big_layers, tiny_layer, dataclasses.replace(tiny_layer, n=2)))
    assert more.choose(small, ["A", "B"]) == "B"  # two on each side: split


def test_info_says_whether_small_calls_choose_among_small_layers(monkeypatch):
    """``small_calls()`` (``info()["rules"]["small_calls"]``) tells a table that chooses a
    small call's lowering among its small layers (SIDE_LAYERS on each side of an op, dtype and
    data format) from one whose small calls may take a large layer's choice."""
    monkeypatch.setattr(rules_table, "SIDE_LAYERS", 2)
    small = [_measured(f"s{i}", {"A": 1.0}, n=1 + i, ic=8, oc=8, src=(4, 4)) for i in range(2)]
    large = [_measured(f"l{i}", {"A": 1.0}, n=16 + i) for i in range(2)]
    assert all(m.small_call for m in small) and not any(m.small_call for m in large)
    split = rules_table.Table("t", "t", "t", {}, layers=(*small, *large)).small_calls()
    assert "among its measured calls of at most 20 MFLOP (2-2 layers) for 1 of its 1 " in split
    assert "the others" not in split
    other = _measured("bwd", {"A": 1.0}, op=BACKWARD_DATA)  # a configuration with no small layer
    partly = rules_table.Table("t", "t", "t", {}, layers=(*small, *large, other)).small_calls()
    assert "for 1 of its 2 " in partly and "among all its layers for the others" in partly
    # grouped 3-D layers on oneDNN's gemm convolution choose among their own kind (nearest_choice),
    # counted apart: one small of them does not make their small calls choose among small layers
    gemm = _measured("g3d", {"A": 1.0}, n=1, ic=8, oc=8, groups=8, src=(2, 2, 2), kernel=(2, 2, 2),
                     strides=(2, 2, 2))
    assert gemm.gemm_grouped and gemm.small_call
    apart = rules_table.Table("t", "t", "t", {}, layers=(*small, *large, gemm)).small_calls()
    assert "(2-2 layers) for 1 of its 2 " in apart and "among all its layers for the others" in apart
    few = rules_table.Table("t", "t", "t", {}, layers=(small[0], *large)).small_calls()
    assert few.startswith("among all its layers: it measured at most 1 calls") and "fewer than the 2" in few
    assert "shape class" in rules_table.Table("t", rules_table.DEFAULT_NAME, "t", {}).small_calls()
    report = rules.report()
    chosen, _ = rules.table()
    assert report["small_calls"] == (None if chosen is None else chosen.small_calls())


def test_a_layer_of_the_problems_shape_decides_alone():
    """Where the table measured the problem's very shape (batch, channels, groups, src,
    kernel, strides), its fastest candidate there wins, whatever the neighbours say; two
    such layers (pads differ) weigh alike."""
    p = _fwd_problem()
    here = _measured("here", {"A": 1.0, "B": 1.2})
    outvoting = (_measured("feat", {"A": 3.0, "B": 1.0}, src=(8, 32)),
                 _measured("batch", {"A": 3.0, "B": 1.0}, n=16))
    assert rules_table.Table("t", "t", "t", {}, layers=(*outvoting, here)).choose(p, ["A", "B"]) == "A"
    # without it the neighbours decide
    assert rules_table.Table("t", "t", "t", {}, layers=outvoting).choose(p, ["A", "B"]) == "B"
    # a candidate this layer did not measure counts as twice the fastest, as elsewhere
    assert rules_table.Table("t", "t", "t", {}, layers=(*outvoting, here)).choose(p, ["B", "C"]) == "B"
    twin = _measured("here-padded", {"A": 1.5, "B": 1.0})  # A: log 1.5 / 2 = 0.203, B: log 1.2 / 2 = 0.091
    assert rules_table.Table("t", "t", "t", {}, layers=(*outvoting, here, twin)).choose(p, ["A", "B"]) == "B"


def test_phases_are_chosen_by_the_layers_that_choose_phases(monkeypatch):
    """A layer marked ``"phases": false`` (a ``tune --layers-json`` layer) chooses for
    problems, not for the stride-1 phases of a polyphase lowering: those keep the choices the
    table's polyphase times were measured with."""
    p = _fwd_problem(strides=(1, 1))
    suite = _measured("suite", {"A": 1.0, "B": 1.5}, src=(8, 32), strides=(1, 1))
    user = dataclasses.replace(_measured("user", {"A": 3.0, "B": 1.0}, strides=(1, 1)), phases=False)
    table = rules_table.Table("t", "t", "t", {}, layers=(suite, user))
    assert table.choose(p, ["A", "B"]) == "B"  # its own shape decides a problem
    assert table.choose(p, ["A", "B"], phase=True) == "A"  # but not a phase
    assert rules_table.Table("t", "t", "t", {}, layers=(user,)).choose(p, ["A", "B"], phase=True) is None
    # the polyphase lowering asks for its phases as phases, the call itself as a call
    asked = []
    monkeypatch.setattr(rules, "measured", lambda q, names, phase=False: asked.append((q.geometry.strides, phase)))
    strided = _fwd_problem()
    lowering.build(strided, base.POLYPHASE)
    assert asked and all(phase and set(st) == {1} for st, phase in asked)
    asked.clear()
    lowering.rule(strided)
    assert asked == [((2, 2), False)]


@pytest.mark.parametrize("flag", ["phases", "calls"])
def test_the_phases_and_calls_flags_are_read_strictly(tmp_path, flag):
    layer = {"layer": "custom/a", "op": FORWARD, "dtype": "f32", "data_format": "NCX", "n": 1, "ic": 2, "oc": 2,
             "groups": 1, "src": [4], "kernel": [3], "strides": [1], "ratios": {"A": 1.0}}
    doc = {"format": rules_table.FORMAT, "cpu": "c", "isa": "avx2", "layers": [layer]}
    assert getattr(rules_table.parse(doc, "t").layers[0], flag)
    assert not getattr(rules_table.parse(doc | {"layers": [layer | {flag: False}]}, "t").layers[0], flag)
    with pytest.raises(ValueError, match="rules table t: malformed"):
        rules_table.parse(doc | {"layers": [layer | {flag: "false"}]}, "t")


def test_a_replaced_record_chooses_phases_and_its_replacement_calls():
    """A configuration tuned again (``make_rules.py --remeasured``) chooses for problems by
    its new record (``"phases": false``) and for phases by the one it replaced (``"calls":
    false``): a re-tune moves no phase."""
    p = _fwd_problem(strides=(1, 1))
    old = dataclasses.replace(_measured("here", {"A": 1.0, "B": 1.5}, strides=(1, 1)), calls=False)
    new = dataclasses.replace(_measured("here", {"A": 1.5, "B": 1.0}, strides=(1, 1)), phases=False)
    table = rules_table.Table("t", "t", "t", {}, layers=(new, old))
    assert table.choose(p, ["A", "B"]) == "B"
    assert table.choose(p, ["A", "B"], phase=True) == "A"
    assert table.call_layers == (new,)


def test_the_features_order_layers_by_shape():
    """Each feature counts alike: a doubling of channels, batch or src positions is as far as
    one more spatial dim; groups, depthwise and tiled layers sit apart."""
    import math as m

    from onednn_convt.problem import features

    base_ = features((4, 4), (2, 2), 1, 64, 64, (16, 16), 8)
    assert m.dist(base_, features((4, 4), (2, 2), 1, 128, 64, (16, 16), 8)) == pytest.approx(1.0)
    assert m.dist(base_, features((4, 4), (2, 2), 1, 64, 64, (16, 32), 8)) == pytest.approx(1.0)
    assert m.dist(base_, features((4, 4), (2, 2), 1, 64, 64, (16, 16), 16)) == pytest.approx(1.0)
    depthwise = features((4, 4), (2, 2), 64, 64, 64, (16, 16), 8)
    grouped = features((4, 4), (2, 2), 4, 64, 64, (16, 16), 8)
    assert m.dist(base_, depthwise) > m.dist(base_, grouped) > 2
    assert features((2, 2), (2, 2), 1, 64, 64, (16, 16), 8)[9] == 1.0  # tiled
    assert _fwd_problem().features == base_


def test_the_rules_follow_the_nearest_layers(monkeypatch):
    """With this CPU's kind of table, the op runs what its nearest layer measured fastest, and
    the result is right either way."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 32, 9, 9)).astype(np.float32)
    w = rng.standard_normal((32, 32, 4, 4)).astype(np.float32)
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)
    for name in (base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA, base.POLYPHASE):
        layer = _measured("here", {name: 1.0, "other": 2.0}, n=2, ic=32, oc=32, src=(9, 9))
        table = rules_table.Table("test", "test", "test", {}, layers=(layer,))
        monkeypatch.setattr(rules, "table", lambda table=table: (table, "a test's"))
        op = oc.ConvTranspose(**ATTRS)
        assert lowering.rule(_problem(op, x, w)) == name
        assert_close(op(x, w), want, "f32", 32 * 16)
        assert op.lowering.startswith(name)


def test_the_generator_keeps_each_configuration_as_a_measured_layer(tmp_path, capsys):
    records = [
        _record("fwd", "f32", "NCX", "dcgan1", {"A": 100.0, "B": 200.0}),
        _record("bwd_d", "bf16", "NXC", "unet", {"D": 5.0, "E": 4.0}, {"C": "refused"}),
        # one candidate (a guard's route): left out
        {"key": "models/hifigan/bwd_w/f16/NCX", "op": "bwd_w", "dtype": "f16", "data_format": "NCX",
         "shape_class": "1d", "chosen": None},
        _record("fwd", "f32", "NCX", "gone", {"A": 1.0, "B": 2.0}),  # a layer no suite has today
    ]
    run = tmp_path / "tune.json"
    run.write_text(json.dumps({"context": "oneDNN 3.2.0 x; isa avx2; threads 2; onednn-convt 0.1.0",
                               "cpu": {"microarchitecture": "zen9", "name": "Zen9"},
                               "isa": "avx2_vnni", "records": records}))
    assert make_rules().main([str(run), "--out", str(tmp_path), "--note", "a test"]) == 0
    assert "models/gone/fwd/f32/NCX: no such suite layer today" in capsys.readouterr().err
    table = rules_table.read(tmp_path / "zen9-avx2.json")
    assert (table.cpu, table.isa, table.provenance["cpu_name"], table.provenance["note"]) == ("zen9", "avx2", "Zen9", "a test")
    from onednn_convt.bench import suites

    dcgan1 = next(x for x in suites.layers("models") if x.name == "dcgan1")
    assert [(m.layer, m.op, m.dtype, m.data_format, m.ratios) for m in table.layers] == [
        ("models/dcgan1", FORWARD, "f32", "NCX", {"A": 1.0, "B": 2.0}),
        ("models/unet", BACKWARD_DATA, "bf16", "NXC", {"D": 1.25, "E": 1.0}),
    ]
    m = table.layers[0]
    assert (m.n, m.ic, m.oc, m.groups, m.src, m.kernel, m.strides) == (
        dcgan1.n, dcgan1.ic, dcgan1.oc, dcgan1.groups, dcgan1.spatial, dcgan1.kernel, (dcgan1.stride,) * 2)


def test_the_generator_counts_the_tuners_second_timing(tmp_path):
    """Where the tuner timed a rival of the rules' choice again (``confirm_us``), those two
    candidates count their second times, in one run and merged over repeats."""
    def run(name, records):
        return _tune_run(tmp_path / name, records)

    stalled = _record("fwd", "f32", "NCX", "dcgan1", {"A": 10.0, "B": 4.0, "C": 5.0})
    stalled["confirm_us"] = {"A": 4.0, "B": 4.4}  # A's first timing stalled; B did not beat it
    out = tmp_path / "tables"
    assert make_rules().main([run("one.json", [stalled]), "--out", str(out), "--cpu", "zen9"]) == 0
    assert [m.ratios for m in rules_table.read(out / "zen9-avx2.json").layers] == [{"A": 1.0, "B": 1.1, "C": 1.25}]
    again = _record("fwd", "f32", "NCX", "dcgan1", {"A": 6.0, "B": 3.0, "C": 3.0})
    third = _record("fwd", "f32", "NCX", "dcgan1", {"A": 2.0, "B": 8.0, "C": 4.0})
    assert make_rules().main([run("one.json", [stalled]), run("again.json", [again]), run("third.json", [third]),
                              "--repeats", "--out", str(out), "--cpu", "zen9"]) == 0
    # middle of three: A of (4, 6, 2) 4, B of (4.4, 3, 8) 4.4, C of (5, 3, 4) 4
    assert [m.ratios for m in rules_table.read(out / "zen9-avx2.json").layers] == [{"A": 1.0, "B": 1.1, "C": 1.0}]


def test_class_scores_are_geometric_means_over_the_class():
    gen = make_rules()
    layers = (
        # A wins one layer by 2x, B the other by 1.1x: A's geomean 1.05, B's 1.41
        _measured("one", {"A": 1.0, "B": 2.0}), _measured("two", {"A": 1.1, "B": 1.0}, n=16),
        # C ran on one layer of the class only: no score
        _measured("t1", {"C": 1.0, "D": 5.0}, kernel=(2, 2)), _measured("t2", {"D": 1.0}, kernel=(2, 2), n=16),
    )
    assert gen.class_scores(layers) == {
        (FORWARD, "f32", "NCX", "dense"): {"A": 1.0488, "B": 1.4142},
        (FORWARD, "f32", "NCX", "tiled"): {"D": 1.0},
    }


def test_the_generator_merges_the_runs_of_one_isa_class(tmp_path, capsys):
    """A models run and a tiny run of one ISA level make one table; a configuration tuned in
    two runs of a class is refused (which one would count?), unless --repeats merges them:
    each candidate its higher time of two (a choice must hold in both), its middle time of
    three (one run's stall does not decide), one timed once its one time."""
    def run(name, records):
        return _tune_run(tmp_path / name, records)

    models = run("tune_avx2.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 1.0, "B": 2.0})])
    tiny = run("tune_tiny_avx2.json", [_record("fwd", "f32", "NCX", "tiny", {"A": 2.0, "B": 1.0}, suite="tiny")])
    out = tmp_path / "tables"
    assert make_rules().main([models, tiny, "--out", str(out), "--cpu", "zen9"]) == 0
    assert [m.layer for m in rules_table.read(out / "zen9-avx2.json").layers] == ["models/dcgan1", "tiny/tiny"]
    again = run("again.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 3.0, "B": 1.0})])
    assert make_rules().main([models, again, "--out", str(out), "--cpu", "zen9"]) == 2
    assert "models/dcgan1/fwd/f32/NCX was tuned in another run" in capsys.readouterr().err
    assert make_rules().main([models, "--out", str(out)]) == 2  # no CPU named: refused
    again = run("again.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 3.0, "B": 1.5, "C": 4.0})])
    assert make_rules().main([models, again, "--repeats", "--out", str(out), "--cpu", "zen9"]) == 0
    assert [m.ratios for m in rules_table.read(out / "zen9-avx2.json").layers] == [{"A": 1.5, "B": 1.0, "C": 2.0}]
    third = run("third.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 1.0, "B": 1.0})])
    assert make_rules().main([models, again, third, "--repeats", "--out", str(out), "--cpu", "zen9"]) == 0
    assert [m.ratios for m in rules_table.read(out / "zen9-avx2.json").layers] == [{"A": 1.0, "B": 1.5, "C": 4.0}]
    # runs made after a change to the code replace the earlier records of their
    # configurations for calls (B got faster: its old times no longer count there), and
    # merge among themselves; the earlier records, merged, still choose phases: a polyphase
    # time was measured with the phases they chose
    new = run("new.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 3.0, "B": 0.5})])
    new2 = run("new2.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 2.0, "B": 1.0})])
    assert make_rules().main([models, again, tiny, "--repeats", "--remeasured", new, "--remeasured", new2,
                              "--out", str(out), "--cpu", "zen9"]) == 0
    table = rules_table.read(out / "zen9-avx2.json")
    assert [(m.layer, m.ratios, m.calls, m.phases) for m in table.layers] == [
        ("models/dcgan1", {"A": 3.0, "B": 1.0}, True, False),
        ("models/dcgan1", {"A": 1.5, "B": 1.0, "C": 2.0}, False, True),
        ("tiny/tiny", {"A": 2.0, "B": 1.0}, True, True)]
    assert [m.layer for m in table.call_layers] == ["models/dcgan1", "tiny/tiny"]
    assert table.call_layers[0].ratios == {"A": 3.0, "B": 1.0}
    assert table.provenance["sources"][-2:] == [new, new2]
    # a run made after B's own code changed again supersedes the earlier re-tunes of its
    # configurations (they timed the old B) rather than merging with them; it still merges
    # with the runs that supersede alongside it
    newer = run("newer.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 2.0, "B": 0.25})])
    newer2 = run("newer2.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 2.0, "B": 0.25})])
    assert make_rules().main([models, again, tiny, "--repeats", "--remeasured", new, "--remeasured", new2,
                              "--supersede", newer, "--supersede", newer2, "--out", str(out), "--cpu", "zen9"]) == 0
    table = rules_table.read(out / "zen9-avx2.json")
    assert [(m.layer, m.ratios, m.calls, m.phases) for m in table.layers] == [
        ("models/dcgan1", {"A": 8.0, "B": 1.0}, True, False),  # merged with new and new2: A 4.0
        ("models/dcgan1", {"A": 1.5, "B": 1.0, "C": 2.0}, False, True),
        ("tiny/tiny", {"A": 2.0, "B": 1.0}, True, True)]
    assert table.provenance["sources"][-2:] == [newer, newer2]
    # --retuned-phases: the new records choose phases too, the earlier ones are dropped (the
    # Zen3 and Zen5 tables were made so)
    assert make_rules().main([models, again, tiny, "--repeats", "--remeasured", new, "--remeasured", new2,
                              "--retuned-phases", "--out", str(out), "--cpu", "zen9"]) == 0
    table = rules_table.read(out / "zen9-avx2.json")
    assert [(m.layer, m.ratios, m.calls, m.phases) for m in table.layers] == [
        ("models/dcgan1", {"A": 3.0, "B": 1.0}, True, True), ("tiny/tiny", {"A": 2.0, "B": 1.0}, True, True)]


def test_the_default_generator(tmp_path):
    """A rival wins the default only by the margin on every native table with the class, and
    only where two tables or more have it; a capped table does not count."""
    def table(name, capped, layers):
        doc = {"format": rules_table.FORMAT, "cpu": name, "cpu_name": name, "isa": "avx2", "capped": capped,
               "layers": [{"layer": f"s/{i}", "op": "ConvTranspose", "dtype": "f32", "data_format": "NCX",
                           "n": 8, "ic": 64, "oc": oc_, "groups": 1, "src": [16, 16], "kernel": k, "strides": [2, 2],
                           "ratios": r} for i, (k, oc_, r) in enumerate(layers)]}
        (tmp_path / f"{name}-avx2.json").write_text(json.dumps(doc))

    dense, tiled = [4, 4], [2, 2]
    table("a", False, [(dense, 64, {"ConvTranspose": 1.3, "X": 1.0}), (tiled, 64, {"ConvTranspose": 1.3, "X": 1.0}),
                       (dense, 8, {"ConvTranspose": 1.3, "X in f32": 1.0, "X": 1.0})])  # "thin": 8 channels out
    table("b", False, [(dense, 64, {"ConvTranspose": 1.2, "X": 1.0}), (tiled, 64, {"ConvTranspose": 1.05, "X": 1.0})])
    table("c", True, [(dense, 64, {"ConvTranspose": 1.0, "X": 2.0})])  # capped: ignored
    assert make_rules().main(["--default", "--out", str(tmp_path)]) == 0
    default = rules_table.read(tmp_path / "default.json")
    assert default.cpu == "default" and default.provenance["made_from"] == ["a-avx2", "b-avx2"]
    assert default.entries == {("ConvTranspose", "f32", "NCX", "dense"): "X",  # 1.3x and 1.2x
                               ("ConvTranspose", "f32", "NCX", "tiled"): "ConvTranspose",  # 1.05x on b
                               ("ConvTranspose", "f32", "NCX", "thin"): "ConvTranspose"}  # a alone; never '... in f32'


def test_the_default_keeps_the_library_op_where_a_rival_lost_one_layer(tmp_path):
    """A rival that won a class on the mean (1.14x and 1.3x) but took 1.15x the library op's
    time on one of its layers does not win it by default; with a looser --row-limit it does."""
    for name, layers in (("a", [{"ConvTranspose": 1.5, "X": 1.0}, {"ConvTranspose": 1.0, "X": 1.15}]),
                         ("b", [{"ConvTranspose": 1.3, "X": 1.0}])):
        doc = {"format": rules_table.FORMAT, "cpu": name, "cpu_name": name, "isa": "avx2", "capped": False,
               "layers": [{"layer": f"s/{i}", "op": "ConvTranspose", "dtype": "f32", "data_format": "NCX",
                           "n": 8, "ic": 64, "oc": 64, "groups": 1, "src": [16, 16], "kernel": [4, 4],
                           "strides": [2, 2], "ratios": r} for i, r in enumerate(layers)]}
        (tmp_path / f"{name}-avx2.json").write_text(json.dumps(doc))
    key = ("ConvTranspose", "f32", "NCX", "dense")
    assert make_rules().main(["--default", "--out", str(tmp_path)]) == 0
    assert rules_table.read(tmp_path / "default.json").entries == {key: "ConvTranspose"}
    assert make_rules().main(["--default", "--out", str(tmp_path), "--row-limit", "1.2"]) == 0
    assert rules_table.read(tmp_path / "default.json").entries == {key: "X"}


def test_rules_cv_scores_choices_made_without_the_layer(tmp_path):
    """benchmarks/rules_cv.py: each fit configuration is chosen by the other layers (leave one
    out), each holdout one by the fit, and scored by the chosen candidate's time over the
    fastest's on the configuration itself; a configuration tuned twice keeps the upper median."""
    def run(name, records):
        path = tmp_path / name
        path.write_text(json.dumps({"context": "oneDNN 3.2.0 x; isa avx2; threads 2", "isa": "avx2",
                                    "records": records}))
        return str(path)

    fit = run("fit.json", [_record("fwd", "f32", "NCX", "dcgan1", {"A": 1.0, "B": 3.0}),
                           _record("fwd", "f32", "NCX", "dcgan2", {"A": 2.0, "B": 1.0})])
    again = run("again.json", [_record("fwd", "f32", "NCX", "dcgan2", {"A": 1.0, "B": 1.5})])
    held = run("held.json", [_record("fwd", "f32", "NCX", "tiny", {"A": 4.0, "B": 1.0}, suite="tiny")])
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "rules_cv.py"), fit, again, "--holdout", held],
                         capture_output=True, text=True, check=True).stdout
    # dcgan2 merged: A 2.0 and 1.0 -> 2.0, B 1.0 and 1.5 -> 1.5: B fastest (A 1.33x). Left out,
    # dcgan1 is chosen by dcgan2 (B: 3x its fastest), dcgan2 by dcgan1 (A: 1.33x)
    assert "leave one layer out (fit): 2 configurations, chosen over fastest: geomean 2.000, above 1.5x 1, above 2x 1" in out
    assert "3.00  models/dcgan1 ConvTranspose f32 NCX: B (fastest A)" in out
    # the holdout's layer, chosen by both fit layers (dcgan2 the nearer: A), at 4x its fastest
    assert "holdout (chosen by the fit): 1 configurations, chosen over fastest: geomean 4.000" in out


def test_a_cpu_that_cannot_run_a_rival_has_no_say_on_it(tmp_path):
    """The native-bf16 polyphase lowering is no candidate where bf16 is computed in f32 (an
    AVX2 table offers "Polyphase in f32" instead): such a table neither vetoes it nor counts
    for it; a table at an ISA that runs it but did not time it (one older than the lowering)
    still vetoes."""
    def table(name, isa, ratios):
        doc = {"format": rules_table.FORMAT, "cpu": name, "cpu_name": name, "isa": isa, "capped": False,
               "layers": [{"layer": "s/0", "op": "ConvTranspose", "dtype": "bf16", "data_format": "NXC",
                           "n": 8, "ic": 64, "oc": 64, "groups": 1, "src": [16, 16], "kernel": [4, 4],
                           "strides": [2, 2], "ratios": ratios}]}
        (tmp_path / f"{name}-{isa}.json").write_text(json.dumps(doc))

    key = ("ConvTranspose", "bf16", "NXC", "dense")
    table("a", "avx512_core_bf16", {"ConvTranspose": 2.0, "Polyphase": 1.0})
    table("b", "avx512_core_bf16", {"ConvTranspose": 1.5, "Polyphase": 1.0})
    table("z", "avx2", {"ConvTranspose": 1.0, "Polyphase in f32": 1.2})  # bf16 in f32: no native polyphase
    assert make_rules().main(["--default", "--out", str(tmp_path)]) == 0
    assert rules_table.read(tmp_path / "default.json").entries[key] == "Polyphase"
    table("old", "avx512_core_amx", {"ConvTranspose": 1.0, "ConvolutionBackwardData": 1.1})  # could run it, did not time it
    assert make_rules().main(["--default", "--out", str(tmp_path)]) == 0
    assert rules_table.read(tmp_path / "default.json").entries[key] == "ConvTranspose"


def _gemm_problem(op_name, fmt, groups, channels, kernel, strides, code="f32"):
    """A 3-D problem of ``op_name`` with ``groups`` groups of ``channels`` in and out (pads 0)."""
    wf = "IOX" if fmt == "NCX" else "XOI"
    attrs = dict(strides=list(strides), groups=groups, data_format=fmt, weights_format=wf)
    src = (6, 5, 6)
    dst = tuple(s * (x - 1) + k for x, k, s in zip(src, kernel, strides))
    c = groups * channels

    def act(sp):
        return np.zeros((2, c, *sp) if fmt == "NCX" else (2, *sp, c), np.float32)

    ws = (c, channels, *kernel) if wf == "IOX" else (*kernel, channels, c)
    if op_name == "fwd":
        return oc.ConvTranspose(**attrs)._problem([act(src), np.zeros(ws, np.float32), None], code)
    if op_name == "bwd_d":
        return oc.ConvTransposeBackwardData(**attrs)._problem([act(dst), np.zeros(ws, np.float32)], code)
    return oc.ConvTransposeBackwardWeights(**attrs)._problem([act(src), act(dst), np.array(ws)], code)


@pytest.mark.parametrize("table_name", ["this CPU's", "default", "none", *sorted(f"{c}-{i}" for c, i in
                                                                           rules_table.tables())])
def test_gemm_grouped_3d_layers_run_the_library_op(table_name, monkeypatch):
    """A grouped 3-D layer that oneDNN 3.2 runs on its gemm convolution (channels per group
    not a multiple of 8, depthwise among them) runs the library's own op under every
    table that measured no such layer: the 2-D layers' choices lost up to 4.8x there (the
    rules' docstring). A table that measured some (Zen3's random layers) chooses from their
    candidates alone. 8 channels per group are ruled as before. A depthwise one runs its
    depth taps where their rule chooses them (lowering.depth_taps), whatever the table."""
    if table_name == "default":
        monkeypatch.setattr(rules, "table", lambda: (rules_table.default(), "a test's"))
    elif table_name == "none":
        monkeypatch.setattr(rules, "table", lambda: (None, "a test's"))
    elif table_name != "this CPU's":
        cpu_name, isa = table_name.split("-", 1)
        monkeypatch.setattr(rules, "table", lambda: (rules_table.tables()[(cpu_name, isa)], "a test's"))
    own = {"fwd": base.CONV_TRANSPOSE, "bwd_d": base.CONV_TRANSPOSE_BACKWARD_DATA,
           "bwd_w": base.CONV_TRANSPOSE_BACKWARD_WEIGHTS}
    for op_name in own:
        for fmt in ("NCX", "NXC"):
            for groups, channels in ((16, 1), (8, 2), (4, 12)):
                for kernel, strides in (((4, 4, 4), (2, 2, 2)), ((3, 3, 3), (1, 1, 1)), ((4, 4, 4), (4, 4, 4))):
                    p = _gemm_problem(op_name, fmt, groups, channels, kernel, strides)
                    assert p.gemm_grouped
                    table, _ = rules.table()
                    kind = {n for m in (table.layers if table else ()) if m.gemm_grouped
                            and (m.op, m.dtype, m.data_format) == (p.op, p.dtype, p.data_format) for n in m.ratios}
                    taps = depth_taps.choice(p, lowering.candidates(p))  # measured apart, before the tables
                    if taps is not None:
                        assert lowering.rule(p) == taps == base.DEPTH_TAPS, (op_name, fmt, groups, kernel)
                    elif kind:
                        assert lowering.rule(p) in kind, (op_name, fmt, groups, channels, kernel)
                    else:
                        assert lowering.rule(p) == own[op_name], (op_name, fmt, groups, channels, kernel)
            assert not _gemm_problem(op_name, fmt, 4, 8, (4, 4, 4), (2, 2, 2)).gemm_grouped
            assert not _gemm_problem(op_name, fmt, 1, 3, (4, 4, 4), (2, 2, 2)).gemm_grouped


def test_measured_gemm_grouped_layers_rule_their_kind_only():
    """The nearest-layers rules choose for a gemm-run grouped 3-D problem from measured
    layers of that kind alone (none: no say), and leave those layers out of every other
    problem's neighbours."""
    p = _gemm_problem("fwd", "NCX", 64, 1, (4, 4, 4), (2, 2, 2))
    dw_2d = _measured("dw2d", {"A": 1.0, "B": 3.0}, groups=64, ic=64, oc=64)
    assert rules_table.Table("t", "t", "t", {}, layers=(dw_2d,)).choose(p, ["A", "B"]) is None
    dw_3d = _measured("dw3d", {"A": 2.0, "B": 1.0}, groups=64, ic=64, oc=64, src=(6, 5, 6), kernel=(4, 4, 4),
                      strides=(2, 2, 2))
    assert rules_table.Table("t", "t", "t", {}, layers=(dw_2d, dw_3d)).choose(p, ["A", "B"]) == "B"
    dw_2d_problem = _fwd_problem(groups=64)
    assert rules_table.Table("t", "t", "t", {}, layers=(dw_2d, dw_3d)).choose(dw_2d_problem, ["A", "B"]) == "A"
    assert rules_table.Table("t", "t", "t", {}, layers=(dw_3d,)).choose(dw_2d_problem, ["A", "B"]) is None
    classes = rules_table.Table("t", "t", "t", {}, {(FORWARD, "f32", "NCX", "depthwise-strided"): "A"})
    assert classes.choose(p, ["A", "B"]) is None
    assert classes.choose(dw_2d_problem, ["A", "B"]) == "A"


def test_make_tables_remakes_every_shipped_table(tmp_path):
    """benchmarks/make_tables.sh, run on the tuning runs kept in benchmarks/results/, writes
    every shipped table byte for byte: a table is its runs and the script's line for them (the
    Zen4 table's re-tunes had been merged by hand, and the script made another table)."""
    script = (ROOT / "benchmarks" / "make_tables.sh").read_text(encoding="utf-8")
    line = 'MAKE="python benchmarks/make_rules.py"'
    assert line in script
    script = script.replace(line, f'MAKE="{sys.executable} benchmarks/make_rules.py --out {tmp_path}"')
    done = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    shipped = sorted(p.name for p in rules_table.DIRECTORY.glob("*.json"))
    assert sorted(p.name for p in tmp_path.glob("*.json")) == shipped
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (rules_table.DIRECTORY / name).read_bytes(), name

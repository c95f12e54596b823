"""The inference runtimes the bench compares with (``onednn-convt bench --peers``): each
peer's graph computes the configuration's op (checked against the float64 reference on
layers with groups, asymmetric pads, dilation, output_padding, a bias, in 1-D to 3-D), the
configurations they cannot run say why, and a bench run records and reports them.
Timings are never asserted. Skipped where ONNX Runtime or OpenVINO is not installed."""

from __future__ import annotations

import json

import pytest
from helpers import bench_main
from onednn_convt.bench import inference_peers, inference_report, peers, suites

LAYERS = [
    suites.Layer("one-d", 2, 8, 6, (5,), (3,), 2, 1),
    suites.Layer("grouped-asym", 2, 8, 12, (5, 6), (4, 3), 2, 1, groups=4, pad_end=2),
    suites.Layer("dilated-3d", 1, 6, 4, (3, 4, 5), (3, 3, 3), 2, 1, dilation=2, output_padding=1),
    suites.Layer("stride3-op2", 2, 4, 4, (7, 7), (3, 3), 3, 1, output_padding=2, groups=2),
    suites.Layer("depthwise", 2, 16, 16, (6, 6), (4, 4), 2, 1, groups=16),
]

#: the largest difference from the float64 reference, over the largest |value|, per dtype:
#: each peer returns f32; OpenVINO's bf16 kernels accumulate in f32, and round their result
#: to bf16 where a reorder to the output's layout follows (NXC)
TOLERANCE = {"f32": 1e-5, "bf16": 1e-2}


def _installed(peer: str) -> None:
    absent = inference_peers.missing(peer)
    if absent is not None:
        pytest.skip(f"{peer}: {absent}")


#: (peer, dtype, data format) that each peer runs: ONNX Runtime NCX f32 alone (the refusals
#: of the others are tested below)
RUNS = [("onnxruntime", "f32", "NCX")] + [("openvino", dtype, fmt) for dtype in ("f32", "bf16") for fmt in ("NCX", "NXC")]


@pytest.mark.parametrize("peer, dtype, fmt", RUNS)
@pytest.mark.parametrize("layer", LAYERS, ids=lambda lay: lay.name)
@pytest.mark.parametrize("op, bias", [("fwd", False), ("fwd", True), ("bwd_d", False)])
def test_a_peer_computes_the_op(peer: str, layer: suites.Layer, op: str, bias: bool, dtype: str, fmt: str) -> None:
    _installed(peer)
    cfg = suites.Config("test", layer, op, dtype, fmt, bias)
    why = inference_peers.unfit(peer, cfg)
    if why is not None:  # only a CPU whose OpenVINO plugin lacks bf16
        assert "capabilities" in why, why
        pytest.skip(why)
    case = cfg.build()
    expected = peers.reference_call(case)()
    got = inference_peers.call(peer, case, 2).run()
    assert got.shape == expected.shape
    assert peers.relative_error(got, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("op, fmt, dtype, layer, peer, reason", [
    ("bwd_w", "NCX", "f32", LAYERS[0], "openvino", "weights gradient"),
    ("fwd", "NXC", "f32", LAYERS[0], "onnxruntime", "NCX only"),
    ("bwd_d", "NXC", "bf16", LAYERS[0], "onnxruntime", "NCX only"),
    ("fwd", "NCX", "bf16", LAYERS[0], "onnxruntime", "f32 only"),
    ("bwd_d", "NCX", "f32", suites.Layer("op-ge-stride", 1, 2, 2, (4,), (5,), 2, 0, dilation=3, output_padding=2),
     "openvino", "output_padding >= stride"),
])
def test_what_does_not_fit_says_why(op, fmt, dtype, layer, peer, reason) -> None:
    why = inference_peers.unfit(peer, suites.Config("test", layer, op, dtype, fmt))
    assert why is not None and reason in why


def test_a_missing_peer_is_refused_before_measuring(monkeypatch, tmp_path) -> None:
    from onednn_convt.bench import cli as bench_cli

    monkeypatch.setattr(inference_peers, "missing", lambda peer: "openvino not installed (pip install x)")
    monkeypatch.setattr(bench_cli, "measure_peak_for", lambda quick: pytest.fail("measured first"))
    code, _, stderr = bench_main(["bench", "--suite", "tiny", "--peers", "openvino", "--out", str(tmp_path)])
    assert code == 2 and "--peers openvino: openvino not installed" in stderr


def test_a_bench_run_records_and_reports_the_peers(tmp_path) -> None:
    """Every configuration a peer fits has its time, ratio and error (its result agrees with
    ours); every other one, the reason; the table and the Markdown file list them."""
    for peer in inference_peers.PEERS:
        _installed(peer)
    code, stdout, stderr = bench_main([
        "bench", "--suite", "tiny", "--quick", "--budget", "0.01", "--repeat", "3", "--dtypes", "f32,bf16",
        "--no-torch", "--no-chart", "--peers", "onnxruntime,openvino", "--out", str(tmp_path), "--name", "peers"])
    assert code == 0, stdout + stderr
    doc = json.loads((tmp_path / "peers.json").read_text())
    assert set(doc["meta"]["peers"]) == set(inference_peers.PEERS) and all(doc["meta"]["peers"].values())
    configs = {c.key: c for c in suites.configs("tiny", suites.OPS, ["f32", "bf16"], suites.FORMATS, False, None, False)}
    rows = doc["results"]
    assert sorted(r["key"] for r in rows) == sorted(configs)
    ran = 0
    for r in rows:
        for peer in inference_peers.PEERS:
            p = inference_peers.PREFIX[peer]
            assert not r.get(f"{p}_error"), r
            if inference_peers.unfit(peer, configs[r["key"]]) is None:
                assert r[f"{p}_ms"] > 0 and r[f"vs_{p}"] > 0 and r["peers_ours_ms"] > 0, r
                assert r[f"{p}_err"] <= {"f32": 1e-5, "bf16": 1e-2}[r["dtype"]], r
                ran += 1
            else:
                assert r[f"{p}_note"] and f"{p}_ms" not in r, r
    assert ran >= 4
    assert "Inference runtimes:" in stdout and "onnxruntime: its time / ours, geomean" in stdout
    markdown = (tmp_path / "peers.md").read_text()
    assert "| layer | op | dtype | fmt | ours ms | onnxruntime ms |" in markdown
    assert "openvino did not fit" in markdown


def test_the_report_marks_a_peer_that_computed_in_another_dtype_or_disagreed() -> None:
    rec = {"layer": "l", "op": "fwd", "dtype": "bf16", "format": "NCX", "key": "s/l/fwd/bf16/NCX",
           "peers_ours_ms": 1.0, "ov_ms": 2.0, "vs_ov": 2.0, "ov_err": 0.5, "ov_precision": "f32",
           "ort_note": "f32 only"}
    text = inference_report.text([rec])
    assert "2 (f32)" in text and "5.0e-01!" in text and "2.00" in text
    assert "onnxruntime did not fit 1 configurations: f32 only" in text


def test_a_peer_that_fails_is_its_own_field_not_the_rows(monkeypatch) -> None:
    """A peer raising (a graph it rejects) records ``<p>_error`` with the exception's first
    line; the row keeps its own figures, and the other peer still runs."""
    from onednn_convt.bench import runner

    def call(peer, case, threads):
        if peer == "onnxruntime":
            raise RuntimeError("rejected\nsecond line")
        return inference_peers.PeerCall(lambda: case.op(*case.args).astype("float32"), "f32")

    monkeypatch.setattr(inference_peers, "unfit", lambda peer, cfg: None)
    monkeypatch.setattr(inference_peers, "call", call)
    opts = runner.Options(repeat=3, budget=0.01, torch=False, reference=False, memory=False,
                          peers=inference_peers.PEERS, threads=1)
    rec = runner.run_config(suites.Config("test", LAYERS[1], "fwd", "f32", "NCX"), opts, {})
    assert "error" not in rec and rec["median_ms"] > 0
    assert rec["ort_error"] == "RuntimeError: rejected" and "ort_ms" not in rec
    assert rec["ov_err"] == 0.0 and rec["vs_ov"] > 0 and rec["ov_precision"] == "f32"

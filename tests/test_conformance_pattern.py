"""Pattern graphs: oneDNN's fused and int8 ConvTranspose chains run as one fused call, other
graphs of several ops are SKIPPED with the reason, fused calls dump and load back."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onednn_convt as oc
import pytest
from onednn_convt import Dequantize, PostOp, Quantize
from onednn_convt.cli import main
from onednn_convt.conformance import fill, to_graph_json
from onednn_convt.conformance.collect import collect
from onednn_convt.conformance.model import INVALID, SKIPPED, Case
from onednn_convt.conformance.harness import parse_harness, parse_text
from onednn_convt.conformance.judge import FAILED, PASSED, Result, float_tolerance
from onednn_convt.conformance.runner import run_case
from test_conformance_harness import ONEDNN, needs_onednn_files
from helpers import int8_fuses

PATTERN = os.path.join(ONEDNN, "pattern")
PATTERN_FILES = sorted(
    os.path.relpath(os.path.join(d, f), ONEDNN)
    for d, _, files in os.walk(PATTERN)
    for f in files
    if f.endswith(".json")
)
HARNESS_FILES = [f"harness_pattern_{dt}" for dt in ("f32", "bf16", "f16", "int8")]
SUM = "pattern/int8/int8_convtranspose_post_ops_sum_fusion.json"

pytestmark = needs_onednn_files

# -- running each problem once ----------------------------------------------------------------

_RESULTS: dict[str, Result] = {}


def _key(case: Case) -> str:
    """What decides a run: the same problem from a JSON and a harness line runs once (the
    chain_fusion file and its harness line are both 50x64x56x56)."""
    inputs = [(t.role, t.shape, t.dtype, t.order) for t in case.inputs]
    return repr((case.path, sorted(case.attrs.items()), inputs, case.output, case.pattern))


def run_once(case: Case) -> Result:
    key = _key(case)
    if key not in _RESULTS:
        _RESULTS[key] = run_case(case)
    return _RESULTS[key]


def harness_cases() -> list[Any]:
    if not os.path.isdir(ONEDNN):  # pragma: no cover - the data is in the repository
        return []
    params = []
    for name in HARNESS_FILES:
        for case in parse_harness(os.path.join(ONEDNN, name)):
            params.append(pytest.param(case, id=f"{case.location}"))
    return params


def check_passed(result: Result) -> None:
    case = result.case
    assert result.outcome == PASSED, f"{case.id}: {result.outcome}: {result.message}"
    if case.pattern is None:
        return
    d = result.details
    if ", then the rest: " in d["lowering"]:  # the op, then the rest (the guard, or the stride-1 speed rule)
        assert d["fused"] is False and d["partitions"] >= 2, d["lowering"]
    elif case.pattern.int8 and not int8_fuses():  # the int8_without_vnni guard: the op in f32, the rest in NumPy
        assert d["fused"] is False and d["lowering"].startswith("Dequantize in NumPy, ConvTranspose (f32)"), d["lowering"]
    else:
        assert d["fused"] is True and d["partitions"] == 1, d["lowering"]
    assert d["nonzero_reference"] > d["elements"] // 4  # not a test of zeros (ReLU: half)
    if case.pattern.int8:
        assert d["max_abs_diff"] == 0.0
        assert d["saturated"] < d["elements"] // 4  # nor of the Quantize's limits


# -- oneDNN's own files -----------------------------------------------------------------------


@pytest.mark.parametrize("path", PATTERN_FILES)
def test_every_pattern_file_passes(path: str) -> None:
    [case] = collect([os.path.join(ONEDNN, path)])
    assert case.status is None, case.reason
    int8 = "/int8/" in path
    assert (case.pattern is not None) == int8  # the float files hold a single ConvTranspose
    check_passed(run_once(case))


@pytest.mark.parametrize("case", harness_cases())
def test_every_harness_pattern_line_passes(case: Case) -> None:
    assert case.status is None, case.reason
    check_passed(run_once(case))


def test_the_harness_files_are_all_here() -> None:
    cases = [c for name in HARNESS_FILES for c in parse_harness(os.path.join(ONEDNN, name))]
    assert len(cases) == 20 and sum(c.pattern is not None for c in cases) == 17
    labels = {c.pattern.label for c in cases if c.pattern is not None}
    assert labels == {
        "Dequantize+Dequantize+ConvTranspose+Quantize",
        "Dequantize+Dequantize+ConvTranspose+Square+Quantize",
        "Dequantize+Dequantize+ConvTranspose+Add+Quantize",
        "Dequantize+Dequantize+ConvTranspose+Add+Multiply+Quantize",
    }


def test_the_int8_harness_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    path = os.path.join(ONEDNN, "harness_pattern_int8")
    assert main(["conformance", path, "-k", "sum_fusion", "--dt", "int8", "--list"]) == 0
    assert capsys.readouterr().out.strip().endswith("13 cases")
    assert main(["conformance", path, "-k", "square", "-v"]) == 0
    out = capsys.readouterr().out
    assert f"Dequantize+Dequantize+ConvTranspose+Square+Quantize s8 fused={int8_fuses()}" in out
    assert "1 passed, 0 failed, 0 skipped" in out


# -- overrides --------------------------------------------------------------------------------


def sum_case(options: str = "") -> Case:
    [case] = parse_text(f"--reset {options} --case={SUM}", base_dir=ONEDNN)
    assert case.status is None, case.reason
    return case


def test_op_attrs_zps_override_shifts_the_dequantized_tensor() -> None:
    """--op-attrs=8209:zps:4 (the sum tensor's Dequantize): the same as zps 0 on the tensor
    minus 4, and not the same as zps 0 on the tensor."""
    base, shifted = sum_case(), sum_case("--op-attrs=8209:zps:4")
    assert base.pattern is not None and shifted.pattern is not None
    assert base.pattern.post_ops[0].dequantize.zps == (0,)  # type: ignore[union-attr]
    assert shifted.pattern.post_ops[0].dequantize.zps == (4,)  # type: ignore[union-attr]
    result = run_once(shifted)
    check_passed(result)
    src, weights, other = fill.make_inputs(shifted)
    ops = {}
    for name, case in (("zp0", base), ("zp4", shifted)):
        assert case.pattern is not None
        ops[name] = oc.ConvTranspose(**case.attrs, **case.pattern.op_kwargs())
    got = ops["zp4"](src, weights, None, other)
    assert np.array_equal(got, ops["zp0"](src, weights, None, (other - 4).astype(np.int8)))
    assert not np.array_equal(got, ops["zp0"](src, weights, None, other))


def test_op_attrs_reach_every_op_and_in_shapes_every_input() -> None:
    case = sum_case("--op-attrs=10256:scales:2*zps:-3+2065:zps:1 --in-shapes=0:2x16x6x6+2:2x16x6x6")
    assert case.pattern is not None
    q = case.pattern.dst_quantize
    assert q is not None and q.scales == (2.0,) and q.zps == (-3,) and q.dtype == "s8"
    assert case.pattern.src_dequantize.zps == (1,)  # type: ignore[union-attr]
    assert case.output is not None and case.output.shape == (2, 16, 6, 6)
    check_passed(run_once(case))
    mb = sum_case("--mb=3")
    assert [t.shape[0] for t in mb.inputs if t.shape] == [3, 16, 3]  # src, weights, sum tensor
    check_passed(run_once(mb))
    bad = parse_text(f"--reset --op-attrs=77:zps:1 --case={SUM}", base_dir=ONEDNN)[0]
    assert bad.status == INVALID and "no op with id 77" in bad.reason
    bad = parse_text(f"--reset --in-shapes=165:2x16x5x5 --case={SUM}", base_dir=ONEDNN)[0]
    assert bad.status == INVALID and "tensor 165 is not a graph input" in bad.reason


def test_a_wrong_int8_result_fails_with_the_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    class OffByOne(oc.ConvTranspose):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            out = super().__call__(*args, **kwargs)
            out[(0,) * out.ndim] += 1
            return out

    monkeypatch.setattr(oc, "ConvTranspose", OffByOne)
    result = run_case(sum_case())
    assert result.outcome == FAILED
    assert "1 of 800 elements differ (1 by 1" in result.message
    assert result.details["max_abs_diff"] == 1.0


# -- graphs that are not a supported chain ---------------------------------------------------


def edited(edit: Callable[[dict[str, Any]], None], tmp_path: Path, options: str = "") -> Case:
    with open(os.path.join(ONEDNN, SUM), encoding="utf-8") as f:
        graph = json.load(f)
    edit(graph)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph))
    [case] = parse_text(f"--reset {options} --case=g.json", base_dir=str(tmp_path))
    return case


def op_of(graph: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(op for op in graph["graph"] if op["kind"] == kind)


def as_subtract_of_the_chain(g: dict[str, Any]) -> None:
    add = op_of(g, "Add")
    add["kind"] = "Subtract"
    add["inputs"].reverse()  # other - chain


def as_branch(g: dict[str, Any]) -> None:
    relu = copy.deepcopy(op_of(g, "Add"))
    relu.update(id=99, kind="ReLU", attrs={})
    relu["inputs"] = relu["inputs"][:1]
    relu["outputs"][0]["id"] = 999
    g["graph"].append(relu)  # the ConvTranspose's output feeds Add and ReLU


def as_concat(g: dict[str, Any]) -> None:
    op_of(g, "Add")["kind"] = "Concat"


def without_weights_dequantize(g: dict[str, Any]) -> None:
    deq = next(op for op in g["graph"] if op["id"] == 4113)
    g["graph"].remove(deq)
    conv = op_of(g, "ConvTranspose")
    conv["inputs"][1] = {**deq["inputs"][0], "dtype": "f32"}


def with_four_post_ops(g: dict[str, Any]) -> None:
    quantize = op_of(g, "Quantize")
    chain_out = quantize["inputs"][0]
    for k in range(3):
        relu: dict[str, Any] = {
            "id": 500 + k,
            "name": f"relu{k}",
            "kind": "ReLU",
            "attrs": {},
            "inputs": [dict(chain_out)],
            "outputs": [{**chain_out, "id": 700 + k}],
        }
        g["graph"].insert(-1, relu)
        chain_out = relu["outputs"][0]
    quantize["inputs"] = [dict(chain_out)]


def with_float_output(g: dict[str, Any]) -> None:
    op_of(g, "Quantize")["outputs"][0]["dtype"] = "f32"


def with_mismatched_sum_shape(g: dict[str, Any]) -> None:
    deq = next(op for op in g["graph"] if op["id"] == 8209)
    deq["inputs"][0]["shape"] = [2, 16, 5, 4]


@pytest.mark.parametrize(
    ("edit", "status", "reason"),
    [
        (as_subtract_of_the_chain, SKIPPED, "op 6159 (Subtract) takes the chain on input 1"),
        (as_branch, SKIPPED, "tensor 165 feeds 2 ops (6159 (Add), 99 (ReLU))"),
        (as_concat, SKIPPED, "op 6159 (Concat) follows the ConvTranspose"),
        (without_weights_dequantize, SKIPPED, "only src of the ConvTranspose is dequantized"),
        (with_four_post_ops, SKIPPED, "4 post-ops; oneDNN 3.2 fuses at most 3"),
        (with_float_output, INVALID, "the Quantize output 10416 has dtype f32"),
        (with_mismatched_sum_shape, INVALID, "auto_broadcast 'none'"),
    ],
)
def test_other_graphs_are_skipped_or_invalid_with_the_reason(
    edit: Callable[[dict[str, Any]], None], status: str, reason: str, tmp_path: Path
) -> None:
    case = edited(edit, tmp_path)
    assert case.status == status and reason in case.reason, case.reason
    if status == SKIPPED:
        assert case.reason.startswith("the graph has ")  # with the op kinds
    result = run_case(case)
    assert result.outcome == status and reason in result.message


def test_a_commutative_op_takes_the_chain_on_either_input(tmp_path: Path) -> None:
    case = edited(lambda g: op_of(g, "Add")["inputs"].reverse(), tmp_path)
    assert case.status is None, case.reason
    check_passed(run_case(case))


def float_graph(bias_add_format: str, post: str = "ReLU") -> dict[str, Any]:
    """The f32 pattern file's ConvTranspose followed by BiasAdd and a unary post-op."""
    with open(
        os.path.join(PATTERN, "f32", "convtranspose_post_ops_fusion.json"), encoding="utf-8"
    ) as f:
        g: dict[str, Any] = json.load(f)
    [conv] = g["graph"]
    out = conv["outputs"][0]
    bias = {**out, "id": 10, "shape": [16], "stride": [1]}
    g["graph"].append(
        {
            "id": 1,
            "name": "bias",
            "kind": "BiasAdd",
            "attrs": {"data_format": {"type": "string", "value": bias_add_format}},
            "inputs": [dict(out), bias],
            "outputs": [{**out, "id": 11}],
        }
    )
    g["graph"].append(
        {
            "id": 2,
            "name": "post",
            "kind": post,
            "attrs": {"alpha": {"type": "f32", "value": 0.5}} if post == "Elu" else {},
            "inputs": [{**out, "id": 11}],
            "outputs": [{**out, "id": 12}],
        }
    )
    return g


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("post", ["ReLU", "Elu"])
def test_bias_add_and_float_post_ops(dt: str, post: str, tmp_path: Path) -> None:
    path = tmp_path / "float.json"
    path.write_text(json.dumps(float_graph("NCX", post)))
    [case] = parse_text(f"--reset --dt={dt} --case=float.json", base_dir=str(tmp_path))
    assert case.status is None, case.reason
    assert case.pattern is not None and case.pattern.bias_add
    assert [t.role for t in case.inputs] == ["src", "weights", "bias"]
    result = run_case(case)
    check_passed(result)
    want = "exact" if post == "ReLU" else f"tol={float_tolerance(dt):.3g}"  # Elu: exp
    assert result.details["criterion"] == want
    path.write_text(json.dumps(float_graph("NXC")))
    [case] = collect([str(path)])
    assert (
        case.status == SKIPPED
        and "BiasAdd) has data_format NXC and the ConvTranspose NCX" in case.reason
    )


# -- dump -> load -> run ---------------------------------------------------------------------


def round_trip(
    op: oc.ConvTranspose, arrays: list[Any], tmp_path: Path
) -> tuple[dict[str, Any], Result]:
    text = to_graph_json(op, *arrays)
    path = tmp_path / "dumped.json"
    path.write_text(text)
    [case] = collect([str(path)])
    assert case.status is None, case.reason
    return json.loads(text), run_case(case)


def test_dump_of_a_fused_float_call_passes(tmp_path: Path) -> None:
    op = oc.ConvTranspose(
        strides=2,
        pads_begin=1,
        pads_end=0,
        output_padding=1,
        groups=2,
        data_format="NXC",
        weights_format="XOI",
        post_ops=[PostOp("Add"), "ReLU", PostOp("Multiply")],
    )
    arrays = [
        np.zeros((2, 5, 5, 4), np.float32),
        np.zeros((3, 3, 3, 4), np.float32),
        np.zeros(6, np.float32),
        np.zeros((2, 11, 11, 6), np.float32),
        np.zeros(6, np.float32),
    ]
    data, result = round_trip(op, arrays, tmp_path)
    assert [o["kind"] for o in data["graph"]] == ["ConvTranspose", "Add", "ReLU", "Multiply"]
    conv, add, _, mul = data["graph"]
    assert [t["id"] for t in conv["inputs"]] == [0, 1, 2] and add["inputs"][1]["id"] == 3
    assert mul["inputs"][1]["shape"] == [1, 1, 1, 6]  # at dst's rank, as compiled
    assert add["attrs"] == {"auto_broadcast": {"type": "string", "value": "numpy"}}
    assert all(t["dtype"] == "f32" for o in data["graph"] for t in o["inputs"] + o["outputs"])
    check_passed(result)
    assert result.details["criterion"] == "exact"
    # the same call loads with the same attributes and post-ops
    case = result.case
    assert case.pattern is not None
    assert case.pattern.post_ops == op.fusion.post_ops  # type: ignore[union-attr]
    assert case.attrs["groups"] == 2 and case.attrs["output_padding"] == (1, 1)


def test_dump_of_an_int8_call_passes(tmp_path: Path) -> None:
    scales = [1.0, 2.0, 0.5, 0.25, 4.0, 2.25]
    op = oc.ConvTranspose(
        strides=2,
        pads_begin=1,
        pads_end=1,
        groups=2,
        data_format="NCX",
        weights_format="IOX",
        post_ops=[PostOp("Add", dequantize=Dequantize(scales=[0.5], zps=[-2])), "Square"],
        src_dequantize=Dequantize(scales=[0.5], zps=[3]),
        weights_dequantize=Dequantize(scales=scales, qtype="per_channel", axis=1),
        dst_quantize=Quantize(scales=[2.0], zps=[5], dtype="s8"),  # u8 with an s8 sum: unfused
    )
    arrays = [
        np.zeros((2, 4, 5, 5), np.uint8),
        np.zeros((4, 3, 3, 3), np.int8),
        None,
        np.zeros((1, 6, 1, 1), np.int8),
    ]
    data, result = round_trip(op, arrays, tmp_path)
    kinds = [o["kind"] for o in data["graph"]]
    assert kinds == [
        "Dequantize",
        "Dequantize",
        "ConvTranspose",
        "Dequantize",
        "Add",
        "Square",
        "Quantize",
    ]
    deq_w = data["graph"][1]
    assert (
        deq_w["attrs"]["qtype"]["value"] == "per_channel" and deq_w["attrs"]["axis"]["value"] == 1
    )
    assert deq_w["attrs"]["scales"] == {"type": "f32[]", "value": scales}
    assert (
        data["graph"][0]["inputs"][0]["dtype"] == "u8"
        and data["graph"][3]["inputs"][0]["dtype"] == "s8"
    )
    assert data["graph"][-1]["outputs"][0]["dtype"] == "s8"
    check_passed(result)
    assert result.details["ties"] > 0  # rounding ties met, and matched exactly


def test_cli_dump_of_an_int8_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "i8.json"
    call = (
        'ConvTranspose(strides=2, data_format="NCX", weights_format="IOX", '
        'post_ops=[PostOp("Add", dequantize=Dequantize(scales=1)), "ReLU"], '
        "src_dequantize=Dequantize(scales=0.5, zps=2), weights_dequantize=Dequantize(scales=2), "
        'dst_quantize=Quantize(scales=1, dtype="s8"))'
    )
    args = ["conformance", "--dump", call, "--shapes", "s8:1x8x5x5", "8x4x3x3", "-", "1x4x11x11"]
    assert main([*args, "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["graph"][0]["inputs"][0]["dtype"] == "s8"
    assert data["graph"][3]["inputs"][0]["dtype"] == "s8"  # the dequantized sum tensor
    assert main(["conformance", str(out)]) == 0
    assert "1 passed, 0 failed, 0 skipped" in capsys.readouterr().out
    assert (
        main(
            [
                "conformance",
                "--dump",
                "ConvTranspose(post_ops=[Foo()])",
                "--shapes",
                "1x5x5x8",
                "3x3x4x8",
            ]
        )
        == 2
    )
    assert "Foo() is not a call of PostOp, Dequantize, Quantize" in capsys.readouterr().err


def test_a_call_the_library_does_not_fuse_is_judged_the_same(tmp_path: Path) -> None:
    """oneDNN 3.2 gets a u8 dst with an s8 sum tensor wrong when fused, so the package runs
    it unfused (op.lowering says so): the runner still judges it exactly, and says how it ran."""
    op = oc.ConvTranspose(
        data_format="NCX",
        weights_format="IOX",
        post_ops=[PostOp("Add", dequantize=Dequantize(scales=[1.0]))],
        src_dequantize=Dequantize(scales=[1.0]),
        weights_dequantize=Dequantize(scales=[1.0]),
        dst_quantize=Quantize(scales=[1.0], dtype="u8"),
    )
    arrays = [
        np.zeros((1, 4, 5, 5), np.uint8),
        np.zeros((4, 3, 3, 3), np.int8),
        None,
        np.zeros((1, 3, 7, 7), np.int8),
    ]
    _, result = round_trip(op, arrays, tmp_path)
    assert result.outcome == PASSED, result.message
    assert result.details["fused"] is False and "in NumPy" in result.details["lowering"]
    assert result.details["max_abs_diff"] == 0.0


def test_the_bundled_pattern_suite_passes_fused() -> None:
    from onednn_convt.conformance.collect import bundled_suite

    cases = collect([os.path.join(bundled_suite(), "harness_pattern")])
    assert len(cases) == 16 and all(c.pattern is not None for c in cases)
    assert {c.dtype for c in cases} == {"f32", "bf16", "f16", "s8", "u8"}
    for case in cases:
        check_passed(run_case(case))

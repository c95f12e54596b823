"""Malformed or spec-violating cases are INVALID with a reason; other graphs are SKIPPED."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable

import pytest
from onednn_convt.conformance.model import INVALID, SKIPPED
from onednn_convt.conformance.op_case import expected_output_shape
from onednn_convt.conformance.harness import parse_text
from onednn_convt.conformance.judge import PASSED
from onednn_convt.conformance.runner import run_case
from test_conformance_harness import BASE


def tensor(tid: int, shape: list[int], dtype: str = "f32") -> dict[str, Any]:
    stride, step = [], 1
    for n in reversed(shape):
        stride.insert(0, step)
        step *= n
    return {
        "id": tid,
        "dtype": dtype,
        "shape": shape,
        "stride": stride,
        "layout_type": "strided",
        "property_type": "undef",
    }


def bwd_w_graph(**changes: Any) -> dict[str, Any]:
    g = copy.deepcopy(BASE)
    op = g["graph"][0]
    op["kind"] = "ConvTransposeBackwardWeights"
    del op["attrs"]["output_padding"]
    op["attrs"]["weights_shape"] = {"type": "s64[]", "value": [4, 2, 3, 3]}
    op["inputs"] = [tensor(0, [1, 4, 3, 3]), tensor(1, [1, 2, 7, 7])]
    op["outputs"] = [tensor(2, [4, 2, 3, 3])]
    op.update(changes)
    return g


def run_json(tmp_path: Path, graph: Any, options: str = "") -> Any:
    """Write ``graph`` (an object, or raw text) and run it with harness ``options``."""
    path = tmp_path / "case.json"
    path.write_text(graph if isinstance(graph, str) else json.dumps(graph))
    [case] = parse_text(f"--reset {options} --case=case.json", base_dir=str(tmp_path))
    return run_case(case)


def edit(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    g = copy.deepcopy(BASE)
    change(g["graph"][0])
    return g


def test_base_case_passes(tmp_path: Path) -> None:
    assert run_json(tmp_path, BASE).outcome == PASSED
    assert run_json(tmp_path, bwd_w_graph()).outcome == PASSED


@pytest.mark.parametrize(
    ("graph", "reason"),
    [
        ('{"graph": [', "not valid JSON"),
        ("[1, 2]", "expected a JSON object at the top level"),
        ('{"version": "3.2.0"}', "missing key 'graph'"),
        (edit(lambda op: op.pop("kind")), "missing key 'kind'"),
        (edit(lambda op: op["inputs"][0].pop("shape")), "inputs[0]: missing key 'shape'"),
        (
            edit(lambda op: op["inputs"][0].update(shape=[1, "4", 3, 3])),
            "expected a list of integers",
        ),
        (
            edit(lambda op: op["attrs"].update(groups={"value": 1, "type": "s64"})),
            "'type' must be the first key",
        ),
        (
            edit(lambda op: op["attrs"].update(groups={"type": "int", "value": 1})),
            "unknown type 'int'",
        ),
        (
            edit(lambda op: op["attrs"].update(groups={"type": "s64", "value": "1"})),
            "of type s64 has value '1'",
        ),
    ],
)
def test_malformed_json_is_invalid(tmp_path: Path, graph: Any, reason: str) -> None:
    result = run_json(tmp_path, graph)
    assert result.outcome == INVALID
    assert reason in result.message
    assert str(tmp_path / "case.json") in result.message  # says which file


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (
            lambda op: op.update(kind="ConvTransposeFoo"),
            "unknown op kind 'ConvTransposeFoo' (not a oneDNN Graph op)",
        ),
        (lambda op: op["attrs"].pop("strides"), "missing required attribute(s) strides"),
        (lambda op: op["attrs"].pop("dilations"), "missing required attribute(s) dilations"),
        (
            lambda op: op["attrs"].update(weights_shape={"type": "s64[]", "value": [1]}),
            "attribute 'weights_shape' is not defined for ConvTranspose",
        ),
        (
            lambda op: op["attrs"].update(strides={"type": "s64", "value": 2}),
            "attribute 'strides' expected type s64[], got s64",
        ),
        (
            lambda op: op["attrs"].update(auto_pad={"type": "string", "value": "same_upper"}),
            "attribute 'auto_pad' is 'same_upper'; the library accepts exactly None, SAME_UPPER, SAME_LOWER, VALID",
        ),
        (
            lambda op: op["attrs"].update(weights_format={"type": "string", "value": "OIX"}),
            "a Convolution format",
        ),
        (lambda op: op["inputs"].pop(), "ConvTranspose expected 2 or 3 inputs"),
        (
            lambda op: op["inputs"][1].update(dtype="s8"),
            "weights has dtype s8; ConvTranspose takes f32, bf16 or f16",
        ),
        (
            lambda op: op["inputs"][1].update(dtype="bf16"),
            "must have one dtype, got src=f32, weights=bf16, dst=f32",
        ),
        (
            lambda op: op["inputs"][0].update(shape=[1, 4, -(2**63), 3]),
            "input 0 (src) has an unknown shape",
        ),
        (
            lambda op: op["outputs"][0].update(shape=[1, 2, 8, 8]),
            "output 2 has shape [1, 2, 8, 8] in the JSON; the inputs and attributes give [1, 2, 7, 7]",
        ),
        # shapes the op refuses: its ValueError is the reason
        (
            lambda op: op["inputs"][1].update(shape=[3, 2, 3, 3]),
            "'weights' has I = 3 (IOX), expected the channel count of 'src', 4",
        ),
        (
            lambda op: op["attrs"].update(output_padding={"type": "s64[]", "value": [2, 0]}),
            "'output_padding' expected < stride, got 2 >= 2",
        ),
        (
            lambda op: op["attrs"].update(pads_end={"type": "s64[]", "value": [9, 9]}),
            "pads crop more than the output",
        ),
        (
            lambda op: op["attrs"].update(strides={"type": "s64[]", "value": [2, 2, 2]}),
            "attribute 'strides' expected 2 entries (one per spatial dim), got [2, 2, 2]",
        ),
    ],
)
def test_spec_violations_are_invalid(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], reason: str
) -> None:
    graph = edit(change)
    if "outputs" not in reason and "output 2" not in reason:  # keep the JSON output consistent
        graph["graph"][0]["outputs"][0]["shape"] = [-(2**63)] * 4
    result = run_json(tmp_path, graph)
    assert result.outcome == INVALID, result.message
    assert reason in result.message


def test_override_naming_an_absent_attribute_is_invalid(tmp_path: Path) -> None:
    result = run_json(tmp_path, bwd_w_graph(), "--op-attrs=0:output_padding:1x1")
    assert result.outcome == INVALID
    assert "no attribute 'output_padding' in op 0 (ConvTransposeBackwardWeights)" in result.message
    result = run_json(tmp_path, BASE, "--op-attrs=3:groups:1")
    assert result.outcome == INVALID and "no op with id 3" in result.message
    result = run_json(tmp_path, BASE, "--op-attrs=0:groups:two")
    assert result.outcome == INVALID and "'two' of 'groups' does not parse as s64" in result.message


def test_in_shapes_must_name_a_graph_input(tmp_path: Path) -> None:
    result = run_json(tmp_path, BASE, "--in-shapes=2:1x2x7x7")
    assert result.outcome == INVALID and "tensor 2 is not a graph input" in result.message
    result = run_json(tmp_path, BASE, "--in-shapes=0:1x4x3x3*abdc")
    assert result.outcome == PASSED  # a valid tag
    result = run_json(tmp_path, BASE, "--in-shapes=0:1x4x3x3*abz")
    assert result.outcome == INVALID and "memory tag 'abz'" in result.message


def test_other_graphs_are_skipped_with_the_reason(tmp_path: Path) -> None:
    conv = edit(lambda op: op.update(kind="Convolution"))
    result = run_json(tmp_path, conv)
    assert result.outcome == SKIPPED and "op kind Convolution is not one of" in result.message
    two = copy.deepcopy(BASE)
    relu = {**copy.deepcopy(BASE["graph"][0]), "id": 1, "kind": "ReLU"}
    relu["outputs"][0]["id"] = 3  # a tensor has one producer
    two["graph"].append(relu)
    result = run_json(tmp_path, two)
    assert (
        result.outcome == SKIPPED and "the graph has 2 ops (ConvTranspose, ReLU)" in result.message
    )
    empty = {**BASE, "graph": []}
    assert run_json(tmp_path, empty).outcome == INVALID


def test_backward_weights_shape_sources(tmp_path: Path) -> None:
    # all-zero attribute (the library's default): the known output shape is used
    g = bwd_w_graph()
    g["graph"][0]["attrs"]["weights_shape"]["value"] = [0] * 12
    assert run_json(tmp_path, g).outcome == PASSED
    g["graph"][0]["outputs"][0]["shape"] = [-(2**63)] * 4
    result = run_json(tmp_path, g)
    assert result.outcome == INVALID and "weights_shape is neither set" in result.message
    # as a third (s32) input; its values come from the attribute
    g = bwd_w_graph()
    g["graph"][0]["inputs"].append(tensor(3, [4], "s32"))
    path = tmp_path / "case.json"
    path.write_text(json.dumps(g))
    [case] = parse_text("--reset --case=case.json", base_dir=str(tmp_path))
    assert case.inputs[2].role == "weights_shape" and case.inputs[2].values == (4, 2, 3, 3)
    assert run_case(case).outcome == PASSED
    g["graph"][0]["inputs"][2]["dtype"] = "s64"
    result = run_json(tmp_path, g)
    assert result.outcome == INVALID and "weights_shape) expected dtype s32" in result.message


def test_groups_as_one_element_list_is_accepted(tmp_path: Path) -> None:
    # the library stores attributes by name, so this works there too (spec 2)
    g = edit(lambda op: op["attrs"].update(groups={"type": "s64[]", "value": [2]}))
    g["graph"][0]["inputs"][1]["shape"] = [4, 1, 3, 3]
    g["graph"][0]["outputs"][0]["shape"] = [1, 2, 7, 7]
    assert run_json(tmp_path, g).outcome == PASSED


def test_max_ndims_lists_are_cut_to_the_spatial_rank(tmp_path: Path) -> None:
    path = tmp_path / "case.json"
    path.write_text(json.dumps(BASE))
    [case] = parse_text("--reset --case=case.json", base_dir=str(tmp_path))
    assert case.attrs["output_padding"] == (0, 0)  # 12 zeros in the JSON
    g = edit(lambda op: op["attrs"]["output_padding"]["value"].__setitem__(5, 1))
    g["graph"][0]["outputs"][0]["shape"] = [-(2**63)] * 4
    result = run_json(tmp_path, g)
    assert result.outcome == INVALID and "output_padding" in result.message


def test_expected_output_shape_follows_the_spec() -> None:
    attrs = dict(
        strides=(2, 3),
        dilations=(1, 2),
        pads_begin=(1, 0),
        pads_end=(0, 2),
        output_padding=(1, 2),
        groups=2,
        data_format="NCX",
        weights_format="IOX",
    )
    # dst = s*(x-1) + d*(k-1)+1 - pb - pe + op
    assert expected_output_shape("ConvTranspose", attrs, [(1, 4, 5, 6), (4, 3, 3, 2)]) == (
        1,
        6,
        2 * 4 + 3 - 1 + 1,
        3 * 5 + 3 - 2 + 2,
    )
    same = dict(
        attrs, auto_pad="same_upper", output_padding=0, data_format="NXC", weights_format="XOI"
    )
    assert expected_output_shape("ConvTranspose", same, [(1, 5, 6, 4), (3, 2, 3, 4)]) == (
        1,
        10,
        18,
        6,
    )
    bwd = dict(
        strides=2, dilations=2, pads_begin=1, pads_end=0, data_format="NCX", weights_format="XOI"
    )
    # diff_src = floor((y + pb + pe - ek) / s) + 1
    assert expected_output_shape("ConvTransposeBackwardData", bwd, [(2, 6, 12), (3, 3, 4)]) == (
        2,
        4,
        (12 + 1 - 5) // 2 + 1,
    )
    assert expected_output_shape(
        "ConvTransposeBackwardWeights", {"weights_shape": [4, 3, 3]}, []
    ) == (4, 3, 3)

"""benchdnn harness syntax: every option form, sweeps, state carried until --reset, errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from onednn_convt.conformance import graph_json
from onednn_convt.conformance.collect import collect
from onednn_convt.conformance.model import INVALID
from onednn_convt.conformance.harness import parse_harness, parse_text
from onednn_convt.conformance.harness_options import HarnessSyntaxError, parse_dt, parse_in_shapes, parse_op_attrs

#: oneDNN's own graph test inputs for these ops, copied verbatim (tests/data/onednn/README.md)
ONEDNN = str(Path(__file__).resolve().parent / "data" / "onednn")
needs_onednn_files = pytest.mark.skipif(not os.path.isdir(ONEDNN), reason=f"{ONEDNN} not present")
BASE = {
    "version": "3.2.0",
    "engine_kind": "cpu",
    "fpmath_mode": "strict",
    "graph": [
        {
            "id": 0,
            "name": "d",
            "kind": "ConvTranspose",
            "attrs": {
                "strides": {"type": "s64[]", "value": [2, 2]},
                "pads_begin": {"type": "s64[]", "value": [0, 0]},
                "pads_end": {"type": "s64[]", "value": [0, 0]},
                "dilations": {"type": "s64[]", "value": [1, 1]},
                "auto_pad": {"type": "string", "value": "None"},
                "groups": {"type": "s64", "value": 1},
                "data_format": {"type": "string", "value": "NCX"},
                "weights_format": {"type": "string", "value": "IOX"},
                "output_padding": {"type": "s64[]", "value": [0] * 12},
            },
            "inputs": [
                {
                    "id": 0,
                    "dtype": "f32",
                    "shape": [1, 4, 3, 3],
                    "stride": [36, 9, 3, 1],
                    "layout_type": "strided",
                    "property_type": "undef",
                },
                {
                    "id": 1,
                    "dtype": "f32",
                    "shape": [4, 2, 3, 3],
                    "stride": [18, 9, 3, 1],
                    "layout_type": "strided",
                    "property_type": "undef",
                },
            ],
            "outputs": [
                {
                    "id": 2,
                    "dtype": "f32",
                    "shape": [1, 2, 7, 7],
                    "stride": [98, 49, 7, 1],
                    "layout_type": "strided",
                    "property_type": "undef",
                },
            ],
        }
    ],
}


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    (tmp_path / "op").mkdir()
    (tmp_path / "op" / "fwd.json").write_text(json.dumps(BASE))
    return tmp_path


def lines_of(cases) -> list[str]:
    return [c.id for c in cases]


# -- option values -------------------------------------------------------------------------------


def test_parse_in_shapes_forms() -> None:
    assert parse_in_shapes("") == ()
    assert parse_in_shapes("0:1x28x28x32") == ((0, (1, 28, 28, 32), None),)
    assert parse_in_shapes("0:1x2x3*acb+1:4x5") == ((0, (1, 2, 3), "acb"), (1, (4, 5), None))
    assert parse_in_shapes("1:acdb") == ((1, None, "acdb"),)
    assert parse_in_shapes("0:-") == ((0, (), None),)
    assert parse_in_shapes("0:0") == ((0, (0,), None),)


@pytest.mark.parametrize("bad", ["0", "x:1x2", "0:1xax2", "0:1x2*a1", "0:", "0:-1x2"])
def test_parse_in_shapes_errors(bad: str) -> None:
    with pytest.raises(HarnessSyntaxError, match="--in-shapes"):
        parse_in_shapes(bad)


def test_parse_op_attrs_forms() -> None:
    assert parse_op_attrs("") == ()
    assert parse_op_attrs("0:auto_pad:SAME_UPPER") == ((0, (("auto_pad", "SAME_UPPER"),)),)
    assert parse_op_attrs("0:strides:1x1*dilations:2x2*groups:4") == (
        (0, (("strides", "1x1"), ("dilations", "2x2"), ("groups", "4"))),
    )
    assert parse_op_attrs("0:groups:2+1:groups:3") == (
        (0, (("groups", "2"),)),
        (1, (("groups", "3"),)),
    )
    # a repeated attribute keeps its last value
    assert parse_op_attrs("0:groups:2*groups:3") == ((0, (("groups", "3"),)),)


@pytest.mark.parametrize(
    "bad", ["auto_pad:VALID", "0:auto_pad", "0:", "a:groups:1", "0:groups:1*strides"]
)
def test_parse_op_attrs_errors(bad: str) -> None:
    with pytest.raises(HarnessSyntaxError, match="--op-attrs"):
        parse_op_attrs(bad)


def test_parse_dt_forms() -> None:
    assert parse_dt("bf16") == ("bf16", ())
    assert parse_dt("0:f16+2:f16") == (None, ((0, "f16"), (2, "f16")))
    with pytest.raises(HarnessSyntaxError, match="unknown data type 'f8'"):
        parse_dt("f8")


# -- lines -----------------------------------------------------------------------------------


def test_settings_carry_over_until_reset(case_dir: Path) -> None:
    text = (
        "--dt=bf16\n"
        "--case=op/fwd.json   # comment: --case=ignored.json\n"
        "--op-attrs=0:groups:1 --case=op/fwd.json\n"
        "--reset --case=op/fwd.json\n"
        "# a whole-line comment\n"
    )
    cases = parse_text(text, base_dir=str(case_dir))
    assert lines_of(cases) == [
        "--reset --dt=bf16 --case=op/fwd.json",
        "--reset --dt=bf16 --op-attrs=0:groups:1 --case=op/fwd.json",
        "--reset --case=op/fwd.json",
    ]
    assert [c.dtype for c in cases] == ["bf16", "bf16", "f32"]
    assert all(c.status is None for c in cases)


def test_sweeps_are_nested_loops(case_dir: Path) -> None:
    text = "--reset --dt=f32,f16 --mb=0,3 --in-shapes=,0:1x4x5x5 --op-attrs=0:auto_pad:VALID,,0:groups:1 --case=op/fwd.json"
    cases = parse_text(text, base_dir=str(case_dir))
    assert len(cases) == 2 * 2 * 2 * 3
    assert cases[0].id == "--reset --dt=f32 --mb=0 --op-attrs=0:auto_pad:VALID --case=op/fwd.json"
    assert cases[1].id == "--reset --dt=f32 --mb=0 --case=op/fwd.json"  # empty element: unmodified
    assert (
        cases[-1].id
        == "--reset --dt=f16 --mb=3 --in-shapes=0:1x4x5x5 --op-attrs=0:groups:1 --case=op/fwd.json"
    )
    assert len(set(lines_of(cases))) == len(cases)
    last = cases[-1]
    assert last.inputs[0].shape == (3, 4, 5, 5)  # --mb wins over --in-shapes
    assert last.output.shape == (3, 2, 11, 11)  # recomputed
    assert last.dtype == "f16"


def test_overrides_and_recomputed_output(case_dir: Path) -> None:
    [case] = parse_text(
        "--reset --in-shapes=0:2x5x5x4*acdb+1:3x3x2x4 --op-attrs=0:data_format:NXC*weights_format:XOI*strides:3x1*output_padding:2x0 --case=op/fwd.json",
        base_dir=str(case_dir),
    )
    assert case.status is None, case.reason
    assert case.attrs["strides"] == (3, 1)
    assert case.attrs["output_padding"] == (2, 0)
    assert case.attrs["data_format"] == "NXC"
    assert case.inputs[0].order == (0, 2, 3, 1)
    assert case.inputs[1].order == (0, 1, 2, 3)  # same rank: the JSON's (plain) order
    # dst = s*(src-1) + k - pb - pe + op, NXC
    assert case.output.shape == (2, 3 * 4 + 3 + 2, 1 * 4 + 3, 2)


def test_dt_per_tensor_id(case_dir: Path) -> None:
    [mixed, ok] = parse_text(
        "--reset --dt=0:bf16 --case=op/fwd.json\n--reset --dt=0:f16+1:f16+2:f16 --case=op/fwd.json",
        base_dir=str(case_dir),
    )
    assert mixed.status == INVALID and "one dtype" in mixed.reason
    assert ok.status is None and ok.dtype == "f16"


def test_rank_change_needs_attributes(case_dir: Path) -> None:
    good, bad = parse_text(
        "--reset --in-shapes=0:1x4x3x3x3+1:4x2x3x3x3 --op-attrs=0:strides:1x1x1*pads_begin:0x0x0*pads_end:0x0x0*dilations:1x1x1 --case=op/fwd.json\n"
        "--reset --in-shapes=0:1x4x3x3x3+1:4x2x3x3x3 --case=op/fwd.json",
        base_dir=str(case_dir),
    )
    assert good.status is None and good.output.shape == (1, 2, 5, 5, 5)
    assert good.inputs[0].order == (0, 1, 2, 3, 4)  # a new rank gets the plain order
    assert bad.status is None and bad.output.shape is None  # the op reports the bad lengths


def test_case_path_lookup(case_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    harness_dir = tmp_path_factory.mktemp("elsewhere")
    harness = harness_dir / "harness_x"
    harness.write_text("--reset --case=op/fwd.json\n--reset --case=op/missing.json\n")
    found, missing = parse_harness(str(harness), cases_root=str(case_dir))
    assert found.status is None and found.path == str(case_dir / "op" / "fwd.json")
    assert found.root == str(case_dir) and found.location == f"{harness}:1"
    assert missing.status == INVALID and "'op/missing.json' not found" in missing.reason
    # next to the harness file wins over --cases-root
    (harness_dir / "op").mkdir()
    (harness_dir / "op" / "fwd.json").write_text(json.dumps(BASE))
    assert parse_harness(str(harness), cases_root=str(case_dir))[0].root == str(harness_dir)


def test_batch_includes_another_file(case_dir: Path) -> None:
    (case_dir / "inner").write_text("--case=op/fwd.json\n")
    cases = parse_text(
        "--reset --dt=f16 --batch=inner --reset --batch=inner", base_dir=str(case_dir)
    )
    assert lines_of(cases) == ["--reset --dt=f16 --case=op/fwd.json", "--reset --case=op/fwd.json"]


def test_ignored_benchdnn_options_stay_in_the_line(case_dir: Path) -> None:
    [case] = parse_text(
        "--graph --reset --engine=cpu --attr-fpmath=bf16 -v5 --case=op/fwd.json",
        base_dir=str(case_dir),
    )
    assert case.status is None
    assert case.id == "--reset --engine=cpu --attr-fpmath=bf16 -v5 --case=op/fwd.json"


def test_syntax_errors_make_following_cases_invalid(case_dir: Path) -> None:
    text = (
        "--reset --op-attrs=0:strides --case=op/fwd.json --case=op/fwd.json\n"
        "--reset --case=op/fwd.json\n"
        "--reset --bogus=1\n"
    )
    a, b, ok, tail = parse_text(text, "h", base_dir=str(case_dir))
    assert a.status == b.status == INVALID
    assert "h:1: --op-attrs: 'strides' in '0:strides' expected NAME:VALUE" in a.reason
    assert ok.status is None
    assert (
        tail.status == INVALID
        and "unknown option '--bogus=1'" in tail.reason
        and tail.location == "h:3"
    )
    # the id is the line with the error: the repro runs into it again
    assert a.id == "--reset --op-attrs=0:strides --case=op/fwd.json --case=op/fwd.json"
    assert tail.id == "--reset --bogus=1"
    [again, _] = parse_text(a.id, "line", base_dir=str(case_dir))
    assert again.status == INVALID and again.reason == a.reason.replace("h:1", "line:1")


def test_unbalanced_quote_is_reported(case_dir: Path) -> None:
    [case] = parse_text("--reset --case='op/fwd.json", "h", base_dir=str(case_dir))
    assert case.status == INVALID and "h:1" in case.reason


@needs_onednn_files
def test_onednn_harness_files_parse_unmodified() -> None:
    expected = {
        "harness_f32": 37,
        "harness_bf16": 21,
        "harness_f16": 21,
        "harness_bf16_v3.2": 21,
        "harness_f16_v3.2": 21,
    }
    for name, count in expected.items():
        path = os.path.join(ONEDNN, name)
        with open(path) as f:
            n_lines = sum(1 for line in f if line.strip())
        cases = parse_harness(path)
        assert len(cases) == count == n_lines, name
        assert all(c.status is None for c in cases), [c.reason for c in cases if c.status]
    dts = {c.dtype for c in parse_harness(os.path.join(ONEDNN, "harness_bf16"))}
    assert dts == {"bf16"}


def test_directories_are_searched_for_json_and_harness_files(case_dir: Path) -> None:
    (case_dir / "harness_a").write_text("--reset --case=op/fwd.json\n")
    (case_dir / "notes.txt").write_text("not a case\n")
    cases = collect([str(case_dir)])
    assert sorted(c.location for c in cases) == sorted(
        [f"{case_dir}/harness_a:1", f"{case_dir}/op/fwd.json"]
    )
    json_case = next(c for c in cases if c.location.endswith(".json"))
    assert json_case.id == "--reset --case=op/fwd.json" and json_case.root == str(case_dir)
    with pytest.raises(FileNotFoundError, match="no such file"):
        collect([str(case_dir / "nope")])


def test_lines_given_directly(case_dir: Path) -> None:
    [case] = collect(
        lines=["--reset --op-attrs=0:auto_pad:VALID --case=op/fwd.json"], cases_root=str(case_dir)
    )
    assert case.status is None and case.attrs["auto_pad"] == "VALID"
    assert "--cases-root" in case.repro() and "--line" in case.repro()


@needs_onednn_files
def test_graph_json_loader_reads_the_files() -> None:
    graph = graph_json.load(os.path.join(ONEDNN, "op/f32/deconv_bwd_w.json"))
    [op] = graph.ops
    assert op.kind == "ConvTransposeBackwardWeights"
    assert op.attrs["weights_shape"].value == [32, 128, 3, 3]
    assert [t.id for t in op.inputs] == [0, 1] and op.outputs[0].shape == [32, 128, 3, 3]

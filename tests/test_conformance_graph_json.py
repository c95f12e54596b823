"""Writing cases: to_graph_json in the library's spelling; dump -> load -> run round trips."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from onednn_convt.cli import main
from onednn_convt.conformance import bundled, graph, to_graph_json
from onednn_convt.conformance.collect import bundled_suite, collect
from onednn_convt.conformance.judge import PASSED
from onednn_convt.conformance.runner import run_case

RNG = np.random.default_rng(7)


def arrays(*shapes: tuple[int, ...], dtype: Any = np.float32) -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(dtype) for s in shapes]


CALLS = [
    pytest.param(
        oc.ConvTranspose(
            strides=2,
            pads_begin=(1, 0),
            auto_pad="same_lower",
            dilations=(1, 2),
            groups=2,
            output_padding=1,
            data_format="NCX",
            weights_format="IOX",
        ),
        arrays((1, 4, 5, 6), (4, 3, 3, 3), (6,)),
        id="fwd-bias-same_lower",
    ),
    pytest.param(
        oc.ConvTranspose(strides=3, weights_format="XOI"),
        arrays((2, 7, 3), (2, 2, 3)),
        id="fwd-1d-defaults",
    ),
    pytest.param(
        oc.ConvTransposeBackwardData(
            strides=(1, 2, 2),
            dilations=2,
            pads_begin=1,
            pads_end=(0, 1, 1),
            groups=3,
            output_padding=(0, 1, 1),
            data_format="NXC",
            weights_format="XOI",
        ),
        arrays((1, 6, 8, 8, 6), (3, 3, 3, 2, 6), dtype=ml_dtypes.bfloat16),
        id="bwd_d-3d-bf16",
    ),
    pytest.param(
        oc.ConvTransposeBackwardWeights(
            strides=2,
            auto_pad="VALID",
            weights_shape=(4, 3, 3),
            data_format="NCX",
            weights_format="IOX",
        ),
        arrays((2, 4, 5), (2, 3, 11), dtype=np.float16),
        id="bwd_w-attr-f16",
    ),
    pytest.param(
        oc.ConvTransposeBackwardWeights(
            strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="XOI"
        ),
        [*arrays((1, 2, 4, 4), (1, 3, 7, 7)), np.array([3, 3, 3, 2], np.int32)],
        id="bwd_w-input",
    ),
]


def check_spelling(data: dict[str, Any], kind: str, spatial: int) -> None:
    [op] = data["graph"]
    assert op["kind"] == kind
    attrs = op["attrs"]
    assert list(attrs) == list(graph.LIBRARY_ATTRS[kind])  # every attribute, defaults included
    for name, entry in attrs.items():
        assert list(entry) == ["type", "value"], name
        if entry["type"] == "s64[]" and name != "weights_shape":
            assert len(entry["value"]) == spatial, name
    assert attrs["auto_pad"]["value"] in ("None", "SAME_UPPER", "SAME_LOWER", "VALID")
    assert attrs["data_format"]["value"] in ("NCX", "NXC") and attrs["weights_format"]["value"] in (
        "IOX",
        "XOI",
    )


@pytest.mark.parametrize(("op", "inputs"), CALLS)
def test_dump_load_run_round_trip(op: Any, inputs: list[np.ndarray], tmp_path: Path) -> None:
    text = to_graph_json(op, *inputs)
    data = json.loads(text)
    spatial = inputs[0].ndim - 2
    check_spelling(data, op.op_name, spatial)
    [graph_op] = data["graph"]
    expected = op(*inputs)
    assert graph_op["outputs"][0]["shape"] == list(expected.shape)
    dtype = {
        np.dtype(np.float32): "f32",
        np.dtype(ml_dtypes.bfloat16): "bf16",
        np.dtype(np.float16): "f16",
    }[inputs[0].dtype]
    assert graph_op["outputs"][0]["dtype"] == dtype
    assert [t["shape"] for t in graph_op["inputs"]] == [list(a.shape) for a in inputs]
    path = tmp_path / "case.json"
    path.write_text(text)
    [case] = collect([str(path)])
    assert case.status is None, case.reason
    assert case.output.shape == expected.shape
    for name, value in op.attrs.items():  # the case calls the op with the same attributes
        if value is None or name in ("output_padding",) and op.op_name != "ConvTranspose":
            continue
        if name == "auto_pad":
            assert case.attrs[name] == value
        elif isinstance(value, int) and name != "groups":
            assert case.attrs[name] == (value,) * spatial
        else:
            assert case.attrs[name] == (tuple(value) if isinstance(value, tuple) else value), name
    result = run_case(case)
    assert result.outcome == PASSED, result.message
    if len(inputs) == 3 and inputs[2].dtype == np.int32:
        assert graph_op["inputs"][2]["dtype"] == "s32" and case.inputs[2].values == tuple(inputs[2])
        assert graph_op["attrs"]["weights_shape"]["value"] == list(inputs[2])


def test_library_spelling_details() -> None:
    src, w = arrays((1, 2, 3, 3), (2, 2, 3, 3))
    fwd = json.loads(
        to_graph_json(
            oc.ConvTranspose(auto_pad="same_upper", data_format="NCX", weights_format="IOX"), src, w
        )
    )
    attrs = fwd["graph"][0]["attrs"]
    assert attrs["auto_pad"]["value"] == "SAME_UPPER"
    assert attrs["output_padding"] == {"type": "s64[]", "value": [0, 0]}
    assert attrs["groups"] == {"type": "s64", "value": 1}
    # output_padding given to a backward op is checked by the package only: not a library attribute
    bwd = json.loads(
        to_graph_json(
            oc.ConvTransposeBackwardData(
                strides=2, output_padding=1, data_format="NCX", weights_format="IOX"
            ),
            *arrays((1, 2, 6, 6), (2, 2, 3, 3)),
        )
    )
    assert "output_padding" not in bwd["graph"][0]["attrs"]
    assert list(fwd) == ["version", "engine_kind", "fpmath_mode", "graph"]
    v = oc._core.version()
    assert fwd["version"] == f"{v['major']}.{v['minor']}.{v['patch']}"


def test_strides_of_the_arrays_are_written() -> None:
    src = np.ascontiguousarray(RNG.standard_normal((1, 3, 4, 2)).astype(np.float32)).transpose(
        0, 3, 1, 2
    )  # NCX over NHWC
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    data = json.loads(
        to_graph_json(oc.ConvTranspose(data_format="NCX", weights_format="IOX"), src, w)
    )
    assert data["graph"][0]["inputs"][0]["stride"] == [24, 1, 8, 2]
    assert data["graph"][0]["inputs"][1]["stride"] == [18, 9, 3, 1]


def test_legacy_op_is_written_as_backward_weights(tmp_path: Path) -> None:
    op = oc.ConvTransposeBackpropFilters(strides=2, data_format="NCX", filter_format="OIX")
    src, dd = arrays((1, 4, 5, 5), (1, 3, 11, 11))
    text = to_graph_json(op, src, dd, np.array([3, 4, 3, 3]))  # OIX filter shape
    data = json.loads(text)
    assert data["graph"][0]["kind"] == "ConvTransposeBackwardWeights"
    assert data["graph"][0]["attrs"]["weights_format"]["value"] == "IOX"
    assert data["graph"][0]["attrs"]["weights_shape"]["value"] == [4, 3, 3, 3]
    path = tmp_path / "legacy.json"
    path.write_text(text)
    assert run_case(collect([str(path)])[0]).outcome == PASSED


def test_writer_errors() -> None:
    src, w = arrays((1, 2, 3, 3), (2, 2, 3, 3))
    with pytest.raises(TypeError, match="argument 'op' expected a ConvTranspose"):
        to_graph_json(object(), src, w)
    with pytest.raises(TypeError, match="argument 'weights' expected dtype"):
        to_graph_json(oc.ConvTranspose(), src, w.astype(np.float16))
    with pytest.raises(ValueError, match="weights_shape expected as input 2 or as the attribute"):
        to_graph_json(oc.ConvTransposeBackwardWeights(), src, src)
    with pytest.raises(ValueError, match="expected inputs src, weights, bias"):
        to_graph_json(oc.ConvTranspose(), src)
    with pytest.raises(ValueError, match="'strides' expected 2 entries"):
        to_graph_json(
            oc.ConvTranspose(strides=(1, 1, 1), data_format="NCX", weights_format="IOX"), src, w
        )


def test_cli_dump_matches_the_python_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d.json"
    call = 'ConvTranspose(strides=2, pads_begin=1, auto_pad="None", data_format="NCX", weights_format="IOX")'
    assert (
        main(
            [
                "conformance",
                "--dump",
                call,
                "--shapes",
                "1x8x5x5",
                "8x4x3x3",
                "--dt",
                "bf16",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    op = oc.ConvTranspose(strides=2, pads_begin=1, data_format="NCX", weights_format="IOX")
    zeros = [np.zeros(s, ml_dtypes.bfloat16) for s in ((1, 8, 5, 5), (8, 4, 3, 3))]
    assert out.read_text() == to_graph_json(op, *zeros)
    assert (
        main(
            [
                "conformance",
                "--dump",
                "ConvTransposeBackwardWeights(strides=2)",
                "--shapes",
                "1x5x5x4",
                "1x11x11x3",
                "ws:3x3x3x4",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["graph"][0]["inputs"][2] == {
        "id": 2,
        "dtype": "s32",
        "shape": [4],
        "stride": [1],
        "layout_type": "strided",
        "property_type": "undef",
    }
    for bad in (
        "ConvTranspose(2)",
        "Convolution(strides=2)",
        "ConvTranspose(strides=x)",
        "ConvTranspose(",
    ):
        assert main(["conformance", "--dump", bad, "--shapes", "1x8x5x5", "8x4x3x3"]) == 2
    assert "--dump" in capsys.readouterr().err


def test_bundled_suite_is_what_the_generator_writes(tmp_path: Path) -> None:
    written = bundled.write_suite(str(tmp_path))
    shipped = bundled_suite()
    for path in written:
        rel = os.path.relpath(path, tmp_path)
        assert filecmp.cmp(path, os.path.join(shipped, rel), shallow=False), (
            f"{rel} differs: regenerate the suite"
        )
    assert sorted(os.listdir(os.path.join(shipped, "cases"))) == sorted(
        os.listdir(tmp_path / "cases")
    )


def test_bundled_suite_covers_every_attribute_value() -> None:
    cases = collect()
    runnable = [c for c in cases if c.status is None]
    assert len(runnable) == len(cases)
    seen: dict[str, set[Any]] = {}
    for c in runnable:
        key = c.kind
        a = c.attrs
        ranks = len(c.inputs[0].shape) - 2
        facts = {
            f"rank{ranks}",
            f"auto_pad={a['auto_pad']}",
            f"{a['data_format']}/{a['weights_format']}",
            f"dt={c.dtype}",
            "groups" if a["groups"] > 1 else "",
            "dilated" if max(a["dilations"]) > 1 else "",
            "strided" if max(a["strides"]) > 1 else "",
            "asym" if a["pads_begin"] != a["pads_end"] else "",
            "output_padding" if any(a.get("output_padding") or ()) else "",
            "bias" if len(c.inputs) == 3 and key == "ConvTranspose" else "",
            "ws_input" if any(t.role == "weights_shape" for t in c.inputs) else "",
            "depthwise"
            if a["groups"] > 1
            and a["groups"]
            == (c.inputs[0].shape[1] if a["data_format"] == "NCX" else c.inputs[0].shape[-1])
            else "",
            "tag" if any(t.order != tuple(range(len(t.order))) for t in c.inputs) else "",
        }
        seen.setdefault(key, set()).update(facts - {""})
    common = {
        "rank1",
        "rank2",
        "rank3",
        "groups",
        "depthwise",
        "dilated",
        "strided",
        "asym",
        "tag",
        "auto_pad=None",
        "auto_pad=SAME_UPPER",
        "auto_pad=SAME_LOWER",
        "auto_pad=VALID",
        "NCX/IOX",
        "NCX/XOI",
        "NXC/IOX",
        "NXC/XOI",
        "dt=f32",
        "dt=bf16",
        "dt=f16",
    }
    assert common | {"bias", "output_padding"} <= seen["ConvTranspose"]
    assert common <= seen["ConvTransposeBackwardData"]
    assert common | {"ws_input"} <= seen["ConvTransposeBackwardWeights"]

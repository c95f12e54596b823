"""The bundled suite's fused calls: ConvTranspose graphs with Dequantize, BiasAdd, post-ops
and Quantize (pattern cases), their graph JSON and harness lines (see :mod:`.bundled`)."""


from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

FWD, BWD_D, BWD_W = "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"


@dataclass
class PatternBase:
    """A fused call whose whole graph is written: ``attrs`` are the ConvTranspose's keywords
    (post_ops, quantization included); ``inputs`` are (shape, dtype code) of src, weights,
    the bias (None: no bias) and each binary post-op's tensor; ``lines`` the harness options
    run on it besides the plain case (op ids are the graph's node order)."""

    name: str
    attrs: dict[str, Any]
    inputs: list[Optional[tuple[tuple[int, ...], str]]]
    lines: list[str] = field(default_factory=list)


def pattern_bases() -> list[PatternBase]:
    from ..post_ops import Dequantize, PostOp, Quantize

    per_channel = [1.0, 2.0, 0.5, 0.25, 4.0, 2.25]
    return [
        PatternBase(
            "pattern_f32_chain",
            dict(
                strides=2,
                pads_begin=1,
                pads_end=0,
                output_padding=1,
                groups=2,
                data_format="NXC",
                weights_format="XOI",
                post_ops=[PostOp("Add"), PostOp("ReLU"), PostOp("Multiply")],
            ),
            [
                ((2, 5, 5, 4), "f32"),
                ((3, 3, 3, 4), "f32"),
                ((6,), "f32"),
                ((6,), "f32"),
                ((2, 11, 11, 6), "f32"),
            ],
            [
                "--dt=bf16",
                "--dt=f16",
                "--mb=1",
                "--in-shapes=0:2x4x6x4+4:2x9x13x6 --op-attrs=0:pads_begin:0x1*pads_end:1x0",
            ],
        ),
        PatternBase(
            "pattern_f32_eltwise",
            dict(
                strides=1,
                pads_begin=1,
                pads_end=1,
                data_format="NCX",
                weights_format="IOX",
                post_ops=[PostOp("GELU"), PostOp("Elu", alpha=0.5)],
            ),
            [((1, 6, 5, 5), "f32"), ((6, 4, 3, 3), "f32"), None],
            ["--dt=bf16", "--op-attrs=2:alpha:1.5"],
        ),
        PatternBase(
            "pattern_int8_sum",
            dict(
                strides=2,
                pads_begin=1,
                pads_end=1,
                groups=2,
                data_format="NCX",
                weights_format="IOX",
                post_ops=[PostOp("Add", dequantize=Dequantize(scales=[0.5], zps=[-1]))],
                src_dequantize=Dequantize(scales=[0.5], zps=[2]),
                weights_dequantize=Dequantize(scales=per_channel, qtype="per_channel", axis=1),
                dst_quantize=Quantize(scales=[1.0], zps=[3], dtype="s8"),
            ),
            [((2, 4, 5, 5), "u8"), ((4, 3, 3, 3), "s8"), ((6,), "f32"), ((2, 6, 9, 9), "s8")],
            [
                "--op-attrs=3:zps:4",
                "--op-attrs=5:scales:2*zps:-5+0:zps:0",
                "--in-shapes=0:1x4x7x7+3:1x6x13x13",
            ],
        ),
        PatternBase(
            "pattern_int8_square",
            dict(
                strides=1,
                groups=2,
                data_format="NXC",
                weights_format="XOI",
                post_ops=[PostOp("Square")],
                src_dequantize=Dequantize(scales=[1.0], zps=[-1]),
                weights_dequantize=Dequantize(scales=[2.25]),
                dst_quantize=Quantize(scales=[0.5], dtype="u8"),
            ),
            [((2, 4, 4, 4), "s8"), ((2, 2, 3, 4), "s8"), None],
            ["--op-attrs=2:strides:2x1*output_padding:1x0"],
        ),
        PatternBase(
            "pattern_int8_add_multiply",
            dict(
                data_format="NCX",
                weights_format="IOX",
                post_ops=[PostOp("Add", dequantize=Dequantize(scales=[1.0])), PostOp("Multiply")],
                src_dequantize=Dequantize(scales=[1.0]),
                weights_dequantize=Dequantize(scales=[1.0]),
                dst_quantize=Quantize(scales=[1.0], dtype="s8"),
            ),
            [
                ((2, 8, 6, 6), "s8"),
                ((8, 8, 1, 1), "s8"),
                None,
                ((1, 1, 1, 1), "s8"),
                ((1, 8, 1, 1), "f32"),
            ],
            ["--mb=3"],
        ),
    ]


def pattern_json(base: PatternBase) -> str:
    """The graph JSON of a fused call."""
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES

    from ..post_ops import INT8_DTYPES
    from .export import to_graph_json

    dtypes = {**FLOAT_DTYPES, **INT8_DTYPES}
    arrays = [None if i is None else np.zeros(i[0], dtypes[i[1]]) for i in base.inputs]
    return to_graph_json(onednn_convt.ConvTranspose(**base.attrs), *arrays)


def pattern_harness_lines() -> list[str]:
    """The lines of ``harness_pattern``."""
    lines = [
        "# onednn-convt bundled suite, fused calls (generated by onednn_convt.conformance.bundled)"
    ]
    for base in pattern_bases():
        case = f"--case=cases/{base.name}.json"
        lines.append(f"# {base.name}")
        lines.append(f"--reset {case}")
        lines.extend(f"--reset {opts} {case}" for opts in base.lines)
    return lines



"""The bundled suite: how ``suite/`` is made (``python -m onednn_convt.conformance.bundled``).

``suite/cases/*.json`` are the graph JSON of small Python calls, written with
:func:`~onednn_convt.conformance.export.to_graph_json`; ``suite/harness_{f32,bf16,f16}``
run each of them and benchdnn-style variations of them (every auto_pad mode on every op,
the four NCX/NXC x IOX/XOI combinations on every op, --mb, memory tags, a rank change,
sweeps), the bf16 and f16 files through ``--dt``. Together they cover every attribute
value at least once:

- ranks 1, 2 and 3 on every op; groups > 1 and depthwise on every op;
- dilations on every op (BackwardData dilated: spec D9); strides 1, 2, 3;
- asymmetric pads; pads larger than the kernel; output_padding (ConvTranspose);
- auto_pad None, SAME_UPPER, SAME_LOWER, VALID on every op (BackwardWeights with
  ``src mod stride != 0``, where the library's own pads differ: spec D8);
- NCX/NXC x IOX/XOI on every op; bias; weights_shape as attribute and as input;
- f32, bf16 and f16 (also JSON files whose tensors are bf16 or f16 themselves);
- inputs whose memory order is not the logical one (JSON strides and ``*TAG``).

``suite/cases/pattern_*.json`` are fused calls (the whole graph: Dequantize, ConvTranspose,
post-ops, Quantize) and ``suite/harness_pattern`` runs them with variations: float chains
judged exactly (Add/ReLU/Multiply) and within a tolerance (GELU, Elu), also in bf16 and f16
through ``--dt``; int8 chains with u8 and s8 src, per-tensor and per-channel weights scales,
a dequantized sum tensor, Square, an f32 Multiply, zero points and scales changed through
``--op-attrs`` on the Dequantize/Quantize ops, the geometry changed on the ConvTranspose.

A test regenerates the files and checks they are unchanged.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from .bundled_patterns import pattern_bases, pattern_harness_lines, pattern_json

FWD, BWD_D, BWD_W = "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"


@dataclass
class Base:
    """A base case: the Python call whose JSON is written."""

    name: str
    kind: str
    attrs: dict[str, Any]
    shapes: list[tuple[int, ...]]  # float inputs in order
    dtype: str = "f32"
    weights_shape_input: bool = False  # BackwardWeights: pass weights_shape as input 2
    orders: dict[int, tuple[int, ...]] = field(default_factory=dict)  # input index -> memory order
    variations: bool = True  # also run the harness variations on it


BASES = [
    Base(
        "fwd_1d",
        FWD,
        dict(
            strides=2,
            pads_begin=1,
            pads_end=0,
            output_padding=1,
            data_format="NCX",
            weights_format="IOX",
        ),
        [(2, 4, 7), (4, 3, 3)],
    ),
    Base(
        "fwd_2d_groups_bias",
        FWD,
        dict(
            strides=(2, 1),
            dilations=(1, 2),
            pads_begin=(1, 0),
            pads_end=(0, 2),
            output_padding=(1, 0),
            groups=3,
            data_format="NXC",
            weights_format="XOI",
        ),
        [(2, 5, 6, 6), (3, 3, 2, 6), (6,)],
    ),
    Base(
        "fwd_3d",
        FWD,
        dict(
            strides=(2, 1, 3),
            dilations=(1, 2, 1),
            pads_begin=(0, 1, 1),
            pads_end=(1, 0, 0),
            output_padding=(1, 0, 2),
            groups=2,
            data_format="NCX",
            weights_format="XOI",
        ),
        [(1, 4, 3, 4, 3), (2, 3, 2, 2, 4)],
    ),
    Base(
        "fwd_2d_depthwise",
        FWD,
        dict(
            strides=2, pads_begin=1, pads_end=1, groups=8, data_format="NXC", weights_format="IOX"
        ),
        [(1, 5, 5, 8), (8, 1, 3, 3)],
    ),
    Base(
        "fwd_2d_big_pads",
        FWD,
        dict(
            strides=2, pads_begin=(0, 3), pads_end=(5, 4), data_format="NCX", weights_format="IOX"
        ),
        [(1, 3, 6, 7), (3, 2, 3, 3)],
    ),
    Base(
        "fwd_2d_strided",
        FWD,
        dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX"),
        [(2, 4, 3, 5), (4, 2, 4, 4)],
        orders={0: (0, 2, 3, 1), 1: (2, 3, 0, 1)},
    ),
    Base(
        "bwd_d_1d",
        BWD_D,
        dict(
            strides=2,
            dilations=2,
            pads_begin=1,
            pads_end=0,
            groups=2,
            data_format="NCX",
            weights_format="XOI",
        ),
        [(2, 6, 12), (3, 3, 4)],
    ),
    Base(
        "bwd_d_2d",
        BWD_D,
        dict(
            strides=(2, 3),
            dilations=(2, 1),
            pads_begin=(1, 0),
            pads_end=(0, 1),
            data_format="NXC",
            weights_format="IOX",
        ),
        [(2, 9, 8, 4), (6, 4, 3, 2)],
    ),
    Base(
        "bwd_d_3d",
        BWD_D,
        dict(
            strides=(1, 2, 2),
            dilations=(2, 1, 1),
            pads_begin=(0, 1, 0),
            pads_end=(1, 0, 1),
            groups=2,
            data_format="NCX",
            weights_format="IOX",
        ),
        [(1, 4, 5, 6, 5), (4, 2, 2, 3, 2)],
    ),
    Base(
        "bwd_d_1d_depthwise",
        BWD_D,
        dict(
            strides=2, pads_begin=1, pads_end=1, groups=6, data_format="NXC", weights_format="XOI"
        ),
        [(2, 9, 6), (3, 1, 6)],
    ),
    Base(
        "bwd_w_1d",
        BWD_W,
        dict(
            strides=2,
            pads_begin=0,
            pads_end=1,
            groups=2,
            weights_shape=(4, 3, 3),
            data_format="NCX",
            weights_format="IOX",
        ),
        [(2, 4, 5), (2, 6, 10)],
    ),
    Base(
        "bwd_w_2d",
        BWD_W,
        dict(
            strides=2,
            dilations=(2, 1),
            pads_begin=(1, 0),
            pads_end=(2, 1),
            weights_shape=(3, 2, 3, 4),
            data_format="NXC",
            weights_format="XOI",
        ),
        [(1, 4, 3, 4), (1, 8, 5, 3)],
    ),
    Base(
        "bwd_w_3d_input",
        BWD_W,
        dict(
            strides=(1, 2, 1),
            pads_begin=(0, 1, 0),
            pads_end=(0, 0, 1),
            weights_shape=(2, 2, 3, 2, 2),
            data_format="NCX",
            weights_format="XOI",
        ),
        [(1, 2, 3, 3, 2), (1, 2, 4, 5, 3)],
        weights_shape_input=True,
    ),
    Base(
        "bwd_w_2d_depthwise",
        BWD_W,
        dict(
            strides=1,
            dilations=2,
            pads_begin=2,
            pads_end=2,
            groups=6,
            weights_shape=(6, 1, 3, 3),
            data_format="NCX",
            weights_format="IOX",
        ),
        [(2, 6, 4, 4), (2, 6, 4, 4)],
    ),
    Base(
        "fwd_2d_bf16",
        FWD,
        dict(
            strides=2,
            pads_begin=(0, 1),
            pads_end=(1, 0),
            groups=2,
            data_format="NCX",
            weights_format="IOX",
        ),
        [(1, 4, 4, 5), (4, 3, 3, 3), (6,)],
        dtype="bf16",
        variations=False,
    ),
    Base(
        "bwd_d_2d_f16",
        BWD_D,
        dict(
            strides=2,
            dilations=2,
            pads_begin=1,
            pads_end=1,
            data_format="NXC",
            weights_format="XOI",
        ),
        [(1, 8, 8, 4), (3, 3, 4, 2)],
        dtype="f16",
        variations=False,
    ),
    Base(
        "bwd_w_1d_bf16",
        BWD_W,
        dict(
            strides=3,
            pads_begin=1,
            pads_end=1,
            weights_shape=(2, 3, 4),
            data_format="NXC",
            weights_format="IOX",
        ),
        [(2, 4, 2), (2, 11, 3)],
        dtype="bf16",
        variations=False,
    ),
]


def _array(shape: Sequence[int], dtype: Any, order: Optional[tuple[int, ...]]) -> np.ndarray:
    from .fill import place

    return place(np.zeros(shape), dtype, order or ())


def base_json(base: Base) -> str:
    """The graph JSON of a base case."""
    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES, SHAPE_DTYPE

    from .export import to_graph_json

    attrs = dict(base.attrs)
    arrays = [
        _array(s, FLOAT_DTYPES[base.dtype], base.orders.get(i)) for i, s in enumerate(base.shapes)
    ]
    if base.weights_shape_input:
        arrays.append(np.asarray(attrs.pop("weights_shape"), SHAPE_DTYPE))
    op = getattr(onednn_convt, base.kind)(**attrs)
    return to_graph_json(op, *arrays)


# -- variations ------------------------------------------------------------------------------


def _x(shape: Sequence[int]) -> str:
    return "x".join(str(int(d)) for d in shape)


def _swap_data(shape: Sequence[int], to: str) -> tuple[int, ...]:
    """An activation shape converted to ``to`` (NCX or NXC) from the other format."""
    s = list(shape)
    return (s[0], s[-1], *s[1:-1]) if to == "NCX" else (s[0], *s[2:], s[1])


def _swap_weights(shape: Sequence[int], to: str) -> tuple[int, ...]:
    """A weights shape converted to ``to`` (IOX or XOI) from the other format."""
    s = list(shape)
    if to == "IOX":  # XOI (X..., O, I) -> IOX (I, O, X...)
        return (s[-1], s[-2], *s[:-2])
    return (*s[2:], s[1], s[0])


def _format_lines(base: Base) -> list[str]:
    """The three other NCX/NXC x IOX/XOI combinations of a base case."""
    df, wf = base.attrs["data_format"], base.attrs["weights_format"]
    lines = []
    for new_df in ("NCX", "NXC"):
        for new_wf in ("IOX", "XOI"):
            if (new_df, new_wf) == (df, wf):
                continue
            shapes, attrs = [], []
            for i, shape in enumerate(base.shapes):
                is_weights = i == 1 and base.kind != BWD_W
                if is_weights and new_wf != wf:
                    shapes.append(f"{i}:{_x(_swap_weights(shape, new_wf))}")
                elif not is_weights and len(shape) > 1 and new_df != df:
                    shapes.append(f"{i}:{_x(_swap_data(shape, new_df))}")
            if new_df != df:
                attrs.append(f"data_format:{new_df}")
            if new_wf != wf:
                attrs.append(f"weights_format:{new_wf}")
                if base.kind == BWD_W:
                    attrs.append(
                        f"weights_shape:{_x(_swap_weights(base.attrs['weights_shape'], new_wf))}"
                    )
            shape_opt = f"--in-shapes={'+'.join(shapes)} " if shapes else ""
            lines.append(f"{shape_opt}--op-attrs=0:{'*'.join(attrs)}")
    return lines


def _auto_pad_lines(base: Base) -> list[str]:
    """SAME_UPPER, SAME_LOWER and VALID on a base case (BackwardWeights: with the diff_dst
    size of the forward op under that auto_pad)."""
    modes = ("SAME_UPPER", "SAME_LOWER", "VALID")
    if base.kind != BWD_W:
        return ["--op-attrs=" + ",".join(f"0:auto_pad:{m}" for m in modes)]
    from .op_case import expected_output_shape

    lines = []
    for mode in modes:
        attrs = {**base.attrs, "auto_pad": mode}
        dst = expected_output_shape(FWD, attrs, [base.shapes[0], base.attrs["weights_shape"]])
        lines.append(f"--in-shapes=1:{_x(dst)} --op-attrs=0:auto_pad:{mode}")
    return lines


#: Extra lines: (base name, options)
EXTRA = [
    ("fwd_1d", "--mb=3"),
    ("fwd_1d", "--in-shapes=0:2x4x7*acb"),
    ("fwd_1d", "--op-attrs=0:output_padding:0,0:strides:3*output_padding:2"),
    ("fwd_2d_groups_bias", "--mb=1"),
    ("fwd_3d", "--in-shapes=0:2x4x3x4x3*acdeb"),
    (
        "fwd_2d_depthwise",
        "--in-shapes=0:1x5x5x8+1:8x1x2x2 --op-attrs=0:strides:3x2*pads_begin:0x1*pads_end:2x0",
    ),
    (
        "bwd_d_2d",
        "--in-shapes=0:2x5x6x7x4+1:6x4x3x2x2 --op-attrs=0:strides:1x2x3*dilations:1x2x1*pads_begin:1x1x0*pads_end:0x0x1",
    ),
    ("bwd_d_1d", "--mb=1"),
    ("bwd_d_3d", "--in-shapes=0:1x4x5x6x5*acdeb+1:4x2x2x3x2*cdeab"),
    ("bwd_w_1d", "--mb=3"),
    ("bwd_w_1d", "--op-attrs=0:groups:1*weights_shape:4x6x3"),
    ("bwd_w_2d_depthwise", "--in-shapes=0:2x6x4x4*acdb+1:2x6x4x4*acdb"),
]


def harness_lines(dt: str) -> list[str]:
    """The lines of ``harness_<dt>``."""
    prefix = "--reset" + (f" --dt={dt}" if dt != "f32" else "")
    lines = [f"# onednn-convt bundled suite, {dt} (generated by onednn_convt.conformance.bundled)"]
    for base in BASES:
        if base.dtype != "f32" and (dt != "f32" or base.variations):
            continue
        case = f"--case=cases/{base.name}.json"
        lines.append(f"# {base.name}: {base.kind}")
        lines.append(f"{prefix} {case}")
        if not base.variations:
            continue
        for opts in _auto_pad_lines(base) + _format_lines(base):
            lines.append(f"{prefix} {opts} {case}")
        for name, opts in EXTRA:
            if name == base.name:
                lines.append(f"{prefix} {opts} {case}")
    return lines


def write_suite(directory: str) -> list[str]:
    """Write the whole suite into ``directory``; returns the files written."""
    cases_dir = os.path.join(directory, "cases")
    os.makedirs(cases_dir, exist_ok=True)
    written = []
    for base in BASES:
        path = os.path.join(cases_dir, f"{base.name}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(base_json(base))
        written.append(path)
    for dt in ("f32", "bf16", "f16"):
        path = os.path.join(directory, f"harness_{dt}")
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(harness_lines(dt)) + "\n")
        written.append(path)
    for pattern in pattern_bases():
        path = os.path.join(cases_dir, f"{pattern.name}.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(pattern_json(pattern))
        written.append(path)
    path = os.path.join(directory, "harness_pattern")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(pattern_harness_lines()) + "\n")
    written.append(path)
    return written


if __name__ == "__main__":
    from .collect import bundled_suite

    for p in write_suite(sys.argv[1] if len(sys.argv) > 1 else bundled_suite()):
        print(p)

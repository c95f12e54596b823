"""int8 inference: a quantized ConvTranspose with bias, ReLU and a u8 output.

The activations are u8 with a scale and a zero point, the weights s8 with one scale per
output channel, the bias f32. ``ConvTranspose(src_dequantize=..., weights_dequantize=...,
post_ops=[...], dst_quantize=...)`` runs oneDNN's int8 pattern (Dequantize ->
ConvTranspose -> BiasAdd -> ReLU -> Quantize), in one partition where this CPU's int8
kernels are right (``op.fused``; otherwise unfused, with the same result).

Quantize rounds half to even and saturates, as the library does, and so does the reference:
the u8 result must equal ``onednn_convt.reference.fused_conv_transpose`` exactly.

    python examples/int8_inference.py            # batch 8, 64 -> 32 channels, 16x16 -> 32x32
    python examples/int8_inference.py --small    # batch 1, 8 -> 4 channels, 5x5 -> 10x10 (CI)
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onednn_convt as oc
from onednn_convt import Dequantize, PostOp, Quantize


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a second or two (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    args = parser.parse_args()
    n, ic, oc_, size = (1, 8, 4, 5) if args.small else (8, 64, 32, 16)
    rng = np.random.default_rng(0)
    q_src = rng.integers(0, 50, (n, size, size, ic), dtype=np.uint8)  # NXC, u8
    q_w = rng.integers(-60, 60, (4, 4, oc_, ic), dtype=np.int8)  # XOI, s8
    bias = rng.normal(0, 1, oc_).astype(np.float32)

    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 1}
    quantization = {
        "src_dequantize": Dequantize(scales=0.02, zps=10),  # real = 0.02 * (q - 10)
        # one scale per output channel, along the O dim of XOI weights (axis rank - 2)
        "weights_dequantize": Dequantize(scales=np.linspace(0.001, 0.002, oc_), qtype="per_channel", axis=2),
        "post_ops": [PostOp("ReLU")],
        "dst_quantize": Quantize(scales=0.05, zps=0, dtype="u8"),
    }
    op = oc.ConvTranspose(**attrs, **quantization)
    q_dst = op(q_src, q_w, bias)

    want = oc.reference.fused_conv_transpose(q_src, q_w, bias, **attrs, **quantization)
    print(f"int8 ConvTranspose {q_src.shape} {q_src.dtype} -> {q_dst.shape} {q_dst.dtype}: {op.lowering}")
    print(f"  {np.count_nonzero(q_dst)} of {q_dst.size} outputs above zero, max {q_dst.max()}")
    assert q_dst.dtype == np.uint8 and q_dst.shape == (n, 2 * size, 2 * size, oc_)
    assert np.array_equal(q_dst, want), "int8 result differs from the reference"
    print("equal to the reference, element for element")
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

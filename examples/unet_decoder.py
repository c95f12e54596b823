"""A U-Net decoder step with the bias and ReLU fused into the up-sampling ConvTranspose.

In a U-Net decoder, each step doubles the image size with a 2x2 stride-2 ConvTranspose that
halves the channels, applies its bias and ReLU, and concatenates the encoder's feature map
of the same size (the skip connection). Here the arrays are channels-last (NXC activations,
XOI weights): ``ConvTranspose(post_ops=[PostOp("ReLU")])`` compiles the transposed
convolution, its bias and the ReLU into one oneDNN partition, so dst is written once
(``op.fused``; where a guard keeps a oneDNN bug of this CPU away, ``op.lowering`` says how
the call ran instead, with the same result).

The step is checked against ``onednn_convt.reference`` in float64.

    python examples/unet_decoder.py            # batch 4, 256 -> 128 channels, 32x32 -> 64x64
    python examples/unet_decoder.py --small    # batch 1, 16 -> 8 channels, 8x8 -> 16x16 (CI)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onednn_convt as oc
from onednn_convt import PostOp


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a second or two (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    args = parser.parse_args()
    n, c, size = (1, 8, 8) if args.small else (4, 128, 32)
    rng = np.random.default_rng(0)
    below = rng.standard_normal((n, size, size, 2 * c)).astype(np.float32)  # NXC: (N, H, W, C)
    skip = rng.standard_normal((n, 2 * size, 2 * size, c)).astype(np.float32)  # the encoder's map
    fan_in = 2 * c * 2 * 2
    w = (rng.standard_normal((2, 2, c, 2 * c)) / np.sqrt(fan_in)).astype(np.float32)  # XOI: (kH, kW, O, I)
    b = rng.normal(0, 0.1, c).astype(np.float32)

    up = oc.ConvTranspose(strides=2, post_ops=[PostOp("ReLU")])  # NXC and XOI are the defaults
    decoded = np.concatenate([up(below, w, b), skip], axis=-1)  # the first call compiles
    start = time.perf_counter()
    decoded = np.concatenate([up(below, w, b), skip], axis=-1)
    seconds = time.perf_counter() - start

    want = np.maximum(oc.reference.conv_transpose(below, w, b, strides=2), 0)
    error = float(np.abs(decoded[..., :c] - want).max() / np.abs(want).max())
    print(f"decoder step {below.shape} -> {decoded.shape} in {seconds * 1e3:.2f} ms; "
          f"relative error against float64: {error:.1e}")
    # one partition where oneDNN fuses this graph on this CPU; where a guard keeps a library
    # bug away, the call says how it ran instead (same result)
    print("fused into one partition" if up.fused else f"not fused on this CPU: {up.lowering}")
    assert decoded.shape == (n, 2 * size, 2 * size, 2 * c)
    assert error < 1e-4, error
    assert np.array_equal(decoded[..., c:], skip)
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""DCGAN generator inference with constant weights.

A DCGAN generator: a latent vector z of shape (N, 100, 1, 1) through five ConvTranspose2d
layers (kernel 4; the first 1x1 -> 4x4, the others stride 2) to an (N, 3, 64, 64) image, in
PyTorch's layout (NCX activations, IOX weights). For inference each BatchNorm is folded into
its layer's weights and bias, ReLU follows every layer but the last, Tanh the last.

Each layer's weights are bound once with ``op.with_constant_weights(w)``: oneDNN reorders
them into its own blocked layout on the first call and keeps the result for later calls.
The image is checked against the same network computed in float64 by
``onednn_convt.reference``.

    python examples/dcgan_inference.py            # batch 16, 512 -> 64 channel widths
    python examples/dcgan_inference.py --small    # batch 2, narrow layers (what CI runs)
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onednn_convt as oc

ATTRS = {"data_format": "NCX", "weights_format": "IOX"}  # PyTorch's layouts


def make_generator(nz: int, ngf: int, rng: np.random.Generator) -> list[dict]:
    """The layers, each with BatchNorm (where it has one) folded into its weights and bias."""
    widths = [nz, 8 * ngf, 4 * ngf, 2 * ngf, ngf, 3]
    layers = []
    for i, (ic, oc_) in enumerate(zip(widths, widths[1:])):
        w = rng.normal(0, 0.02, (ic, oc_, 4, 4))  # IOX: (in, out, kH, kW), as torch's weight
        b = np.zeros(oc_)
        last = i == len(widths) - 2
        if not last:  # BatchNorm2d(oc_) in eval mode: y = gamma * (x - mean) / sqrt(var + eps) + beta
            gamma, beta = rng.uniform(0.5, 1.5, oc_), rng.normal(0, 0.1, oc_)
            mean, var = rng.normal(0, 0.1, oc_), rng.uniform(0.5, 1.5, oc_)
            scale = gamma / np.sqrt(var + 1e-5)
            w = w * scale[None, :, None, None]  # per output channel: the O axis of IOX
            b = (b - mean) * scale + beta
        stride, pad = (1, 0) if i == 0 else (2, 1)
        layers.append({"w": w.astype(np.float32), "b": b.astype(np.float32), "strides": stride, "pads_begin": pad,
                           "pads_end": pad, "activation": "tanh" if last else "relu"})
    return layers


def activation(kind: str, x: np.ndarray) -> np.ndarray:
    return np.tanh(x) if kind == "tanh" else np.maximum(x, 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a second or two (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    args = parser.parse_args()
    batch, nz, ngf = (2, 16, 4) if args.small else (16, 100, 64)
    rng = np.random.default_rng(0)
    layers = make_generator(nz, ngf, rng)

    # bind each layer's weights once; a bound layer is called as layer(src, bias)
    bound = [oc.ConvTranspose(strides=lay["strides"], pads_begin=lay["pads_begin"], pads_end=lay["pads_end"],
                              **ATTRS).with_constant_weights(lay["w"]) for lay in layers]

    def generate(z: np.ndarray) -> np.ndarray:
        x = z
        for layer, lay in zip(bound, layers):
            x = activation(lay["activation"], layer(x, lay["b"]))
        return x

    z = rng.standard_normal((batch, nz, 1, 1)).astype(np.float32)
    image = generate(z)  # the first call compiles and reorders the weights
    start = time.perf_counter()
    image = generate(z)
    seconds = time.perf_counter() - start

    # the same network in float64
    want = z.astype(np.float64)
    for lay in layers:
        attrs = {k: lay[k] for k in ("strides", "pads_begin", "pads_end")}
        want = activation(lay["activation"], oc.reference.conv_transpose(want, lay["w"], lay["b"], **attrs, **ATTRS))
    error = float(np.abs(image - want).max() / np.abs(want).max())
    print(f"generated {image.shape} {image.dtype} images in {seconds * 1e3:.1f} ms; "
          f"relative error against float64: {error:.1e}")
    for i, layer in enumerate(bound):
        print(f"  layer {i + 1}: {layer.lowering}")
    assert image.shape == (batch, 3, 64, 64) and image.dtype == np.float32
    assert error < 1e-4, error
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

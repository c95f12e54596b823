"""Our calls beside NumPy's matrix products: how two thread pools on the same CPUs slow each other.

NumPy's wheels run ``@``/``np.matmul``/``np.dot`` on OpenBLAS, whose own threads (pthreads,
one per CPU) spin after each product before they sleep; oneDNN runs on GNU OpenMP, whose
threads spin after each of our calls. A program that alternates the two (NumPy pre- or
post-processing around a layer) has each pool's threads spinning on the CPUs the other one
needs. This script measures, for a few layers, our call and a NumPy product each alone and
then alternated, under each setting of the environment below, each setting in processes of
its own (the pools read these variables when their libraries load)::

    python benchmarks/blas_neighbour.py                 # every setting, 2 processes each
    python benchmarks/blas_neighbour.py --processes 3 --seconds 2

Settings: the defaults; ``OPENBLAS_NUM_THREADS=1`` (NumPy's products on one thread);
``OPENBLAS_THREAD_TIMEOUT=4`` (OpenBLAS's threads sleep almost at once after a product);
``OMP_WAIT_POLICY=passive`` (oneDNN's threads sleep at once after a call). The processes of
the settings alternate (setting A, B, C, D, then again), and within a process the alone and
alternated loops alternate too, each ``--seconds`` long, twice; the table keeps, per figure,
the median over the processes of each process's faster loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS: dict[str, dict[str, str]] = {
    "defaults": {},
    "OPENBLAS_NUM_THREADS=1": {"OPENBLAS_NUM_THREADS": "1"},
    "OPENBLAS_THREAD_TIMEOUT=4": {"OPENBLAS_THREAD_TIMEOUT": "4"},
    "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
}
#: name -> (src shape, weights shape, stride, pad, dtype); NCX and IOX
LAYERS = {
    "3-D k2 s2, 1x64x16^3, bf16": ((1, 64, 16, 16, 16), (64, 32, 2, 2, 2), 2, 0, "bf16"),
    "DCGAN k4 s2, 16x512x4x4, f32": ((16, 512, 4, 4), (512, 256, 4, 4), 2, 1, "f32"),
    "U-Net k2 s2, 4x128x64x64, f32": ((4, 128, 64, 64), (128, 64, 2, 2), 2, 0, "f32"),
}
#: the NumPy product between two calls: (512, 512) @ (512, 512), float32
PRODUCT = 512


def measure(seconds: float) -> dict[str, dict[str, float]]:
    """In this process: per layer, milliseconds of our call alone, the product alone, and
    each of the two when they alternate (the faster of two loops of ``seconds`` each)."""
    import ml_dtypes
    import numpy as np

    import onednn_convt as oc

    rng = np.random.default_rng(0)
    a = rng.standard_normal((PRODUCT, PRODUCT)).astype(np.float32)

    def loop(steps: list, secs: float) -> list[float]:
        times: list[list[float]] = [[] for _ in steps]
        end = time.perf_counter() + secs
        while time.perf_counter() < end:
            for i, step in enumerate(steps):
                start = time.perf_counter()
                step()
                times[i].append(time.perf_counter() - start)
        return [statistics.median(t) * 1e3 for t in times]

    out: dict[str, dict[str, float]] = {}
    for name, (src, w, stride, pad, code) in LAYERS.items():
        dtype = ml_dtypes.bfloat16 if code == "bf16" else np.float32
        x = rng.standard_normal(src).astype(dtype)
        wt = (rng.standard_normal(w) * 0.1).astype(dtype)
        op = oc.ConvTranspose(strides=stride, pads_begin=pad, pads_end=pad, data_format="NCX", weights_format="IOX")
        op(x, wt)

        def call(op=op, x=x, wt=wt) -> None:  # this layer's op and arrays, bound now
            op(x, wt)

        def product() -> None:
            a @ a

        rounds: dict[str, list[float]] = {"call alone": [], "product alone": [], "call": [], "product": []}
        for _ in range(2):  # the alone and alternated loops alternate
            (alone,) = loop([call], seconds)
            (prod,) = loop([product], seconds)
            mixed_call, mixed_product = loop([product, call], seconds)[::-1]
            rounds["call alone"].append(alone)
            rounds["product alone"].append(prod)
            rounds["call"].append(mixed_call)
            rounds["product"].append(mixed_product)
        out[name] = {k: min(v) for k, v in rounds.items()}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2, help="processes per setting (default 2)")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per loop (default 1)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.seconds)))
        return 0
    runs: dict[str, list[dict[str, dict[str, float]]]] = {s: [] for s in SETTINGS}
    for _ in range(args.processes):
        for setting, env in SETTINGS.items():
            child_env = {k: v for k, v in os.environ.items() if k not in {"OPENBLAS_NUM_THREADS",
                                                                         "OPENBLAS_THREAD_TIMEOUT", "OMP_WAIT_POLICY"}}
            done = subprocess.run([sys.executable, __file__, "--child", "--seconds", str(args.seconds)],
                                  env={**child_env, **env}, capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(done.stdout.splitlines()[-1]))
    print(f"our call and a NumPy ({PRODUCT}x{PRODUCT}) @ ({PRODUCT}x{PRODUCT}) float32 product, alone and alternated; "
          f"ms, median over {args.processes} processes")
    print(f"{'setting':<27} {'layer':<31} {'call alone':>10} {'alternated':>10} {'x':>5} "
          f"{'product alone':>13} {'alternated':>10} {'x':>5}")
    for setting in SETTINGS:
        for layer in LAYERS:
            fig = {k: statistics.median(r[layer][k] for r in runs[setting]) for k in runs[setting][0][layer]}
            print(f"{setting:<27} {layer:<31} {fig['call alone']:>10.3f} {fig['call']:>10.3f} "
                  f"{fig['call'] / fig['call alone']:>5.2f} {fig['product alone']:>13.3f} {fig['product']:>10.3f} "
                  f"{fig['product'] / fig['product alone']:>5.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

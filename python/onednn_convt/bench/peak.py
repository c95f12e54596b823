"""The machine's practical peak, measured in the same run: a large matrix product.

The f32 peak is oneDNN's MatMul (through this package's native core, same library, same
threads) on square f32 matrices, best of a few samples; NumPy's matmul (its own BLAS and
threads) is measured for information. The bf16 (f16) peak is oneDNN's bf16 (f16) MatMul
when the CPU has native kernels for it; otherwise that dtype runs emulated in f32 and its
peak is the f32 peak (the report says which).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .. import native
from ..errors import OneDNNError


def _matmul(size: int, code: str) -> tuple[Any, list[np.ndarray], np.ndarray]:
    dense = ((size, size), (size, 1), code)
    compiled = native.compile("MatMul", {}, [dense, dense], dense)
    dtype: np.dtype[Any] = np.dtype(np.float32 if code == "f32" else np.uint16)  # bit patterns suffice
    rng = np.random.default_rng(0)
    if code == "f32":
        a, b = (rng.standard_normal((size, size), dtype=np.float32) for _ in range(2))
    else:  # bit patterns of small normal values in both bf16 and f16
        a, b = (rng.integers(0x3C00, 0x3CFF, (size, size)).astype(dtype) for _ in range(2))
    return compiled, [a, b], np.empty((size, size), dtype)


def _best_gflops(run: Any, flops: float, samples: int, budget: float) -> float:
    best = 0.0
    start = time.perf_counter()
    for i in range(samples):
        t = run()
        best = max(best, flops / t / 1e9)
        if i >= 1 and time.perf_counter() - start > budget:
            break
    return best


def measure_peak(size: int = 2048, samples: int = 5, budget: float = 3.0) -> dict[str, Any]:
    """Measure the f32 (and bf16, where native) matrix-product peak, GFLOP/s.

    Args:
        size: matrix size (size x size times size x size).
        samples: samples per measurement; the best is kept.
        budget: seconds per measurement, about.

    Returns:
        ``f32_gflops``, ``bf16_gflops``, ``f16_gflops``, ``bf16_source`` and ``f16_source``
        ("native MatMul" or "f32 peak (... emulated)"), ``numpy_f32_gflops``, ``size``.
    """
    flops = 2.0 * size**3
    compiled, args, out = _matmul(size, "f32")
    compiled.time_loop(args, out, 1)  # warm-up
    f32 = _best_gflops(lambda: compiled.time_loop(args, out, 1), flops, samples, budget)

    a, b = args
    np.matmul(a, b)
    t_np = _best_gflops(lambda: _timed(lambda: np.matmul(a, b)), flops, samples, budget)

    result: dict[str, Any] = {"f32_gflops": f32, "numpy_f32_gflops": t_np, "size": size}
    for code in ("bf16", "f16"):
        try:
            c16, args16, out16 = _matmul(size, code)
        except OneDNNError:
            result[f"{code}_gflops"] = f32
            result[f"{code}_source"] = f"f32 peak ({code} emulated)"
            continue
        c16.time_loop(args16, out16, 1)
        result[f"{code}_gflops"] = _best_gflops(
            lambda: c16.time_loop(args16, out16, 1), flops, samples, budget  # noqa: B023
        )
        result[f"{code}_source"] = "native MatMul"
    return result


def _timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def peak_for(peak: dict[str, Any], dtype: str) -> float:
    """The peak, GFLOP/s, that a configuration in ``dtype`` is compared with."""
    return float(peak[f"{dtype}_gflops"])

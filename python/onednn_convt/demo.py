"""``onednn-convt demo``: each op in each dtype on a DCGAN-like layer, checked and timed.

The layer: N=4, 64 -> 32 channels, 8x8 -> 16x16, kernel 4, stride 2, pads 1 (NCX, IOX).
Each result is compared with :mod:`onednn_convt.reference` computed from the same
(rounded) inputs; the exit status is 1 if any error is over the tolerance.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from . import accuracy, reference
from .dtypes import FLOAT_DTYPES
from .info import dtype_support
from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights

N, IC, OC, X, K = 4, 64, 32, 8, 4
ATTRS: dict[str, Any] = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")


def _median_seconds(fn: Callable[[], Any], repeat: int = 7) -> float:
    fn()  # compile
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def add_arguments(parser: Any) -> None:
    """``onednn-convt demo``: no options."""


def run(args: Any = None) -> int:
    """Print the table; return 0 if every op ran within tolerance (1 if one did not, or
    could not run under the memory limit)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, IC, X, X))
    w = rng.standard_normal((IC, OC, K, K))
    y = rng.standard_normal((N, OC, 2 * X, 2 * X))
    support = dtype_support()
    header = f"{'op':<30} {'dtype':<5} {'in -> out shape':<34} {'rel.err':>9} {'tol':>9} {'kernel':<9} {'time':>9}"
    print(header)
    print("-" * len(header))
    failed = not_run = 0
    for code, dtype in FLOAT_DTYPES.items():
        xr, wr, yr = (a.astype(dtype) for a in (x, w, y))
        fwd = ConvTranspose(**ATTRS)
        bwd_d = ConvTransposeBackwardData(**ATTRS)
        bwd_w = ConvTransposeBackwardWeights(weights_shape=w.shape, **ATTRS)
        Call = Callable[[], np.ndarray]
        cases: list[tuple[str, Call, Call, tuple[int, ...], int]] = [
            ("ConvTranspose", lambda: fwd(xr, wr),
             lambda: reference.conv_transpose(xr, wr, **ATTRS), xr.shape, IC * K * K),
            ("ConvTransposeBackwardData", lambda: bwd_d(yr, wr),
             lambda: reference.conv_transpose_backward_data(yr, wr, **ATTRS), yr.shape, OC * K * K),
            ("ConvTransposeBackwardWeights", lambda: bwd_w(xr, yr),
             lambda: reference.conv_transpose_backward_weights(xr, yr, w.shape, **ATTRS), xr.shape, N * X * X),
        ]
        for op, call, ref, in_shape, reduction in cases:
            try:
                got = call()
            except MemoryError as e:  # a memory limit below the layer's few hundred KiB
                not_run += 1
                print(f"{op:<30} {code:<5} not run: {e}")
                continue
            err = accuracy.relative_error(got, ref())
            tol = accuracy.tolerance(code, reduction)
            ok = err <= tol and got.dtype == dtype
            failed += not ok
            seconds = _median_seconds(call)
            shape = f"{'x'.join(map(str, in_shape))} -> {'x'.join(map(str, got.shape))}"
            print(
                f"{op:<30} {code:<5} {shape:<34} {err:9.2e} {tol:9.2e} {support[op][code]:<9} "
                f"{seconds * 1e3:7.3f}ms{'' if ok else '  FAILED'}"
            )
    print(f"{9 - failed - not_run} passed, {failed} failed" + (f", {not_run} not run" if not_run else ""))
    return 1 if failed or not_run else 0

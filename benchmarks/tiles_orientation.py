"""The tiles BackwardWeights' two orientations for IOX weights in NCX, timed side by side.

Usage::

    python benchmarks/tiles_orientation.py [--seed 1] [--layers 30] [--dtypes f32,bf16] [--json out.json]

Draws random k2 s2 layers (2-D and 3-D, batch 1-16, 16-512 channels on each side; half of
them with diff_dst planes a multiple of 1024 elements, whose copy by columns evicts its own
lines) and runs each ConvTransposeBackwardWeights call (NCX, IOX weights) as the tiles MatMul
both ways (:func:`onednn_convt.lowering.matmul_tiles.conv_transpose_backward_weights`):
by rows, frames (OC*K, N*P) @ src (N*P, IC) then the result transposed; by columns,
src^T (IC, N*P) @ frames (N*P, OC*K). The two results must agree within twice the dtype's
tolerance (else the configuration is listed as WRONG and the exit status is 1); then the
two are timed in alternation, nine rounds of each, each round two calls, the median per call
kept. Prints each configuration with diff_dst's size over src's (the
threshold's measure, ``ROWS_FROM``), the times and rows/columns, and the geometric mean of
the ratios in three bands of that measure.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any, Callable

import numpy as np
from lowering_ab import _per_call_ms  # the sibling script's timer (this folder is on sys.path when run)

import onednn_convt as oc
from onednn_convt import accuracy, cpu, dtypes, lowering
from onednn_convt.lowering import base, matmul_tiles

BANDS = ((8.0, math.inf), (4.0, 8.0), (0.0, 4.0))
#: the package's threshold, restored after each forced build
ROWS_FROM = matmul_tiles.ROWS_FROM


def _layer(rng: np.random.Generator) -> tuple[int, int, int, tuple[int, ...]]:
    """(batch, IC, OC, src spatial sizes) of one random k2 s2 layer, diff_dst 0.2-20 M elements."""
    while True:
        rank = int(rng.choice([2, 2, 3]))
        aliased = rng.random() < 0.5
        if rank == 2:
            if aliased:
                sp = (int(rng.choice([8, 16, 32, 64, 128])), int(rng.choice([8, 16, 32, 64, 128, 256])))
            else:
                sp = (int(rng.integers(4, 150)), int(rng.integers(4, 150)))
        else:
            pick = (lambda: int(rng.choice([4, 8, 16, 32]))) if aliased else (lambda: int(rng.integers(2, 20)))
            sp = (pick(), pick(), pick())
        n = int(rng.choice([1, 1, 2, 4, 8, 16]))
        ic = int(rng.choice([16, 32, 64, 128, 256, 512]))
        oc_ = int(rng.choice([16, 32, 64, 128, 256]))
        dd = n * oc_ * math.prod(sp) * 2**rank
        if 2e5 < dd < 2e7 and dd * ic < 4e9:
            return n, ic, oc_, sp


def _median_ms(f: Callable[[], Any], g: Callable[[], Any]) -> tuple[float, float]:
    """Medians per call (ms) of ``f`` and ``g``, timed in alternation, two calls a round."""
    tf, tg = [], []
    for _ in range(9):
        tf.append(_per_call_ms(f, 2))
        tg.append(_per_call_ms(g, 2))
    return statistics.median(tf), statistics.median(tg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--dtypes", default="f32,bf16")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rules_choice = lowering.rule
    lowering.rule = lambda p, native=False, phase=False: base.TILES  # type: ignore[assignment]
    rng = np.random.default_rng(args.seed)
    rows: list[dict[str, Any]] = []
    wrong: list[str] = []
    print(f"CPU: {cpu.detect().name}")
    try:
        for _ in range(args.layers):
            n, ic, oc_, sp = _layer(rng)
            rank = len(sp)
            k = 2**rank
            for code in args.dtypes.split(","):
                dtype = dtypes.FLOAT_DTYPES[code]
                src = rng.standard_normal((n, ic, *sp), dtype=np.float32).astype(dtype)
                dd = rng.standard_normal((n, oc_, *(2 * x for x in sp)), dtype=np.float32).astype(dtype)
                attrs = dict(strides=(2,) * rank, data_format="NCX", weights_format="IOX",
                             weights_shape=(ic, oc_, *(2,) * rank))
                ops = {}
                for form, threshold in (("rows", 0), ("columns", 10**9)):
                    matmul_tiles.ROWS_FROM = threshold  # read when the op's plan is built
                    ops[form] = oc.ConvTransposeBackwardWeights(**attrs)
                    ops[form](src, dd)
                matmul_tiles.ROWS_FROM = ROWS_FROM
                got = {form: op(src, dd) for form, op in ops.items()}
                diff = accuracy.relative_error(got["rows"], got["columns"])
                # each form within tolerance of the exact sum: the two within twice it
                bad = not diff <= 2 * accuracy.tolerance(code, n * math.prod(sp))
                if bad:
                    wrong.append(f"N={n} {ic}->{oc_} {sp} {code}: the forms differ by {diff:.1e}")
                rows_ms, cols_ms = _median_ms(lambda: ops["rows"](src, dd), lambda: ops["columns"](src, dd))
                ratio = oc_ * k / ic
                row = dict(n=n, ic=ic, oc=oc_, spatial=list(sp), dtype=code, dd_over_src=ratio,
                           plane_aliased=math.prod(sp) * k % 1024 == 0, rows_ms=rows_ms, columns_ms=cols_ms,
                           rows_over_columns=rows_ms / cols_ms, difference=diff)
                rows.append(row)
                print(f"N={n:<2} {ic:>3}->{oc_:<3} {'x'.join(map(str, sp)):>10} {code:4} dd/src {ratio:5.2f}"
                      f"  rows {rows_ms:8.3f} ms  columns {cols_ms:8.3f} ms  rows/columns {rows_ms / cols_ms:.2f}"
                      f"  (results differ by {diff:.1e}){'  WRONG' if bad else ''}", flush=True)
    finally:
        lowering.rule = rules_choice  # type: ignore[assignment]
        matmul_tiles.ROWS_FROM = ROWS_FROM
    for lo, hi in BANDS:
        band = [r["rows_over_columns"] for r in rows if lo <= r["dd_over_src"] < hi]
        if band:
            geo = math.exp(sum(map(math.log, band)) / len(band))
            print(f"diff_dst {lo:g}-{hi:g} x src: {len(band)} configurations, rows/columns geomean {geo:.2f}"
                  f" ({min(band):.2f}-{max(band):.2f})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cpu": cpu.detect().name, "seed": args.seed, "rows": rows}, f, indent=1)
    for line in wrong:
        print(f"WRONG: {line}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())

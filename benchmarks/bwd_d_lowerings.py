"""Side by side: ConvTransposeBackwardData lowered onto the library's own op vs onto Convolution.

The measurement behind :func:`onednn_convt.lowerings.backward_data_kind`. For each models-suite
bwd_d configuration (f32, bf16; NCX, NXC) it builds the op twice, once per lowering, and
times both in alternating rounds (median of 5 calls per round, best of 5 rounds, ms).

    python benchmarks/bwd_d_lowerings.py
"""

from __future__ import annotations

import statistics
import time

from onednn_convt import lowerings
from onednn_convt.bench import suites

KINDS = (lowerings.CONV_TRANSPOSE_BACKWARD_DATA, lowerings.CONVOLUTION)


def _median_ms(case: suites.Case, calls: int = 5) -> float:
    out = case.op(*case.args)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        case.op(*case.args, out=out)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _build(cfg: suites.Config, kind: str) -> suites.Case:
    """The case with its lowering forced to ``kind`` (dilated ops always take Convolution)."""
    rule = lowerings.backward_data_kind
    lowerings.backward_data_kind = lambda dilations, fmt: kind  # type: ignore[assignment]
    try:
        case = cfg.build()
        case.op(*case.args)  # compiles while the forced rule is in place
    finally:
        lowerings.backward_data_kind = rule
    assert case.op.lowering == kind, case.op.lowering
    return case


def main() -> None:
    for cfg in suites.configs("models", ops=["bwd_d"], dtypes_=["f32", "bf16"], skip_slow=True):
        cases = {kind: _build(cfg, kind) for kind in KINDS}
        best = {kind: min(_median_ms(cases[kind]) for _ in range(5)) for kind in KINDS}
        own, conv = (best[k] for k in KINDS)
        print(f"{cfg.key:36s} library op {own:8.2f} ms  Convolution {conv:8.2f} ms  ratio {own / conv:.2f}", flush=True)


if __name__ == "__main__":
    main()

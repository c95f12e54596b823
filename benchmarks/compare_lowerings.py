"""Side by side: each op under each lowering it can take, on the models suite.

The measurements behind the rules in :mod:`onednn_convt.lowerings`. For each models-suite
configuration of the chosen op (f32, bf16; NCX, NXC) it builds the op once per candidate
lowering (forcing the rule), checks the results agree, and times them in alternating rounds
(median of 5 calls per round, best of 5 rounds, ms). The rule's own choice is marked ``*``.

    python benchmarks/compare_lowerings.py bwd_d      # or fwd, bwd_w; --layers dcgan1,unet
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from onednn_convt import lowerings
from onednn_convt.bench import suites

#: op -> (name of the rule in onednn_convt.lowerings, the kinds it chooses between)
RULES = {
    "fwd": ("forward_kind", (lowerings.CONV_TRANSPOSE, lowerings.CONVOLUTION)),
    "bwd_d": ("backward_data_kind", (lowerings.CONV_TRANSPOSE_BACKWARD_DATA, lowerings.CONVOLUTION)),
    "bwd_w": ("backward_weights_kind", (lowerings.CONV_TRANSPOSE_BACKWARD_WEIGHTS, lowerings.CONVOLUTION_BACKWARD_WEIGHTS)),
}


def _median_ms(case: suites.Case, calls: int = 5) -> float:
    out = case.op(*case.args)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        case.op(*case.args, out=out)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _build(cfg: suites.Config, rule: str, kind: str | None) -> tuple[suites.Case, Any]:
    """The case compiled with the rule forced to ``kind`` (None: the rule as it is), and its
    result. Calls with out= later reuse the plans made here."""
    original = getattr(lowerings, rule)
    if kind is not None:
        setattr(lowerings, rule, lambda *args, **kw: kind)
    try:
        case = cfg.build()
        result = case.op(*case.args)
        out = np.empty_like(result)
        case.op(*case.args, out=out)  # the out= plan too, while the forced rule is in place
    finally:
        setattr(lowerings, rule, original)
    return case, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("op", choices=sorted(RULES))
    parser.add_argument("--layers", help="comma-separated layer names (default: all but istft)")
    args = parser.parse_args()
    rule, kinds = RULES[args.op]
    layers = args.layers.split(",") if args.layers else None
    for cfg in suites.configs("models", ops=[args.op], dtypes_=["f32", "bf16"], skip_slow=True, layer_names=layers):
        chosen = _build(cfg, rule, None)[0].op.lowering
        if chosen not in kinds:  # another lowering altogether (MatMul)
            continue
        if args.op == "fwd" and cfg.layer.stride != 1:  # the Convolution form needs stride 1
            continue
        built = {kind: _build(cfg, rule, kind) for kind in kinds}
        (a, ra), (b, rb) = built.values()
        ref = np.asarray(ra, np.float32)
        err = float(np.max(np.abs(np.asarray(rb, np.float32) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))
        best = {kind: min(_median_ms(case) for _ in range(5)) for kind, (case, _) in built.items()}
        cells = "  ".join(f"{k}{'*' if k == chosen else ' '} {best[k]:8.3f} ms" for k in kinds)
        print(f"{cfg.key:36s} {cells}  ratio {best[kinds[1]] / best[kinds[0]]:.2f}  rel diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

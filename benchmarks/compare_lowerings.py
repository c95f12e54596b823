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
    "fwd": ("forward_kind", (lowerings.CONV_TRANSPOSE, lowerings.CONVOLUTION, lowerings.CONVOLUTION_BACKWARD_DATA)),
    "bwd_d": ("backward_data_kind", (lowerings.CONV_TRANSPOSE_BACKWARD_DATA, lowerings.CONVOLUTION)),
    "bwd_w": ("backward_weights_kind", (lowerings.CONV_TRANSPOSE_BACKWARD_WEIGHTS, lowerings.CONVOLUTION_BACKWARD_WEIGHTS)),
}


def _applies(op: str, kind: str, layer: suites.Layer) -> bool:
    """Whether ``kind`` can run ``op`` on ``layer`` at all."""
    if op == "fwd" and kind == lowerings.CONVOLUTION:
        return layer.stride == 1  # the flipped-weights Convolution form needs stride 1
    if kind == lowerings.CONVOLUTION_BACKWARD_DATA:
        return layer.groups == 1  # oneDNN 3.2: invalid_shape with groups
    return True


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
    parser.add_argument("--suite", default="models", help="models (default), tiny or sweep")
    args = parser.parse_args()
    rule, kinds = RULES[args.op]
    layers = args.layers.split(",") if args.layers else None
    for cfg in suites.configs(args.suite, ops=[args.op], dtypes_=["f32", "bf16"], skip_slow=True, layer_names=layers):
        chosen = _build(cfg, rule, None)[0].op.lowering
        if chosen not in kinds:  # another lowering altogether (MatMul)
            continue
        built = {kind: _build(cfg, rule, kind) for kind in kinds if _applies(args.op, kind, cfg.layer)}
        ref = np.asarray(built[kinds[0]][1], np.float32)
        scale = max(float(np.max(np.abs(ref))), 1e-30)
        err = max(float(np.max(np.abs(np.asarray(r, np.float32) - ref))) / scale for _, r in built.values())
        best = {kind: min(_median_ms(case) for _ in range(5)) for kind, (case, _) in built.items()}
        cells = "  ".join(f"{k}{'*' if k == chosen else ' '} {best[k]:9.4f} ms" for k in built)
        ratios = " ".join(f"{best[k] / best[kinds[0]]:.2f}" for k in list(built)[1:])
        print(f"{cfg.key:36s} {cells}  ratio {ratios}  rel diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()

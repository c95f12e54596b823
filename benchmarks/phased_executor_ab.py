"""Phased calls through their C++ executor, and through the Python path, timed side by side
in one process.

Usage::

    python benchmarks/phased_executor_ab.py (--suite broad | --layers-json benchmarks/random_layers_3d_depthwise.json) \\
        [--layers a,b] [--formats NCX,NXC] [--dtypes f32,bf16] [--ops fwd,bwd_d,bwd_w] [--json out.json]

For each configuration (layer, op, dtype, data format), built as ``onednn-convt bench``
builds it, whose rules' plan is phased (polyphase, depth taps, per group) and has a phased
executor (:func:`onednn_convt.plan._phased_executor`), two op objects of that configuration
make the same plan: one keeps the executor ("executor"), the other drops it and runs every
call through :meth:`onednn_convt.plan.PhasedPlan.run` ("python"). Their results are
compared bit for bit, then the two are timed in alternation: eleven rounds of each, each
round as many calls as fill about 20 ms, the median per call kept. Prints each
configuration's times and python/executor ratio, and the geometric mean of the ratios. A
suite's HiFi-GAN and inverse-STFT layers (calls of 0.1-0.3 s) are left out unless --layers
names them.
"""

from __future__ import annotations

from typing import Any

import ab_configs  # the sibling modules (this folder is on sys.path when run)
import numpy as np

from onednn_convt import native

#: layers left out of a suite by default: a call of 0.1-0.3 s, where a few microseconds do not show
SLOW_LAYERS = ("hifigan", "istft")


def main(argv: list[str] | None = None) -> int:
    args = ab_configs.parser(__doc__.split("\n\n")[0]).parse_args(argv)
    rows = []
    for config in ab_configs.configurations(args, "phased_executor_ab", SLOW_LAYERS):
        with_executor, without = config.build(), config.build()
        first = with_executor.op(*with_executor.args)
        executor = getattr(with_executor.op.last_plan, "executor", None)
        if not isinstance(executor, native.PhasedExecutor):
            continue
        without.op(*without.args)
        without.op.last_plan.executor = None  # its later calls take the Python path
        without.op._fast = None

        def fast(case: Any = with_executor) -> Any:
            return case.op(*case.args)

        def python(case: Any = without) -> Any:
            return case.op(*case.args)

        a, b = np.asarray(fast()), np.asarray(python())
        assert without.op._fast is None, "the Python op took a fast path"
        same = bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)) and
                    np.array_equal(np.asarray(first).view(np.uint8), a.view(np.uint8)))
        executor_ms, python_ms = ab_configs.alternated(fast, python)
        row = dict(layer=config.layer.name, op=config.op, format=config.data_format, dtype=config.dtype,
                   lowering=with_executor.op.lowering, steps=executor.steps, executor_ms=executor_ms,
                   python_ms=python_ms, same_bits=same)
        row["ratio"] = row["python_ms"] / row["executor_ms"]
        rows.append(row)
        print(f"{row['layer']:28s} {row['op']:5s} {row['format']} {row['dtype']:4s} {executor.steps:3d} steps"
              f"  executor {row['executor_ms']:8.3f} ms  python {row['python_ms']:8.3f} ms"
              f"  x{row['ratio']:.2f}  same bits {same}", flush=True)
    return ab_configs.report(args, rows, max=max((r["ratio"] for r in rows), default=None),
                             same_bits=all(r["same_bits"] for r in rows))


if __name__ == "__main__":
    raise SystemExit(main())

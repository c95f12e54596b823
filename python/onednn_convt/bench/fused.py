"""``onednn-convt bench --suite fused``: a fused ConvTranspose (bias and post-ops in one
library partition) against the same computation unfused and in PyTorch.

Layers: the models suite's (:func:`onednn_convt.bench.suites.layers`), forward only; the
slow inverse-STFT-like layer only when ``--layers`` names it (the tiny suite's layer can be
named too). Per layer, dtype (f32, bf16) and data format (NCX by default), four post-op
chains, each after the bias (:data:`CASES`); and, in f32's place, one int8 chain (u8 src,
s8 weights, bias, ReLU, u8 dst). Per row, these run in rounds of alternating batches
(:func:`onednn_convt.bench.timing.measure_rounds`), so that every figure of a row sees the
same moments of this noisy machine (PyTorch's and the allocating fused call's batches first
in each round, each after a short sleep; the others without):

* ``fused``: one call of ``ConvTranspose(post_ops=...)`` with ``out=``; ``op.fused`` and
  ``op.partitions`` are recorded (a row the library did not fuse says so);
* ``unfused``: the plain ``ConvTranspose`` (with the bias) with ``out=``, then the same
  post-ops in NumPy, in place (GELU, erf form, through a float32 buffer);
* ``post``: the NumPy post-ops alone (out of place from a ready dst into a buffer, then in
  place: the same bytes as in ``unfused``);
* ``pass``: one memory pass over dst in place, as a post-op run after the op makes it: each
  byte read once and written back (a bitwise XOR with 0 over a copy of dst seen as
  integers: no arithmetic to speak of, any dtype), the least a post-op's pass costs;
* ``copy``: one NumPy copy of dst into another buffer, for comparison: it also reads the
  destination's lines before writing them (write-allocate), 1.3-2.3x a pass here;
* ``fused (alloc)``: the fused call allocating its result, as PyTorch's does;
* ``torch``: ``torch.nn.functional.conv_transpose{1,2,3}d`` with the bias, then the post-ops
  with torch ops (in place where torch has them), on tensors made once, in the same memory
  format and thread count. int8: ``torch.ao.nn.quantized.ConvTranspose{1,2,3}d`` (the
  first quantized engine of :data:`TORCH_QENGINES` whose result passes the check) then the
  quantized ReLU.

Derived per row: ``fused / unfused``, ``torch / fused`` (against the allocating fused call),
``saved`` (the median of per-round differences unfused - fused), ``saved / post`` and
``saved / pass``: at or above 1, fusion saves at least the post-op's memory pass.

Before timing, each row's fused result is checked against the unfused one (and against
PyTorch's) within the dtype's tolerance; a row that fails is reported as an error, not
timed, and the command exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from . import peers, report, suites, timing
from .runner import TOLERANCE
from . import fused_report
from .fused_checks import (CASES, DTYPES, INT8_CASE, TORCH_QENGINES, PostCase, Record, check_close, conv_function,
                           erf_name, layers, numpy_post, tensor, torch_activation, torch_to_numpy, torch_weights)
from .fused_int8 import int8_row
from .fused_report import BUSY, LEGEND, SLOWER, markdown_table, summary, summary_table
from .fused_rows import Inputs, Options, base_record, fusion_state, in_place_pass, make_inputs, time_row


def float_row(inp: Inputs, case: PostCase, opts: Options) -> Record:
    """One float row: build, check, time."""
    import onednn_convt as oc

    cfg = inp.cfg
    rec = base_record(inp, case.name, cfg.dtype)
    attrs = cfg.attrs()
    fused = oc.ConvTranspose(**attrs, post_ops=[oc.PostOp(k) for k in case.kinds])
    plain = oc.ConvTranspose(**attrs)
    operands = [inp.residual if o == "full" else inp.channel for o in case.operands]
    dt = inp.src.dtype
    shape = inp.dst_shape
    out_f, out_u = np.empty(shape, dt), np.empty(shape, dt)
    tmp = np.empty(shape, np.float32) if "GELU" in case.kinds else None
    src, w, bias = inp.src, inp.w, inp.bias

    start = time.perf_counter()
    fused(src, w, bias, *operands, out=out_f)
    rec["compile_ms"] = (time.perf_counter() - start) * 1e3
    fusion_state(fused, rec)
    plain(src, w, bias, out=out_u)
    rec["plain_lowering"] = plain.lowering
    y0 = out_u.copy()  # the plain op's dst, for the post-op-alone and pass runners
    buf, copy = np.empty(shape, dt), np.empty(shape, dt)

    def run_fused() -> None:
        fused(src, w, bias, *operands, out=out_f)

    def run_unfused() -> None:
        plain(src, w, bias, out=out_u)
        numpy_post(out_u, out_u, case.kinds, operands, tmp)

    def run_post() -> None:
        numpy_post(y0, buf, case.kinds, operands, tmp)

    def run_copy() -> None:
        np.copyto(copy, y0)

    def run_fused_alloc() -> Any:
        return fused(src, w, bias, *operands)

    runners: dict[str, Callable[[], Any]] = {
        "fused": run_fused, "unfused": run_unfused, "post": run_post, "pass": in_place_pass(y0),
        "copy": run_copy, "fused_alloc": run_fused_alloc,
    }
    run_fused()
    run_unfused()
    tol = TOLERANCE[cfg.dtype]
    what = rec["key"]
    rec["err_unfused"] = check_close(f"{what}: fused against unfused", out_f, out_u, tol)
    rec["err_alloc"] = check_close(f"{what}: fused allocating against out=", run_fused_alloc(), out_f, 0.0)
    if case.operands[:1] == ("full",):  # a residual first: out= the residual, the call in place
        residual = operands[0].copy()

        def run_fused_inplace() -> None:  # the residual accumulates the results: timing only
            fused(src, w, bias, residual, *operands[1:], out=residual)

        rec["err_inplace"] = check_close(
            f"{what}: fused with out= the residual against out=",
            fused(src, w, bias, residual, *operands[1:], out=residual), out_f, 0.0)
        rec["inplace_lowering"] = fused.lowering
        runners["fused_inplace"] = run_fused_inplace

    torch = peers.torch_module() if opts.torch else None
    if torch is not None:
        call = _torch_float(torch, inp, case, operands)
        result = call()
        rec["err_torch"] = check_close(f"{what}: fused against PyTorch", out_f, torch_to_numpy(result, inp.nxc), 2 * tol)
        del result
        runners["torch"] = call
    time_row(rec, runners, opts, out_f.nbytes)
    return rec


def _torch_float(torch: Any, inp: Inputs, case: PostCase, operands: Sequence[np.ndarray]) -> Callable[[], Any]:
    """PyTorch's ConvTranspose with the bias, then ``case``'s post-ops, on tensors made once."""
    lay, rank, nxc = inp.cfg.layer, inp.rank, inp.nxc
    x = torch_activation(torch, tensor(torch, inp.src), nxc, rank)
    w = torch_weights(torch, tensor(torch, inp.w), inp.cfg.weights_format == "XOI", rank)
    b = tensor(torch, inp.bias)
    seconds = []
    for kind_of, a in zip(case.operands, operands):
        if kind_of == "full":
            seconds.append(torch_activation(torch, tensor(torch, a), nxc, rank))
        else:
            seconds.append(tensor(torch, a).reshape((1, lay.oc) + (1,) * rank))
    conv = conv_function(torch, rank)
    gelu = torch.nn.functional.gelu
    stride, pad, zeros, ones = [lay.stride] * rank, [lay.pad] * rank, [0] * rank, [1] * rank
    kinds = case.kinds

    def call() -> Any:
        with torch.inference_mode():
            y = conv(x, w, b, stride, pad, zeros, lay.groups, ones)
            pending = iter(seconds)
            for kind in kinds:
                if kind == "ReLU":
                    y.relu_()
                elif kind == "Add":
                    y.add_(next(pending))
                elif kind == "Multiply":
                    y.mul_(next(pending))
                else:  # GELU: no in-place form
                    y = gelu(y)
            return y

    return call


def plan(
    layer_list: Sequence[suites.Layer], dtypes_: Sequence[str], formats: Sequence[str], int8: bool = True,
) -> list[tuple[suites.Layer, str, str, Optional[PostCase]]]:
    """The rows, in order: per layer and format, each dtype's four chains; after f32's, the
    int8 row (case None)."""
    rows: list[tuple[suites.Layer, str, str, Optional[PostCase]]] = []
    for lay in layer_list:
        for fmt in formats:
            for dt in dtypes_:
                rows += [(lay, dt, fmt, c) for c in CASES]
                if dt == "f32" and int8:
                    rows.append((lay, dt, fmt, None))
    return rows


def measure(
    layer_list: Sequence[suites.Layer], dtypes_: Sequence[str], formats: Sequence[str], opts: Options,
    int8: bool = True,
) -> list[Record]:
    """Every row: checked, then timed; a row that fails has ``error`` (and no timings). With
    ``opts.retry_busy``, rows during which other processes used more than ``BUSY`` CPUs run
    again (up to that many times), keeping the quieter measurement."""
    rows = plan(layer_list, dtypes_, formats, int8)
    cache: dict[tuple[str, str, str], Inputs] = {}
    start = time.perf_counter()

    def one(lay: suites.Layer, dt: str, fmt: str, case: Optional[PostCase], label: str) -> Record:
        name = case.name if case is not None else INT8_CASE
        print(f"{label} {lay.name} {name} {'int8' if case is None else dt} {fmt} ...",
              end="", file=sys.stderr, flush=True)
        key = (lay.name, dt, fmt)
        if key not in cache:
            cache.clear()  # one layer's tensors at a time
            cache[key] = make_inputs(lay, dt, fmt)
        inp = cache[key]
        if opts.wait_idle > 0:
            timing.wait_for_quiet(opts.wait_idle)
        try:
            rec = float_row(inp, case, opts) if case is not None else int8_row(inp, opts)
        except Exception as e:  # noqa: BLE001 - recorded, reported, and the exit code says so
            rec = base_record(inp, name, "int8" if case is None else dt)
            rec["error"] = f"{type(e).__name__}: {e}"
        print(" " + fused_report.progress(rec) + f"  [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)
        return rec

    width = len(str(len(rows)))
    records = [one(*row, f"[{i:>{width}}/{len(rows)}]") for i, row in enumerate(rows, 1)]
    for attempt in range(1, opts.retry_busy + 1):
        again = [i for i, r in enumerate(records) if fused_report.busy(r) > BUSY]
        if not again:
            break
        print(f"retry {attempt}: {len(again)} rows ran while other processes were busy", file=sys.stderr, flush=True)
        for n, i in enumerate(again, 1):
            rec = one(*rows[i], f"[retry {n}/{len(again)}]")
            if not rec.get("error") and fused_report.busy(rec) < fused_report.busy(records[i]):
                rec["retried"] = attempt
                records[i] = rec
    return records


def run(args: argparse.Namespace, meta: dict[str, Any]) -> int:
    """The fused suite: print and write ``fused.md`` / ``fused.json`` to ``args.out``."""
    quick = args.quick
    opts = Options(
        repeat=args.repeat or (3 if quick else 7),
        budget=args.budget or (0.05 if quick else 2.0),
        torch=not args.no_torch and peers.torch_module() is not None,
        torch_limit=args.torch_limit,
        wait_idle=args.wait_idle,
        retry_busy=args.retry_busy,
    )
    try:
        names = args.layers
        chosen = layers(names)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    wanted = args.dtypes or list(DTYPES)
    bad = [d for d in wanted if d not in DTYPES]
    if bad:
        print(f"bench: the fused suite runs {', '.join(DTYPES)}, not {', '.join(bad)}", file=sys.stderr)
        return 2
    formats = args.formats or ["NCX"]
    meta = dict(meta, gelu_numpy_erf=erf_name(),
                torch_quantized_engines_tried=list(TORCH_QENGINES) if opts.torch else None)
    start = time.perf_counter()
    records = measure(chosen, wanted, formats, opts, int8="f32" in wanted)
    items = summary(records)
    failed = [r for r in records if r.get("error")]
    header = "\n".join(report.header_lines(meta, None))
    notes = [f"NumPy GELU (erf form) through {meta['gelu_numpy_erf']}."]
    if opts.torch:
        engines = sorted({r["torch_engine"] for r in records if r.get("torch_engine")})
        rejected = sorted({e for r in records for e in r.get("torch_rejected", {})})
        notes.append(
            "PyTorch int8 peer: `torch.ao.nn.quantized.ConvTranspose{1,2,3}d` (u8 src, s8 weights, u8 dst; "
            "`torch.ao.nn.quantized.functional` has no conv_transpose), then the quantized ReLU; quantized "
            f"engines tried in the order {', '.join(TORCH_QENGINES)}, the first whose result passes the check "
            f"timed: {', '.join(engines) or 'none'}"
            + (f"; rejected on some row: {', '.join(rejected)} (see each row's torch_rejected in the JSON)"
               if rejected else "") + ".")
    seen: set[str] = set()
    for r in records:
        if r.get("note"):
            notes.append(f"{r['key']}: {r['note']}")
        if r.get("torch_error"):
            notes.append(f"{r['key']}: PyTorch failed: {r['torch_error']}")
        for engine, why in r.get("torch_rejected", {}).items():
            if engine not in seen:
                seen.add(engine)
                notes.append(f"PyTorch int8 engine {engine} rejected (first on {r['key']}): {why}")
    slower = [r for r in records if not r.get("error") and r["fused_vs_unfused"] > SLOWER]
    if slower:
        notes.append(f"fused slower than unfused (fused/unfused above {SLOWER}) on {len(slower)} row(s): "
                     + ", ".join(f"{r['layer']} {r['case']} {r['dtype']} {r['format']} ({r['fused_vs_unfused']:.2f})"
                                 for r in slower))
    busy = [r for r in records if fused_report.busy(r) > BUSY]
    if busy:
        notes.append(f"WARNING: other processes used more than {BUSY} CPUs during {len(busy)} row(s) (column "
                     "busy; --wait-idle, --retry-busy): those timings are slower and noisier")
    if failed:
        notes.append(f"FAILED: {len(failed)} row(s): " + "; ".join(f"{r['key']}: {r['error']}" for r in failed))
    intro = (
        f"Fused ConvTranspose (bias and post-ops in one library partition) against the unfused op followed by "
        f"NumPy and against PyTorch, forward, {opts.repeat} rounds per row ({opts.budget:g} s budget)."
    )
    text = (header + "\n\n" + intro + "\n\n" + summary_table(items) + "\n\n" + markdown_table(records) + "\n\n"
            + LEGEND + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    print()
    print(text)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    base = args.name or "fused"
    (out / f"{base}.md").write_text(text)
    report.write_json({"meta": meta, "options": vars(opts), "elapsed_s": time.perf_counter() - start,
                       "summary": items, "results": records, "notes": notes}, out / f"{base}.json")
    print(f"\nwrote {out / (base + '.md')}, {out / (base + '.json')}", file=sys.stderr)
    if failed:
        print(f"bench: {len(failed)} fused row(s) FAILED their checks (see above)", file=sys.stderr)
        return 1
    return 0

"""``onednn-convt bench``: time the ops against the native loop, PyTorch and the reference.

Examples::

    onednn-convt bench                         # models suite, every op, dtype and format
    onednn-convt bench --suite tiny --quick
    onednn-convt bench --suite models --skip-slow --ops fwd --dtypes f32 --formats NXC
    onednn-convt bench --compare benchmarks/results/zen5/models-rules.json
    onednn-convt bench --suite step            # DCGAN training step: onednn_convt.torch vs torch
    onednn-convt bench --suite fused           # fused ConvTranspose + post-ops vs unfused and torch

Progress goes to stderr; the table, a summary of the figures and the comparison to stdout;
CSV, JSON and (with matplotlib) a PNG chart to ``--out``. The exit code is 1 if a
configuration failed or gave a wrong result (:func:`.runner.wrong`).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.util
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Optional

from .. import arguments, cpu
from . import inference_peers, inference_report, peers, report, runner, suites, timing
from .peak import peak_for

#: ``onednn-convt bench --help``'s text above the options
DESCRIPTION = """\
Time the ops on a suite of layers against the native loop (the same compiled partition run
from C++), PyTorch (if installed) and the NumPy reference, after checking each result against
the reference. Progress goes to stderr; the table, a summary and the comparison (--compare) to
stdout; CSV, JSON, Markdown and (with matplotlib) a PNG chart to --out. Every result is
checked: against the reference, against PyTorch's (the check left to --no-reference runs),
and the call with the weights bound as constant against the plain one; the exit code is 1
if a configuration failed or a check did.

examples:
  onednn-convt bench                         # models suite, every op, dtype and format
  onednn-convt bench --suite tiny --quick    # a smoke run of a few seconds
  onednn-convt bench --suite models --skip-slow --ops fwd --dtypes f32 --formats NXC
  onednn-convt bench --compare bench-results/models.json
  onednn-convt bench --suite step            # DCGAN training step: onednn_convt.torch vs torch
  onednn-convt bench --suite fused           # fused ConvTranspose + post-ops vs unfused and torch"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``onednn-convt bench``."""
    parser.description = DESCRIPTION
    parser.add_argument("--suite", type=arguments.comma_list((*suites.SUITES, *ALONE)), default=["models"],
                        help="suites to run, comma-separated: models (default), tiny, sweep, broad "
                             "(broad-fit and broad-holdout: its halves); or alone: "
                             "step (a DCGAN generator's training step, onednn_convt.torch vs torch) or "
                             "fused (the models layers' ConvTranspose with bias and post-ops fused, "
                             "unfused and in torch; f32, bf16 and int8; NCX unless --formats)")
    parser.add_argument("--ops", type=arguments.comma_list(suites.OPS, suites.OP_ALIASES), default=list(suites.OPS),
                        help="fwd,bwd_d,bwd_w (or the op class names); default all")
    parser.add_argument("--dtypes", type=arguments.comma_list(suites.DTYPES), default=None,
                        help="f32,bf16,f16; default all (fused: f32,bf16)")
    parser.add_argument("--formats", type=arguments.comma_list(suites.FORMATS), default=None,
                        help="NCX,NXC (data_format; weights IOX with NCX, XOI with NXC); default both "
                             "(fused: NCX)")
    parser.add_argument("--layers", type=lambda s: [x for x in s.split(",") if x], default=None,
                        help="only these layers (names as in the table), comma-separated (fused: the "
                             "models suite's without istft unless named)")
    parser.add_argument("--layers-json", type=Path, default=None, metavar="FILE",
                        help="time the layers of this file instead of a suite (suite 'custom'), in the "
                             "format of onednn-convt tune --layers-json")
    parser.add_argument("--bias", action="store_true",
                        help="give each forward a bias (one value per output channel), as torch.nn layers have by default")
    parser.add_argument("--skip-slow", action="store_true",
                        help="leave out layers marked slow (the inverse-STFT-like layer)")
    parser.add_argument("--threads", type=arguments.up_to_cpus("a thread count"), default=None,
                        help="threads for oneDNN (OpenMP) and PyTorch alike, at most the CPUs this "
                             "process may use; default: all of them")
    parser.add_argument("--repeat", type=arguments.positive(int), default=None,
                        help="samples per measurement (default 11, 5 with --quick)")
    parser.add_argument("--budget", type=arguments.positive(float), default=None,
                        help="seconds per measurement, about (default 0.5, 0.05 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="few, short samples and a small peak measurement: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("bench-results"),
                        help="directory for the CSV, JSON and PNG files (default ./bench-results)")
    parser.add_argument("--name", type=arguments.file_stem, default=None,
                        help="base name of the result files (default: the suite names)")
    parser.add_argument("--compare", type=Path, default=None, metavar="OLD.json",
                        help="print speed-ups against an earlier run's JSON file")
    parser.add_argument("--wait-idle", type=arguments.non_negative(float), default=0.0, metavar="SECONDS",
                        help="before each configuration, wait up to SECONDS for other processes to go "
                             "quiet (a shared machine); default 0")
    parser.add_argument("--retry-busy", type=arguments.non_negative(int), default=0, metavar="N",
                        help="re-run up to N times the configurations during which other processes "
                             "used more than 0.2 CPUs, keeping the quieter measurement; default 0")
    parser.add_argument("--retry-noisy", type=arguments.non_negative(int), default=0, metavar="N",
                        help="re-run up to N times the configurations whose samples spread more than "
                             f"{int(NOISY * 100)}%% of the median (IQR), keeping the steadier measurement; default 0")
    parser.add_argument("--torch-limit", type=arguments.non_negative(float), default=5.0, metavar="SECONDS",
                        help="bf16/f16: when PyTorch is estimated (from batch 1) to take longer than "
                             "this per call, report the estimate instead (default 5; 0 = always run)")
    parser.add_argument("--autotune", action="store_true",
                        help="autotune each configuration first (onednn-convt tune), then time it as a "
                             "second process would: its first call reads the choice from the cache "
                             "(and where the choice replaced the rules' lowering, times the two once "
                             "more before it keeps it); and time tuned first calls against untuned "
                             "ones in alternating pairs")
    parser.add_argument("--no-torch", action="store_true", help="do not time PyTorch or check our results against its")
    parser.add_argument("--peers", type=arguments.comma_list(inference_peers.PEERS), default=[],
                        help="also compare with these inference runtimes, where they fit (forward and "
                             "BackwardData; ONNX Runtime in NCX and f32, OpenVINO in NCX and NXC, in f32 "
                             "and the dtypes its CPU plugin runs natively), each against our call with the weights "
                             "bound as constant: " + ",".join(inference_peers.PEERS)
                             + " (pip install 'onednn-convt[bench]')")
    parser.add_argument("--no-reference", action="store_true", help="do not run the NumPy reference (results are then checked against PyTorch's)")
    parser.add_argument("--no-chart", action="store_true", help="do not draw the PNG chart")


#: suites that run alone, each with its own module and result files
ALONE = ("step", "fused")

#: CPUs used by other processes above which a measurement counts as disturbed
BUSY = 0.2

#: spread of our samples (IQR over the median) above which a measurement counts as noisy
NOISY = 0.2


def _busy(rec: dict[str, Any]) -> float:
    """CPUs other processes used while the configuration ran."""
    return float(rec.get("others_cpu") or 0)


def _spread(rec: dict[str, Any]) -> float:
    """IQR over the median of our call's samples (0 for a failed configuration)."""
    median, iqr = rec.get("median_ms"), rec.get("iqr_ms")
    return float(iqr / median) if median and iqr is not None else 0.0


def set_threads(n: int) -> Optional[int]:
    """Use ``n`` threads in oneDNN (OpenMP: OMP_NUM_THREADS and omp_set_num_threads) and in
    PyTorch; returns OpenMP's thread count afterwards (None if libgomp cannot be reached)."""
    os.environ["OMP_NUM_THREADS"] = str(n)
    try:
        gomp = ctypes.CDLL("libgomp.so.1")
        gomp.omp_set_num_threads(ctypes.c_int(n))
        got: Optional[int] = int(gomp.omp_get_max_threads())
    except OSError:
        got = None
    peers.torch_set_threads(n)
    return got


def _tune(cfg: suites.Config) -> dict[str, Any]:
    """Autotune ``cfg`` (the choice lands in the cache its timed calls then read, as a
    second process reads it: where the choice overturned the rules', that process times the
    two again before it trusts it, :func:`onednn_convt.lowering.autotune.choice`)."""
    from .. import tune
    from ..lowering import autotune, tuning_cache

    autotune.set_autotune(True)
    tuned = tune.tune_config(cfg)
    tuning_cache.forget()  # what follows is a second process
    autotune.set_autotune(True)
    return tuned


def _meta(args: argparse.Namespace, threads: int, omp: Optional[int]) -> dict[str, Any]:
    from ..info import info
    from ..lowering import rules

    i = info()
    torch = peers.torch_module() if not args.no_torch else None
    return {
        **{k: i[k] for k in ("onednn_version", "onednn_commit", "cpu_runtime", "cpu_isa")},
        "libdnnl": os.path.basename(i["libdnnl"]),  # no machine paths in the result files
        "dtype_support": {dt: i["dtypes"]["ConvTranspose"][dt] for dt in suites.DTYPES},
        "threads": threads, "omp_threads": omp,
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        **(peers.torch_versions() if not args.no_torch else {"torch": None, "torch_onednn": None}),
        "cpus": arguments.usable_cpus(), "cpu_model": cpu.detect().name,
        "python": platform.python_version(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": _without_paths(sys.argv[1:]), "autotune": bool(getattr(args, "autotune", False)),
        # which measured table chose the lowerings: its name, file digest and provenance
        "rules_table": rules.result_record(),
        "peers": inference_peers.versions(tuple(getattr(args, "peers", ()))),
    }


#: the options whose values are files or folders
PATH_OPTIONS = ("--out", "--layers-json", "--compare")


def _without_paths(argv: list[str]) -> list[str]:
    """``argv`` with each file or folder option's value cut to its last component: no
    machine paths in the result files."""
    out = []
    for i, arg in enumerate(argv):
        option, eq, value = arg.partition("=")
        if eq and option in PATH_OPTIONS:
            arg = f"{option}={os.path.basename(value.rstrip('/')) or value}"
        elif i > 0 and argv[i - 1] in PATH_OPTIONS:
            arg = os.path.basename(arg.rstrip("/")) or arg
        out.append(arg)
    return out


def run(args: argparse.Namespace) -> int:
    """Run the chosen suites; print the table and targets; write the files."""
    quick = args.quick
    threads = args.threads or arguments.usable_cpus()
    omp = set_threads(threads)
    opts = runner.Options(
        repeat=args.repeat or (5 if quick else 11),
        budget=args.budget or (0.05 if quick else 0.5),
        torch=not args.no_torch,
        reference=not args.no_reference,
        wait_idle=args.wait_idle,
        torch_limit=args.torch_limit,
        peers=tuple(args.peers),
        threads=threads,
    )
    for peer in opts.peers:
        absent = inference_peers.missing(peer)
        if absent is not None:
            print(f"bench: --peers {peer}: {absent}", file=sys.stderr)
            return 2
    unwritable = arguments.make_writable_dir("bench: --out", args.out)
    if unwritable:
        print(unwritable, file=sys.stderr)
        return 2
    alone = [s for s in args.suite if s in ALONE]
    if alone and args.layers_json is not None:
        print(f"bench: --layers-json times the file's layers; the {alone[0]} suite runs alone (drop one of them)",
              file=sys.stderr)
        return 2
    if alone:
        if len(args.suite) > 1:
            print(f"bench: the {alone[0]} suite runs alone (--suite {alone[0]})", file=sys.stderr)
            return 2
        if alone[0] == "fused":
            from . import fused

            return fused.run(args, _meta(args, threads, omp))
        from . import training_step

        return training_step.run(args, _meta(args, threads, omp))
    args.dtypes = args.dtypes or list(suites.DTYPES)
    args.formats = args.formats or list(suites.FORMATS)
    try:
        old = report.read_json(args.compare) if args.compare else None
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    if args.layers_json is not None:
        from ..tune import layers_from_json

        try:
            layers = layers_from_json(args.layers_json, "bench")
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        configs = suites.configs(suites.CUSTOM, args.ops, args.dtypes, args.formats, False, args.layers, args.bias,
                                 custom=layers)
    else:
        configs = [c for s in args.suite for c in suites.configs(
            s, args.ops, args.dtypes, args.formats, args.skip_slow, args.layers, args.bias)]
    if not configs:
        print("bench: no configuration matches the options", file=sys.stderr)
        return 2

    meta = _meta(args, threads, omp)
    for line in report.header_lines(meta, None):
        print(line)
    print(f"measuring the peak ({'quick' if quick else 'full'})...", file=sys.stderr, flush=True)
    if opts.wait_idle > 0:
        timing.wait_for_quiet(opts.wait_idle)
    monitor = timing.LoadMonitor()
    peak = measure_peak_for(quick)
    peak["others_cpu"] = monitor.others()
    print(report.header_lines(meta, peak)[-1] + (" (at the start; measured again at the end)" if not quick else ""),
          flush=True)

    records = []
    start = time.perf_counter()
    width = len(str(len(configs)))
    for i, cfg in enumerate(configs, 1):
        print(f"[{i:>{width}}/{len(configs)}] {cfg.key} ({cfg.layer.describe()}) ...",
              end="", file=sys.stderr, flush=True)
        tuned = _tune(cfg) if args.autotune else None
        rec = runner.run_config(cfg, opts, peak)
        if tuned is not None:
            rec["tuning"] = tuned
            if not tuned.get("error"):  # (the row has the same error, from its own call)
                runner.measure_first_calls(cfg, rec)
        records.append(rec)
        print(" " + _progress(rec) + f"  [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    retries = [(args.retry_busy, _busy, BUSY, "ran while other processes were busy"),
               (args.retry_noisy, _spread, NOISY, "spread their samples widely")]
    for times, badness, limit, why in retries:
        for attempt in range(1, times + 1):
            again_at = [i for i, r in enumerate(records) if badness(r) > limit]
            if not again_at:
                break
            print(f"retry {attempt}: {len(again_at)} configurations {why}", file=sys.stderr, flush=True)
            for n, i in enumerate(again_at, 1):
                cfg = configs[i]
                print(f"[retry {n}/{len(again_at)}] {cfg.key} ...", end="", file=sys.stderr, flush=True)
                rec = runner.run_config(cfg, opts, peak)
                if badness(rec) < badness(records[i]) and not rec.get("error"):
                    records[i] = rec
                print(" " + _progress(rec) + f"  [{time.perf_counter() - start:.0f} s]", file=sys.stderr, flush=True)

    if not quick:  # the peak again at the end; the better of the two counts
        monitor.restart()
        again = measure_peak_for(quick)
        again["others_cpu"] = monitor.others()
        peak["start"] = {k: peak.get(k) for k in ("f32_gflops", "others_cpu")}
        peak["end"] = {k: again.get(k) for k in ("f32_gflops", "others_cpu")}
        for key in ("f32_gflops", "bf16_gflops", "f16_gflops", "numpy_f32_gflops"):
            peak[key] = max(peak[key], again[key])
        peak["others_cpu"] = min(peak["others_cpu"] or 0, again["others_cpu"] or 0)
        for rec in records:
            if rec.get("gflops") is not None:
                rec["pct_peak"] = 100.0 * rec["gflops"] / peak_for(peak, rec["dtype"])

    print()
    print(report.text_table(records))
    print()
    print(report.LEGEND)
    if opts.peers:
        print()
        print(inference_report.text(records))
    busy = [r["others_cpu"] for r in records if r.get("others_cpu") is not None]
    if busy and max(busy) > BUSY:
        print(f"\nWARNING: other processes used up to {max(busy):.1f} CPUs during this run "
              f"({sum(b > 0.2 for b in busy)} of {len(busy)} configurations above 0.2, column 'busy'); "
              "those timings are slower and noisier than the machine can do (see --wait-idle).")
    unchecked = [r["key"] for r in records if not r.get("error") and r.get("ref_err") is None
                 and r.get("torch_err") is None]
    if unchecked:
        print(f"\nNOTE: {len(unchecked)} of {len(records)} configurations' results were checked against neither the "
              "reference (--no-reference, or a layer too large for it) nor PyTorch's (not run, or estimated)")
    failed = [(r["key"], failure) for r in records for failure in runner.wrong(r)]
    if failed:
        print(f"\nWRONG RESULTS in {len({k for k, _ in failed})} of {len(records)} configurations (the exit code is 1):")
        for key, failure in failed:
            print(f"  {key}: {failure}")
    items = report.targets(records)
    print()
    print("Summary:")
    print(report.summary_text(items))
    if old is not None:
        print()
        print(report.compare(old, records))

    args.out.mkdir(parents=True, exist_ok=True)
    base = args.name or (suites.CUSTOM if args.layers_json is not None else "-".join(args.suite))
    doc = {"meta": meta, "peak": peak, "options": vars(opts), "elapsed_s": time.perf_counter() - start,
           "results": records, "targets": items}
    report.write_json(doc, args.out / f"{base}.json")
    report.write_csv(records, args.out / f"{base}.csv")
    (args.out / f"{base}.md").write_text(
        "\n".join(report.header_lines(meta, peak)) + "\n\n" + report.markdown_table(records) + "\n\n"
        + report.LEGEND + "\n\n" + (inference_report.markdown(records) + "\n\n" if opts.peers else "")
        + "Summary:\n" + report.summary_text(items) + "\n"
    )
    written = [f"{base}.json", f"{base}.csv", f"{base}.md"]
    if not args.no_chart:
        if report.chart(records, args.out / f"{base}.png"):
            written.append(f"{base}.png")
        elif importlib.util.find_spec("matplotlib") is None:
            print("bench: no chart drawn: matplotlib is not installed "
                  "(pip install matplotlib, or the package's [bench] extra)", file=sys.stderr)
    print(f"\nwrote {', '.join(str(args.out / w) for w in written)}", file=sys.stderr)
    return 1 if failed or any(r.get("error") for r in records) else 0


def measure_peak_for(quick: bool) -> dict[str, Any]:
    """The peak measurement, smaller with --quick."""
    from .peak import measure_peak

    return measure_peak(size=512, samples=3, budget=0.2) if quick else measure_peak()


def _progress(rec: dict[str, Any]) -> str:
    if rec.get("error"):
        return f"ERROR {rec['error']}"
    text = f"{rec['median_ms']:.3g} ms, {rec['gflops']:.3g} GFLOP/s, compile {rec['compile_ms']:.3g} ms"
    if rec.get("torch_ms") is not None:
        text += f", torch {rec['torch_ms']:.3g} ms ({rec['vs_torch']:.2f}x)"
    for peer in inference_peers.PEERS:
        prefix = inference_peers.PREFIX[peer]
        if rec.get(f"{prefix}_ms") is not None:
            text += f", {peer} {rec[f'{prefix}_ms']:.3g} ms ({rec[f'vs_{prefix}']:.2f}x)"
    for failure in runner.wrong(rec):
        text += f", WRONG: {failure}"
    return text

"""``onednn-convt tune``: autotune a bench suite, or layers of your own, ahead of time.

Each configuration (layer x op x dtype x data format) is called once with autotuning on, so
its choice lands in the cache file (:mod:`onednn_convt.lowering.tuning_cache`) that later
processes read. Examples::

    onednn-convt tune                                   # the models suite, every op/dtype/format
    onednn-convt tune --suite models --skip-slow --dtypes f32,bf16 --json tuned.json
    onednn-convt tune --layers-json my_layers.json      # [{"name": "up1", "n": 8, "ic": 256,
                                                        #   "oc": 128, "spatial": [16, 16],
                                                        #   "kernel": [4, 4], "stride": 2, "pad": 1}]

A layer is a forward problem (src -> dst, as in ``bench``): ``name``, the integers ``n``,
``ic``, ``oc``, ``spatial`` and ``kernel`` (lists), and optionally ``stride``, ``pad`` and
``groups``; a layer that is no valid problem, or whose arrays pass the memory limit, is
refused before anything is tuned.
Where a choice changes the rules' lowering, the two are timed once more after every other
configuration, as the next process to use it would (:data:`onednn_convt.lowering.autotune.CHECKS`):
the cache then holds settled choices, which later processes only compile.
The table says, per configuration, the rules' lowering, the chosen one, its speed-up over
the rules' (the tuner's own medians) and what tuning cost.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from . import arguments, cpu, guards, limits, shapes
from .bench import suites


#: ``onednn-convt tune --layers-json``'s help: the file's format
LAYERS_JSON_HELP = (
    "tune the layers of this JSON file instead of a suite: a list of objects, one per layer, "
    'e.g. [{"name": "up1", "n": 8, "ic": 256, "oc": 128, "spatial": [16, 16], "kernel": [4, 4], '
    '"stride": 2, "pad": 1}]. A layer is a forward problem as in bench: src of batch n, ic '
    "channels and the spatial size in spatial (1 to 3 dims) -> dst of oc channels. Required: "
    "name, n, ic, oc, spatial, kernel (a list, one size per spatial dim); optional: stride "
    "(default 1), pad (pads_begin = pads_end, default 0), groups (default 1), each one int "
    "for every spatial dim"
)

EPILOG = """\
examples:
  onednn-convt tune                                    # the models suite, every op/dtype/format
  onednn-convt tune --suite models --skip-slow --dtypes f32,bf16 --json tuned.json
  onednn-convt tune --layers-json my_layers.json --ops fwd --dtypes f32
  ONEDNN_CONVT_CACHE_DIR=/tmp/tuned onednn-convt tune --suite tiny   # another cache folder

Choices are kept in autotune.json in the user cache directory, or in $ONEDNN_CONVT_CACHE_DIR;
'onednn-convt info' shows the file. A process uses them with autotuning on
(onednn_convt.set_autotune(True) or ONEDNN_CONVT_AUTOTUNE=1)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``tune`` subcommand's options."""
    parser.epilog = EPILOG
    parser.add_argument("--suite", default="models", choices=sorted(suites.SUITES), type=str.lower,
                        help="the bench suite whose layers to tune (default models)")
    parser.add_argument("--layers-json", type=Path, metavar="FILE", help=LAYERS_JSON_HELP)
    parser.add_argument("--layers", type=lambda t: t.split(","), metavar="NAMES",
                        help="only these layers of the suite, comma-separated")
    parser.add_argument("--ops", type=arguments.comma_list(suites.OPS, suites.OP_ALIASES), default=list(suites.OPS),
                        help="ops to tune, comma-separated: fwd, bwd_d, bwd_w (or the op class names); "
                             "default all")
    parser.add_argument("--dtypes", type=arguments.comma_list(suites.DTYPES), default=list(suites.DTYPES),
                        help="dtypes to tune, comma-separated: f32, bf16, f16; default all")
    parser.add_argument("--formats", type=arguments.comma_list(suites.FORMATS), default=list(suites.FORMATS),
                        help="data formats to tune, comma-separated: NCX (with IOX weights), NXC "
                             "(with XOI weights); default both")
    parser.add_argument("--skip-slow", action="store_true",
                        help="leave out the suite's layers marked slow (the inverse-STFT-like layer)")
    parser.add_argument("--retune", action="store_true",
                        help="delete the cache file first and measure every configuration again")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write the choices and every candidate's time to this JSON file")


def layers_from_json(path: Path, command: str = "tune") -> list[suites.Layer]:
    """The layers of a ``--layers-json`` file of ``command`` (named in the messages).

    Raises:
        ValueError: the file is not a JSON list of layer objects, or a layer is not a valid
            forward problem whose float32 arrays fit in the memory limit.
    """
    try:
        items = arguments.read_json_file(path)
        if not isinstance(items, list):
            raise TypeError("expected a list")
        layers = [
            suites.Layer(
                str(d["name"]), _whole(d["n"]), _whole(d["ic"]), _whole(d["oc"]),
                tuple(_whole(v) for v in d["spatial"]), tuple(_whole(v) for v in d["kernel"]),
                _whole(d.get("stride", 1)), _whole(d.get("pad", 0)), _whole(d.get("groups", 1)),
            )
            for d in items
        ]
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as e:
        msg = (f"{command}: --layers-json {path}: expected a JSON list of layers (name, n, ic, oc, spatial, "
               f"kernel), got {e!r}")
        raise ValueError(msg) from None
    for layer in layers:
        why = _layer_problem(layer)
        if why:
            raise ValueError(f"{command}: --layers-json {path}: layer {layer.name!r}: {why}")
    return layers


def _whole(value: Any) -> int:
    """A JSON integer (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected integers, got {value!r}")
    return value


def _layer_problem(layer: suites.Layer) -> str:
    """What makes ``layer`` no problem to tune ('' if nothing): a count below 1, a negative
    pad, spatial and kernel of other lengths or outside 1-3 dims, channels that the groups do
    not divide, an empty output, or arrays past the memory limit (f32, the largest op's)."""
    counts = {"n": layer.n, "ic": layer.ic, "oc": layer.oc, "stride": layer.stride, "groups": layer.groups}
    low = [f"{k} = {v}" for k, v in counts.items() if v < 1]
    low += [f"spatial {layer.spatial}"] if min(layer.spatial, default=1) < 1 else []
    low += [f"kernel {layer.kernel}"] if min(layer.kernel, default=1) < 1 else []
    if low:
        return f"expected positive values, got {', '.join(low)}"
    if layer.pad < 0:
        return f"expected pad >= 0, got {layer.pad}"
    if not 1 <= len(layer.spatial) <= 3 or len(layer.kernel) != len(layer.spatial):
        return f"expected spatial and kernel of the same length, 1 to 3, got {layer.spatial} and {layer.kernel}"
    if layer.ic % layer.groups or layer.oc % layer.groups:
        return f"expected ic and oc divisible by groups = {layer.groups}, got {layer.ic} and {layer.oc}"
    dims = len(layer.spatial)
    out = shapes.conv_transpose_output(layer.spatial, layer.kernel, (layer.stride,) * dims, (1,) * dims,
                                       (layer.pad,) * dims, (layer.pad,) * dims, (0,) * dims)
    if min(out) < 1:
        return f"expected a non-empty output, got spatial {out} (pad {layer.pad} is too large)"
    elements = (layer.n * layer.ic * math.prod(layer.spatial) + layer.n * layer.oc * math.prod(out)
                + layer.ic * layer.oc // layer.groups * math.prod(layer.kernel))
    limit = limits.memory_limit()
    if limit is not None and 4 * elements > limit:
        return (f"its f32 arrays take {limits.format_bytes(4 * elements)}, expected at most the memory limit, "
                f"{limits.format_bytes(limit)}")
    return ""


def configs(args: argparse.Namespace) -> list[suites.Config]:
    """The configurations the options name."""
    if args.layers_json is None:
        return suites.configs(args.suite, args.ops, args.dtypes, args.formats, args.skip_slow, args.layers)
    return suites.configs(suites.CUSTOM, args.ops, args.dtypes, args.formats, custom=layers_from_json(args.layers_json))


def tune_config(cfg: suites.Config) -> dict[str, Any]:
    """Call one configuration with autotuning on; what the tuner chose and why (``error``:
    why it could not be called, a memory limit below its arrays)."""
    case = cfg.build()
    lay = cfg.layer
    rec: dict[str, Any] = {
        "key": cfg.key, "op": cfg.op, "dtype": cfg.dtype, "data_format": cfg.data_format,
        "shape_class": lay.shape_class,
    }
    if cfg.suite == suites.CUSTOM:  # no suite names it: its shape, for make_rules.py and rules_cv.py
        rec["layer"] = {"n": lay.n, "ic": lay.ic, "oc": lay.oc, "groups": lay.groups, "spatial": list(lay.spatial),
                        "kernel": list(lay.kernel), "stride": lay.stride, "pad": lay.pad}
    try:
        case.op(*case.args)
    except MemoryError as e:
        rec.update(lowering=None, chosen=None, rule=None, error=f"MemoryError: {e}")
        return rec
    t = case.op.tuning
    rec["lowering"] = case.op.lowering
    if t is None:
        rec.update(chosen=None, rule=None, note="one candidate (a guard or the rules' only lowering)")
        return rec
    rule_us = t.times_us.get(t.rule)
    rec.update(
        chosen=t.name, rule=t.rule, cached=t.cached, seconds=round(t.seconds, 3), times_us=t.times_us,
        rejected=t.rejected, batch=t.batch, checks=t.checks, settled=t.settled,
        speedup=None if not rule_us else round(rule_us / t.times_us[t.name], 3),
    )
    if t.confirm_us:
        rec["confirm_us"] = t.confirm_us
    if t.recheck_us:
        rec["recheck_us"] = t.recheck_us
    return rec


def run(args: argparse.Namespace) -> int:
    """Tune every configuration, with a progress bar; print the table."""
    from tqdm import tqdm

    from .lowering import autotune, rules, tuning_cache

    try:
        todo = configs(args)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    # the choices go to the cache file (what tune is for) and --json: both writable, or nothing is tuned
    cache, cache_file = "tune: the autotuning cache file (in $ONEDNN_CONVT_CACHE_DIR or the user cache directory)", tuning_cache.path()
    unwritable = arguments.make_writable_file(cache, cache_file)
    if not unwritable and args.json is not None:
        unwritable = arguments.make_writable_file("tune: --json", args.json)
    if not unwritable and args.retune:
        try:
            tuning_cache.clear()
        except OSError as e:
            unwritable = f"{cache} {cache_file}: --retune cannot delete it ({e.strerror or e})"
    if unwritable:
        print(unwritable, file=sys.stderr)
        return 2
    autotune.set_autotune(True)
    records = []
    for cfg in tqdm(todo, desc="tuning", unit="config", file=sys.stderr):
        records.append(tune_config(cfg))
    # each change from the rules' choice timed again after all the others, as the next
    # process would (autotune.CHECKS): the cache then holds settled choices only, and a
    # deployed process compiles them and times nothing
    changed = [i for i, r in enumerate(records) if r.get("settled") is False]
    if changed:
        tuning_cache.forget()
        autotune.set_autotune(True)
        for i in tqdm(changed, desc="checking changes", unit="config", file=sys.stderr):
            first = records[i]
            records[i] = tune_config(todo[i])
            records[i]["seconds"] = round(first.get("seconds", 0) + records[i].get("seconds", 0), 3)
    print(f"{'configuration':<34} {'rules':<30} {'tuned':<30} {'speed-up':>8} {'cost s':>7}")
    for r in records:
        if r.get("error"):
            print(f"{r['key']:<34} ERROR {r['error']}")
            continue
        speed = f"{r['speedup']:.2f}" if r.get("speedup") else "-"
        cost = "cache" if r.get("cached") else f"{r.get('seconds', 0):.2f}"
        print(f"{r['key']:<34} {str(r['rule'] or '-'):<30} {str(r['chosen'] or r['lowering']):<30} {speed:>8} {cost:>7}")
    print(f"choices cached in {cache_file}")
    if args.json is not None:
        me = cpu.detect()
        where = {"microarchitecture": me.microarchitecture, "name": me.name}
        # "rules_table": the table whose choices the records' "rule" column holds
        args.json.write_text(json.dumps({"context": tuning_cache.context(), "cpu": where, "isa": guards.dispatch_isa(),
                                         "rules_table": rules.result_record(), "records": records}, indent=1))
    return 1 if any(r.get("error") for r in records) else 0

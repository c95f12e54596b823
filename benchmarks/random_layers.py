"""Layers nobody tuned for: seeded random layers for ``onednn-convt tune``, and what the
rules' choices cost on them.

The suites hold published layers; the rules were fit on part of them. This draws layers
no suite holds (1-D to 3-D; dense, grouped, depthwise, one-channel ends; kernels 2-32,
strides 1-16; batch 1-32), each sized to a few tens to a few hundred million multiply-adds
(a call of about 1-100 ms, above this host's sub-millisecond noise) with activations of
about 8 Mi elements at most, and reads the tuner's side-by-side times of every candidate::

    python benchmarks/random_layers.py draw --seed 1 --count 40 > layers.json
    python benchmarks/random_layers.py draw --seed 20 --small > small.json
    python benchmarks/random_layers.py draw --seed 9 --kinds grouped,depthwise > layers.json
    ONEDNN_CONVT_CACHE_DIR=$(mktemp -d) onednn-convt tune --layers-json layers.json \\
        --dtypes f32 --retune --json tune.json
    python benchmarks/random_layers.py report tune.json [--limit 1.5]

``--kinds`` keeps the layers of those kinds (of ``KINDS``) among those drawn, until it has
``--count``: more layers of the kinds the rules choose badly for, named by their index among
all the seed's draws.
``--small`` draws small layers instead: 0.1-5 million multiply-adds (a call of tens to a few
hundred microseconds), batch 1-16 and at most 128 channels, the layers of small networks
and of a batch of one, where a call's fixed costs (each library op's, each Python step's)
weigh as much as its arithmetic; they are named ``t{seed}r{index}-...``.
``report`` prints, per run, the geometric mean over the configurations of the rules'
time over the fastest candidate's and over the library op's (the op's own
ConvTranspose, ConvTransposeBackwardData or ConvTransposeBackwardWeights), and each
configuration whose rules' choice took more than ``--limit`` times the fastest candidate's
time. The tuner times candidates alternated in one process (``onednn_convt.lowering.autotune``);
a ratio near 1 is within its noise, a ratio of 2 is not.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any

import numpy as np

from onednn_convt.bench import suites

#: (kernel, stride, pad) of up-sampling and same-size layers, per rank
GEOMETRIES = {
    1: ((2, 2, 0), (3, 1, 1), (4, 2, 1), (5, 1, 2), (8, 4, 2), (11, 5, 3), (16, 8, 4), (32, 16, 8), (7, 1, 3)),
    2: ((2, 2, 0), (3, 1, 1), (3, 2, 1), (4, 2, 1), (4, 4, 0), (5, 2, 2), (7, 1, 3), (8, 4, 2), (16, 8, 4)),
    3: ((2, 2, 0), (3, 1, 1), (3, 2, 1), (4, 2, 1), (4, 4, 0), (5, 1, 2)),
}
CHANNELS = (1, 3, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)
BATCHES = (1, 2, 4, 8, 16, 32)
#: the spatial size's bound per rank (an input's)
MAX_SIDE = {1: 8192, 2: 256, 3: 48}
#: elements of the larger activation at most (32 MiB in f32), of a square input (a non-square
#: one, its sides halved and doubled, may come a little over)
MAX_ELEMENTS = 8 * 2**20


#: the kinds of layer drawn (a layer's name says its kind), and how often each
KINDS = {"dense": 0.4, "grouped": 0.2, "depthwise": 0.15, "one-out": 0.15, "one-in": 0.1}


def _channels(rng: np.random.Generator) -> tuple[int, int, int, str]:
    """(ic, oc, groups, kind)."""
    kind = str(rng.choice(list(KINDS), p=list(KINDS.values())))
    if kind == "dense":
        return int(rng.choice(CHANNELS[2:])), int(rng.choice(CHANNELS[2:])), 1, kind
    if kind == "grouped":
        g = int(rng.choice([2, 4, 8, 16, 32]))
        per_in, per_out = (int(rng.choice([1, 2, 4, 8, 16])) for _ in range(2))
        return g * per_in, g * per_out, g, kind
    if kind == "depthwise":
        c = int(rng.choice([8, 16, 32, 64, 128, 256]))
        return c, c, c, kind
    few = int(rng.choice([1, 2, 3]))
    many = int(rng.choice(CHANNELS[4:]))
    return (many, few, 1, kind) if kind == "one-out" else (few, many, 1, kind)


#: multiply-adds of a drawn layer (log-uniform between the two), normal and ``--small``
MACS = {False: (3e7, 6e8), True: (1e5, 5e6)}
#: a small layer's bounds: batch and channels at most these
SMALL_BATCH = 16
SMALL_CHANNELS = 128


def draw_layer(rng: np.random.Generator, seed: int, index: int, small: bool = False) -> dict[str, Any]:
    """One layer in the tuner's ``--layers-json`` form, named by its seed and index (so that
    the layers of several seeds merge into one table); ``small``: see the module docstring."""
    rank = int(rng.choice([1, 2, 3], p=[0.2, 0.55, 0.25]))
    k, s, p = (int(v) for v in GEOMETRIES[rank][int(rng.integers(len(GEOMETRIES[rank])))])
    ic, oc, groups, kind = _channels(rng)
    n = int(rng.choice(BATCHES))
    if small:
        n = min(n, SMALL_BATCH)
        while max(ic, oc) > SMALL_CHANNELS:  # halve both: the kind (its groups) stays
            ic, oc, groups = max(1, ic // 2), max(1, oc // 2), max(1, groups // 2)
    lo, hi = MACS[small]
    macs = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    per_position = n * ic * (oc // groups) * k**rank
    side = max(1, min(MAX_SIDE[rank], round((macs / per_position) ** (1 / rank))))
    while side > 1 and n * max(ic, oc) * ((side - 1) * s + k) ** rank > MAX_ELEMENTS:
        side -= 1
    spatial = [side] * rank
    if rank > 1 and rng.random() < 0.3:  # a non-square input
        spatial[0] = max(1, side // 2)
        spatial[-1] = min(MAX_SIDE[rank], side * 2)
    name = f"{'t' if small else 's'}{seed}r{index:02d}-{rank}d-{kind}-k{k}s{s}"
    return {"name": name, "n": n, "ic": ic, "oc": oc, "spatial": spatial, "kernel": [k] * rank,
            "stride": s, "pad": p, "groups": groups}


def kind_of(layer: dict[str, Any]) -> str:
    """A drawn layer's kind (of ``KINDS``), from its name: ``s9r07-2d-one-in-k3s1`` is one-in."""
    return str(layer["name"]).split("-", 2)[2].rsplit("-", 1)[0]


def draw(seed: int, count: int, kinds: set[str], small: bool = False) -> list[dict[str, Any]]:
    """The first ``count`` layers of ``kinds`` that seed ``seed`` draws (every kind: its first
    ``count`` layers); ``small`` ones where asked."""
    rng = np.random.default_rng(seed)
    layers: list[dict[str, Any]] = []
    index = 0
    while len(layers) < count:
        layer = draw_layer(rng, seed, index, small)
        index += 1
        if kind_of(layer) in kinds:
            layers.append(layer)
    return layers


def report(paths: list[str], limit: float) -> int:
    """Print each run's ratios (see the module docstring)."""
    library = {key: name for name, key in suites.OP_ALIASES.items()}  # each op's own library op
    for path in paths:
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        best, lib, slow = [], [], []
        for rec in run["records"]:
            times = rec.get("times_us") or {}
            rule = times.get(rec.get("rule") or "")
            if not rule:
                continue
            fastest = min(times.values())
            best.append(rule / fastest)
            own = times.get(library[rec["op"]])
            if own:
                lib.append(rule / own)
            if rule / fastest > limit:
                winner = min(times, key=lambda name: times[name])
                slow.append((rule / fastest, rec["key"], rec["rule"], rule, winner, fastest))
        print(f"{path}: {run.get('cpu', {}).get('name', '?')}, {run.get('isa', '?')}: {len(best)} configurations "
              f"with a timed rules' choice")
        if best:
            print(f"  rules / fastest: geomean {statistics.geometric_mean(best):.3f}, "
                  f"worst {max(best):.2f}; above {limit}: {len(slow)}")
        if lib:
            print(f"  rules / library op: geomean {statistics.geometric_mean(lib):.3f}, "
                  f"worst {max(lib):.2f}, {sum(r > 1.1 for r in lib)} above 1.10")
        for ratio, key, rule_name, rule_us, winner, fastest in sorted(slow, reverse=True):
            print(f"  {ratio:5.2f}x  {key}: {rule_name} {rule_us / 1000:.2f} ms, {winner} {fastest / 1000:.2f} ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("draw", help="print COUNT seeded random layers as --layers-json")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--count", type=int, default=40)
    d.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds to keep (default: all)")
    d.add_argument("--small", action="store_true", help="small layers (0.1-5 M multiply-adds; see above)")
    r = sub.add_parser("report", help="the rules' choices against the fastest candidate, from tune --json files")
    r.add_argument("paths", nargs="+")
    r.add_argument("--limit", type=float, default=1.5, help="list configurations slower than this (default 1.5)")
    args = parser.parse_args(argv)
    if args.command == "draw":
        kinds = set(args.kinds.split(","))
        if not kinds <= set(KINDS):
            parser.error(f"--kinds: expected some of {', '.join(KINDS)}, got {args.kinds!r}")
        layers = draw(args.seed, args.count, kinds, args.small)
        print("[\n" + ",\n".join(json.dumps(layer) for layer in layers) + "\n]")
        return 0
    return report(args.paths, args.limit)


if __name__ == "__main__":
    raise SystemExit(main())

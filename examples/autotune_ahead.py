"""Autotune a model's ConvTranspose layers ahead of time, so that deployed processes only
compile the fastest lowering.

With autotuning on, the first call of each input signature times the ways this package can
run it on this CPU (the library's op, its Convolution forms, MatMuls) and keeps the fastest;
the choice is written to a cache file (``autotune.json`` in ``ONEDNN_CONVT_CACHE_DIR``, by
default the user cache directory) that later processes read. This example tunes a small
DCGAN generator's layers two ways, into a temporary cache directory:

1. ``onednn-convt tune --layers-json layers.json`` (the layers in NCX, PyTorch's layout);
2. the Python API: ``onednn_convt.set_autotune(True)`` and one call per layer (NXC);

then starts a fresh "deployed" process with ``ONEDNN_CONVT_AUTOTUNE=1`` that runs the layers
in both layouts: no call tunes again, and every result must match ``onednn_convt.reference``.
``onednn-convt tune`` settles its choices (a change from the rules' lowering is timed a
second time after the others), so the NCX calls take theirs from the cache
(``op.tuning.cached``). A change made through the Python API is settled by the first later
process that uses it: that process times the two lowerings once more (``op.tuning.recheck_us``).

    python examples/autotune_ahead.py            # batch 16, DCGAN's widths
    python examples/autotune_ahead.py --small    # batch 2, narrow layers (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onednn_convt as oc


# the layers in the format of `onednn-convt tune --layers-json` (forward problems: src ->
# dst; stride and pad are one value for every spatial dim)
def layers(small: bool) -> list[dict]:
    n, ngf = (2, 4) if small else (16, 64)
    widths = [8 * ngf, 4 * ngf, 2 * ngf, ngf, 3]
    return [{"name": f"up{i + 1}", "n": n, "ic": ic, "oc": o, "spatial": [4 * 2**i] * 2, "kernel": [4, 4], "stride": 2, "pad": 1}
            for i, (ic, o) in enumerate(zip(widths, widths[1:]))]


def run_layers(spec: list[dict], data_format: str) -> list[dict]:
    """Call each layer once (autotuning, where it is on, tunes or reads the cache); check it."""
    weights_format = "IOX" if data_format == "NCX" else "XOI"
    rng = np.random.default_rng(0)
    out = []
    for lay in spec:
        attrs = {"strides": lay["stride"], "pads_begin": lay["pad"], "pads_end": lay["pad"],
                     "data_format": data_format, "weights_format": weights_format}
        shape = [lay["n"], lay["ic"], *lay["spatial"]] if data_format == "NCX" else [lay["n"], *lay["spatial"], lay["ic"]]
        w_shape = [lay["ic"], lay["oc"], *lay["kernel"]] if weights_format == "IOX" else [*lay["kernel"], lay["oc"], lay["ic"]]
        x = rng.standard_normal(shape).astype(np.float32)
        w = (rng.standard_normal(w_shape) / np.sqrt(lay["ic"] * 16)).astype(np.float32)
        op = oc.ConvTranspose(**attrs)
        y = op(x, w)
        want = oc.reference.conv_transpose(x, w, **attrs)
        error = float(np.abs(y - want).max() / np.abs(want).max())
        t = op.tuning
        out.append({"layer": lay["name"], "format": data_format, "lowering": op.lowering, "error": error,
                        "tuned": t is not None, "cached": bool(t and t.cached), "rechecked": bool(t and t.recheck_us)})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a few seconds (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    parser.add_argument("--deployed", action="store_true", help=argparse.SUPPRESS)  # the fresh process
    args = parser.parse_args()
    spec = layers(args.small)
    if args.deployed:  # autotuning on from the environment: report what each call used
        print(json.dumps(run_layers(spec, "NCX") + run_layers(spec, "NXC")))
        return 0

    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, ONEDNN_CONVT_CACHE_DIR=cache_dir)
        os.environ["ONEDNN_CONVT_CACHE_DIR"] = cache_dir  # this process's cache too
        layers_json = Path(cache_dir) / "layers.json"
        layers_json.write_text(json.dumps(spec, indent=1))

        print("1. onednn-convt tune --layers-json layers.json --ops fwd --dtypes f32 --formats NCX")
        subprocess.run([sys.executable, "-m", "onednn_convt", "tune", "--layers-json", str(layers_json),
                        "--ops", "fwd", "--dtypes", "f32", "--formats", "NCX"], env=env, check=True)

        print("\n2. the Python API: set_autotune(True), one call per layer (NXC)")
        oc.set_autotune(True)
        for r in run_layers(spec, "NXC"):
            print(f"   {r['layer']} {r['format']}: {r['lowering']}")
        oc.set_autotune(False)

        print("\n3. a deployed process with ONEDNN_CONVT_AUTOTUNE=1 reads the choices")
        child = subprocess.run([sys.executable, __file__, "--deployed"] + (["--small"] if args.small else []),
                               env=dict(env, ONEDNN_CONVT_AUTOTUNE="1"), check=True, capture_output=True, text=True)
        report = json.loads(child.stdout.splitlines()[-1])
        for r in report:
            source = ("from the cache" if r["cached"] else "one candidate, nothing to tune" if not r["tuned"]
                      else "a change made in step 2, timed once more against the rules'" if r["rechecked"]
                      else "TUNED AGAIN")
            print(f"   {r['layer']} {r['format']}: {r['lowering']} ({source}), error {r['error']:.1e}")
        assert all(r["cached"] or not r["tuned"] for r in report if r["format"] == "NCX"), "a call tune settled was timed"
        assert all(r["cached"] or r["rechecked"] or not r["tuned"] for r in report), "a deployed call tuned again"
        assert any(r["cached"] for r in report)
        assert all(r["error"] < 1e-4 for r in report)
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

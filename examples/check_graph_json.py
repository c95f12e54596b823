"""Check your own oneDNN graph JSON with the conformance runner.

The conformance runner reads the graph JSON files that oneDNN's benchdnn reads (one
ConvTranspose-family op, or a fused ConvTranspose pattern) and benchdnn-style harness files
that sweep them, runs each case through this package and judges it against the float64
reference, exactly. This example:

1. writes the graph JSON of a call of your own (``onednn_convt.conformance.to_graph_json``);
2. writes a harness file that runs it again with other attributes, batch and dtype;
3. runs both with ``onednn-convt conformance`` (exit status 0: nothing failed);
4. runs a broken case (weights whose channels do not match src) through the Python API
   (``collect``, ``run_cases``), which reports it INVALID with the reason.

    python examples/check_graph_json.py            # a DCGAN-sized layer
    python examples/check_graph_json.py --small    # a small layer (CI)
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
from onednn_convt import conformance


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a few seconds (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    args = parser.parse_args()
    n, ic, oc_, size = (1, 8, 4, 5) if args.small else (16, 256, 128, 8)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        # 1. the graph JSON of a call, in the library's spelling with every attribute
        op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
        x = np.zeros((n, ic, size, size), np.float32)  # only the shapes and dtypes are written
        w = np.zeros((ic, oc_, 4, 4), np.float32)
        (folder / "my_layer.json").write_text(conformance.to_graph_json(op, x, w))

        # 2. a harness file: each line is a case; --op-attrs=0:... sets op 0's attributes
        (folder / "harness_my_layer").write_text(
            "# my layer, as written, then swept\n"
            "--reset --case=my_layer.json\n"
            "--reset --op-attrs=0:auto_pad:SAME_UPPER,0:auto_pad:VALID --case=my_layer.json\n"
            "--reset --mb=3 --case=my_layer.json\n"
            "--reset --dt=bf16 --case=my_layer.json\n"
            "--reset --op-attrs=0:output_padding:1x1 --case=my_layer.json\n"  # one value per spatial dim
        )

        # 3. the command line: files, folders and harness files
        print(f"onednn-convt conformance {folder}/harness_my_layer")
        run = subprocess.run([sys.executable, "-m", "onednn_convt", "conformance", str(folder / "harness_my_layer")],
                             capture_output=True, text=True, check=False)
        print(run.stdout.strip().splitlines()[-1])
        assert run.returncode == 0, run.stdout + run.stderr

        # 4. a broken case through the Python API: src has `ic` channels, the weights ic + 1
        graph = json.loads((folder / "my_layer.json").read_text())
        weights = graph["graph"][0]["inputs"][1]
        weights["shape"][0] = ic + 1
        weights["stride"] = list(np.cumprod([1, *weights["shape"][:0:-1]])[::-1].tolist())
        (folder / "broken.json").write_text(json.dumps(graph))
        cases = conformance.collect([str(folder / "broken.json")])
        (result,) = conformance.run_cases(cases)
        print(f"broken.json: {result.outcome}: {result.message}")
        assert result.outcome == "INVALID", result
    print("ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Random differential scan over problems sized to reach oneDNN's blocked and AMX kernels.

Each problem is a valid call of one op in one dtype, with 8-96 channels per group (or
depthwise) or, one in five, a model-sized layer (256-1024 input channels, a published
layer's geometry, mostly with a bias), groups, strides above the kernel, kernel 1, dilation, pads, auto_pad,
output_padding, bias, 1-D to 3-D, NCX/NXC and IOX/XOI. It is called twice and once with
``out=``, and every result is compared with the float64 reference on the same (rounded)
inputs, with the tolerance every numeric test uses (:func:`helpers.tolerance`).

Run as a script, one batch per process, so that a problem which crashes the interpreter
(oneDNN heap corruption, a segfault) ends only its batch::

    ONEDNN_MAX_CPU_ISA=AVX512_CORE python tests/isa_scan.py --seed 7 --count 50

It prints one JSON line per problem *before* running it (``{"start": ...}``) and one after
(``{"ok": ...}``), so the driver (:func:`run_batch`) can name the problem in flight when the
process dies. ``tests/test_isa_matrix.py`` runs batches under every ISA level this CPU has.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from helpers import DTYPES, OPS, Config, ek, tolerance  # noqa: E402

FWD, BWD_D, BWD_W = OPS
#: ONEDNN_MAX_CPU_ISA values, lowest first, and the ISA name oneDNN reports for each.
ISA_LEVELS = {
    "AVX2": "avx2",
    "AVX512_CORE": "avx512_core",
    "AVX512_CORE_BF16": "avx512_core_bf16",
    "AVX512_CORE_FP16": "avx512_core_fp16",
    "AVX512_CORE_AMX": "avx512_core_amx",
}
#: (level, problems run, of them native, failures) of each scan in this pytest session
#: (conftest prints it)
COVERAGE: list[tuple[str, int, int, int]] = []
#: (level, the child pytest's summary line) of each differential-file run (test_isa_matrix)
COVERAGE_FILES: list[tuple[str, str]] = []
#: multiply-adds per problem at most: keeps one problem (reference included) near 50 ms
MAX_MACS = 6_000_000


@dataclass(frozen=True)
class Problem:
    """One scan problem: a configuration, the op, the dtype and the seed of its data."""

    cfg: Config
    op: str
    code: str
    seed: int

    def describe(self) -> str:
        return f"{self.op} {self.code} {self.cfg}"

    def to_json(self) -> dict[str, Any]:
        cfg = {k: v for k, v in asdict(self.cfg).items() if k != "name"}
        return {"cfg": cfg, "op": self.op, "code": self.code, "seed": self.seed}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Problem:
        cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in data["cfg"].items()}
        return Problem(Config(**cfg), data["op"], data["code"], data["seed"])


def _macs(cfg: Config) -> int:
    return cfg.n * math.prod(cfg.src) * cfg.ic * (cfg.oc // cfg.groups) * math.prod(cfg.kernel)


#: multiply-adds per problem at most for the model-sized ones (256-1024 input channels)
MAX_MODEL_MACS = 40_000_000
#: the up-sampling layers of published models: (kernel, stride, pads, output_padding)
LAYERS = ((4, 2, 1, 0), (3, 2, 1, 1), (2, 2, 0, 0), (4, 4, 0, 0), (5, 2, 2, 1), (3, 1, 1, 0))


def model_config(rng: np.random.Generator) -> Config:
    """A model-sized layer: 256-1024 input channels, a published layer's geometry, mostly
    with a bias (oneDNN 3.2's strided deconvolution added it once per tap on such layers on
    AMD Zen4/Zen5, errors up to 2.3x the output's scale: the guard
    strided_deconvolution_epilogue)."""
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    while True:
        rank = pick((1, 2, 2, 2, 3))
        k, s, p, op = pick(LAYERS)
        ic, oc = pick((256, 384, 512, 768, 1024)), pick((32, 64, 128, 256))
        side = max(1, int((MAX_MODEL_MACS / (ic * oc * k**rank)) ** (1 / rank)))
        src = tuple(int(rng.integers(1, min(side, 16) + 1)) for _ in range(rank))
        cfg = Config(
            src=src, kernel=(k,) * rank, n=pick((1, 1, 2)), ic=ic, oc=oc, strides=(s,) * rank,
            pads_begin=(p,) * rank, pads_end=(p,) * rank, output_padding=(op,) * rank,
            data_format=pick(("NCX", "NXC")), weights_format=pick(("IOX", "XOI")), bias=pick((True, True, False)),
        )
        if cfg.valid and _macs(cfg) <= MAX_MODEL_MACS:
            return cfg


def scan_config(rng: np.random.Generator) -> Config:
    """A random valid configuration in the blocked-kernel range (8-96 channels per group),
    or, one in five, a model-sized layer (:func:`model_config`)."""
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    if rng.random() < 0.2:
        return model_config(rng)
    while True:
        rank = pick((1, 2, 3))
        kind = pick(("dense", "dense", "groups", "depthwise"))
        if kind == "depthwise":
            groups = pick((8, 16, 24, 32, 48, 64))
            icg = ocg = 1
        else:
            groups = 1 if kind == "dense" else pick((2, 3, 4))
            icg, ocg = pick((8, 16, 24, 32, 48, 64, 96)), pick((8, 16, 24, 32, 48, 64, 96))
        kernel = tuple(pick((1, 1, 2, 3, 4, 5) if rank < 3 else (1, 1, 2, 3)) for _ in range(rank))
        # strides above the kernel often (the AMX fault), equal or below it too
        strides = tuple(pick((1, 2, 3, 4, k + 1, k + 2)) for k in kernel)
        dilations = tuple(pick((1, 1, 1, 2)) for _ in range(rank))
        src = tuple(pick((1, 2, 3, 4, 5, 7, 9, 12, 16) if rank < 3 else (1, 2, 3, 4, 6)) for _ in range(rank))
        pads_begin = tuple(pick(tuple(range(ek(k, d)))) for k, d in zip(kernel, dilations))
        pads_end = tuple(pick(tuple(range(ek(k, d) + 1))) for k, d in zip(kernel, dilations))
        cfg = Config(
            src=src, kernel=kernel, n=pick((1, 2)), ic=groups * icg, oc=groups * ocg, groups=groups,
            strides=strides, dilations=dilations, pads_begin=pads_begin, pads_end=pads_end,
            output_padding=tuple(pick(tuple(range(s))) for s in strides),
            auto_pad=pick(("None", "None", "None", "SAME_UPPER", "SAME_LOWER", "VALID")),
            data_format=pick(("NCX", "NXC")), weights_format=pick(("IOX", "XOI")), bias=pick((False, True)),
        )
        if cfg.valid and _macs(cfg) <= MAX_MACS and _macs(cfg) * math.prod(cfg.strides) <= 4 * MAX_MACS:
            return cfg


def problems(seed: int, count: int, ops: Sequence[str] = OPS, codes: Sequence[str] = ("bf16", "f16", "f32")) -> list[Problem]:
    """``count`` problems from ``seed``: ops and dtypes in turn, configurations random."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        cfg = scan_config(rng)
        out.append(Problem(cfg, ops[i % len(ops)], codes[(i // len(ops)) % len(codes)], int(rng.integers(2**31))))
    return out


def _call(problem: Problem) -> tuple[Callable[..., Any], tuple[Any, ...], np.ndarray, int]:
    """(op object, its arguments, the float64 reference, the reduction length)."""
    import onednn_convt as oc

    cfg, code = problem.cfg, problem.code
    t = cfg.tensors(np.random.default_rng(problem.seed), code)
    if problem.op == FWD:
        bias = t["bias"] if cfg.bias else None
        args: tuple[Any, ...] = (t["src"], t["weights"], bias)
        ref = cfg.ref_forward(t["src"], t["weights"], bias)
        return oc.ConvTranspose(**cfg.attrs()), args, ref, cfg.fwd_reduction
    if problem.op == BWD_D:
        ref = cfg.ref_backward_data(t["diff_dst"], t["weights"])
        op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
        return op, (t["diff_dst"], t["weights"]), ref, cfg.bwd_data_reduction
    ref = cfg.ref_backward_weights(t["src"], t["diff_dst"])
    op = oc.ConvTransposeBackwardWeights(weights_shape=cfg.weights_shape, **cfg.attrs(BWD_W))
    return op, (t["src"], t["diff_dst"]), ref, cfg.bwd_weights_reduction


def check(problem: Problem) -> tuple[Optional[str], bool]:
    """(None if the three calls of ``problem`` match the reference, else what went wrong;
    whether the calls ran on the dtype's own kernels, not emulated in f32)."""
    op, args, ref, reduction = _call(problem)
    error = _compare(op, args, ref, problem.code, reduction)
    plan = op.last_plan
    return error, plan is not None and not plan.emulated


def _compare(op: Any, args: tuple[Any, ...], ref: np.ndarray, code: str, reduction: int) -> Optional[str]:
    scale = float(np.max(np.abs(ref))) or 1.0
    limit = tolerance(code, reduction)
    for what in ("first call", "second call", "out= call"):
        if what == "out= call":
            out = np.full(ref.shape, np.nan, DTYPES[code])
            got = op(*args, out=out)
            if got is not out:
                return "out= call returned another array"
        else:
            got = op(*args)
        got64 = np.asarray(got, np.float64)
        if got64.shape != ref.shape:
            return f"{what}: shape {got64.shape}, expected {ref.shape}"
        err = float(np.max(np.abs(got64 - ref))) / scale if np.all(np.isfinite(got64)) else math.inf
        if err > limit:
            return f"{what} ({op.lowering}): error {err:.3g} of the output's scale, tolerance {limit:.3g}"
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--dtypes", default="bf16,f16,f32")
    parser.add_argument("--only", type=int, default=None, help="run only problem ONLY of the batch")
    parser.add_argument("--unguarded", action="store_true", help="turn the guards off (to measure them)")
    args = parser.parse_args(argv)
    import onednn_convt as oc

    oc.guards.set_enabled(not args.unguarded)

    print(json.dumps({"isa": oc.info()["cpu_isa"]}), flush=True)
    for i, problem in enumerate(problems(args.seed, args.count, args.ops.split(","), args.dtypes.split(","))):
        if args.only is not None and i != args.only:
            continue
        print(json.dumps({"start": i, "problem": problem.to_json()}), flush=True)
        error, native = check(problem)
        print(json.dumps({"ok": i, "error": error, "native": native}), flush=True)
    return 0


@dataclass
class BatchResult:
    """What one scan process reported: the ISA it ran on, problems run, how many of them on
    the dtype's own kernels (not emulated in f32), the failures (a description of each, a
    crash included) and the exit status."""

    isa: Optional[str]
    ran: int
    native: int
    failures: list[str]
    returncode: int


def run_batch(
    seed: int, count: int, isa: Optional[str] = None, ops: Sequence[str] = OPS,
    codes: Sequence[str] = ("bf16", "f16", "f32"), timeout: float = 600, unguarded: bool = False,
) -> BatchResult:
    """Run one batch in a child interpreter capped at ``isa`` (None: the CPU's own)."""
    env = dict(os.environ)
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    cmd = [sys.executable, str(Path(__file__)), "--seed", str(seed), "--count", str(count),
           "--ops", ",".join(ops), "--dtypes", ",".join(codes)] + (["--unguarded"] if unguarded else [])
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        stdout, stderr, rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr, rc = "timeout", -1
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    isa_seen = next((x["isa"] for x in lines if "isa" in x), None)
    started = {x["start"]: Problem.from_json(x["problem"]) for x in lines if "start" in x}
    done = {x["ok"]: x["error"] for x in lines if "ok" in x}
    failures = [f"{started[i].describe()}: {err}" for i, err in sorted(done.items()) if err]
    repro = " ".join(cmd[2:])
    if rc != 0:
        lost = [i for i in started if i not in done]
        where = started[lost[0]].describe() if lost else "before the first problem"
        failures.append(f"process died (status {rc}) in {where}; stderr: {stderr.strip()[-300:]}; rerun with {repro}")
    native = sum(1 for x in lines if x.get("native"))
    return BatchResult(isa_seen, len(done), native, failures, rc)


if __name__ == "__main__":
    sys.exit(main())

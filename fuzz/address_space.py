"""Address-space fuzzer: ops under a random ``ulimit -v`` (RLIMIT_AS), lowered while they run.

Each trial (its own process) draws 1-4 problems of the three ops (f32 or bf16, 1-D to 3-D,
NCX/NXC, groups) whose result takes from 1 MiB to 128 MiB, runs some of them first (so they
are compiled and the library's temporary blocks are kept, or given back at random), then
lowers the soft address-space limit to what the process maps now plus a random headroom
(1 MiB to 1 GiB) and calls each op, with and without ``out=``. A call under the limit must
give the result the same op gives without it, or raise MemoryError (the package's names
the op; with a headroom of a few MiB the interpreter's own may come first), never another
exception (oneDNN 3.2 out of memory while it compiles is left broken, see the
package's ``limits.address_space_reserve``). Then the limit goes back, and every op, and a
new op of each problem, must run and agree; a result small enough is also checked against
the float64 reference. A crash or a hang is the harness's finding.
"""

from __future__ import annotations

import math
import resource
from typing import Any

import numpy as np

import onednn_convt as oc
from harness import Failure
from onednn_convt import accuracy, native, reference

NAME = "address_space"
PER_PROCESS = 1
TIMEOUT = 300.0
DTYPES = {"f32": np.float32, "bf16": oc.dtypes.FLOAT_DTYPES["bf16"]}
#: the largest src (f32 bytes) a problem may have: sized by its dst, a problem of many src
#: channels and few dst channels had a 1.9 GiB src, which the library copies, and so was
#: refused by the 2 GiB memory limit the harness sets, with or without an address-space
#: limit (seed 4005, trial 10)
MAX_INPUT_BYTES = 2**28
#: multiply-adds past which the float64 reference is skipped (the op's own unlimited result
#: is the oracle of the limited call there)
REFERENCE_MACS = 5 * 10**7


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def _problem(rng: np.random.Generator) -> dict[str, Any]:
    """A valid problem whose dst (or diff_dst) takes about 2**[20, 27) bytes in f32."""
    op = str(rng.choice(["fwd", "bwd_d", "bwd_w"]))
    code = str(rng.choice(["f32", "bf16"]))
    rank = int(rng.choice([1, 2, 3]))
    groups = int(rng.choice([1, 1, 2]))
    ic, oc_ = groups * int(rng.integers(1, 33)), groups * int(rng.integers(1, 33))
    kernel = [int(rng.integers(1, 5)) for _ in range(rank)]
    strides = [int(rng.integers(1, 3)) for _ in range(rank)]
    n = int(rng.integers(1, 17))
    per_dim = (2 ** rng.uniform(20, 27) / 4 / n / oc_) ** (1 / rank)
    src = [max(1, int(per_dim / s)) for s in strides]
    fmt = str(rng.choice(["NCX", "NXC"]))
    pads = [int(rng.integers(0, k)) for k in kernel]
    attrs = dict(strides=strides, groups=groups, data_format=fmt, pads_begin=pads, pads_end=pads,
                 weights_format="IOX" if fmt == "NCX" else "XOI")
    dst = [s * (x - 1) + k - 2 * p for x, k, s, p in zip(src, kernel, strides, pads)]
    if min(dst) < 1:
        return _problem(rng)
    if 4 * n * ic * math.prod(src) > MAX_INPUT_BYTES:  # the library's copy of src would pass the limit
        return _problem(rng)
    dt = DTYPES[code]
    act = (lambda c, sp: (n, c, *sp)) if fmt == "NCX" else (lambda c, sp: (n, *sp, c))
    wshape = (ic, oc_ // groups, *kernel) if fmt == "NCX" else (*kernel, oc_ // groups, ic)
    x = rng.standard_normal(act(ic, src), np.float32).astype(dt)
    w = rng.standard_normal(wshape, np.float32).astype(dt)
    dd = rng.standard_normal(act(oc_, dst), np.float32).astype(dt)
    macs = n * math.prod(src) * ic * oc_ // groups * math.prod(kernel)
    if op == "fwd":
        args: tuple[Any, ...] = (x, w)
        reduction = ic // groups * math.prod(kernel)
    elif op == "bwd_d":
        args = (dd, w)
        reduction = oc_ // groups * math.prod(kernel)
    else:
        args = (x, dd)
        reduction = n * math.prod(dst)
    return dict(op=op, code=code, attrs=attrs, args=args, wshape=wshape, macs=macs,
                tol=accuracy.tolerance(code, reduction) * 4)


def _make(p: dict[str, Any]) -> Any:
    if p["op"] == "fwd":
        return oc.ConvTranspose(**p["attrs"])
    if p["op"] == "bwd_d":
        return oc.ConvTransposeBackwardData(**p["attrs"])
    return oc.ConvTransposeBackwardWeights(weights_shape=list(p["wshape"]), **p["attrs"])


def _reference(p: dict[str, Any]) -> np.ndarray:
    f64 = [np.asarray(a, np.float64) for a in p["args"]]
    if p["op"] == "fwd":
        return reference.conv_transpose(f64[0], f64[1], **p["attrs"])
    if p["op"] == "bwd_d":
        return reference.conv_transpose_backward_data(f64[0], f64[1], **p["attrs"])
    return reference.conv_transpose_backward_weights(f64[0], f64[1], p["wshape"], **p["attrs"])


def _differs(got: np.ndarray, want: np.ndarray, tol: float) -> float | None:
    """The relative error of ``got`` against ``want`` where it passes ``tol``, else None."""
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = float(np.max(np.abs(b))) or 1.0
    err = float(np.max(np.abs(a - b))) / scale if a.size else 0.0
    return err if not err <= tol else None


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    problems = [_problem(rng) for _ in range(int(rng.integers(1, 5)))]
    ops = [_make(p) for p in problems]
    warm = [bool(rng.random() < 0.6) for _ in problems]
    for p, op, w in zip(problems, ops, warm):
        if w:
            op(*p["args"])
    if rng.random() < 0.5:
        native.release_host_memory()
    headroom = int(2 ** rng.uniform(20, 30))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + headroom
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    got: list[Any] = []
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        for p, op in zip(problems, ops):
            try:
                if rng.random() < 0.3:
                    out = np.empty_like(op(*p["args"]))  # a second call: the same plan, out= given
                    got.append(op(*p["args"], out=out))
                else:
                    got.append(op(*p["args"]))
            except MemoryError:  # the package's (naming the op), or the interpreter's own near the limit
                got.append(None)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    refused = 0
    for k, (p, op) in enumerate(zip(problems, ops)):
        what = f"problem {k} ({p['op']} {p['code']} {p['attrs']}, {'warm' if warm[k] else 'cold'})"
        try:
            want = op(*p["args"])
            fresh = _make(p)(*p["args"])
        except Exception as e:  # noqa: BLE001 - the library left broken is the finding
            raise Failure(f"{what}: with the limit lifted: {type(e).__name__}: {e}") from None
        if got[k] is None:
            refused += 1
        elif (err := _differs(got[k], want, p["tol"])) is not None:
            raise Failure(f"{what}: under the limit, relative error {err:.3g} against the same op without it")
        if (err := _differs(fresh, want, p["tol"])) is not None:
            raise Failure(f"{what}: a new op after the limit, relative error {err:.3g}")
        if p["macs"] <= REFERENCE_MACS and (err := _differs(want, _reference(p), p["tol"])) is not None:
            raise Failure(f"{what}: relative error {err:.3g} against the float64 reference")
    return f"{len(problems)} problems under {headroom >> 20} MiB of headroom: {refused} refused"

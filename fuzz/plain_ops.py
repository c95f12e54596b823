"""Differential fuzzer of the plain ops: random valid calls against the float64 reference.

Each trial draws one op (ConvTranspose with or without a bias, BackwardData,
BackwardWeights), one dtype (f32, bf16, f16), 1-D to 3-D, NCX/NXC, IOX/XOI, groups
(depthwise included), strides, dilations, pads (asymmetric, auto_pad), output_padding, and
channel counts from tiny to model-sized (256-1024, where oneDNN's blocked kernels change
their blocking; the Zen4 bias defect lived there), with spatial sizes kept small enough
for the reference. It calls the op twice (the second through the cached fast path) and
once with ``out=``, and compares each result with the reference on the same rounded
inputs, judged against the magnitude of the summed products (the reference on the
inputs' absolute values), so that products cancelling to a small result do not fail a
correct one.

Half the trials run every lowering choice drawn at random among the problem's candidates
(:func:`onednn_convt.lowering.candidates`), a polyphase op's phases each by its own draw:
a measured table may choose any candidate for any problem, a phase's stride-1 problem
included, and a channels-last phase of an NCX view once failed where the rules had never
chosen it.
"""

from __future__ import annotations

import contextlib
import math
import zlib
from typing import Any, Iterator

import numpy as np

import onednn_convt as oc
from harness import Failure
from onednn_convt import accuracy, lowering, reference

NAME = "plain"
PER_PROCESS = 25
TIMEOUT = 120.0
#: multiply-adds per trial at most (keeps the float64 reference near a second)
MAX_MACS = 200_000_000
DTYPES = {"f32": np.float32, "bf16": oc.dtypes.FLOAT_DTYPES["bf16"], "f16": np.float16}


def _channels(rng: np.random.Generator) -> tuple[int, int, int]:
    """(IC, OC, groups): small, model-sized, grouped or depthwise."""
    kind = rng.choice(["small", "model", "grouped", "depthwise"], p=[0.35, 0.35, 0.15, 0.15])
    if kind == "small":
        return int(rng.integers(1, 40)), int(rng.integers(1, 40)), 1
    if kind == "model":
        return int(rng.choice([128, 192, 256, 384, 512, 768, 1024])), int(rng.choice([3, 16, 64, 128, 256, 512])), 1
    if kind == "grouped":
        g = int(rng.choice([2, 3, 4, 8, 32]))
        return g * int(rng.integers(1, 17)), g * int(rng.integers(1, 17)), g
    g = int(rng.choice([3, 16, 64, 128]))
    return g, g, g


#: the up-sampling layers of published models: (kernel, stride, pads, output_padding)
LAYERS = ((4, 2, 1, 0), (3, 2, 1, 1), (2, 2, 0, 0), (3, 1, 1, 0), (4, 4, 0, 0), (5, 2, 2, 1))


def draw(rng: np.random.Generator) -> dict[str, Any]:
    """One valid problem, as the keywords the trial and its description use."""
    op = str(rng.choice(["fwd", "fwd_bias", "bwd_d", "bwd_w"]))
    code = str(rng.choice(["f32", "bf16", "f16"], p=[0.5, 0.35, 0.15]))
    rank = int(rng.choice([1, 2, 3], p=[0.25, 0.55, 0.2]))
    ic, oc_, groups = _channels(rng)
    attrs: dict[str, Any] = dict(
        groups=groups, data_format=str(rng.choice(["NCX", "NXC"])), weights_format=str(rng.choice(["IOX", "XOI"])),
    )
    if rng.random() < 0.4:  # a published layer's geometry, model-sized
        k, s, pad, op_ = LAYERS[int(rng.integers(len(LAYERS)))]
        kernel = [k] * rank
        attrs.update(strides=[s] * rank, dilations=[1] * rank, pads_begin=[pad] * rank,
                             pads_end=[pad] * rank, output_padding=[op_] * rank)
    else:
        kernel = [int(rng.choice([1, 2, 3, 4, 5, 7])) for _ in range(rank)]
        strides = [int(rng.choice([1, 2, 2, 3, 4])) for _ in range(rank)]
        dilations = [int(rng.choice([1, 1, 1, 2, 3])) for _ in range(rank)]
        attrs.update(strides=strides, dilations=dilations)
        if rng.random() < 0.15:
            attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        else:
            ek = [d * (k - 1) + 1 for k, d in zip(kernel, dilations)]
            attrs["pads_begin"] = [int(rng.integers(0, e)) for e in ek]
            attrs["pads_end"] = [int(rng.integers(0, e)) for e in ek]
        attrs["output_padding"] = [int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in strides]
    # spatial size: at most 20 a side, and the work under MAX_MACS
    per_position = max(1, ic * (oc_ // groups) * math.prod(kernel))
    budget = max(1, MAX_MACS // per_position)
    n = int(rng.choice([1, 1, 2, 3, 4, 8]))
    side = max(1, int((budget / n) ** (1 / rank)))
    src = [int(rng.integers(1, max(2, min(side, 20)) + 1)) for _ in range(rank)]
    return dict(op=op, code=code, ic=ic, oc=oc_, n=n, kernel=kernel, src=src, attrs=attrs)


def _activation(n: int, c: int, spatial: list[int], fmt: str) -> tuple[int, ...]:
    return (n, c, *spatial) if fmt == "NCX" else (n, *spatial, c)


def _weights_shape(ic: int, o: int, kernel: list[int], fmt: str) -> tuple[int, ...]:
    return (ic, o, *kernel) if fmt == "IOX" else (*kernel, o, ic)


@contextlib.contextmanager
def drawn_lowerings(salt: int) -> Iterator[None]:
    """Within the block, each problem runs a candidate drawn by ``salt`` and the problem
    (repeatable in another process: no Python string hash)."""
    rule = lowering.rule

    def drawn(p: Any, native: bool = False, phase: bool = False) -> str:
        names = lowering.candidates(p, native=native)
        return names[zlib.crc32(f"{salt} {p!r} {native}".encode()) % len(names)]

    lowering.rule = drawn
    try:
        yield
    finally:
        lowering.rule = rule


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    p = draw(rng)
    salt = int(rng.integers(1 << 30)) if rng.random() < 0.5 else None
    if salt is None:
        return _trial(rng, p, "")
    with drawn_lowerings(salt):
        return _trial(rng, p, f" (lowerings drawn, salt {salt})")


def _trial(rng: np.random.Generator, p: dict[str, Any], drawn: str) -> str:
    attrs, code = p["attrs"], p["code"]
    dt = DTYPES[code]
    fmt, wf = attrs["data_format"], attrs["weights_format"]
    forward_attrs = {k: v for k, v in attrs.items()}
    pads = reference.resolve_pads(p["kernel"], attrs["strides"], attrs["dilations"], attrs.get("auto_pad", "None"),
                                  attrs.get("pads_begin", [0] * len(p["kernel"])),
                                  attrs.get("pads_end", [0] * len(p["kernel"])))
    dst_spatial = [s * (x - 1) + d * (k - 1) + 1 - pb - pe + op for x, k, s, d, pb, pe, op in zip(
        p["src"], p["kernel"], attrs["strides"], attrs["dilations"], pads[0], pads[1], attrs["output_padding"])]
    what = f"{p['op']} {code} n={p['n']} ic={p['ic']} oc={p['oc']} src={p['src']} k={p['kernel']} {attrs}{drawn}"
    if min(dst_spatial) < 1:
        return what + " (skipped: empty dst)"
    wshape = _weights_shape(p["ic"], p["oc"] // attrs["groups"], p["kernel"], wf)
    src = rng.standard_normal(_activation(p["n"], p["ic"], p["src"], fmt)).astype(dt)
    w = (rng.standard_normal(wshape) / math.sqrt(max(1, p["ic"] // attrs["groups"]) * math.prod(p["kernel"]))).astype(dt)
    dd = rng.standard_normal(_activation(p["n"], p["oc"], dst_spatial, fmt)).astype(dt)
    bias = rng.standard_normal(p["oc"]).astype(dt) if p["op"] == "fwd_bias" else None
    f64 = [np.asarray(a, np.float64) for a in (src, w, dd)]
    absolute = [np.abs(a) for a in f64]
    if p["op"].startswith("fwd"):
        op = oc.ConvTranspose(**forward_attrs)
        b64 = None if bias is None else np.asarray(bias, np.float64)
        ref = reference.conv_transpose(f64[0], f64[1], b64, **forward_attrs)
        mag = reference.conv_transpose(absolute[0], absolute[1], None if b64 is None else np.abs(b64), **forward_attrs)
        args: tuple[Any, ...] = (src, w, bias)
        reduction = (p["ic"] // attrs["groups"]) * math.prod(p["kernel"])
    elif p["op"] == "bwd_d":
        op = oc.ConvTransposeBackwardData(**forward_attrs)
        ref = reference.conv_transpose_backward_data(f64[2], f64[1], **_no_op(forward_attrs))
        mag = reference.conv_transpose_backward_data(absolute[2], absolute[1], **_no_op(forward_attrs))
        args = (dd, w)
        reduction = (p["oc"] // attrs["groups"]) * math.prod(p["kernel"])
    else:
        op = oc.ConvTransposeBackwardWeights(**forward_attrs)
        ref = reference.conv_transpose_backward_weights(f64[0], f64[2], wshape, **_no_op(forward_attrs))
        mag = reference.conv_transpose_backward_weights(absolute[0], absolute[2], wshape, **_no_op(forward_attrs))
        args = (src, dd, np.array(wshape, np.int32))
        reduction = p["n"] * math.prod(dst_spatial)
    try:
        first = op(*args)
    except MemoryError as e:  # the package's refusal, by design: a lowering drawn here may need more
        if f"{op.op_name}: this call would allocate" not in str(e) or "over the limit of" not in str(e):
            raise Failure(f"{what}: MemoryError without the op's estimate: {e}") from None
        return f"{what} (skipped: over the memory limit: {str(e)[:120]})"
    second = op(*args)
    out = _out_like(rng, first)
    third = op(*args, out=out)
    if third is not out:
        raise Failure(f"{what}: the out= call did not return out")
    tol = accuracy.tolerance(code, reduction)
    scale = float(np.max(mag)) if mag.size else 0.0
    for label, got in (("first call", first), ("second call", second), ("out= call", third)):
        if got.shape != ref.shape or got.dtype != np.dtype(dt):
            raise Failure(f"{what}: {label} gave {got.dtype}{got.shape}, expected {np.dtype(dt)}{ref.shape}")
        if not np.all(np.isfinite(got)):
            raise Failure(f"{what}: {label} has non-finite values ({op.lowering})")
        # row by row: a model-sized 3-D weights gradient is 1.3 GiB in float64 alone
        err = max((float(np.max(np.abs(np.asarray(g, np.float64) - r))) for g, r in zip(got, ref)), default=0.0)
        if err > tol * scale:
            raise Failure(f"{what}: {label} off by {err:.3g} (tolerance {tol * scale:.3g}; {op.lowering})")
    return f"{what}: {op.lowering}"


def _out_like(rng: np.random.Generator, first: np.ndarray) -> np.ndarray:
    """An out= for the third call: mostly dense, else every step-th element of a wider
    array (oneDNN 3.2's Reorder wrote garbage into such arrays at steps 4 and 8:
    strides.writable)."""
    if rng.random() < 0.7:
        return np.empty_like(first)
    step = int(rng.choice([2, 3, 4, 8]))
    wide = np.full((*first.shape[:-1], first.shape[-1] * step), np.nan, first.dtype)
    return wide[..., ::step]


def _no_op(attrs: dict[str, Any]) -> dict[str, Any]:
    """The reference's backward functions take no output_padding (the shapes carry it)."""
    return {k: v for k, v in attrs.items() if k != "output_padding"}

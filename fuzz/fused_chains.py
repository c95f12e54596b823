"""Differential fuzzer of fused and int8 ConvTranspose calls against the float64 reference.

Each trial draws a ConvTranspose (1-D to 3-D, NCX/NXC, IOX/XOI, groups and depthwise,
strides, dilations, pads, output_padding, channel counts up to 512, with or without a bias)
and a chain of up to three post-ops of every kind in :data:`onednn_convt.post_ops.POST_OPS`,
each binary one with a tensor that is dst-shaped, per channel, one value, or broadcast along
some dims (and of lower rank). A float trial is f32, bf16 or f16; an int8 trial has a u8 or
s8 src with a per-tensor Dequantize (zero point), s8 weights with per-tensor or per-channel
scales, an f32 bias, a u8/s8 ``dst_quantize`` or an f32 dst, and sometimes a first Add of
a dequantized u8/s8 tensor (the library's "sum").

The first call of an int8 trial also runs with oneDNN's verbose log on
(``dnnl_set_verbose``, its output caught): an int8 convolution or deconvolution kernel
without VNNI (``jit_uni_int8:avx2``, any kernel named for ``sse41``, ``avx``,
``avx2`` or ``avx512_core`` alone) is a finding whatever the values, because those kernels
saturate u8 x s8 pairs of products at 16 bits (oneDNN's "Nuances of int8 computations"):
the library falls back to them on a CPU without AVX-VNNI where its AVX-512 kernels refuse a
call, and the random values of a trial rarely reach the saturation.

The op is called three times: twice as it is (the second through the cached fast path)
and once with ``out=`` (the dst-shaped tensor of a binary post-op, when there is one of
the right dtype: the in-place residual). Each result is judged against an envelope: the
reference ConvTranspose moved by its tolerance (``accuracy.tolerance`` times the magnitude
of the summed products, the reference on the inputs' absolute values) and carried through
the chain, widened by the dtype's rounding at each step. A quantized result must lie
between the quantized ends of that envelope, so a value on a rounding boundary may land on
either side. Results beyond float32's range must be infinite on the right side.

Known and being fixed elsewhere: on an AMD Zen4/Zen5 (AVX-512 with bf16) oneDNN 3.2's strided
deconvolution kernel applies the bias and post-ops wrongly on some model-sized problems
(stride > 1, IC >= ~256, a bias or post-op); such a failure says so in its message.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import sys
import tempfile
from typing import Any, Callable

import numpy as np
import onednn_convt as oc
from harness import Failure
from onednn_convt import Dequantize, PostOp, Quantize, accuracy, reference
from onednn_convt.post_ops import POST_OPS

NAME = "fused"
PER_PROCESS = 20
TIMEOUT = 120.0
#: multiply-adds per trial at most, and dst elements (GELU's reference is elementwise Python)
MAX_MACS = 40_000_000
MAX_DST = 150_000
DTYPES = {"f32": np.dtype(np.float32), "bf16": oc.dtypes.FLOAT_DTYPES["bf16"], "f16": np.dtype(np.float16)}
F32_MAX = float(np.finfo(np.float32).max)
#: the largest finite value of each float output dtype
FLOAT_MAX = {str(DTYPES["f32"]): F32_MAX, str(DTYPES["f16"]): 65504.0, str(DTYPES["bf16"]): 3.3895313892515355e38}
INT_RANGES = {"u8": (0, 255), "s8": (-128, 127)}
INT_DTYPES = {"u8": np.dtype(np.uint8), "s8": np.dtype(np.int8)}
#: kinds computed (by the library's approximations) to an absolute precision near their
#: O(1) range: Sigmoid(-45) is 4.8e-19 in the library and 0 in float64
ABSOLUTE = frozenset({"Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "GELU", "Mish", "Elu", "SoftPlus", "Exp", "Log"})
#: the spacing of each dtype's subnormals: the least absolute rounding error to allow
TINY = {"f32": 2.0**-149, "bf16": 2.0**-133, "f16": 2.0**-24}
#: the non-monotonic kinds: where their minimum is, and its value (float64, found by a
#: fine grid over the reference's math)
CRITICAL = {"Abs": (0.0, 0.0), "Square": (0.0, 0.0), "GELU": (-0.751792, -0.16997120747985495),
            "Mish": (-1.192431, -0.3088434130172443), "HardSwish": (-1.5, -0.375)}
#: an int8 convolution or deconvolution in oneDNN's verbose log: (kind, implementation)
INT8_KERNEL = re.compile(r"exec,cpu,((?:de)?convolution),([^,]+),[^,]*,src_[us]8:")
#: the ISAs of int8 kernels that multiply with vpmaddubsw (no VNNI): they saturate
SATURATING_ISAS = frozenset({"sse41", "avx", "avx2", "avx512_core"})
UNARY = sorted(k for k, v in POST_OPS.items() if not v.is_binary)
BINARY = sorted(k for k, v in POST_OPS.items() if v.is_binary)


def _attrs_of(kind: str, rng: np.random.Generator) -> dict[str, float]:
    if kind == "Clamp":
        lo = float(rng.uniform(-2, 0.5))
        return {"min": lo, "max": lo + float(rng.uniform(0, 3))}
    if kind in ("Elu", "LeakyReLU"):
        return {"alpha": float(rng.choice([0.01, 0.1, 0.25, 1.0, 1.5]))}
    if kind == "HardSigmoid":
        return {"alpha": float(rng.uniform(0.1, 0.5)), "beta": float(rng.uniform(0.2, 0.8))}
    if kind == "SoftPlus":
        return {"beta": float(rng.choice([0.5, 1.0, 2.0, -1.0]))}
    return {}


def _channels(rng: np.random.Generator) -> tuple[int, int, int]:
    """(IC, OC, groups)."""
    kind = rng.choice(["small", "model", "grouped", "depthwise"], p=[0.45, 0.25, 0.15, 0.15])
    if kind == "small":
        return int(rng.integers(1, 40)), int(rng.integers(1, 40)), 1
    if kind == "model":
        return int(rng.choice([64, 128, 256, 512])), int(rng.choice([3, 16, 32, 64, 128, 256, 512])), 1
    if kind == "grouped":
        g = int(rng.choice([2, 3, 4, 8]))
        return g * int(rng.integers(1, 9)), g * int(rng.integers(1, 9)), g
    g = int(rng.choice([3, 16, 32, 64]))
    return g, g, g


def draw_geometry(rng: np.random.Generator) -> dict[str, Any]:
    rank = int(rng.choice([1, 2, 3], p=[0.25, 0.55, 0.2]))
    ic, oc_, groups = _channels(rng)
    if rng.random() < 0.4:  # a published up-sampling layer
        k, s, pad, op_ = [(4, 2, 1, 0), (3, 2, 1, 1), (2, 2, 0, 0), (3, 1, 1, 0), (4, 4, 0, 0), (5, 2, 2, 1)][
            int(rng.integers(6))]
        kernel, strides, dil = [k] * rank, [s] * rank, [1] * rank
        pb, pe, opad = [pad] * rank, [pad] * rank, [op_] * rank
    else:
        kernel = [int(rng.choice([1, 2, 3, 4, 5])) for _ in range(rank)]
        strides = [int(rng.choice([1, 1, 2, 2, 3, 4])) for _ in range(rank)]
        dil = [int(rng.choice([1, 1, 1, 2])) for _ in range(rank)]
        ek = [d * (k - 1) + 1 for k, d in zip(kernel, dil)]
        pb = [int(rng.integers(0, e)) for e in ek]
        pe = [int(rng.integers(0, e)) for e in ek]
        opad = [int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in strides]
    per_position = max(1, (ic // groups) * oc_ * math.prod(kernel))
    n = int(rng.choice([1, 1, 2, 3]))
    side = max(1, int((MAX_MACS / per_position / n) ** (1 / rank)))
    src = [int(rng.integers(1, max(2, min(side, 12)) + 1)) for _ in range(rank)]
    ek = [d * (k - 1) + 1 for k, d in zip(kernel, dil)]
    dst = [s * (x - 1) + e - a - b + o for s, x, e, a, b, o in zip(strides, src, ek, pb, pe, opad)]
    attrs = {"strides": strides, "dilations": dil, "pads_begin": pb, "pads_end": pe, "output_padding": opad, "groups": groups,
                 "data_format": str(rng.choice(["NCX", "NXC"])), "weights_format": str(rng.choice(["IOX", "XOI"]))}
    return {"rank": rank, "ic": ic, "oc": oc_, "groups": groups, "kernel": kernel, "n": n, "src": src, "dst": dst, "attrs": attrs}


def _act(n: int, c: int, spatial: list[int], fmt: str) -> tuple[int, ...]:
    return (n, c, *spatial) if fmt == "NCX" else (n, *spatial, c)


def _operand_shape(rng: np.random.Generator, dst: tuple[int, ...], fmt: str) -> tuple[str, tuple[int, ...]]:
    kind = str(rng.choice(["dst", "dst", "channel", "scalar", "broadcast", "lower rank"]))
    rank = len(dst)
    c_axis = 1 if fmt == "NCX" else rank - 1
    if kind == "dst":
        return kind, dst
    if kind == "channel":
        shape = [1] * rank
        shape[c_axis] = dst[c_axis]
        return kind, tuple(shape) if (fmt == "NCX" or rng.random() < 0.5) else (dst[c_axis],)
    if kind == "scalar":
        return kind, (1,) if rng.random() < 0.5 else (1,) * rank
    if kind == "broadcast":
        return kind, tuple(d if rng.random() < 0.5 else 1 for d in dst)
    return kind, dst[1:]  # no batch dim: broadcast over it


def draw_chain(rng: np.random.Generator, dst: tuple[int, ...], fmt: str, int8: bool, has_quant: bool,
               code: str) -> tuple[list[PostOp], list[np.ndarray], list[str]]:
    """A chain of 0-3 post-ops, their binary tensors and a description of each."""
    length = int(rng.choice([0, 1, 1, 2, 2, 3]))
    chain: list[PostOp] = []
    operands: list[np.ndarray] = []
    words: list[str] = []
    dt = np.dtype(np.float32) if int8 else DTYPES[code]
    if int8 and has_quant and rng.random() < 0.25:  # a first Add of a dequantized tensor: the library's sum
        qt = str(rng.choice(["u8", "s8"]))
        lo, hi = INT_RANGES[qt]
        zp = int(rng.integers(lo, min(hi, lo + 40)))
        chain.append(PostOp("Add", dequantize=Dequantize(scales=float(rng.choice([0.05, 0.25, 1.0])), zps=zp)))
        operands.append(rng.integers(lo, hi + 1, dst).astype(INT_DTYPES[qt]))
        words.append(f"Add(dequantized {qt} zp {zp})[dst]")
    while len(chain) < length:
        kind = str(rng.choice(UNARY + BINARY)) if rng.random() < 0.6 else str(rng.choice(BINARY))
        if kind in ("Log", "Sqrt"):  # defined for positive inputs: after Abs and an Add of a positive value
            if length - len(chain) < 3:
                kind = "Abs"
            else:
                chain += [PostOp("Abs"), PostOp("Add")]
                operands.append(np.full((1,), 0.25, dt))
                words += ["Abs", "Add[scalar 0.25]"]
        if POST_OPS[kind].is_binary:
            how, shape = _operand_shape(rng, dst, fmt)
            if kind == "Divide":  # away from zero
                x = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
            else:
                x = rng.uniform(-2, 2, shape)
            operands.append(np.asarray(x).astype(dt))
            chain.append(PostOp(kind))
            words.append(f"{kind}[{how} {shape}]")
        else:
            a = _attrs_of(kind, rng)
            chain.append(PostOp(kind, **a))
            words.append(kind + (f"{a}" if a else ""))
    return chain[:3], operands, words


def _round_to(x: np.ndarray, code: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(np.asarray(x, np.float64).astype(DTYPES[code]), np.float64)


def envelope(y: np.ndarray, delta: np.ndarray, chain: list[PostOp], operands: list[np.ndarray],
             code: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per element, the range the chain's result may take when its input is anywhere in
    ``[y - delta, y + delta]``, widened at each step by the dtype's rounding; and where a
    step's input already left the dtype's range (an Exp of 100, say): there the library
    computes on inf, and a post-op with no limit at inf in its formula gives NaN (oneDNN 3.2's
    GELU of inf, as ``0.5 * x * (1 + erf(...))`` does in NumPy too), which a Quantize turns
    into 0: such elements are not judged."""
    eps = 2 * accuracy.epsilon(code)
    samples = [y + t * delta for t in (-1.0, -0.5, 0.0, 0.5, 1.0)]
    lo = np.minimum.reduce(samples)
    hi = np.maximum.reduce(samples)
    it = iter(operands)
    overflowed = np.zeros(np.shape(lo), bool)
    with np.errstate(all="ignore"):
        for p in chain:
            overflowed |= np.maximum(np.abs(lo), np.abs(hi)) > FLOAT_MAX[str(DTYPES[code])]
            other = next(it) if p.is_binary else None
            if other is not None and p.dequantize is not None:
                other = p.dequantize.apply(other)
            # every kind is monotonic in its input except these, whose minimum is added where
            # it lies inside the interval (Abs/Square at 0, GELU, Mish, HardSwish below 0)
            pts = [lo, hi]
            vals = [np.asarray(reference.post_op(p.kind, v, other, **p.attrs), np.float64) for v in pts]
            if p.kind in CRITICAL:
                at, value = CRITICAL[p.kind]
                inside = (lo <= at) & (at <= hi)
                vals.append(np.where(inside, value, vals[0]))
            lo = np.minimum.reduce(vals)
            hi = np.maximum.reduce(vals)
            # the dtype's rounding, relative and (subnormals, flushed values) absolute
            slack = eps * np.maximum(np.abs(lo), np.abs(hi)) + TINY[code]
            if p.kind in ABSOLUTE:  # approximations accurate to some ulps of 1 (SoftPlus: 2**-18,
                # and divided by its beta: 1e-5 with beta 0.5)
                scale = 1.0 / min(1.0, abs(p.attrs.get("beta", 1.0))) if p.kind == "SoftPlus" else 1.0
                slack = slack + eps + 128 * accuracy.epsilon("f32") * scale
            slack = np.where(np.isfinite(slack), slack, 0.0)  # inf stays inf, not inf - inf
            lo, hi = lo - slack, hi + slack
    return lo, hi, overflowed


def _judge(what: str, label: str, got: Any, lo: np.ndarray, hi: np.ndarray, overflowed: np.ndarray,
           out_dtype: np.dtype[Any], quant: Quantize | None, known: str) -> None:
    g = np.asarray(got)
    if g.dtype != out_dtype or g.shape != lo.shape:
        raise Failure(f"{what}: {label} gave {g.dtype}{g.shape}, expected {out_dtype}{lo.shape}{known}")
    g = g.astype(np.float64)
    if quant is not None:
        qlo = quant.apply(lo)
        qhi = quant.apply(hi)
        bad = (g < np.minimum(qlo, qhi)) | (g > np.maximum(qlo, qhi))
    else:
        top = FLOAT_MAX[str(out_dtype)] / 2  # beyond it, the dtype may round to inf
        with np.errstate(invalid="ignore"):
            inside = (g >= lo) & (g <= hi)
            over = (np.isposinf(g) & (hi > top)) | (np.isneginf(g) & (lo < -top))
            nan_ok = np.isnan(g) & (np.isnan(lo) | np.isnan(hi))
        bad = ~(inside | over | nan_ok)
    bad &= ~overflowed  # no f32 result there: the library's NaN, or 0 once quantized
    if bad.any():
        idx = tuple(int(i[0]) for i in np.nonzero(bad))
        raise Failure(f"{what}: {label}: {int(bad.sum())} of {bad.size} outside the envelope; at {idx} got "
                      f"{g[idx]!r}, expected [{lo[idx]!r}, {hi[idx]!r}]" + (
                          f" (quantized [{quant.apply(lo)[idx]}, {quant.apply(hi)[idx]}])" if quant else "") + known)


def logged(call: Callable[[], Any]) -> tuple[Any, list[str]]:
    """``call()``'s result and the lines oneDNN's verbose log printed meanwhile (file
    descriptor 1 redirected to a temporary file; [] where libdnnl has no dnnl_set_verbose)."""
    lib = ctypes.CDLL(oc.native.LIBDNNL_PATH)
    if not hasattr(lib, "dnnl_set_verbose"):
        return call(), []
    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as log:
        os.dup2(log.fileno(), 1)
        lib.dnnl_set_verbose(1)
        try:
            result = call()
        finally:
            libc.fflush(None)
            lib.dnnl_set_verbose(0)
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        return result, log.read().decode("utf-8", "replace").splitlines()


def saturating_kernels(lines: list[str]) -> list[str]:
    """The int8 kernels of a verbose log that multiply without VNNI (:data:`SATURATING_ISAS`)."""
    found = []
    for line in lines:
        m = INT8_KERNEL.search(line)
        if m and m.group(2).rsplit(":", 1)[-1] in SATURATING_ISAS:
            found.append(f"{m.group(1)} {m.group(2)}")
    return sorted(set(found))


def trial(rng: np.random.Generator, index: int) -> str:
    geo = draw_geometry(rng)
    attrs, fmt, wf = geo["attrs"], geo["attrs"]["data_format"], geo["attrs"]["weights_format"]
    n, ic, oc_, g = geo["n"], geo["ic"], geo["oc"], geo["groups"]
    if min(geo["dst"]) < 1:
        return "skipped: empty dst"
    dst = _act(n, oc_, geo["dst"], fmt)
    if math.prod(dst) > MAX_DST:
        return f"skipped: dst {dst} too large for the reference"
    int8 = rng.random() < 0.4
    o = oc_ // g
    wshape = (ic, o, *geo["kernel"]) if wf == "IOX" else (*geo["kernel"], o, ic)
    sshape = _act(n, ic, geo["src"], fmt)
    reduction = (ic // g) * math.prod(geo["kernel"])
    has_bias = rng.random() < 0.5
    q: dict[str, Any] = {}
    quant: Quantize | None = None
    if int8:
        code = "f32"
        st = str(rng.choice(["u8", "s8"]))
        lo, hi = INT_RANGES[st]
        src = rng.integers(lo, hi + 1, sshape).astype(INT_DTYPES[st])
        w = rng.integers(-128, 128, wshape).astype(np.int8)
        zp = int(rng.integers(lo, min(hi, lo + 60))) if rng.random() < 0.7 else 0
        s_scale = float(rng.choice([0.01, 0.05, 0.25]))
        per_channel = rng.random() < 0.4
        w_axis = 1 if wf == "IOX" else len(wshape) - 2
        w_scales: Any = [float(v) for v in rng.uniform(0.001, 0.02, oc_)] if per_channel else float(
            rng.uniform(0.001, 0.02))
        q["src_dequantize"] = Dequantize(scales=s_scale, zps=zp)
        q["weights_dequantize"] = (Dequantize(scales=w_scales, qtype="per_channel", axis=w_axis) if per_channel
                                   else Dequantize(scales=w_scales))
        bias = rng.uniform(-2, 2, oc_).astype(np.float32) if has_bias else None
        src64 = reference.dequantize(src, [s_scale], [zp])
        w64 = reference.dequantize_weights(w, w_scales if per_channel else [w_scales], g, wf)
        b64 = None if bias is None else np.asarray(bias, np.float64)
    else:
        code = str(rng.choice(["f32", "bf16", "f16"], p=[0.5, 0.3, 0.2]))
        dt = DTYPES[code]
        src = rng.standard_normal(sshape).astype(dt)
        w = (rng.standard_normal(wshape) / math.sqrt(max(1, reduction))).astype(dt)
        bias = rng.standard_normal(oc_).astype(dt) if has_bias else None
        src64, w64 = np.asarray(src, np.float64), np.asarray(w, np.float64)
        b64 = None if bias is None else np.asarray(bias, np.float64)
    y = reference.conv_transpose(src64, w64, b64, **attrs)
    mag = reference.conv_transpose(np.abs(src64), np.abs(w64), None if b64 is None else np.abs(b64), **attrs)
    if int8:  # the Quantize after the chain, scaled so its range covers the values
        chain, operands, words = draw_chain(rng, dst, fmt, True, True, code)
        if rng.random() < 0.7:
            probe = reference.fused_conv_transpose(src, w, bias, operands, post_ops=chain, **q, **attrs)
            finite = np.abs(probe[np.isfinite(probe)])
            spread = min(float(finite.max()) if finite.size else 1.0, 1e30)  # a Quantize scale f32 can hold
            dtq = str(rng.choice(["u8", "s8"]))
            quant = Quantize(scales=max(spread, 1e-3) / float(rng.choice([20, 100, 127])), zps=int(
                rng.integers(0, 30) if dtq == "u8" else rng.integers(-20, 20)), dtype=dtq)
            q["dst_quantize"] = quant
        elif chain and chain[0].dequantize is not None:  # the library's sum needs a Quantize: keep it
            chain, operands, words = chain[1:], operands[1:], words[1:]
    else:
        chain, operands, words = draw_chain(rng, dst, fmt, False, False, code)
    out_dtype = INT_DTYPES[quant.dtype] if quant is not None else (np.dtype(np.float32) if int8 else DTYPES[code])
    delta = accuracy.tolerance(code, reduction) * float(np.max(mag)) if mag.size else 0.0
    if not int8 and code != "f32":  # the inputs are exact; the accumulation is f32, the result rounded
        delta = accuracy.tolerance("f32", reduction) * float(np.max(mag))
    # a partial result (the conv's before or after the bias) may be rounded to the call's
    # dtype before the post-ops see it: judged by the magnitude of what was summed
    lo, hi, overflowed = envelope(y, delta + 2 * accuracy.epsilon(code) * mag + TINY[code], chain, operands, code)
    what = (f"{'int8 ' + str(src.dtype) if int8 else code} {attrs} n={n} ic={ic} oc={oc_} src={geo['src']} "
            f"k={geo['kernel']} bias={has_bias} chain={words} {'dst ' + quant.dtype if quant else ''}"
            f"{' ' + str({k: v for k, v in q.items() if k != 'dst_quantize'}) if int8 else ''}")
    known = ""
    if max(attrs["strides"]) > 1 and ic >= 200 and (has_bias or chain):
        known = (" [possibly the known strided-deconvolution epilogue defect on AVX-512 BF16 CPUs "
                 "(stride > 1, IC >= ~256, a bias or post-op): reported separately]")
    op = oc.ConvTranspose(**attrs, post_ops=chain or None, **q) if (chain or q) else oc.ConvTranspose(**attrs)
    first, log = logged(lambda: op(src, w, bias, *operands)) if int8 else (op(src, w, bias, *operands), [])
    low = op.lowering
    what = f"{what} -> {low}"
    saturating = saturating_kernels(log)
    if saturating:
        raise Failure(f"{what}: ran oneDNN's int8 kernel without VNNI ({', '.join(saturating)}), which saturates "
                      "u8 x s8 products at 16 bits: wrong for some values")
    _judge(what, "first call", first, lo, hi, overflowed, out_dtype, quant, known)
    second = op(src, w, bias, *operands)
    _judge(what, "second call", second, lo, hi, overflowed, out_dtype, quant, known)
    residual = [i for i, (p, x) in enumerate(zip([p for p in chain if p.is_binary], operands))
                if x.shape == dst and x.dtype == out_dtype]
    if residual and rng.random() < 0.6:  # out= the dst-shaped tensor itself: the in-place residual
        i = residual[0]
        args = list(operands)
        args[i] = operands[i].copy()
        third = op(src, w, bias, *args, out=args[i])
        if third is not args[i]:
            raise Failure(f"{what}: out= a post-op tensor: the result is not that tensor")
        _judge(what, "out= the residual", third, lo, hi, overflowed, out_dtype, quant, known)
    else:
        out = np.empty(dst, out_dtype)
        third = op(src, w, bias, *operands, out=out)
        if third is not out:
            raise Failure(f"{what}: the out= call did not return out")
        _judge(what, "out= call", third, lo, hi, overflowed, out_dtype, quant, known)
    return f"{what} fused={op.fused}"

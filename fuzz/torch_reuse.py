"""Differential fuzzer of one ``onednn_convt.torch`` module called again and again.

The torch path keeps an executor per call signature (``torch_run.run``: the tensors'
shapes, strides, dtypes and negation bits, the geometry) and runs it on the tensors'
addresses, and an op per geometry that keeps its compiled plans: a signature that leaves
out what decides the problem answers a later call with an earlier call's executor. The
``torch`` fuzzer makes a fresh problem per trial and never calls one module twice.

Each trial makes one module (``ConvTranspose1d/2d/3d``: groups, depthwise, dilation,
padding, output_padding, with or without a bias) and calls it 4-10 times. Between calls
it may change the module as a training loop or a user would: the weights updated in place
(through autograd's view of them or through ``.data``, which does not bump their version),
replaced by a new Parameter of another layout, the module moved to another dtype or to
channels_last, the bias dropped or given back, parameters frozen or thawed. Each call
draws the batch (or an unbatched input), the spatial size, ``output_size``, the input's
layout (contiguous, channels_last, a slice, permuted, broadcast, at an odd storage offset,
misaligned NumPy memory, a negated view, or the previous call's tensor with new values
written into it), the mode (gradients, ``no_grad``, ``inference_mode``, CPU autocast to
bfloat16 or float16) and, with gradients, an incoming gradient of a random layout and
``backward()`` or ``torch.autograd.grad``. Each output and gradient is checked against
torch's own function in float64 on the same (rounded) values: shape, dtype, values.

torch missing: :data:`REQUIRES` names it, and the tests skip this fuzzer.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

import torch_layers
from harness import Failure
from onednn_convt import accuracy, torch_run

NAME = "torch_reuse"
PER_PROCESS = 20
TIMEOUT = 120.0
#: modules a trial imports: without one of them the fuzzer cannot run (tests skip it)
REQUIRES = ("torch",)
CODES = ("f32", "f32", "bf16", "f16")
LAYOUTS = (*torch_layers.LAYOUTS, "offset", "misaligned", "negated")
CHANGES = ("none", "none", "update", "update_data", "replace", "dtype", "channels_last", "bias", "freeze")


def _torch_dtype(torch: Any, code: str) -> Any:
    return {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[code]


def _code(torch: Any, dtype: Any) -> str:
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]


def _layout(torch: Any, t: Any, how: str, rng: np.random.Generator) -> Any:
    """``t``'s values in a tensor laid out as ``how`` (same shape and dtype): the torch
    fuzzer's layouts, and three of memory placement."""
    if how == "offset":  # one element past the start of a buffer: aligned to the element only
        flat = torch.zeros(t.numel() + 1, dtype=t.dtype)
        view = flat[1:].view(t.shape)
        view.copy_(t)
        return view
    if how == "misaligned" and t.dtype == torch.float32:  # NumPy memory one byte off
        raw = np.zeros(t.numel() * 4 + 1, np.uint8)
        arr = raw[1:].view(np.float32).reshape(tuple(t.shape))
        arr[...] = t.numpy()
        return torch.from_numpy(arr)
    if how == "negated":  # a lazily negated view (is_neg)
        return torch._neg_view(-t)
    return torch_layers._layout(torch, t, how, rng)


class _Trial:
    """One module and what its calls draw from."""

    def __init__(self, torch: Any, rng: np.random.Generator) -> None:
        import onednn_convt.torch as oct

        self.torch, self.rng = torch, rng
        self.rank = rank = int(rng.choice([1, 2, 3], p=[0.3, 0.5, 0.2]))
        groups = int(rng.choice([1, 1, 2, 3]))
        depthwise = groups > 1 and rng.random() < 0.3
        self.ic = groups * (1 if depthwise else int(rng.integers(1, 5)))
        self.oc = groups * (1 if depthwise else int(rng.integers(1, 5)))
        kernel = [int(rng.integers(1, 5)) for _ in range(rank)]
        stride = [int(rng.integers(1, 4)) for _ in range(rank)]
        dilation = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
        padding = [int(rng.integers(0, d * (k - 1) + 1)) for k, d in zip(kernel, dilation)]
        out_pad = [int(rng.integers(0, s)) for s in stride]
        bias = bool(rng.random() < 0.6)
        cls = getattr(oct, f"ConvTranspose{rank}d")
        self.module = cls(self.ic, self.oc, kernel, stride=stride, padding=padding, output_padding=out_pad,
                          groups=groups, bias=bias, dilation=dilation)
        code = str(rng.choice(CODES))
        self.module.to(_torch_dtype(torch, code))
        self.sizes = [sorted({int(rng.integers(1, 7)), int(rng.integers(1, 7))}) for _ in range(rank)]
        self.head = (f"ConvTranspose{rank}d({self.ic}, {self.oc}, k{kernel} s{stride} p{padding} op{out_pad} "
                     f"g{groups} d{dilation} bias={bias}) {code}")
        self.previous: Optional[Any] = None

    # -- between calls: what a training loop or a user does to the module -----------------
    def change(self) -> str:
        torch, rng, m = self.torch, self.rng, self.module
        what = str(rng.choice(CHANGES))
        with torch.no_grad():
            if what == "update":  # an optimizer's step: in place, the version bumped
                m.weight.mul_(-0.5).add_(0.125)
            elif what == "update_data":  # through .data: the same memory, the version not bumped
                m.weight.data.copy_(torch.randn(m.weight.shape).to(m.weight.dtype))
                if m.bias is not None:
                    m.bias.data.mul_(-2.0)
            elif what == "replace":
                how = str(rng.choice(["contiguous", "channels_last", "slice", "permuted", "offset"]))
                w = _layout(torch, torch.randn(m.weight.shape).to(m.weight.dtype) / math.sqrt(self.ic), how, rng)
                m.weight = torch.nn.Parameter(w, requires_grad=bool(rng.random() < 0.8))
                what += f" weight ({how})"
            elif what == "dtype":
                code = str(rng.choice(CODES))
                m.to(_torch_dtype(torch, code))
                what += f" {code}"
            elif what == "channels_last" and self.rank > 1:
                fmt = torch_run.channels_last_format(self.rank)
                m.to(memory_format=fmt if rng.random() < 0.7 else torch.contiguous_format)
            elif what == "bias":
                if m.bias is None:
                    m.bias = torch.nn.Parameter(torch.randn(self.oc).to(m.weight.dtype))
                    what += " given"
                else:
                    m.bias = None
                    what += " dropped"
            elif what == "freeze":
                flags = [bool(rng.random() < 0.5) for _ in range(2)]
                m.weight.requires_grad_(flags[0])
                if m.bias is not None:
                    m.bias.requires_grad_(flags[1])
                what += f" weight/bias require grad {flags}"
        return "" if what == "none" else what + "; "

    # -- one call ----------------------------------------------------------------------------
    def input(self, dtype: Any) -> tuple[Any, str]:
        torch, rng = self.torch, self.rng
        prev = self.previous
        if prev is not None and prev.dtype == dtype and rng.random() < 0.25:
            with torch.no_grad():  # the same tensor object, new values in its memory
                prev.copy_(torch.randn(prev.shape).to(dtype))
            return prev, "the previous input, new values"
        n = int(rng.integers(1, 4))
        src = [int(rng.choice(s)) for s in self.sizes]
        batched = rng.random() < 0.85
        x0 = torch.randn((n, self.ic, *src) if batched else (self.ic, *src)).to(dtype)
        how = str(rng.choice(LAYOUTS))
        return _layout(torch, x0, how, rng), f"{tuple(x0.shape)} {how}"

    def output_size(self, x: Any) -> Optional[list[int]]:
        """An output_size torch's module accepts for ``x`` (None: the module's output_padding)."""
        if self.rng.random() < 0.7:
            return None
        m = self.module
        spatial = x.shape[-self.rank:]
        least = [(xi - 1) * s - 2 * p + d * (k - 1) + 1 for xi, s, p, d, k in zip(
            spatial, m.stride, m.padding, m.dilation, m.kernel_size)]
        return [lo + int(self.rng.integers(0, s)) for lo, s in zip(least, m.stride)]


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    import torch

    torch.manual_seed(int(rng.integers(2**31)))
    t = _Trial(torch, rng)
    log: list[str] = []
    for i in range(int(rng.integers(4, 11))):
        change = t.change() if i else ""
        _call(torch, t, rng, i, change, log)
    refused = sum(": refused (" in line for line in log)
    return f"{t.head}: {len(log)} calls ({refused} refused)\n  " + "\n  ".join(log)


def _call(torch: Any, t: _Trial, rng: np.random.Generator, i: int, change: str, log: list[str]) -> None:
    m = t.module
    mode = str(rng.choice(["grad", "grad", "no_grad", "inference", "autocast"]))
    low = torch.bfloat16 if rng.random() < 0.6 else torch.float16
    autocast = mode == "autocast"  # every floating tensor cast to low, as torch's autocast does
    x, how = t.input(m.weight.dtype)
    wants_x = mode in ("grad", "autocast") and rng.random() < 0.7 and not x.requires_grad
    if wants_x:
        x = x.detach().requires_grad_(True) if x.is_neg() or not x.is_leaf else x.requires_grad_(True)
    size = t.output_size(x)
    params = [p for p in (m.weight, m.bias) if p is not None]
    recording = mode in ("grad", "autocast") and (wants_x or any(p.requires_grad for p in params))
    what = (f"#{i} {change}{mode}{f' {low}' if autocast else ''} x {how} "
            f"output_size={size} weight {tuple(m.weight.stride())} {m.weight.dtype}")
    log.append(what)
    trace = f"{t.head}\n  " + "\n  ".join(log)

    # the reference's inputs: the values the op computes on (autocast rounds them first)
    def rounded(v: Any) -> Any:
        v = v.detach()
        # contiguous: torch's float64 layer refuses some layouts itself ("grad_weight needs
        # to be contiguous", seed 9 trials 79 and 86), as the torch fuzzer found
        return (v.to(low) if autocast else v).double().contiguous()

    output_padding = m._output_padding(x, size, m.stride, m.padding, m.kernel_size, t.rank, m.dilation)
    ref_x = rounded(x).requires_grad_(wants_x)
    ref_w = rounded(m.weight).requires_grad_(m.weight.requires_grad and recording)
    ref_b = None if m.bias is None else rounded(m.bias).requires_grad_(m.bias.requires_grad and recording)
    def reference(xv: Any, wv: Any, bv: Any) -> Any:
        return getattr(torch.nn.functional, f"conv_transpose{t.rank}d")(
            xv, wv, bv, m.stride, m.padding, output_padding, m.groups, m.dilation)

    try:
        ref = reference(ref_x, ref_w, ref_b)
    except RuntimeError as e:  # pads that crop more than the output: ours refuses it too
        if "Output size is too small" not in str(e):
            raise
        try:
            m(x, size)
        except ValueError as ours:
            log[-1] += f": refused ({ours})"
            return
        raise Failure(f"{trace}: ran, where torch's layer finds no output ({e})") from None
    # the terms' magnitude (the same sums over |values|): the error is measured against it, as
    # the NumPy fuzzers do, since a bias that cancels the sum leaves a result far below its
    # terms, and a low-precision result is rounded before the bias and after (docs/deviations.md)
    abs_leaves = [None if r is None else r.detach().abs().requires_grad_(r.requires_grad) for r in (ref_x, ref_w, ref_b)]
    mag = reference(*abs_leaves)

    if mode == "no_grad":
        with torch.no_grad():
            out = m(x, size)
    elif mode == "inference":
        with torch.inference_mode():
            out = m(x, size)
    elif autocast:
        with torch.autocast("cpu", dtype=low):
            out = m(x, size)
    else:
        out = m(x, size)
    dtype = low if autocast else m.weight.dtype
    code = _code(torch, dtype)
    k = math.prod(m.kernel_size)
    n = x.shape[0] if x.dim() == t.rank + 2 else 1
    _check(trace, "output", out, ref, mag, dtype, 4 * accuracy.tolerance(code, t.ic // m.groups * k))
    fmt = torch_run.channels_last_format(t.rank)
    if fmt is not None and x.dim() == t.rank + 2 and x.is_contiguous(memory_format=fmt) \
            and not x.is_contiguous() and not out.is_contiguous(memory_format=fmt):
        raise Failure(f"{trace}: a channels_last input gave an output of strides {tuple(out.stride())}")
    if recording:
        g0 = torch.randn(out.shape).to(out.dtype)
        g = _layout(torch, g0, str(rng.choice(LAYOUTS)), rng)
        wanted = [(name, v, r, a) for name, v, r, a in zip(("d input", "d weight", "d bias"), (x, m.weight, m.bias),
                                                            (ref_x, ref_w, ref_b), abs_leaves)
                  if v is not None and r is not None and v.requires_grad]
        refs = torch.autograd.grad(ref, [r for _, _, r, _ in wanted], g.double().contiguous())  # g's values (a broadcast repeats one sample)
        mags = torch.autograd.grad(mag, [a for _, _, _, a in wanted], g.double().abs().contiguous())
        if rng.random() < 0.5:
            grads = torch.autograd.grad(out, [v for _, v, _, _ in wanted], g)
            how_grad = "autograd.grad"
        else:
            for p in params:
                p.grad = None
            if wants_x:
                x.grad = None
            out.backward(g)
            grads = tuple(v.grad for _, v, _, _ in wanted)
            how_grad = "backward()"
        log[-1] += f"; {how_grad} of a {g.stride()} gradient"
        trace = f"{t.head}\n  " + "\n  ".join(log)
        spatial_in = math.prod(x.shape[-t.rank:])
        spatial_out = math.prod(out.shape[-t.rank:])
        reductions = {"d input": t.oc // m.groups * k, "d weight": n * spatial_in, "d bias": n * spatial_out}
        for (name, v, _, _), got, want, size in zip(wanted, grads, refs, mags):
            # under autocast computed in low and cast back to the tensor's dtype: both roundings
            tol = max(accuracy.tolerance(c, reductions[name]) for c in (code, _code(torch, v.dtype)))
            _check(trace, name, got, want, size, v.dtype, 4 * tol)
    # a tensor that can take new values in place next time (not a negated or broadcast view)
    writable = not x.is_neg() and 0 not in x.stride() and x.dim() == t.rank + 2
    t.previous = x.detach() if writable else None


def _check(trace: str, name: str, got: Any, want: Any, magnitude: Any, dtype: Any, tol: float) -> None:
    """``got`` against ``want``: shape, dtype, and values within ``tol`` of the largest of
    ``magnitude`` (the reference's sums over absolute values)."""
    if got is None or got.dtype != dtype or tuple(got.shape) != tuple(want.shape):
        raise Failure(f"{trace}: {name} is {None if got is None else (tuple(got.shape), got.dtype)}, "
                      f"expected {tuple(want.shape)} {dtype}")
    diff = (got.detach().double() - want.detach()).abs()
    scale = float(magnitude.detach().abs().max()) if magnitude.numel() else 0.0
    err = float(diff.max()) / (scale or 1.0) if diff.numel() else 0.0
    if not err <= tol:
        raise Failure(f"{trace}: {name} off by {err:.3g} (allowed {tol:.3g})")

"""Torch fuzzer: ``onednn_convt.torch``'s functions forward and backward, on tensors of any
layout, against torch's own layer in float64.

Each trial draws a transposed convolution (1-D to 3-D; groups, depthwise, dilation,
padding, output_padding; with or without a bias), a dtype (float32, bfloat16, float16) and
a layout for each tensor: contiguous, channels_last, a slice of a larger tensor, a
permuted copy seen in NCX order, or (for the input and the incoming gradient) a broadcast
view with zero strides; and which of input, weight and bias require a gradient. It runs
the forward and the backward (the gradient reaching the layer through a non-leaf, so that
its layout is ours and not the one autograd gives a leaf's ``.grad``) and checks:

- the output's shape and dtype, and its values against ``torch.nn.functional``'s in
  float64 on the same values (the inputs rounded to the dtype);
- each gradient's values likewise, and its dtype;
- the input's gradient in the input's layout (contiguous or channels_last) where the input
  is dense in one of them, as torch's layer gives it;
- in some trials, torch.func transforms (:mod:`onednn_convt.torch_func`): ``jvp`` with
  tangents on the input, weight and bias, and ``vmap`` over two inputs and two weights (the
  vmapped weights run as groups), each against the same transform of torch's function in
  float64;
- in some trials, the three registered custom ops (what ``torch.compile`` traces) on the
  same tensors and on fake tensors: the fake kernel's shape, strides and dtype must be the
  real result's exactly, since a compiled graph lays out what follows by them;
- an output_padding past the stride (torch takes it below the dilation too) that adds
  positions beyond the full output past what the op can give: a ValueError naming the
  function and the argument (``torch_run.Geometry``).

torch missing: :data:`REQUIRES` names it, and the tests skip this fuzzer.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness import Failure
from onednn_convt import accuracy

NAME = "torch"
PER_PROCESS = 25
TIMEOUT = 120.0
#: modules a trial imports: without one of them the fuzzer cannot run (tests skip it)
REQUIRES = ("torch",)
DTYPES = ("f32", "f32", "bf16", "f16")
LAYOUTS = ("contiguous", "contiguous", "channels_last", "slice", "permuted", "broadcast")


def _layout(torch: Any, t: Any, how: str, rng: np.random.Generator) -> Any:
    """``t``'s values in the layout ``how`` (a new tensor or view; same shape)."""
    rank = t.dim() - 2
    if how == "channels_last" and rank in (2, 3):
        return t.contiguous(memory_format=torch.channels_last if rank == 2 else torch.channels_last_3d)
    if how == "slice":  # every other element of a tensor twice as long in one dim
        dim = int(rng.integers(t.dim()))
        shape = list(t.shape)
        shape[dim] *= 2
        big = torch.zeros(shape, dtype=t.dtype)
        index = [slice(None)] * t.dim()
        index[dim] = slice(0, None, 2)
        big[tuple(index)] = t
        return big[tuple(index)]
    if how == "permuted":  # stored in a random dimension order
        order = [int(i) for i in rng.permutation(t.dim())]
        return t.permute(order).contiguous().permute([order.index(i) for i in range(t.dim())])
    if how == "broadcast" and t.shape[0] > 1:  # one sample, broadcast over the batch
        return t[:1].expand(t.shape)
    return t.contiguous()


def _dense_layout(torch: Any, t: Any) -> str:
    """"contiguous", "channels_last" or "" (dense in neither) for an activation."""
    if t.is_contiguous():
        return "contiguous"
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(t.dim())
    return "channels_last" if fmt is not None and t.is_contiguous(memory_format=fmt) else ""


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    import torch

    import onednn_convt.torch as oct

    torch.manual_seed(int(rng.integers(2**31)))
    rank = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 1, 2, 3]))
    depthwise = groups > 1 and rng.random() < 0.3
    ic = groups * (1 if depthwise else int(rng.integers(1, 5)))
    ocg = 1 if depthwise else int(rng.integers(1, 5))
    kernel = [int(rng.integers(1, 5)) for _ in range(rank)]
    strides = [int(rng.integers(1, 4)) for _ in range(rank)]
    dilations = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
    pads = [int(rng.integers(0, d * (k - 1) + 1)) for k, d in zip(kernel, dilations)]
    out_pads = [int(rng.integers(0, max(s, d))) for s, d in zip(strides, dilations)]
    n = int(rng.integers(1, 4))
    src = [int(rng.integers(1, 7)) for _ in range(rank)]
    dst = [(x - 1) * s - 2 * p + d * (k - 1) + o + 1
           for x, s, p, d, k, o in zip(src, strides, pads, dilations, kernel, out_pads)]
    if min(dst) < 1:
        return f"skipped: no output ({dst})"
    code = str(rng.choice(DTYPES))
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[code]
    bias = rng.random() < 0.4

    # values rounded to the dtype first, so that the float64 reference sees the same ones
    x0 = torch.randn(n, ic, *src).to(dtype)
    w0 = torch.randn(ic, ocg, *kernel).to(dtype)
    b0 = torch.randn(ocg * groups).to(dtype) if bias else None
    g0 = torch.randn(n, ocg * groups, *dst).to(dtype)
    layouts = [str(rng.choice(LAYOUTS)) for _ in range(3)]
    x = _layout(torch, x0, layouts[0], rng)
    w = _layout(torch, w0, layouts[1] if layouts[1] != "broadcast" else "slice", rng)
    g = _layout(torch, g0, layouts[2], rng)
    need = [rng.random() < 0.7, rng.random() < 0.7, bias and rng.random() < 0.7]
    if not any(need):
        need[0] = True
    what = (f"{rank}-D {code} n{n} ic{ic} oc{ocg * groups} g{groups} src{src} k{kernel} s{strides} "
            f"d{dilations} p{pads} op{out_pads} bias={bias} layouts x/w/g={layouts} grads={need}")

    def run(fn: Any, dt: Any, values: tuple[Any, Any, Any, Any]) -> tuple[Any, list[Any]]:
        xs, ws, bs, gs = values
        leaf_x = xs.to(dt).requires_grad_(need[0])
        leaf_w = ws.to(dt).requires_grad_(need[1])
        leaf_b = None if bs is None else bs.to(dt).requires_grad_(bool(need[2]))
        seen: list[Any] = []
        inp = leaf_x * 1 if need[0] else leaf_x  # a non-leaf: the gradient reaching it is the layer's
        if need[0]:
            inp.register_hook(seen.append)
        out = fn(inp, leaf_w, leaf_b, strides, pads, out_pads, groups, dilations)
        out.backward(gs.to(dt))
        grads = [seen[0] if need[0] else None, leaf_w.grad, None if leaf_b is None else leaf_b.grad]
        return out, grads

    # past the stride (torch allows output_padding below the dilation too), positions beyond
    # the full output that pads_end cannot give are refused, with a ValueError naming them
    beyond = [o - min(o, p) for o, p in zip(out_pads, pads)]
    if any(o >= s and e >= s for o, e, s in zip(out_pads, beyond, strides)):
        try:
            run(getattr(oct, f"conv_transpose{rank}d"), dtype, (x, w, b0, g))
        except ValueError as e:
            if f"conv_transpose{rank}d: output_padding=" not in str(e) or "positions past the" not in str(e):
                raise Failure(f"{what}: refused with an unclear message: {e}") from None
            return f"{what}: refused as documented"
        raise Failure(f"{what}: ran, where the op cannot give the positions past the full output")
    # .to(dtype) of a tensor already in it is the tensor itself: ours sees the layouts drawn
    ours_out, ours_grads = run(getattr(oct, f"conv_transpose{rank}d"), dtype, (x, w, b0, g))
    # the reference on contiguous copies: the values are the same, and torch's float64 layer
    # refuses some layouts itself ("grad_weight needs to be contiguous", seed 1128103 trial 266)
    ref_out, ref_grads = run(getattr(torch.nn.functional, f"conv_transpose{rank}d"), torch.float64,
                             (x.contiguous(), w.contiguous(), b0, g.contiguous()))
    if tuple(ours_out.shape) != tuple(ref_out.shape) or ours_out.dtype != dtype:
        raise Failure(f"{what}: output {tuple(ours_out.shape)} {ours_out.dtype}, expected "
                      f"{tuple(ref_out.shape)} {dtype}")
    reductions = {"output": ic // groups * math.prod(kernel), "d src": ocg * math.prod(kernel),
                  "d weight": n * math.prod(src), "d bias": n * math.prod(dst)}
    pairs = [("output", ours_out, ref_out)] + [
        (name, o, r) for name, o, r in zip(("d src", "d weight", "d bias"), ours_grads, ref_grads) if r is not None]
    for name, got, want in pairs:
        if got is None or got.dtype != dtype or tuple(got.shape) != tuple(want.shape):
            raise Failure(f"{what}: {name} is {None if got is None else (tuple(got.shape), got.dtype)}, "
                          f"expected {tuple(want.shape)} {dtype}")
        err = accuracy.relative_error(got.detach().double().numpy(), want.detach().numpy())
        # the inputs' rounding compounds over the reduction (each input of a product is
        # rounded to the dtype once, here and by torch alike): tolerance as for a result of it
        tol = 4 * accuracy.tolerance(code, reductions[name])
        if not err <= tol:
            raise Failure(f"{what}: {name} off by {err:.3g} (allowed {tol:.3g})")
    if rng.random() < 0.4:
        _check_transforms(torch, oct, rng, what, code, rank, (x, w, b0), (strides, pads, out_pads, groups, dilations),
                          reductions["output"])
    if rng.random() < 0.3:
        _check_fake(torch, what, (x, w, b0, g), (strides, pads, out_pads, groups, dilations))
    if need[0]:
        layout = _dense_layout(torch, x)
        got_layout = _dense_layout(torch, ours_grads[0])
        if layout and got_layout != layout and not (layout == "contiguous" and ours_grads[0].is_contiguous()):
            raise Failure(f"{what}: d src is {got_layout or 'not dense'} {tuple(ours_grads[0].stride())}, "
                          f"the input {layout} {tuple(x.stride())}")
    return what


def _check_transforms(torch: Any, oct: Any, rng: np.random.Generator, what: str, code: str, rank: int,
                      tensors: tuple[Any, Any, Any], attrs: tuple[Any, ...], reduction: int) -> None:
    """jvp and vmap of ours against torch's function in float64 (see the module docstring)."""
    x, w, b = tensors
    dtype = x.dtype
    ours = getattr(oct, f"conv_transpose{rank}d")
    theirs = getattr(torch.nn.functional, f"conv_transpose{rank}d")
    tx, tw = torch.randn(x.shape).to(dtype), torch.randn(w.shape).to(dtype)
    tb = None if b is None else torch.randn(b.shape).to(dtype)
    x2, w2 = torch.randn(x.shape).to(dtype), torch.randn(w.shape).to(dtype)

    def jvp(fn: Any, dt: Any) -> Any:
        # torch's make_dual refuses a primal with overlapping memory (a broadcast view)
        primals = [(t if 0 not in t.stride() else t.contiguous()).to(dt) for t in (x, w) + (() if b is None else (b,))]
        tangents = [t.to(dt) for t in (tx, tw) + (() if tb is None else (tb,))]
        return torch.func.jvp(lambda *a: fn(a[0], a[1], a[2] if len(a) > 2 else None, *attrs),
                              tuple(primals), tuple(tangents))[1]

    def vmap(fn: Any, dt: Any) -> Any:
        xs, ws = torch.stack([x, x2]).to(dt), torch.stack([w, w2]).to(dt)
        return torch.func.vmap(lambda a, c: fn(a, c, None if b is None else b.to(dt), *attrs))(xs, ws)

    for name, check, terms in (("jvp tangent", jvp, 3), ("vmap output", vmap, 1)):
        got, want = check(ours, dtype), check(theirs, torch.float64)
        if got.dtype != dtype or tuple(got.shape) != tuple(want.shape):
            raise Failure(f"{what}: {name} is {tuple(got.shape)} {got.dtype}, expected {tuple(want.shape)} {dtype}")
        err = accuracy.relative_error(got.detach().double().numpy(), want.detach().numpy())
        tol = 4 * terms * accuracy.tolerance(code, reduction)
        if not err <= tol:
            raise Failure(f"{what}: {name} off by {err:.3g} (allowed {tol:.3g})")


def _check_fake(torch: Any, what: str, tensors: tuple[Any, Any, Any, Any], attrs: tuple[Any, ...]) -> None:
    """Each custom op's fake (meta) result against its real one: shape, strides, dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import onednn_convt.torch as oct

    x, w, b, g = tensors
    calls = (("conv_transpose", oct.conv_transpose_op, (x, w, b, *attrs)),
             ("conv_transpose_backward_data", oct.backward_data_op, (g, w, *attrs)),
             ("conv_transpose_backward_weights", oct.backward_weights_op, (x, g, list(w.shape), *attrs)))
    for name, op, args in calls:
        real = op(*args)
        mode = FakeTensorMode()
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with mode:
            fake = op(*fake_args)
        got = (tuple(fake.shape), tuple(fake.stride()), fake.dtype)
        want = (tuple(real.shape), tuple(real.stride()), real.dtype)
        if got != want:
            raise Failure(f"{what}: the {name} custom op's fake result is {got}, its real one {want}")

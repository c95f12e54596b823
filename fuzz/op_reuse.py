"""Differential fuzzer of one op object called again and again with calls that differ.

An op keeps compiled plans per call signature, and a lean path in C++ re-runs the last
plan when the arrays look the same (shapes, strides, dtypes): a signature that leaves out
what decides the problem answers the next call with the last one's plan. Such a bug
(BackwardWeights' ``weights_shape`` input) once gave a wrong-shaped result, and a fuzzer
that makes a fresh op per problem never calls an op twice with different problems.

Each trial makes one op (ConvTranspose with or without a bias, a ReLU or an Add post-op,
BackwardData, BackwardWeights, the functional API, an op with constant weights) with fixed
attributes, then calls it 4-12 times. Each call draws, independently: the batch, the
spatial size (two choices a dim), the kernel and channels (two choices each), the dtype,
each input's memory layout (contiguous, strided, reversed, transposed, misaligned by one
element), ``out=`` (none, fresh, strided, misaligned, the previous call's own), the bias given or not,
BackwardWeights' ``weights_shape`` from the attribute or as an input (tuple, list, int32,
int64), and sometimes the same array objects again with new values written into them.
Between calls it may turn debug fill on or off, clear the partition cache or shrink it.
Each result is checked against the float64 reference, as the plain fuzzer does.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

import onednn_convt as oc
from harness import Failure
from onednn_convt import accuracy, reference

NAME = "reuse"
PER_PROCESS = 25
TIMEOUT = 120.0
DTYPES = {"f32": np.dtype(np.float32), "bf16": oc.dtypes.FLOAT_DTYPES["bf16"], "f16": np.dtype(np.float16)}
KINDS = ("fwd", "fwd_bias", "fwd_relu", "fwd_add", "bwd_d", "bwd_w", "functional", "const_fwd", "const_bwd_d")


LAYOUTS = ("contiguous", "strided", "reversed", "transposed", "misaligned")


def _layouts(rng: np.random.Generator, rank: int) -> dict[str, tuple[str, int]]:
    """A memory layout for each input, and the axis a strided or reversed one is so along."""
    return {k: (str(rng.choice(LAYOUTS, p=[0.4, 0.15, 0.15, 0.15, 0.15])), int(rng.integers(rank + 2)))
            for k in ("src", "dst", "weights", "bias", "post")}


def _layout(values: np.ndarray, layout: tuple[str, int]) -> np.ndarray:
    """``values`` (already in its dtype) in memory of ``layout`` (see :func:`_layouts`)."""
    how, axis = layout[0], layout[1] % values.ndim
    if how == "strided":
        shape = list(values.shape)
        shape[axis] *= 2
        base = np.zeros(shape, values.dtype)
        view = base[(slice(None),) * axis + (slice(None, None, 2),)]
    elif how == "reversed":
        view = np.empty(values.shape, values.dtype)[(slice(None),) * axis + (slice(None, None, -1),)]
    elif how == "transposed":
        view = np.asfortranarray(np.empty(values.shape, values.dtype))
    elif how == "misaligned":  # one byte off (the op copies it)
        raw = np.empty(values.size * values.itemsize + 1, np.uint8)
        view = raw[1:].view(values.dtype).reshape(values.shape)
    else:
        view = np.empty(values.shape, values.dtype)
    view[...] = values
    return view


class _Trial:
    """One op and the choices its calls draw from."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.kind = str(rng.choice(KINDS))
        self.rank = rank = int(rng.choice([1, 2, 3], p=[0.3, 0.5, 0.2]))
        self.groups = g = int(rng.choice([1, 1, 2, 3]))
        self.channels = [(g * int(rng.integers(1, 5)), g * int(rng.integers(1, 5))) for _ in range(2)]
        if rng.random() < 0.5:  # one channel count: more calls that differ in one thing alone
            self.channels[1] = self.channels[0]
        first = [int(rng.integers(1, 5)) for _ in range(rank)]
        other = [int(rng.integers(1, 5)) for _ in range(rank)]
        if rng.random() < 0.5:  # a neighbour: with stride > 1 both may fit the same src and dst
            other = list(first)
            other[int(rng.integers(rank))] += 1
        self.kernels = [first, other]
        self.sizes = [sorted({int(rng.integers(1, 8)), int(rng.integers(1, 8))}) for _ in range(rank)]
        strides = [int(rng.choice([1, 2, 3])) for _ in range(rank)]
        dilations = [int(rng.choice([1, 1, 2])) for _ in range(rank)]
        self.attrs: dict[str, Any] = dict(
            strides=strides, dilations=dilations, groups=g,
            data_format=str(rng.choice(["NCX", "NXC"])), weights_format=str(rng.choice(["IOX", "XOI"])),
        )
        if rng.random() < 0.2:
            self.attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
        else:
            self.attrs["pads_begin"] = [int(rng.integers(0, 2)) for _ in range(rank)]
            self.attrs["pads_end"] = [int(rng.integers(0, 2)) for _ in range(rank)]
        if self.kind != "bwd_w":  # BackwardWeights takes it from diff_dst's shape
            self.attrs["output_padding"] = [int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in strides]
        codes = list(DTYPES)
        self.codes = [str(c) for c in rng.choice(codes, size=int(rng.integers(1, 3)), replace=False)]
        if self.kind.startswith("const"):  # the bound weights fix the kernel, channels and dtype
            self.kernels, self.channels, self.codes = self.kernels[:1], self.channels[:1], self.codes[:1]
        self.fixed_weights: Optional[np.ndarray] = None
        self.op: Any = None
        self.previous: Optional[dict[str, Any]] = None

    # -- one call ----------------------------------------------------------------------
    def pads(self, kernel: list[int]) -> tuple[list[int], list[int]]:
        a = self.attrs
        return reference.resolve_pads(kernel, a["strides"], a["dilations"], a.get("auto_pad", "None"),
                                      a.get("pads_begin", [0] * self.rank), a.get("pads_end", [0] * self.rank))

    def draw_call(self) -> Optional[dict[str, Any]]:
        """The next call's problem (None: its dst would be empty, or no kernel fits): often
        the previous one with one thing changed (a "kernel" change of another op than
        BackwardWeights: the same call again)."""
        rng, prev = self.rng, self.previous
        if prev is not None and rng.random() < 0.5:
            c = dict(prev["call"])
            changes = ["kernel", "code", "n", "bias", "layout"]
            what = str(rng.choice(changes, p=[0.6, 0.1, 0.1, 0.1, 0.1] if self.kind == "bwd_w" else None))
            if what == "kernel" and self.kind == "bwd_w":  # same src and diff_dst, another kernel
                c["kernel"] = self.kernels[1] if c["kernel"] == self.kernels[0] else self.kernels[0]
                out_pad = [y - x for y, x in zip(c["dst"], self.dst_of(c["kernel"], c["src"], [0] * self.rank))]
                return c if all(0 <= op < s for op, s in zip(out_pad, self.attrs["strides"])) else None
            if what == "code":
                c["code"] = str(rng.choice(self.codes))
            elif what == "n":
                c["n"] = int(rng.integers(1, 4))
            elif what == "bias":  # the bias, or the Add's operand, given the other way
                c["bias"] = self.kind == "fwd_bias" and not c["bias"]
                c["operand"] = {"channel": "full", "full": "channel"}.get(c["operand"], "")
            elif what == "layout":
                c["layouts"] = _layouts(rng, self.rank)
            return c
        return self.new_call()

    def dst_of(self, kernel: list[int], src: list[int], out_pad: list[int]) -> list[int]:
        a = self.attrs
        begin, end = self.pads(kernel)
        return [s * (x - 1) + d * (k - 1) + 1 - pb - pe + op for x, k, s, d, pb, pe, op in zip(
            src, kernel, a["strides"], a["dilations"], begin, end, out_pad)]

    def new_call(self) -> Optional[dict[str, Any]]:
        rng, a = self.rng, self.attrs
        kernel = self.kernels[int(rng.integers(len(self.kernels)))]
        ic, oc_ = self.channels[int(rng.integers(len(self.channels)))]
        src = [int(rng.choice(s)) for s in self.sizes]
        out_pad = a.get("output_padding") or [int(rng.integers(0, s)) if rng.random() < 0.3 else 0 for s in a["strides"]]
        dst = self.dst_of(kernel, src, out_pad)
        if min(dst) < 1:
            return None
        return dict(n=int(rng.integers(1, 4)), ic=ic, oc=oc_, kernel=kernel, src=src, dst=dst,
                    code=str(rng.choice(self.codes)), bias=self.kind == "fwd_bias" and rng.random() < 0.7,
                    operand=str(rng.choice(["channel", "full"])) if self.kind == "fwd_add" else "",
                    layouts=_layouts(rng, self.rank))

    def shapes(self, c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        def act(ch: int, spatial: list[int]) -> tuple[int, ...]:
            return (c["n"], ch, *spatial) if self.attrs["data_format"] == "NCX" else (c["n"], *spatial, ch)
        o = c["oc"] // self.groups
        w = (c["ic"], o, *c["kernel"]) if self.attrs["weights_format"] == "IOX" else (*c["kernel"], o, c["ic"])
        ncx = self.attrs["data_format"] == "NCX"
        channel = (1, c["oc"], *[1] * self.rank) if ncx else (c["oc"],)  # the Add's per-channel operand
        return {"src": act(c["ic"], c["src"]), "dst": act(c["oc"], c["dst"]), "weights": w, "bias": (c["oc"],),
                "post": act(c["oc"], c["dst"]) if c["operand"] == "full" else channel}

    def arrays(self, c: dict[str, Any]) -> tuple[dict[str, np.ndarray], str]:
        """The call's arrays: new ones, or the previous call's objects with new values."""
        rng, dt = self.rng, DTYPES[c["code"]]
        shapes = self.shapes(c)
        fan = max(1, c["ic"] // self.groups * math.prod(c["kernel"]))
        values = {"src": rng.standard_normal(shapes["src"]), "dst": rng.standard_normal(shapes["dst"]),
                  "weights": rng.standard_normal(shapes["weights"]) / math.sqrt(fan),
                  "bias": rng.standard_normal(shapes["bias"]), "post": rng.standard_normal(shapes["post"])}
        prev = self.previous
        if prev is not None and prev["call"] == c and rng.random() < 0.4:
            for name, arr in prev["arrays"].items():
                if name != "weights" or self.fixed_weights is None:
                    arr[...] = values[name].astype(dt)
            return prev["arrays"], "same objects, new values"
        if self.fixed_weights is not None:
            values["weights"] = np.asarray(self.fixed_weights, np.float64)
        arrays = {k: _layout(v.astype(dt), c["layouts"][k]) for k, v in values.items()}
        if self.fixed_weights is not None:
            arrays["weights"] = self.fixed_weights
        return arrays, "new arrays"

    def make_op(self, first: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        a, kind = self.attrs, self.kind
        if kind in ("fwd", "fwd_bias"):
            self.op = oc.ConvTranspose(**a)
        elif kind == "fwd_relu":
            self.op = oc.ConvTranspose(**a, post_ops=["relu"])
        elif kind == "fwd_add":
            self.op = oc.ConvTranspose(**a, post_ops=[oc.PostOp("Add")])
        elif kind == "bwd_d":
            self.op = oc.ConvTransposeBackwardData(**a)
        elif kind == "bwd_w":
            by_attr = self.rng.random() < 0.7  # else every call gives weights_shape
            kernel = self.kernels[int(self.rng.integers(2))]
            ws = self.shapes({**first, "kernel": kernel})["weights"] if by_attr else None
            self.op = oc.ConvTransposeBackwardWeights(**a, weights_shape=ws)
        elif kind == "const_fwd":
            self.fixed_weights = np.ascontiguousarray(arrays["weights"])
            self.op = oc.ConvTranspose(**a).with_constant_weights(arrays["weights"])
        elif kind == "const_bwd_d":
            self.fixed_weights = np.ascontiguousarray(arrays["weights"])
            self.op = oc.ConvTransposeBackwardData(**a).with_constant_weights(arrays["weights"])

    def fresh(self, c: dict[str, Any], arrays: dict[str, np.ndarray]) -> np.ndarray:
        """The call again, on a new op object of the same kind (no out=)."""
        op, fixed, previous = self.op, self.fixed_weights, self.previous
        try:
            self.op, self.fixed_weights = None, None
            if self.kind != "functional":
                self.make_op(c, arrays)
            return self.run(c, arrays, None)[0]
        finally:
            self.op, self.fixed_weights, self.previous = op, fixed, previous

    def run(self, c: dict[str, Any], arrays: dict[str, np.ndarray], out: Optional[np.ndarray]) -> tuple[np.ndarray, str]:
        """Call the op; returns the result and how the call was spelled."""
        a, kind, rng = self.attrs, self.kind, self.rng
        src, dd, w, bias = arrays["src"], arrays["dst"], arrays["weights"], arrays["bias"]
        if kind in ("fwd", "fwd_relu"):
            return self.op(src, w, out=out), ""
        if kind == "fwd_bias":
            return (self.op(src, w, bias, out=out), "bias") if c["bias"] else (self.op(src, w, out=out), "no bias")
        if kind == "fwd_add":
            return self.op(src, w, None, arrays["post"], out=out), f"Add of a {c['operand']} operand"
        if kind == "bwd_d":
            return self.op(dd, w, out=out), ""
        if kind == "const_fwd":
            return self.op(src, out=out), ""
        if kind == "const_bwd_d":
            return self.op(dd, out=out), ""
        if kind == "functional":
            return oc.conv_transpose(src, w, out=out, **a), ""
        ws = self.shapes(c)["weights"]
        attr = self.op.attrs.get("weights_shape")
        spelling = "attribute" if attr is not None and tuple(attr) == ws and rng.random() < 0.5 else str(
            rng.choice(["tuple", "list", "int32", "int64"]))
        given: Any = {"attribute": None, "tuple": tuple(ws), "list": list(ws),
                      "int32": np.array(ws, np.int32), "int64": np.array(ws, np.int64)}[spelling]
        if given is None:
            return self.op(src, dd, out=out), "weights_shape by attribute"
        return self.op(src, dd, given, out=out), f"weights_shape as {spelling}"

    def expected(self, c: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
        """(reference, magnitude, reduction) on the call's rounded inputs."""
        a, kind = self.attrs, self.kind
        f64 = {k: np.asarray(v, np.float64) for k, v in arrays.items()}
        absolute = {k: np.abs(v) for k, v in f64.items()}
        no_op = {k: v for k, v in a.items() if k != "output_padding"}
        g = self.groups
        if kind == "bwd_d" or kind == "const_bwd_d":
            def f(x: dict[str, np.ndarray]) -> np.ndarray:
                return reference.conv_transpose_backward_data(x["dst"], x["weights"], **no_op)
            reduction = c["oc"] // g * math.prod(c["kernel"])
        elif kind == "bwd_w":
            def f(x: dict[str, np.ndarray]) -> np.ndarray:
                return reference.conv_transpose_backward_weights(x["src"], x["dst"], self.shapes(c)["weights"], **no_op)
            reduction = c["n"] * math.prod(c["dst"])
        else:
            bias = kind == "fwd_bias" and c["bias"]

            def f(x: dict[str, np.ndarray]) -> np.ndarray:
                return reference.conv_transpose(x["src"], x["weights"], x["bias"] if bias else None, **a)
            reduction = c["ic"] // g * math.prod(c["kernel"])
        ref = f(f64)
        if kind == "fwd_relu":
            ref = np.maximum(ref, 0)
        if kind == "fwd_add":
            return ref + f64["post"], f(absolute) + absolute["post"], reduction
        return ref, f(absolute), reduction

    def out_for(self, shape: tuple[int, ...], dt: Any, prev_out: Optional[np.ndarray]) -> tuple[Optional[np.ndarray], str]:
        how = str(self.rng.choice(["none", "fresh", "strided", "misaligned", "previous"], p=[0.4, 0.2, 0.1, 0.1, 0.2]))
        if how == "fresh":
            return np.full(shape, np.nan, dt), "out= fresh"
        if how == "misaligned":
            size = math.prod(shape) * np.dtype(dt).itemsize
            view = np.empty(size + np.dtype(dt).itemsize, np.uint8)[np.dtype(dt).itemsize // 2 or 1:][:size]
            return view.view(dt).reshape(shape), "out= misaligned"
        if how == "strided":
            return np.full((*shape[:-1], shape[-1] * 2), np.nan, dt)[..., ::2], "out= strided"
        if how == "previous" and prev_out is not None and prev_out.shape == shape and prev_out.dtype == dt:
            return prev_out, "out= the previous call's"
        return None, "no out="


def _between_calls(rng: np.random.Generator) -> str:
    """Maybe change the package's global state between two calls."""
    r = rng.random()
    if r < 0.08:
        on = not oc.debug_fill()
        oc.set_debug_fill(on)
        return f"debug fill {'on' if on else 'off'}; "
    if r < 0.14:
        oc.clear_cache()
        return "cache cleared; "
    if r < 0.18:
        capacity = int(rng.choice([1, 2, 1024]))
        oc.set_cache_capacity(capacity)
        return f"cache capacity {capacity}; "
    return ""


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    t = _Trial(rng)
    capacity = oc.cache_info()["capacity"]
    log: list[str] = []
    try:
        return _calls(t, rng, log)
    finally:
        oc.set_debug_fill(False)
        oc.set_cache_capacity(capacity)


def _calls(t: _Trial, rng: np.random.Generator, log: list[str]) -> str:
    head = f"{t.kind} rank {t.rank} groups {t.groups} {t.attrs} kernels {t.kernels} channels {t.channels} {t.codes}"
    prev_out: Optional[np.ndarray] = None
    for i in range(int(rng.integers(4, 13))):
        state = _between_calls(rng) if i else ""
        c = t.draw_call()
        if c is None:
            log.append(f"#{i} skipped (an empty dst, or no kernel fits)")
            continue
        arrays, fresh = t.arrays(c)
        if t.op is None and t.kind != "functional":
            t.make_op(c, arrays)
        ref, mag, reduction = t.expected(c, arrays)
        dt = DTYPES[c["code"]]
        out, out_how = t.out_for(tuple(ref.shape), dt, prev_out)
        layouts = {k: ("C" if v.flags.c_contiguous else "F" if v.flags.f_contiguous else "strided")
                   + ("" if v.flags.aligned else ",misaligned") for k, v in arrays.items()}
        what = (f"#{i} {state}{c['code']} n={c['n']} src={c['src']} dst={c['dst']} k={c['kernel']} "
                f"ic/oc={c['ic']}/{c['oc']} {fresh} {layouts} {out_how}")
        try:
            got, spelling = t.run(c, arrays, out)
        except MemoryError as e:
            raise Failure(f"{head}\n  " + "\n  ".join(log) + f"\n  {what}: MemoryError on a small call: {e}") from None
        except ValueError as e:  # a misaligned out= is refused, by the op, every time
            if out_how != "out= misaligned" or "argument 'out' expected positive, aligned" not in str(e):
                raise
            log.append(f"{what}: refused ({e})")
            continue
        if out_how == "out= misaligned":
            raise Failure(f"{head}\n  " + "\n  ".join(log) + f"\n  {what}: a misaligned out= was taken")
        what += f" {spelling}"
        log.append(what)
        trace = f"{head}\n  " + "\n  ".join(log)
        if out is not None and got is not out:
            raise Failure(f"{trace}: the out= call did not return out")
        if got.shape != ref.shape or got.dtype != dt:
            raise Failure(f"{trace}: gave {got.dtype}{got.shape}, expected {dt}{ref.shape}")
        g = np.asarray(got, np.float64)
        if not np.all(np.isfinite(g)):
            raise Failure(f"{trace}: non-finite values ({_lowering(t)})")
        tol = accuracy.tolerance(c["code"], reduction) * (float(np.max(mag)) if mag.size else 0.0)
        err = float(np.max(np.abs(g - ref))) if ref.size else 0.0
        if err > tol:
            fresh = t.fresh(c, arrays)  # is it the reuse? the same call on a new op object
            fresh_err = float(np.max(np.abs(np.asarray(fresh, np.float64) - ref)))
            raise Failure(f"{trace}: off by {err:.3g} (tolerance {tol:.3g}; {_lowering(t)}); "
                          f"a new op object: off by {fresh_err:.3g}")
        t.previous = {"call": c, "arrays": arrays}
        prev_out = got
    return f"{head}: {len(log)} calls"


def _lowering(t: _Trial) -> str:
    op = getattr(t.op, "op", t.op)  # a ConstantWeights' private op
    return str(getattr(op, "lowering", "functional"))


"""The guards (:mod:`onednn_convt.guards`): where each applies, that its route gives the
reference's answer, that ``strict=True`` never reaches the kernel it avoids, and what
``info()`` says.

The routes are exercised on every CPU by making the package believe it dispatches to AMX
(``guards.dispatch_isa`` patched): the problem then takes the guarded lowering, which this
CPU's kernels compute. Whether the guards are still needed is measured by
``tests/isa_scan.py --unguarded`` on a CPU that has the ISA (docs/cpus.md).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onednn_convt as oc
import pytest
from helpers import Config, assert_close, lowering_here, require_native
from onednn_convt import guards, reference

#: these tests check the hand-written rules' routes by name (conftest.hand_rules)
pytestmark = pytest.mark.usefixtures("hand_rules")

BWD_D = "ConvTransposeBackwardData"


@pytest.fixture
def amx(monkeypatch):
    """The package believes oneDNN dispatches to AMX (the guards for AMX apply)."""
    monkeypatch.setattr(guards, "dispatch_isa", lambda: "avx512_core_amx")


def test_the_issue_call_runs_repeatedly_and_matches_the_reference():
    """The BackwardData call that aborted the process on AMX (heap corruption)."""
    rng = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    op = oc.ConvTransposeBackwardData(strides=[3, 2, 3], auto_pad="valid", data_format="NCX", weights_format="XOI")
    w = rng.uniform(-1, 1, (1, 2, 3, 96, 48)).astype(bf)
    dd = rng.uniform(-1, 1, (2, 96, 16, 4, 12)).astype(bf)
    ref = oc.reference.conv_transpose_backward_data(
        dd, w, strides=[3, 2, 3], auto_pad="valid", data_format="NCX", weights_format="XOI"
    )
    for _ in range(20):
        assert_close(op(dd, w), ref, "bf16", 96 * 6)
    if guards.dispatch_isa() in guards.AMX:
        assert op.guard == "amx_stride_not_below_kernel"


def test_stride_condition_is_stride_above_one_and_not_below_kernel(amx):
    for kernel, strides in itertools.product(itertools.product((1, 2, 3), repeat=2), repeat=2):
        want = tuple(i for i in range(2) if strides[i] > 1 and strides[i] >= kernel[i])
        assert guards.stride_not_below_kernel("bf16", kernel, strides) == want
        assert guards.stride_not_below_kernel("f32", kernel, strides) == ()  # f32 kernels are right
        assert guards.stride_not_below_kernel("f16", kernel, strides) == ()  # no AMX-FP16 here


def test_padding_only_condition_is_the_definition(amx):
    """Some output position none of whose taps o*s - pb + j*d falls in [0, given)."""
    rng = np.random.default_rng(5)
    for _ in range(3000):
        x, y, k, s, d, pb = (int(v) for v in rng.integers(1, [9, 9, 5, 5, 4, 9]))
        pb -= 1
        want = any(all(not 0 <= o * s - pb + j * d < y for j in range(k)) for o in range(x))
        assert guards.padding_only_outputs("bf16", (x,), (y,), (k,), (s,), (d,), (pb,)) is want, (x, y, k, s, d, pb)
    # sizes at the 32-bit limit cost no memory (the range check rejects them later)
    assert guards.padding_only_outputs("bf16", (2**31,), (5,), (3,), (1,), (1,), (0,)) is True


def test_guards_apply_only_on_their_isas(monkeypatch):
    monkeypatch.setattr(guards, "dispatch_isa", lambda: "avx512_core_bf16")
    assert guards.stride_not_below_kernel("bf16", (1, 1), (3, 3)) == ()
    assert guards.active(guards.BF16_BACKWARD_WEIGHTS_SHORT_SRC, "bf16")
    assert [g["name"] for g in guards.report()] == ["bf16_backward_weights_short_src", "strided_deconvolution_epilogue",
                                                     "avx512_backward_weights_depth_pad", "strided_1x1_backward_weights"]
    monkeypatch.setattr(guards, "dispatch_isa", lambda: "avx2")  # bf16 computed in f32 there
    assert [g["name"] for g in guards.report()] == ["strided_deconvolution_epilogue",  # every ISA
                                                     "strided_1x1_backward_weights"]


#: BackwardData problems of each route (NCX and NXC, IOX and XOI, groups, dilation)
ROUTED = [
    # stride = kernel, no pads: the taps tile the output, one MatMul (matmul_tiles)
    *(Config(src=(5, 6), kernel=(2, 2), strides=2, ic=16, oc=24, data_format=df, weights_format=wf)
      for df in ("NCX", "NXC") for wf in ("IOX", "XOI")),
    (Config(src=(3, 4, 2), kernel=(2, 1, 3), strides=(2, 1, 3), ic=8, oc=16, data_format="NXC"), "MatMul"),
    (Config(src=(7,), kernel=(4,), strides=4, ic=16, oc=8, weights_format="XOI"), "MatMul"),
    # with pads, dilation, groups or a stride-1 dim: zero taps appended (native Convolution)
    (Config(src=(5, 6), kernel=(2, 2), strides=2, pads_begin=1, ic=16, oc=24), "Convolution"),
    (Config(src=(4, 5), kernel=(3, 2), strides=(3, 2), dilations=(2, 1), pads_begin=(1, 0), ic=8, oc=16,
            groups=2, data_format="NXC", weights_format="XOI"), "Convolution"),
    (Config(src=(3, 4, 3), kernel=(2, 3, 2), strides=(2, 1, 2), ic=8, oc=8, data_format="NXC"), "Convolution"),
    (Config(src=(9,), kernel=(2,), strides=4, pads_end=1, ic=16, oc=8, data_format="NXC"), "Convolution"),
    # kernel 1, no pads_begin: every s-th row of diff_dst, stride 1 (native, the rules' op)
    (Config(src=(4, 5), kernel=(1, 1), strides=3, ic=16, oc=16, weights_format="XOI"), "ConvTransposeBackwardData"),
    (Config(src=(4, 5), kernel=(1, 1), strides=3, pads_end=(0, 1), output_padding=(2, 1), ic=16, oc=16,
            data_format="NXC"), "Convolution"),
    (Config(src=(3, 4, 3), kernel=(1, 3, 1), strides=(2, 2, 4), ic=8, oc=24), "ConvTransposeBackwardData"),
    # kernel 1 with stride 3 beside kernel 2 with stride 3 and a pad: zero taps would cost
    # 4 * 2 = 8x: f32, by the op the rules pick
    (Config(src=(4, 5), kernel=(1, 2), strides=3, pads_begin=(0, 1), ic=16, oc=16, weights_format="XOI"),
     "ConvTransposeBackwardData (f32 emulation)"),
    (Config(src=(4, 5), kernel=(1, 2), strides=3, pads_begin=(0, 1), ic=16, oc=16, data_format="NXC"),
     "Convolution (f32 emulation)"),
]
ROUTED = [r if isinstance(r, tuple) else (r, "MatMul") for r in ROUTED]


@pytest.mark.parametrize(("cfg", "lowering"), ROUTED, ids=[str(c) for c, _ in ROUTED])
def test_stride_route_matches_the_reference(amx, cfg, lowering):
    t = cfg.tensors(np.random.default_rng(9), "bf16")
    op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
    ref = cfg.ref_backward_data(t["diff_dst"], t["weights"])
    for got in (op(t["diff_dst"], t["weights"]), op(t["diff_dst"], t["weights"])):
        assert_close(got, ref, "bf16", cfg.bwd_data_reduction, str(cfg))
    assert op.guard == "amx_stride_not_below_kernel" and op.lowering == lowering_here(lowering, "bf16", BWD_D)
    out = np.empty_like(ref, dtype=ml_dtypes.bfloat16)
    assert op(t["diff_dst"], t["weights"], out=out) is out
    assert_close(out, ref, "bf16", cfg.bwd_data_reduction, str(cfg))


def test_zero_taps_meet_infinity_without_nan(amx):
    """An Inf in diff_dst read only by an appended zero tap: the result is redone without
    the zero taps (0 * Inf would be NaN where the exact result is finite). The redo is the
    native bf16 plan's (an AMX CPU, the only one this guard routes, has native bf16): the
    ``amx`` fixture on a CPU that computes bf16 in f32 has no such plan to test."""
    require_native("bf16", BWD_D)
    cfg = Config(src=(5, 6), kernel=(2, 2), strides=2, pads_begin=1, ic=16, oc=24)
    t = cfg.tensors(np.random.default_rng(10), "bf16")
    dd = t["diff_dst"].copy()
    # taps o*2 - 1 + j: row 1 and col 1 are the appended tap j = 2 of output 0
    dd[0, 0, 1, 1] = np.inf
    op = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D))
    got = np.asarray(op(dd, t["weights"]), np.float64)
    assert op.lowering == lowering_here("Convolution", "bf16", BWD_D) and op.guard is not None
    ref = cfg.ref_backward_data(dd, t["weights"])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))


def test_padding_only_route_and_strict(amx):
    """Every diff_src row reads only pads (dilation 2, stride 2, pads_begin 3 over one row):
    f32, also with strict=True, which must never reach the kernel either."""
    cfg = Config(src=(3, 9), kernel=(3, 4), strides=(2, 5), dilations=(2, 2), pads_begin=(3, 0), pads_end=(5, 6),
                 output_padding=(0, 2), ic=24, oc=48, weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(11), "bf16")
    for strict in (False, True):
        op = oc.ConvTransposeBackwardData(strict=strict, **cfg.attrs(BWD_D))
        got = op(t["diff_dst"], t["weights"])
        assert op.guard == "amx_padding_only_outputs" and op.lowering == "Convolution (f32 emulation)"
        assert_close(got, cfg.ref_backward_data(t["diff_dst"], t["weights"]), "bf16", cfg.bwd_data_reduction)


FORWARD_ROUTED = [
    # stride = kernel, no pads: the taps tile the output, one MatMul
    *((Config(src=(5, 6), kernel=(2, 2), strides=2, ic=16, oc=24, bias=True, data_format=df, weights_format=wf),
       "MatMul") for df in ("NCX", "NXC") for wf in ("IOX", "XOI")),
    (Config(src=(3, 4, 2), kernel=(2, 1, 3), strides=(2, 1, 3), ic=8, oc=16, bias=True, data_format="NXC"),
     "MatMul"),
    # otherwise the rules' lowering in f32: the library's deconvolution (bias or groups) ...
    (Config(src=(2, 6, 6), kernel=(2, 1, 3), strides=(2, 3, 4), bias=True, ic=32, oc=8, weights_format="XOI"),
     "ConvolutionBackwardData+BiasAdd: 2 partitions (f32 emulation)"),  # the bias after it: see STAGED
    # ... or ConvolutionBackwardData (the ISA scan's problem that returned 1e35 on AMX)
    (Config(src=(6, 6, 6), kernel=(3, 1, 2), strides=(3, 2, 4), dilations=(1, 2, 1), auto_pad="SAME_LOWER",
            output_padding=(1, 1, 2), n=1, ic=32, oc=16, weights_format="XOI"), "ConvolutionBackwardData (f32 emulation)"),
    (Config(src=(5, 6), kernel=(2, 2), strides=2, ic=16, oc=24, groups=2), "ConvTranspose (f32 emulation)"),
]


@pytest.mark.parametrize(("cfg", "lowering"), FORWARD_ROUTED, ids=[str(c) for c, _ in FORWARD_ROUTED])
def test_forward_is_routed(amx, cfg, lowering):
    t = cfg.tensors(np.random.default_rng(12), "bf16")
    bias = t["bias"] if cfg.bias else None
    op = oc.ConvTranspose(**cfg.attrs())
    ref = cfg.ref_forward(t["src"], t["weights"], bias)
    for got in (op(t["src"], t["weights"], bias), op(t["src"], t["weights"], bias)):
        assert_close(got, ref, "bf16", cfg.fwd_reduction, str(cfg))
    assert op.guard == "amx_stride_not_below_kernel" and op.lowering == lowering_here(lowering, "bf16")
    out = np.empty(ref.shape, ml_dtypes.bfloat16)
    assert op(t["src"], t["weights"], bias, out=out) is out
    assert_close(out, ref, "bf16", cfg.fwd_reduction, str(cfg))


def test_disabled_guards_route_nothing(amx, monkeypatch):
    monkeypatch.setattr(guards, "_enabled", True)
    guards.set_enabled(False)
    try:
        assert guards.stride_not_below_kernel("bf16", (1, 1), (3, 3)) == ()
        assert guards.report() == []
    finally:
        guards.set_enabled(True)


@pytest.mark.parametrize(("level", "expected"), [
    ("AVX2", ["strided_deconvolution_epilogue", "strided_1x1_backward_weights"]),
    ("AVX512_CORE_BF16", ["bf16_backward_weights_short_src", "strided_deconvolution_epilogue",
                          "avx512_backward_weights_depth_pad", "strided_1x1_backward_weights"]),
    ("AVX512_CORE_AMX", ["amx_stride_not_below_kernel", "amx_padding_only_outputs", "bf16_backward_weights_short_src",
                         "strided_deconvolution_epilogue", "avx512_backward_weights_depth_pad",
                         "strided_1x1_backward_weights"]),
])
def test_info_names_the_dispatched_isa_and_its_guards(level, expected):
    code = "import json, onednn_convt as oc; i = oc.info(); print(json.dumps([i['cpu_isa'], [g['name'] for g in i['guards']], i['rules']]))"
    env = {"ONEDNN_MAX_CPU_ISA": level, "PATH": "", "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    isa, names, used = json.loads(out.stdout)
    assert set(used) == {"cpu", "table", "table_sha256", "why", "small_calls", "fallback_measured_on",
                         "measured_apart"} and used["table"]  # a table, or the default
    assert set(used["measured_apart"]) == {"Lifted to 2-D", "Depth taps", "Channels-last depth taps"}
    assert len(used["table_sha256"]) == 64 and int(used["table_sha256"], 16) >= 0  # the shipped file's SHA-256
    if isa != level.lower():
        pytest.skip(f"this CPU lacks {level}")
    assert names == expected


def tiles_configs(count: int, seed: int) -> list[Config]:
    """Random problems whose taps tile the output (stride = kernel, no pads, groups 1)."""
    rng = np.random.default_rng(seed)
    pick = lambda options: options[int(rng.integers(len(options)))]  # noqa: E731
    found = []
    for _ in range(count):
        rank = pick((1, 2, 3))
        kernel = tuple(pick((1, 2, 3, 4)) for _ in range(rank))
        if max(kernel) == 1:
            kernel = (2, *kernel[1:])
        found.append(Config(
            src=tuple(pick((1, 2, 3, 5, 8)) for _ in range(rank)), kernel=kernel, strides=kernel,
            n=pick((1, 2)), ic=pick((3, 8, 16, 40)), oc=pick((1, 8, 24, 64)), bias=pick((False, True)),
            data_format=pick(("NCX", "NXC")), weights_format=pick(("IOX", "XOI")),
        ))
    return found


@pytest.mark.parametrize("code", ["bf16", "f32"])
@pytest.mark.parametrize("cfg", tiles_configs(24, 21), ids=str)
def test_tiles_matmul_matches_the_reference(amx, cfg, code, monkeypatch):
    """Both ops as the tiles MatMul (f32 too, the guard made to apply to it: the layout
    code is the same), first call, repeated and out=, against the reference."""
    monkeypatch.setitem(guards.AMX_STRIDE_NOT_BELOW_KERNEL.isas, "f32", guards.AMX)
    t = cfg.tensors(np.random.default_rng(22), code)
    bias = t["bias"] if cfg.bias else None
    for op, args, ref, reduction in (
        (oc.ConvTranspose(**cfg.attrs()), (t["src"], t["weights"], bias),
         cfg.ref_forward(t["src"], t["weights"], bias), cfg.fwd_reduction),
        (oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D)), (t["diff_dst"], t["weights"]),
         cfg.ref_backward_data(t["diff_dst"], t["weights"]), cfg.bwd_data_reduction),
    ):
        out = np.full(ref.shape, np.nan, t["src"].dtype)
        # and an out= that is not C-contiguous (every other element of a wider array)
        strided = np.full((*ref.shape[:-1], 2 * ref.shape[-1]), np.nan, t["src"].dtype)[..., ::2]
        for got in (op(*args), op(*args), op(*args, out=out), op(*args, out=strided)):
            assert_close(got, ref, code, reduction, f"{op!r} {cfg}")
        assert strided.base is not None and np.isnan(strided.base[..., 1::2].astype(np.float32)).all()
        assert op.lowering == lowering_here("MatMul", code, type(op).__name__), op.lowering
        assert op.guard == "amx_stride_not_below_kernel"


@pytest.mark.parametrize("code", ["f32", "bf16"])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
@pytest.mark.parametrize("post_ops", [None, ["ReLU"]], ids=["bias", "bias+ReLU"])
def test_strided_deconvolution_keeps_bias_and_post_ops_apart(code, data_format, post_ops):
    """The DCGAN layer (512 -> 256 channels, k4 s2 p1) with a bias: oneDNN 3.2's strided
    deconvolution kernel added the bias, and applied a fused ReLU, once per kernel tap on
    AMD Zen4/Zen5 (errors of 0.3-2.3x the output's scale, AVX2 to AVX-512); the guard runs
    the op alone, then the bias and post-ops, on every CPU."""
    rng = np.random.default_rng(0)
    dt = ml_dtypes.bfloat16 if code == "bf16" else np.float32
    x = rng.standard_normal((2, 512, 4, 4))
    w = rng.standard_normal((512, 256, 4, 4)) / 64
    b = rng.standard_normal(256)
    fmt = dict(data_format=data_format, weights_format="IOX" if data_format == "NCX" else "XOI")
    if data_format == "NXC":
        x, w = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
    x, w, b = (np.ascontiguousarray(a).astype(dt) for a in (x, w, b))
    attrs = dict(strides=2, pads_begin=1, pads_end=1, **fmt)
    op = oc.ConvTranspose(**attrs, post_ops=post_ops)
    ref = reference.conv_transpose(*(np.asarray(a, np.float64) for a in (x, w, b)), **attrs)
    if post_ops:
        ref = np.maximum(ref, 0)
    for got in (op(x, w, b), op(x, w, b)):  # planned, then the C++ executor
        assert_close(got, ref, code, 512 * 4, f"{code} {data_format} {post_ops}")
    assert op.guard == "strided_deconvolution_epilogue", op.lowering
    if post_ops:
        assert op.partitions >= 2, op.lowering
    else:  # the bias added by a second partition, or by the core to a small f32 result
        want = "+BiasAdd: 2 partitions" if code == "bf16" else "+bias (core)"
        assert op.lowering.endswith(lowering_here(want, code)), op.lowering


_DEPTH_PAD = """
import sys, numpy as np, ml_dtypes, onednn_convt as oc
from onednn_convt import reference
rng = np.random.default_rng(0)
# (data format, dtype, kernel, src, strides, dilations, pads_begin, pads_end, channels)
CASES = [("NXC", "f32", (7, 2, 2), (3, 3, 3), (2, 2, 1), (1, 1, 2), (3, 1, 0), (3, 0, 2), (20, 37)),  # fuzz/plain_ops
         ("NXC", "f32", (7, 1, 1), (3, 3, 3), (2, 1, 1), (1, 1, 1), (3, 0, 0), (3, 0, 0), (20, 37)),
         ("NCX", "f32", (9, 2, 2), (4, 3, 3), (1, 1, 1), (1, 1, 1), (6, 0, 0), (3, 0, 0), (32, 32)),
         ("NCX", "bf16", (5, 2, 2), (2, 3, 3), (2, 1, 1), (1, 1, 1), (3, 0, 0), (1, 0, 0), (32, 32)),
         ("NXC", "bf16", (9, 2, 2), (3, 3, 3), (3, 1, 1), (1, 1, 1), (6, 0, 0), (4, 0, 0), (32, 32))]
for fmt, code, k, x, s, d, pb, pe, (ic, oc_) in CASES:
    dt = ml_dtypes.bfloat16 if code == "bf16" else np.float32
    y = [si * (xi - 1) + di * (ki - 1) + 1 - a - b for xi, ki, si, di, a, b in zip(x, k, s, d, pb, pe)]
    src = rng.standard_normal((1, ic, *x) if fmt == "NCX" else (1, *x, ic)).astype(dt)
    dd = rng.standard_normal((1, oc_, *y) if fmt == "NCX" else (1, *y, oc_)).astype(dt)
    ws = (ic, oc_, *k) if fmt == "NCX" else (*k, oc_, ic)
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, data_format=fmt,
                 weights_format="IOX" if fmt == "NCX" else "XOI")
    op = oc.ConvTransposeBackwardWeights(**attrs)
    ref = reference.conv_transpose_backward_weights(src, dd, ws, **attrs)
    for got in (op(src, dd, np.array(ws)), op(src, dd, np.array(ws))):
        err = np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max()
        assert err < (0.02 if code == "bf16" else 1e-5), (fmt, code, k, pb, err, op.lowering)
    # the first guard that chose the route is named (a short bf16 src has its own)
    assert op.guard in ("avx512_backward_weights_depth_pad", "bf16_backward_weights_short_src"), op.guard
print("ok")
"""


def test_backward_weights_depth_front_pad_keeps_off_avx512_kernels():
    """3-D BackwardWeights with pads_begin >= 3 in depth: oneDNN 3.2's AVX-512 backward-weights
    kernels (f32 and bf16, both library ops) corrupted the heap (abort, segfault) or returned
    garbage; the guard gives the library diff_dst with its cropped rows back as zeros. In a
    child (a regression would crash), with glibc's heap checks on."""
    if guards.dispatch_isa() not in guards.AVX512:
        pytest.skip("the guard applies to AVX-512 CPUs")
    env = dict(os.environ, MALLOC_CHECK_="3")
    proc = subprocess.run([sys.executable, "-c", _DEPTH_PAD], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stderr[-2000:])


@pytest.mark.parametrize("name", ["ConvTransposeBackwardWeights", "ConvolutionBackwardWeights", "Channels-last",
                                  "ConvolutionBackwardWeights in f32"])
@pytest.mark.parametrize("cfg", [
    Config(src=(5, 6), kernel=(1, 1), n=1, ic=1, oc=3, strides=(1, 2), output_padding=(0, 1)),
    Config(src=(4, 5), kernel=(1, 1), n=2, ic=3, oc=5, strides=(2, 3), pads_begin=(1, 2), pads_end=(2, 0),
           output_padding=(1, 2), data_format="NXC", weights_format="XOI"),
    Config(src=(3, 2, 4), kernel=(1, 1, 1), n=1, ic=2, oc=4, groups=2, strides=(3, 1, 2), pads_begin=(2, 0, 1)),
], ids=["crash_case", "pads_nxc", "3d_groups"])
def test_a_strided_1x1_backward_weights_runs_at_unit_stride_in_a_child(cfg, name):
    """strided_1x1_backward_weights: the library's strided 1x1 backward-weights kernel wrote
    past its scratchpad (a crash at the next compile in 6 of 8 processes on an AMD Zen4).
    Each library lowering gets diff_dst's tapped rows at unit stride, in a child process
    (where a heap corruption would kill it), right against the reference."""
    code = f"""
import sys, numpy as np
sys.path.insert(0, {str(Path(__file__).parent)!r})
from dataclasses import replace
from helpers import Config, assert_close
from test_numerics import inputs_of, reference
from test_lowering_candidates import op_of, call_arrays
from onednn_convt import lowering
cfg = {cfg!r}
op = "ConvTransposeBackwardWeights"
for code in ("f32", "bf16"):
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(3), code), cfg)
    inst = op_of(op, cfg)
    given = call_arrays(op, cfg, arrays)
    problem = inst._problem(given, code)
    names = lowering.candidates(problem)
    if {name!r} not in names:
        continue
    low = lowering.build(problem, {name!r})
    for _ in range(3):  # a corrupted heap shows at a later compile
        got = inst._target().plan(replace(low, single_thread=False), given, None, code).run(given, None)
    assert_close(got, reference(op, cfg, arrays), code, cfg.bwd_weights_reduction, {name!r})
    print(code, low.guard)
    for other in names:  # more compiles, where a corrupted heap gives way
        inst._target().plan(lowering.build(problem, other), given, None, code).run(given, None)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "strided_1x1_backward_weights" in proc.stdout or not proc.stdout.strip(), proc.stdout

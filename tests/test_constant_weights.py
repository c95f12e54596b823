"""Constant weights: ``op.with_constant_weights(w)`` compiles with the weights marked constant,
so the library reorders them on the first call and reuses the result (its constant tensor
cache, kept per compiled partition).

What must hold: the same results as the op with the weights passed on each call, on every
lowering (ConvTranspose, Convolution, ConvTransposeBackwardData, the depthwise Convolution
over flipped weights, MatMul) and dtype path; two objects with equal shapes and different
weights never share a cached reorder; the caller's array can change without effect; the
reorder really happens once (ONEDNN_VERBOSE); and a dropped object frees its reordered
weights.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close, emulated_dtype

from onednn_convt import plan as plans
from test_emulated_fast_path import make, reduction
from test_memory import MB, trimmed_rss
from test_numerics import BWD_D, FWD, LONG, inputs_of, reference
from test_threads import run_threads

#: one config per lowering: ConvTranspose / ConvTransposeBackwardData (NCX, with groups and a
#: bias), ConvolutionBackwardData for the forward and Convolution for BackwardData (NXC), the depthwise stride-1 NXC forward (Convolution over flipped
#: weights), and MatMul (kernel >= 128, forward and BackwardData)
CFGS = {
    "ncx-iox-bias": Config(src=(6, 5), kernel=(3, 2), n=2, ic=6, oc=4, groups=2, strides=2, pads_begin=1, bias=True),
    "nxc-xoi": Config(src=(5, 6), kernel=(2, 3), n=2, ic=4, oc=6, strides=(2, 1), dilations=(1, 2),
                      data_format="NXC", weights_format="XOI"),
    "depthwise": Config(src=(7, 6), kernel=(3, 3), n=2, ic=8, oc=8, groups=8, pads_begin=1, pads_end=1,
                        data_format="NXC", weights_format="XOI", bias=True),
    "matmul": LONG,
    "3d": CASES[CASE_IDS.index("3d_groups_nxc_xoi")],
}
LOWERINGS = {
    # groups 2, stride 2, a bias: the deconvolution without it (guard strided_deconvolution_epilogue),
    # then the core adds it (a small f32 result: lowering.forward.bias_apart)
    ("ncx-iox-bias", FWD): "ConvTranspose+bias (core)", ("ncx-iox-bias", BWD_D): "ConvTransposeBackwardData",
    ("nxc-xoi", FWD): "ConvolutionBackwardData", ("nxc-xoi", BWD_D): "Convolution",
    ("depthwise", FWD): "Convolution", ("matmul", FWD): "MatMul", ("matmul", BWD_D): "MatMul",
}


def bind(op: str, cfg: Config, weights: np.ndarray) -> oc.ConstantWeights:
    instance = make(op, cfg)
    return instance.with_constant_weights(weights)  # type: ignore[no-any-return]


def others(op: str, arrays: list[Any]) -> list[Any]:
    """The call's inputs without the weights (input 1)."""
    return [arrays[0], *arrays[2:]]


#: BackwardData has no depthwise lowering of its own: its depthwise case is nxc-xoi's path
CASES_RUN = [(name, op) for name in CFGS for op in (FWD, BWD_D) if (name, op) != ("depthwise", BWD_D)]


@pytest.fixture
def hand_written_rules():
    """The lowerings of LOWERINGS are the hand-written rules' (a measured table picks by CPU)."""
    from onednn_convt.lowering import rules_table

    rules_table.use_no_tables()
    yield
    rules_table.use_shipped_tables()


@pytest.mark.parametrize("code", ["f32", "bf16", "f16"])
@pytest.mark.parametrize(("name", "op"), CASES_RUN, ids=[f"{n}-{o}" for n, o in CASES_RUN])
def test_same_results_as_weights_given_per_call(name, op, code, hand_written_rules):
    cfg = CFGS[name]
    arrays = inputs_of(op, cfg.tensors(np.random.default_rng(3), code), cfg)
    plain = make(op, cfg)
    expected = plain(*arrays)
    f = bind(op, cfg, arrays[1])
    rest = others(op, arrays)
    got = [f(*rest), f(*rest), f(*rest, out=np.full_like(expected, np.nan))]
    assert f.lowering == plain.lowering
    if (name, op) in LOWERINGS and code == "f32":
        assert f.lowering == LOWERINGS[name, op]
    compiled = f.op.last_plan.compiled
    assert compiled.constant_inputs == [f.op.last_plan.lowering.weights_arg]
    for g in got:
        assert g.dtype == expected.dtype and g.shape == expected.shape
        np.testing.assert_array_equal(g.view(np.uint8), expected.view(np.uint8))
        assert_close(g, reference(op, cfg, arrays), code, reduction(op, cfg), f"{name} {op} {code}")


def test_equal_shapes_other_weights_are_not_shared():
    """Two objects, same shapes, different weights, called in turn: each keeps its own
    reordered weights (a shared compiled partition would give the first one's results)."""
    cfg = CFGS["nxc-xoi"]
    rng = np.random.default_rng(5)
    x = cfg.tensors(rng)["src"]
    ws = [cfg.tensors(rng)["weights"] for _ in range(3)]
    fs = [bind(FWD, cfg, w) for w in ws]
    plain = oc.ConvTranspose(**cfg.attrs())
    for _ in range(2):
        for f, w in zip(fs, ws):
            np.testing.assert_array_equal(f(x), plain(x, w))
    keys = {f.op.last_plan.compiled.key for f in fs}
    assert len(keys) == 1  # same spec: the objects differ only by their private compiles


def test_weights_are_copied_and_read_only():
    cfg = CFGS["ncx-iox-bias"]
    t = cfg.tensors(np.random.default_rng(6))
    w = t["weights"].copy()
    f = bind(FWD, cfg, w)
    before = f(t["src"], t["bias"])
    w *= -3  # the caller's array changes; the bound copy does not
    np.testing.assert_array_equal(f(t["src"], t["bias"]), before)
    assert not f.weights.flags.writeable and f.weights.flags.c_contiguous
    with pytest.raises(ValueError):
        f.weights[...] = 0
    # a transposed view is bound as a C-contiguous copy of the same values
    view = np.asfortranarray(t["weights"])
    np.testing.assert_array_equal(bind(FWD, cfg, view)(t["src"], t["bias"]), before)


def test_constant_compiles_stay_out_of_the_shared_cache():
    cfg = CFGS["nxc-xoi"]
    t = cfg.tensors(np.random.default_rng(7))
    size = oc.cache_info()["size"]
    bind(FWD, cfg, t["weights"])(t["src"])
    assert oc.cache_info()["size"] == size


def test_pickle_keeps_weights_and_attributes():
    cfg = CFGS["ncx-iox-bias"]
    t = cfg.tensors(np.random.default_rng(8))
    f = bind(FWD, cfg, t["weights"])
    expected = f(t["src"], t["bias"])
    g = pickle.loads(pickle.dumps(f))
    assert not g.weights.flags.writeable
    np.testing.assert_array_equal(g(t["src"], t["bias"]), expected)
    assert g.op.last_plan.compiled.constant_inputs == [1]


def test_threads_share_one_object():
    """Eight threads make the first calls of one object at once (the library fills its
    constant cache once and the others wait for it); every result is right."""
    cfg = CFGS["nxc-xoi"]
    rng = np.random.default_rng(9)
    w = cfg.tensors(rng)["weights"]
    xs = [cfg.tensors(rng)["src"] for _ in range(8)]
    f = bind(FWD, cfg, w)
    plain = oc.ConvTranspose(**cfg.attrs())
    got = run_threads(8, lambda i: [f(xs[i]) for _ in range(3)])
    for i, results in enumerate(got):
        for r in results:
            np.testing.assert_array_equal(r, plain(xs[i], w))


def test_errors_name_the_op_and_argument():
    cfg = CFGS["ncx-iox-bias"]
    t = cfg.tensors(np.random.default_rng(10))
    op = oc.ConvTranspose(**cfg.attrs())
    with pytest.raises(TypeError, match=r"ConvTranspose.with_constant_weights: argument 'weights' expected dtype"):
        op.with_constant_weights(t["weights"].astype(np.int32))
    with pytest.raises(TypeError, match=r"ConvTranspose: argument 'weights' expected a NumPy array, got str"):
        op.with_constant_weights("weights")
    f = op.with_constant_weights(t["weights"])
    with pytest.raises(TypeError, match=r"ConvTranspose with constant weights: expected the inputs src, bias"):
        f(t["src"], t["weights"], t["bias"])
    with pytest.raises(TypeError, match=r"expected the inputs"):
        f()
    with pytest.raises(TypeError, match=r"ConvTranspose: every float tensor of a call must have one dtype"):
        f(t["src"].astype(np.float16))
    with pytest.raises(ValueError, match=r"ConvTranspose: 'weights' has I = "):
        op.with_constant_weights(t["weights"][:2])(t["src"])
    bwd = oc.ConvTransposeBackwardData(**cfg.attrs(BWD_D)).with_constant_weights(t["weights"])
    with pytest.raises(TypeError, match=r"ConvTransposeBackwardData with constant weights: expected the inputs diff_dst"):
        bwd(t["diff_dst"], t["diff_dst"])
    assert not hasattr(oc.ConvTransposeBackwardWeights, "with_constant_weights")


_VERBOSE_SCRIPT = """
import numpy as np, onednn_convt as oc
x = np.ones((2, 6, 5, 48), np.float32)  # NXC
w = np.ones((3, 3, 40, 48), np.float32)  # XOI
op = oc.ConvTranspose()  # stride 1: one partition (a strided layer may run as phases)
f = op.with_constant_weights(w)
for i in range(3):
    print("CALL plain", flush=True); op(x, w)
for i in range(3):
    print("CALL const", flush=True); f(x)
"""


def test_library_reorders_constant_weights_once():
    """ONEDNN_VERBOSE lists each primitive run: the weights reorder (40x48x3x3, or 48x40x3x3
    where the lowering reads them as a convolution's) runs on every plain call and on the
    first call with constant weights only."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", _VERBOSE_SCRIPT], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    calls: list[tuple[str, int]] = []
    for line in out.splitlines():
        if line.startswith("CALL"):
            calls.append((line.split()[1], 0))
        elif ",exec," in line and ",reorder," in line and ("40x48x3x3" in line or "48x40x3x3" in line):
            kind, n = calls[-1]
            calls[-1] = (kind, n + 1)
    assert [k for k, _ in calls] == ["plain"] * 3 + ["const"] * 3
    assert [n for _, n in calls] == [1, 1, 1, 1, 0, 0], out


_PHASED_SCRIPT = """
import numpy as np, onednn_convt as oc
from onednn_convt import lowering
from onednn_convt.lowering import base, polyphase
rule = lowering.rule  # every strided problem as phases, whatever this CPU's table says
lowering.rule = lambda p, native=False, phase=False: base.POLYPHASE if polyphase.applies(p) else rule(p, native=native)
x = np.ones((2, 6, 5, 48), np.float32)  # NXC
w = np.ones((3, 3, 40, 48), np.float32)  # XOI
op = oc.ConvTranspose(strides=2)
f = op.with_constant_weights(w)
for i in range(3):
    print("CALL const", flush=True); f(x)
print("LOWERING", f.lowering, flush=True)
"""


def test_phased_constant_weights_are_reordered_once():
    """A stride-2 layer that runs as four phases reorders each phase's weights (48 x 40
    channels, in the order its phase's library op reads them, by 2x2, 2x1, 1x2 and 1x1 taps)
    on the first call only."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", _PHASED_SCRIPT], env=env, capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert "LOWERING Polyphase (4 phases" in out
    calls: list[list[str]] = []
    for line in out.splitlines():
        if line.startswith("CALL"):
            calls.append([])
        elif ",exec," in line and ",reorder," in line and (",48x40x" in line or ",40x48x" in line):
            calls[-1].append(line.rsplit(",", 2)[-2].split("x", 2)[2])  # the taps
    assert sorted(calls[0]) == ["1x1", "1x2", "2x1", "2x2"], out
    assert calls[1:] == [[], []], out


def test_dropped_objects_free_their_reordered_weights():
    """30 objects with 2 MB weights each, called once and dropped: RSS stays flat (oneDNN's
    compiled-partition cache, which would keep them alive, is off). The control keeps them."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((1, 4, 4, 256)).astype(np.float32)
    w = rng.standard_normal((4, 4, 128, 256)).astype(np.float32)  # 2 MB
    op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1)

    def bind_and_call() -> Any:
        f = op.with_constant_weights(w)
        f(x)
        return f

    bind_and_call()  # settle
    before = trimmed_rss()
    for _ in range(30):
        bind_and_call()
    dropped = trimmed_rss() - before
    kept = [bind_and_call() for _ in range(30)]
    held = trimmed_rss() - before - dropped
    print(f"\n30 dropped: RSS {dropped / MB:+.2f} MB; 30 kept: {held / MB:+.2f} MB")
    assert len(kept) == 30
    assert held > 60 * MB  # the measure sees them: a copy and a reorder of 2 MB each
    assert dropped < 8 * MB


def test_emulated_path_with_constant_weights_matches(monkeypatch):
    """Emulated bf16/f16 converts the bound weights each call; the library still reorders
    its f32 copy once. Results equal the plain op's. (bf16 is made emulated here.)"""
    for kind in ("ConvTranspose", "Convolution"):
        monkeypatch.setitem(plans._NATIVE, (kind, "bf16"), False)
    code = "f16" if emulated_dtype() == np.float16 else "bf16"
    cfg = CFGS["nxc-xoi"]
    arrays = inputs_of(FWD, cfg.tensors(np.random.default_rng(13), code), cfg)
    plain = make(FWD, cfg)
    expected = plain(*arrays)
    f = bind(FWD, cfg, arrays[1])
    for _ in range(3):
        np.testing.assert_array_equal(f(arrays[0]).view(np.uint16), expected.view(np.uint16))
    assert f.op.last_plan.emulated

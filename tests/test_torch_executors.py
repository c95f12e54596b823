"""onednn_convt.torch's per-signature executors (onednn_convt.torch_run): a signature's
later calls run its C++ executor on the tensors' addresses, and still give torch's values
(torch in float64 as the oracle) on fresh memory, misaligned memory, negated views, mixed
layouts, non-finite bf16 inputs, several threads, debug fill and a forked child.

Skipped when torch is not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any

import numpy as np
import pytest
from helpers import assert_close

torch = pytest.importorskip("torch")
oct = pytest.importorskip("onednn_convt.torch")
from onednn_convt import limits, torch_run  # noqa: E402
from test_torch_modules import CASES, CODES, Case  # noqa: E402

F = torch.nn.functional


class Spy:
    """Counts the calls that took the op's path (the first of each signature), from a start
    with no executor and no op object of an earlier test (whose signatures it would miss)."""

    def __init__(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(torch_run, "_FAST", {})
        torch_run._op.cache_clear()
        self.calls = 0
        original = torch_run._run_op

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(torch_run, "_run_op", counted)


def step(case: Case, ours: Any, theirs: Any, seed: int, dtype: Any) -> None:
    """Forward and backward of both modules on fresh tensors; ours checked against torch's."""
    gen = torch.Generator().manual_seed(seed)
    x = case.input(gen)
    xo = x.to(dtype).requires_grad_()
    x64 = xo.detach().double().requires_grad_()  # what ours computes on, exactly
    want, got = theirs(x64), ours(xo)
    g = torch.randn(want.shape, generator=gen)
    want.backward(g.to(dtype).double())
    got.backward(g.to(dtype).contiguous(memory_format=torch.preserve_format))
    code = CODES[dtype]
    red_dst, red_src, red_w = case.reductions(want.shape)
    assert_close(got.detach().float().numpy(), want.detach().numpy(), code, red_dst, "dst")
    assert_close(xo.grad.float().numpy(), x64.grad.numpy(), code, red_src, "diff_src")
    assert_close(ours.weight.grad.float().numpy(), theirs.weight.grad.numpy(), code, red_w, "diff_weights")
    for m in (ours, theirs):
        m.zero_grad(set_to_none=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_later_calls_run_the_executor_on_fresh_memory(monkeypatch, dtype):
    spy = Spy(monkeypatch)
    fast = 0
    for case in CASES:
        theirs, ours = case.modules(dtype)
        step(case, ours, theirs, 1, dtype)
        first = spy.calls
        assert first > 0, f"{case}: the first call took no op path"
        for seed in (2, 3):  # new tensors (new memory, new values) of the same signatures
            step(case, ours, theirs, seed, dtype)
        fast += spy.calls == first
    # each signature with an executor took the op's path once; most of these cases have one
    assert fast >= len(CASES) // 2, f"only {fast} of {len(CASES)} cases ran their executors"


def test_inference_calls_need_no_function(monkeypatch):
    """Without gradients to record, a call runs the op directly (no autograd Function)."""
    applied = []
    original = oct._apply
    monkeypatch.setattr(oct, "_apply", lambda *a: applied.append(a[0]) or original(*a))
    m = oct.ConvTranspose2d(4, 3, 3, stride=2)
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        y = m(x)
    assert not applied and y.grad_fn is None
    want = F.conv_transpose2d(x.double(), m.weight.double(), m.bias.double(), 2)
    assert_close(y.numpy(), want.detach().numpy(), "f32", 36)
    m(x).sum().backward()
    assert applied == [oct._Forward]


def test_backward_runs_the_ops_without_functions(monkeypatch):
    """A backward pass (grad mode off) computes its gradients with the ops directly: only
    the forward's Function is applied; with ``create_graph=True`` the gradients' ops are
    recorded (Functions), and the second-order gradient is torch's."""
    applied = []
    original = oct._apply
    monkeypatch.setattr(oct, "_apply", lambda *a: applied.append(a[0]) or original(*a))
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 4, 5, 5, generator=gen, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=gen, requires_grad=True)
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    y, want = oct.conv_transpose2d(x, w, None, 2), F.conv_transpose2d(x64, w64, None, 2)
    g = torch.randn(y.shape, generator=gen)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    gx64, gw64 = torch.autograd.grad(want, (x64, w64), g.double())
    assert applied == [oct._Forward]
    assert_close(gx.numpy(), gx64.numpy(), "f32", 27)
    assert_close(gw.numpy(), gw64.numpy(), "f32", 2 * 25)
    applied.clear()
    (gx,) = torch.autograd.grad((oct.conv_transpose2d(x, w, None, 2) ** 2).sum(), x, create_graph=True)
    (gx64,) = torch.autograd.grad((F.conv_transpose2d(x64, w64, None, 2) ** 2).sum(), x64, create_graph=True)
    assert oct._BackwardData in applied
    (ww,) = torch.autograd.grad(gx.sum(), w)
    (ww64,) = torch.autograd.grad(gx64.sum(), w64)
    assert_close(ww.numpy(), ww64.numpy(), "f32", 2 * 25 * 27)


def _escaped(shape: tuple[int, ...]) -> Any:
    """A tensor that outlived the functorch transform that wrapped it (torch.func.grad)."""
    kept: list[Any] = []

    def f(t: Any) -> Any:
        kept.append(t)
        return t.sum()

    torch.func.grad(f)(torch.randn(*shape, generator=torch.Generator().manual_seed(5)))
    return kept[0]


@pytest.mark.parametrize("path", ["direct", "Function.apply", "transform active"])
def test_recorded_calls_by_either_apply(monkeypatch, path):
    """A recorded call takes torch's C apply where it may (no functorch transform active)
    and Function.apply otherwise; either records the same graph and gives torch's values
    and gradients, also for a tensor that outlived its transform (unwrapped as torch does)."""
    applied = []
    original = oct._Forward.apply
    monkeypatch.setattr(oct._Forward, "apply", lambda *a: applied.append(1) or original(*a))
    if path == "Function.apply":
        monkeypatch.setattr(oct, "_DIRECT", {})
    elif path == "transform active":
        monkeypatch.setattr(oct, "_TRANSFORMS_ACTIVE", lambda: True)
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(4, 3, 3, 3, generator=gen, requires_grad=True)
    b = torch.randn(3, generator=gen, requires_grad=True)
    for x in (torch.randn(2, 4, 5, 5, generator=gen, requires_grad=True), _escaped((2, 4, 5, 5))):
        w.grad = b.grad = None
        y = oct.conv_transpose2d(x, w, b, stride=2, padding=1)
        assert type(y.grad_fn).__name__ == "_ForwardBackward"
        g = torch.randn(y.shape, generator=gen)
        y.backward(g)
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
        want = F.conv_transpose2d(x64, w64, b64, 2, 1)
        want.backward(g.double())
        assert_close(y.detach().numpy(), want.detach().numpy(), "f32", 36)
        assert_close(w.grad.numpy(), w64.grad.numpy(), "f32", 2 * 5 * 5)
        assert_close(b.grad.numpy(), b64.grad.numpy(), "f32", 2 * 10 * 10)
        if x.requires_grad and x.grad is not None:
            assert_close(x.grad.numpy(), x64.grad.numpy(), "f32", 27)
    assert bool(applied) == (path != "direct")


def _pair(seed: int, shape: tuple[int, ...] = (2, 4, 5, 5)) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randn(4, 3, 3, 3, generator=gen)


def _want(x: Any, w: Any) -> Any:
    return F.conv_transpose2d(x.double(), w.double(), None, 2, 1).numpy()


def test_misaligned_memory_of_a_known_signature():
    x, w = _pair(0)
    oct.conv_transpose2d(x, w, None, 2, 1)  # the signature's executor
    raw = np.zeros(x.numel() * 4 + 2, np.uint8)
    odd = torch.from_numpy(raw[2:].view(np.float32).reshape(x.shape))  # address 2 mod 4
    odd.copy_(x)
    assert odd.data_ptr() % 4 == 2 and odd.stride() == x.stride()
    assert_close(oct.conv_transpose2d(odd, w, None, 2, 1).numpy(), _want(x, w), "f32", 36)


def test_negated_view_is_read_as_its_values():
    x, w = _pair(1)
    oct.conv_transpose2d(x, w, None, 2, 1)
    oct.conv_transpose2d(-x, w, None, 2, 1)
    neg = torch._neg_view(x)
    assert neg.is_neg() and neg.data_ptr() == x.data_ptr()
    for _ in range(2):
        assert_close(oct.conv_transpose2d(neg, w, None, 2, 1).numpy(), _want(-x, w), "f32", 36)


def test_weight_gradient_of_mixed_layouts(monkeypatch):
    """BackwardWeights with a channels_last input and an NCHW gradient: the gradient is
    brought to the input's layout on every call, the executor's included."""
    spy = Spy(monkeypatch)
    m = oct.ConvTranspose2d(4, 3, 3, stride=2, padding=1, bias=False)
    ref = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, bias=False).double()
    ref.load_state_dict(m.state_dict())
    for seed in range(3):
        x, _ = _pair(seed)
        x = x.to(memory_format=torch.channels_last)
        y = m(x)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(10 + seed))  # NCHW
        y.backward(g)
        ref(x.double()).backward(g.double())
        assert_close(m.weight.grad.numpy(), ref.weight.grad.numpy(), "f32", 2 * 100)
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        if seed == 0:
            first = spy.calls
    assert spy.calls == first, "later calls took the op's path"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_channels_last_weights_run_the_executor(monkeypatch, dtype):
    """channels_last weights (``model.to(memory_format=torch.channels_last)`` makes them so)
    with NCHW activations, where bf16/f16 compute in f32: the executor converts the weights
    from their strides, so later steps take no op path; against torch in float64."""
    spy = Spy(monkeypatch)
    m = oct.ConvTranspose2d(4, 3, 3, stride=2, padding=1).to(dtype)
    ref = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1).double()
    ref.load_state_dict(m.state_dict())
    m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
    assert not m.weight.is_contiguous()
    for seed in range(3):
        x, _ = _pair(seed)
        x = x.to(dtype).requires_grad_()
        x64 = x.detach().double().requires_grad_()
        y, want = m(x), ref(x64)
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(20 + seed)).to(dtype)
        y.backward(g)
        want.backward(g.double())
        code = CODES[dtype]
        assert_close(y.detach().float().numpy(), want.detach().numpy(), code, 4 * 9, "dst")
        assert_close(x.grad.float().numpy(), x64.grad.numpy(), code, 3 * 9, "diff_src")
        assert_close(m.weight.grad.float().numpy(), ref.weight.grad.numpy(), code, 2 * 100, "diff_weights")
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        if seed == 0:
            first = spy.calls
    assert spy.calls == first, "later calls took the op's path"


@pytest.mark.parametrize("layout", ["NCHW", "channels_last"])
def test_a_reshaping_matmul_runs_the_executor(monkeypatch, layout):
    """DCGAN's z layer (N, C, 1, 1) -> k4: one MatMul over views of the call's memory whose
    result is dst's memory in another shape (``Plan.pointer_executor``). Its later calls run
    the executor on the addresses, on fresh tensors each time; against torch in float64."""
    from onednn_convt import lowering
    from onednn_convt.lowering import base
    from onednn_convt.problem import FORWARD

    monkeypatch.setattr(lowering, "rule", lambda p, native=False, phase=False: base.TILES if p.op == FORWARD
                        else lowering.rules.fallback(p))
    spy = Spy(monkeypatch)
    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    m = oct.ConvTranspose2d(16, 32, 4, bias=False).to(memory_format=fmt)
    ref = torch.nn.ConvTranspose2d(16, 32, 4, bias=False).double()
    ref.load_state_dict(m.state_dict())
    first = None
    for seed in range(3):
        z = torch.randn(8, 16, 1, 1, generator=torch.Generator().manual_seed(seed)).to(memory_format=fmt)
        with torch.no_grad():
            y = m(z)
        want = ref(z.double())
        assert y.is_contiguous(memory_format=fmt)
        assert_close(y.numpy(), want.detach().numpy(), "f32", 16)
        first = spy.calls if first is None else first
    assert spy.calls == first == 1, "later calls took the op's path"
    key = next(k for k, v in torch_run._FAST.items() if k[0] is oct.ConvTranspose and k[3] == (8, 16, 1, 1)
               and k[4] == tuple(z.stride()))
    plan_executor = torch_run._FAST[key].executor
    assert list(plan_executor.output_shape) != [8, 32, 4, 4]  # the library's shape: reshaped


def test_non_finite_bf16_input_after_the_executor():
    """A bf16 result holding an Inf or NaN is redone in f32 (onednn_convt.plan.Plan._guarded), on the
    executor's path too: each finite output equals the one computed from finite inputs."""
    x, w = _pair(2, (1, 4, 6, 6))
    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    clean = oct.conv_transpose2d(x, w, None, 2, 1)
    oct.conv_transpose2d(x, w, None, 2, 1)
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    got = oct.conv_transpose2d(bad, w, None, 2, 1).float()
    reached = ~torch.isfinite(got)
    assert reached.any()
    # outputs the Inf cannot reach (rows and columns past its 3x3 footprint) keep their values
    far = got[..., 4:, 4:]
    assert torch.isfinite(far).all()
    torch.testing.assert_close(far, clean.float()[..., 4:, 4:], rtol=0.02, atol=0.02)


def test_threads_share_an_executor():
    w = _pair(0)[1]
    oct.conv_transpose2d(_pair(0)[0], w, None, 2, 1)
    errors: list[str] = []

    def work(seed: int) -> None:
        for i in range(40):
            x = _pair(seed * 100 + i)[0]
            got = oct.conv_transpose2d(x, w, None, 2, 1).numpy()
            if not np.allclose(got, _want(x, w), atol=1e-4):
                errors.append(f"thread {seed} call {i}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors


def test_debug_fill_takes_the_op_path(monkeypatch):
    x, w = _pair(3)
    oct.conv_transpose2d(x, w, None, 2, 1)
    spy = Spy(monkeypatch)
    limits.set_debug_fill(True)
    try:
        got = oct.conv_transpose2d(x, w, None, 2, 1)
    finally:
        limits.set_debug_fill(False)
    assert spy.calls == 1
    assert_close(got.numpy(), _want(x, w), "f32", 36)


def test_forked_child_after_executors():
    """A child forked after the parent ran executors on two threads computes the same
    values (on one thread: see onednn_convt.native), and does not hang."""
    script = textwrap.dedent("""
        import os, sys, torch
        import onednn_convt.torch as oct
        torch.set_num_threads(2)
        x, w = torch.randn(4, 8, 9, 9), torch.randn(8, 6, 4, 4)
        want = torch.nn.functional.conv_transpose2d(x.double(), w.double(), None, 2, 1)
        for _ in range(3):
            oct.conv_transpose2d(x, w, None, 2, 1)
        pid = os.fork()
        if pid == 0:
            ok = all(torch.allclose(oct.conv_transpose2d(x, w, None, 2, 1).double(), want, atol=1e-3)
                     for _ in range(3))
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_forked_child_after_torchs_own_parallel_ops():
    """A parent that ran torch's own parallel ops (never ours) shares its OpenMP pool with
    oneDNN (one libgomp): its forked child hung in our first op (fuzz/fork.py), and in
    torch's own. Now the child runs both on one thread, with torch's values."""
    script = textwrap.dedent("""
        import os, signal, sys, torch
        import onednn_convt.torch as oct
        from onednn_convt import native
        torch.set_num_threads(2)
        x, w, b = torch.randn(4, 64, 16, 16), torch.randn(64, 32, 4, 4), torch.randn(32)
        want = torch.nn.functional.conv_transpose2d(x.double(), w.double(), b.double(), 2, 1)
        torch.nn.functional.conv_transpose2d(x, w, b, 2, 1)  # torch's own, on two threads
        assert not native._core.library_entered()
        pid = os.fork()
        if pid == 0:
            signal.alarm(60)  # a hang ends the child
            ok = torch.allclose(oct.conv_transpose2d(x, w, b, 2, 1).double(), want, atol=1e-3)
            ok = ok and torch.allclose(torch.nn.functional.conv_transpose2d(x, w, b, 2, 1).double(), want, atol=1e-3)
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr)

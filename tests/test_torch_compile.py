"""onednn_convt.torch under torch.compile and CPU autocast: the three ops are torch custom
ops (``torch.ops.onednn_convt.*``) that pass ``torch.library.opcheck``, a compiled model
keeps them in one graph (``fullgraph=True``) and matches the eager one, values and
gradients, and under ``torch.autocast("cpu")`` the modules return torch's dtypes.

Skipped when torch is not installed.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
oct = pytest.importorskip("onednn_convt.torch")

GEOMETRIES = [
    # stride, padding, output_padding, groups, dilation
    ([2, 2], [1, 1], [1, 1], 2, [1, 1]),
    ([1, 3], [0, 1], [0, 2], 1, [2, 1]),
    # output_padding at the stride (below the dilation): less pads_end for the op, which
    # changes BackwardData's diff_src size formula (its fake kernel once missed it)
    ([1, 2], [2, 1], [1, 1], 1, [2, 1]),
]
IDS = ["s2-g2", "s13-d2", "op-at-stride"]


def _inputs(geometry: Any, channels_last: bool, bias: bool) -> tuple[Any, ...]:
    stride, padding, output_padding, groups, dilation = geometry
    gen = torch.Generator().manual_seed(3)
    src = torch.randn(2, 4, 5, 6, generator=gen)
    weight = torch.randn(4, 6 // groups, 3, 3, generator=gen)
    if channels_last:
        src = src.to(memory_format=torch.channels_last)
    b = torch.randn(6, generator=gen) if bias else None
    return src, weight, b, stride, padding, output_padding, groups, dilation


# every geometry in NCHW by default; channels_last with -m slow (4-9 s each on an AMD Zen3;
# the torch fuzzer checks the custom ops' fake results on random layouts, channels_last among them)
@pytest.mark.parametrize("geometry,channels_last", [
    *[pytest.param(g, False, id=f"{i}-nchw") for g, i in zip(GEOMETRIES, IDS)],
    *[pytest.param(g, True, id=f"{i}-channels_last", marks=pytest.mark.slow) for g, i in zip(GEOMETRIES, IDS)],
])
def test_opcheck_passes_on_each_op(geometry, channels_last):
    src, weight, bias, *g = _inputs(geometry, channels_last, bias=True)
    for t in (src, weight, bias):
        t.requires_grad_(True)
    torch.library.opcheck(oct.conv_transpose_op, (src, weight, bias, *g))
    torch.library.opcheck(oct.conv_transpose_op, (src, weight, None, *g))
    dst = oct.conv_transpose_op(src.detach(), weight.detach(), None, *g)
    diff_dst = torch.randn_like(dst).requires_grad_(True)
    torch.library.opcheck(oct.backward_data_op, (diff_dst, weight, *g))
    torch.library.opcheck(oct.backward_weights_op, (src, diff_dst, list(weight.shape), *g))


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_custom_ops_give_torchs_values_and_gradients(geometry):
    src, weight, bias, stride, padding, output_padding, groups, dilation = _inputs(geometry, False, bias=True)
    ours = [t.clone().requires_grad_(True) for t in (src, weight, bias)]
    theirs = [t.double().requires_grad_(True) for t in (src, weight, bias)]
    out = oct.conv_transpose_op(*ours, stride, padding, output_padding, groups, dilation)
    ref = torch.nn.functional.conv_transpose2d(*theirs, stride, padding, output_padding, groups, dilation)
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    grad = torch.randn_like(ref)
    out.backward(grad.float())
    ref.backward(grad)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-4)


def generator(cls: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        cls(16, 16, 4, 1, 0, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        cls(16, 8, 4, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        cls(8, 3, 4, 2, 1, bias=True), nn.Tanh(),
    )


def _step(model: Any, z: Any) -> tuple[Any, list[Any]]:
    model.zero_grad()
    out = model(z)
    out.square().mean().backward()
    return out.detach(), [p.grad.detach().clone() for p in model.parameters()]


def test_compiled_layer_with_output_padding_at_the_stride_matches_eager():
    # torch takes output_padding below the dilation: with stride 1 and dilation 2, d src's
    # shape in the traced backward comes from the fake kernel, which must count it
    torch.manual_seed(5)
    layer = oct.ConvTranspose1d(4, 3, 3, stride=1, dilation=2, padding=3, output_padding=1)
    x = torch.randn(3, 4, 5, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = compiled(x)
    (g,) = torch.autograd.grad(got.square().sum(), x)
    want = layer(x)
    (e,) = torch.autograd.grad(want.square().sum(), x)
    assert got.shape == want.shape and g.shape == e.shape == x.shape
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_generator_matches_eager_in_one_graph(backend):
    torch.manual_seed(4)
    model = generator(oct.ConvTranspose2d)
    z = torch.randn(4, 16, 1, 1)
    eager_out, eager_grads = _step(model, z)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break or a fallback would warn
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's own imports (torch.jit)
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        out, grads = _step(compiled, z)
    np.testing.assert_allclose(out.numpy(), eager_out.numpy(), rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, eager_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


def test_compiled_graph_calls_the_custom_op():
    seen: list[str] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    layer = oct.ConvTranspose2d(4, 2, 3, stride=2)
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    x = torch.randn(1, 4, 5, 5)
    np.testing.assert_allclose(compiled(x).detach().numpy(), layer(x).detach().numpy(), rtol=1e-6)
    assert "onednn_convt.conv_transpose.default" in seen


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_autocast_returns_torchs_dtype_and_values(low, channels_last):
    torch.manual_seed(8)
    theirs = torch.nn.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    ours = oct.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 8, 6, 6)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=low):
        a, b = ours(x), theirs(x)
    assert a.dtype == b.dtype == low
    # both computed from the same rounded inputs: within a few units of the low dtype
    np.testing.assert_allclose(a.float().detach().numpy(), b.float().detach().numpy(), rtol=0.05, atol=0.05)
    a.float().sum().backward()
    assert ours.weight.grad is not None and ours.weight.grad.dtype == torch.float32
    assert ours.bias.grad is not None and ours.bias.grad.dtype == torch.float32
    b.float().sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=0.05, atol=0.5)


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_autocast_casts_every_dtype_as_torch_does(low, dtype):
    # torch's autocast casts any floating tensor but a float64 one: float16 under bfloat16 too
    torch.manual_seed(9)
    theirs = torch.nn.ConvTranspose2d(4, 2, 3, stride=2).to(dtype)
    ours = oct.ConvTranspose2d(4, 2, 3, stride=2).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 4, 5, 5).to(dtype).requires_grad_()
    with torch.autocast("cpu", dtype=low):
        a, b = ours(x), theirs(x)
    assert a.dtype == b.dtype == low
    np.testing.assert_allclose(a.float().detach().numpy(), b.float().detach().numpy(), rtol=0.05, atol=0.05)
    a.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    assert ours.weight.grad is not None and ours.weight.grad.dtype == dtype


def test_without_autocast_float32_stays_float32():
    layer = oct.ConvTranspose2d(4, 2, 3)
    x = torch.randn(1, 4, 5, 5)
    assert layer(x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert layer(x).dtype == torch.float32

"""onednn_convt.torch against torch itself: the modules and functions give torch's forward
and gradients (torch in float64 as the oracle), gradcheck passes, a DCGAN-style generator
trains to the same parameters, and tensors reach the ops without copies.

Skipped when torch is not installed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from helpers import assert_close

torch = pytest.importorskip("torch")
oct = pytest.importorskip("onednn_convt.torch")
from onednn_convt import op_base  # noqa: E402

CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


@dataclass(frozen=True)
class Case:
    rank: int
    cin: int
    cout: int
    kernel: Any
    stride: Any = 1
    padding: Any = 0
    output_padding: Any = 0
    groups: int = 1
    dilation: Any = 1
    bias: bool = True
    channels_last: bool = False
    size: int = 5
    batch: int = 2

    def __str__(self) -> str:
        fields = [f"{self.rank}d", f"{self.cin}->{self.cout}", f"k{self.kernel}", f"s{self.stride}",
                  f"p{self.padding}", f"op{self.output_padding}", f"g{self.groups}", f"d{self.dilation}"]
        return "-".join(fields) + ("-bias" if self.bias else "") + ("-cl" if self.channels_last else "")

    def modules(self, dtype: Any = torch.float32) -> tuple[Any, Any]:
        """(torch's module in float64, ours in dtype) with the same parameters: ours's,
        rounded to dtype, are theirs's values, so that the float64 module is the exact
        result of what ours computes on."""
        kw = dict(stride=self.stride, padding=self.padding, output_padding=self.output_padding,
                  groups=self.groups, dilation=self.dilation, bias=self.bias)
        theirs = getattr(torch.nn, f"ConvTranspose{self.rank}d")(self.cin, self.cout, self.kernel, **kw)
        ours = getattr(oct, f"ConvTranspose{self.rank}d")(self.cin, self.cout, self.kernel, **kw)
        ours.load_state_dict(theirs.state_dict())
        ours.to(dtype)
        theirs.double().load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
        return theirs, ours

    def input(self, gen: Any) -> Any:
        x = torch.randn(self.batch, self.cin, *([self.size] * self.rank), generator=gen)
        if self.channels_last:
            x = x.to(memory_format={2: torch.channels_last, 3: torch.channels_last_3d}[self.rank])
        return x

    def reductions(self, dst_shape: Any) -> tuple[int, int, int]:
        """Terms summed per element: dst, diff_src, diff_weights (bounds)."""
        k = int(np.prod(np.broadcast_to(self.kernel, (self.rank,))))
        return (self.cin // self.groups * k, self.cout // self.groups * k, int(np.prod(dst_shape)) // self.cout)


CASES = [
    Case(1, 4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
    Case(1, 3, 5, 4, stride=3, dilation=2, bias=False, size=7),
    Case(2, 8, 4, 4, stride=2, padding=1),
    Case(2, 8, 4, 4, stride=2, padding=1, channels_last=True),
    Case(2, 6, 9, (3, 2), stride=(2, 3), padding=(1, 0), output_padding=(1, 2), groups=3),
    Case(2, 6, 6, 3, stride=2, padding=2, dilation=2, groups=6, channels_last=True, output_padding=1),
    Case(2, 4, 4, 1, stride=2),
    Case(2, 16, 8, 4, stride=1, padding=0, size=1),  # DCGAN's first layer: 1x1 -> 4x4
    Case(3, 4, 6, 3, stride=2, padding=1, output_padding=1, groups=2, size=4),
    Case(3, 4, 4, (2, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 1), size=3, channels_last=True),
    # output_padding at or past the stride, below the dilation (torch takes it, the op below
    # the stride): it reaches the op as less pads_end (pads_end 0; 0 and output_padding 1;
    # per dim one taken from the pads, one as it is)
    Case(2, 4, 3, (3, 2), stride=1, padding=1, output_padding=1, dilation=2),
    Case(2, 4, 3, (3, 2), stride=2, padding=1, output_padding=2, dilation=3),
    Case(2, 4, 3, (3, 2), stride=(1, 2), padding=(2, 0), output_padding=(1, 1), dilation=(2, 1)),
]


def run_both(case: Case, dtype: Any, seed: int) -> tuple[Any, Any, Any, Any, Any]:
    theirs, ours = case.modules(dtype)
    gen = torch.Generator().manual_seed(seed)
    x = case.input(gen)
    xo = x.to(dtype).requires_grad_()
    x64 = xo.detach().double().requires_grad_()  # what ours computes on, exactly
    want = theirs(x64)
    got = ours(xo)
    g = torch.randn(want.shape, generator=gen)
    want.backward(g.to(dtype).double())
    got.backward(g.to(dtype).contiguous(memory_format=torch.preserve_format))
    return theirs, ours, (want, x64), (got, xo), case.reductions(want.shape)


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_module_forward_and_gradients_match_torch(case, dtype):
    theirs, ours, (want, x64), (got, xo), (r_dst, r_dx, r_dw) = run_both(case, dtype, seed=1)
    code = CODES[dtype]
    assert got.dtype == dtype and got.shape == want.shape
    assert_close(got.float().detach().numpy(), want.detach().numpy(), code, r_dst, "dst")
    assert_close(xo.grad.float().numpy(), x64.grad.numpy(), code, r_dx, "input grad")
    assert_close(ours.weight.grad.float().numpy(), theirs.weight.grad.numpy(), code, r_dw, "weight grad")
    if case.bias:
        assert_close(ours.bias.grad.float().numpy(), theirs.bias.grad.numpy(), code, r_dw, "bias grad")
    if case.channels_last:  # torch's rule: a channels_last input gives channels_last outputs
        fmt = {2: torch.channels_last, 3: torch.channels_last_3d}[case.rank]
        assert got.is_contiguous(memory_format=fmt) and xo.grad.is_contiguous(memory_format=fmt)


def test_f16_module_matches_torch():
    case = CASES[2]
    theirs, ours, (want, x64), (got, xo), (r_dst, r_dx, r_dw) = run_both(case, torch.float16, seed=2)
    assert_close(got.float().detach().numpy(), want.detach().numpy(), "f16", r_dst, "dst")
    assert_close(xo.grad.float().numpy(), x64.grad.numpy(), "f16", r_dx, "input grad")
    assert_close(ours.weight.grad.float().numpy(), theirs.weight.grad.numpy(), "f16", r_dw, "weight grad")


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_functions_match_torch_functional(rank):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, *([4] * rank), generator=gen)
    w = torch.randn(6, 2, *([3] * rank), generator=gen)
    b = torch.randn(4, generator=gen)
    kw = dict(stride=2, padding=1, output_padding=1, groups=2, dilation=1)
    got = getattr(oct, f"conv_transpose{rank}d")(x, w, b, **kw)
    want = getattr(torch.nn.functional, f"conv_transpose{rank}d")(x.double(), w.double(), b.double(), **kw)
    assert_close(got.numpy(), want.numpy(), "f32", 3 * 3**rank)
    # positional arguments, as torch's signature orders them
    got = getattr(oct, f"conv_transpose{rank}d")(x, w, b, 2, 1, 1, 2, 1)
    assert_close(got.numpy(), want.numpy(), "f32", 3 * 3**rank)


@pytest.mark.parametrize("case", [CASES[0], CASES[4], CASES[5], CASES[8]], ids=str)
def test_gradcheck(case):
    """ConvTranspose is linear in input and in weight: central differences are exact up to
    f32 rounding, so gradcheck holds in f32 with a large step."""
    _, ours = case.modules()
    gen = torch.Generator().manual_seed(4)
    x = case.input(gen).narrow(0, 0, 1).detach().requires_grad_()
    w = ours.weight.detach().clone().requires_grad_()
    b = ours.bias.detach().clone().requires_grad_() if case.bias else None
    fn = getattr(oct, f"conv_transpose{case.rank}d")

    def f(x: Any, w: Any, b: Any) -> Any:
        return fn(x, w, b, case.stride, case.padding, case.output_padding, case.groups, case.dilation)

    with pytest.warns(UserWarning, match="not a double precision"):
        assert torch.autograd.gradcheck(f, (x, w, b), eps=0.25, atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("case", [CASES[0], CASES[5]], ids=str)
def test_gradgradcheck(case):
    """Second derivatives run on the package's ops too (each op's gradients are the others)."""
    _, ours = case.modules()
    gen = torch.Generator().manual_seed(8)
    x = case.input(gen).narrow(0, 0, 1).detach().requires_grad_()
    w = ours.weight.detach().clone().requires_grad_()
    fn = getattr(oct, f"conv_transpose{case.rank}d")

    def f(x: Any, w: Any) -> Any:
        return fn(x, w, None, case.stride, case.padding, case.output_padding, case.groups, case.dilation)

    with pytest.warns(UserWarning, match="not a double precision"):
        assert torch.autograd.gradgradcheck(f, (x, w), eps=0.25, atol=2e-3, rtol=2e-3)


def test_second_order_gradient_matches_torch():
    """A gradient penalty: d/dw of |d(sum y^2)/dx|^2, against torch in float64."""
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 4, 5, 5, generator=gen)
    w = torch.randn(4, 3, 3, 3, generator=gen)
    grads = []
    for fn, dtype in ((torch.nn.functional.conv_transpose2d, torch.float64), (oct.conv_transpose2d, torch.float32)):
        xi = x.to(dtype).requires_grad_()
        wi = w.to(dtype).requires_grad_()
        y = fn(xi, wi, None, 2, 1)
        (gx,) = torch.autograd.grad((y ** 2).sum(), xi, create_graph=True)
        (gw,) = torch.autograd.grad((gx ** 2).sum(), wi)
        grads.append(gw.detach().numpy())
    assert_close(grads[1], grads[0], "f32", 4 * 3 * 9 * 25 * 9)


def generator(nz: int, ngf: int, cls: Any) -> Any:
    """A small DCGAN generator: nz x 1 x 1 -> 3 x 16 x 16."""
    nn = torch.nn
    return nn.Sequential(
        cls(nz, ngf * 2, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
        cls(ngf * 2, ngf, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf), nn.ReLU(True),
        cls(ngf, 3, 4, 2, 1, bias=True), nn.Tanh(),
    )


def train(model: Any, steps: int, seed: int, channels_last: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        z = torch.randn(8, 16, 1, 1, generator=gen)
        target = torch.rand(8, 3, 16, 16, generator=gen) * 2 - 1
        if channels_last:
            z = z.to(memory_format=torch.channels_last)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(z), target)
        loss.backward()
        opt.step()


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_dcgan_generator_trains_to_torchs_parameters(channels_last):
    torch.manual_seed(5)
    theirs = generator(16, 8, torch.nn.ConvTranspose2d)
    ours = generator(16, 8, oct.ConvTranspose2d)  # the one-line swap: the import
    ours.load_state_dict(theirs.state_dict())
    if channels_last:
        theirs, ours = theirs.to(memory_format=torch.channels_last), ours.to(memory_format=torch.channels_last)
    initial = copy.deepcopy(ours.state_dict())
    for model in (theirs, ours):
        train(model, steps=5, seed=6, channels_last=channels_last)
    moved = 0.0
    for name, a in theirs.state_dict().items():
        b = ours.state_dict()[name]
        if a.dtype.is_floating_point:
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
            moved = max(moved, float((b - initial[name]).abs().max()))
    assert moved > 1e-3, "training did not move the parameters: the comparison would prove nothing"


def test_swap_modules_keeps_parameters_and_runs_ours(monkeypatch):
    torch.manual_seed(7)
    model = generator(16, 8, torch.nn.ConvTranspose2d)
    params = [p.data_ptr() for p in model.parameters()]
    x = torch.randn(2, 16, 1, 1)
    want = model(x)
    assert oct.swap_modules(model) is model
    assert all(isinstance(m, oct.ConvTranspose2d) for m in model if isinstance(m, torch.nn.ConvTranspose2d))
    assert [p.data_ptr() for p in model.parameters()] == params
    calls = []
    original = op_base.Op._call
    monkeypatch.setattr(op_base.Op, "_call", lambda self, i, o: calls.append(self.op_name) or original(self, i, o))
    got = model(x)
    assert calls.count("ConvTranspose") >= 3
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_state_dict_and_isinstance_are_torchs():
    ours = oct.ConvTranspose3d(4, 6, (2, 3, 3), stride=2, groups=2)
    theirs = torch.nn.ConvTranspose3d(4, 6, (2, 3, 3), stride=2, groups=2)
    assert isinstance(ours, torch.nn.ConvTranspose3d)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(1, 4, 3, 3, 3)
    np.testing.assert_allclose(ours(x).detach().numpy(), theirs(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert repr(ours).startswith("ConvTranspose3d(4, 6")


def test_output_size_as_in_torch():
    theirs = torch.nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1)
    ours = oct.ConvTranspose2d(4, 3, 3, stride=2, padding=1)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 4, 5, 5)
    for size in ([9, 9], [10, 10], [9, 10], torch.Size([1, 3, 10, 9])):
        want, got = theirs(x, output_size=size), ours(x, output_size=size)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="requested an output size of"):  # torch's own check
        ours(x, output_size=[12, 12])


def test_unbatched_and_empty_inputs():
    theirs = torch.nn.ConvTranspose1d(3, 2, 3, stride=2)
    ours = oct.ConvTranspose1d(3, 2, 3, stride=2)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 6)
    np.testing.assert_allclose(ours(x).detach().numpy(), theirs(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    assert ours(torch.randn(0, 3, 6)).shape == (0, 2, 13)


def test_channels_last_reaches_the_op_without_a_copy(monkeypatch):
    seen = []
    original = op_base.Op._call

    def spy(self: Any, inputs: Any, out: Any) -> Any:
        if isinstance(inputs[0], np.ndarray):
            seen.append((self.op_name, self.attrs["data_format"], inputs[0].ctypes.data))
        return original(self, inputs, out)

    monkeypatch.setattr(op_base.Op, "_call", spy)
    x = torch.randn(2, 8, 6, 6).to(memory_format=torch.channels_last).requires_grad_()
    m = oct.ConvTranspose2d(8, 4, 4, stride=2, padding=1)
    y = m(x)
    g = torch.randn(y.shape).to(memory_format=torch.channels_last)
    y.backward(g)
    assert seen[0] == ("ConvTranspose", "NXC", x.data_ptr())
    assert ("ConvTransposeBackwardData", "NXC", g.data_ptr()) in seen
    assert ("ConvTransposeBackwardWeights", "NXC", x.data_ptr()) in seen


@pytest.mark.parametrize("out_channels", [4, 1])
@pytest.mark.parametrize("input_last", [False, True], ids=["x", "x_last"])
@pytest.mark.parametrize("grad_last", [False, True], ids=["g", "g_last"])
@pytest.mark.parametrize("rank", [2, 3])
def test_input_gradient_comes_back_in_the_inputs_layout(rank, input_last, grad_last, out_channels):
    """Whatever the layout of the gradient that reaches the layer (a loss gives a contiguous
    one, a channels_last network a channels_last one; with one output channel it is dense
    in both), d src comes back in the layout of the forward's input, as torch's layer gives
    it, with torch's values. (Seen by a hook on a non-leaf input: a leaf's .grad is brought
    to the leaf's layout by autograd anyway.)"""
    fmt = torch.channels_last if rank == 2 else torch.channels_last_3d
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(2, 6, *([5] * rank), generator=gen)
    w = torch.randn(6, out_channels, *([4] * rank), generator=gen)
    if input_last:
        x = x.contiguous(memory_format=fmt)
    g = torch.randn(2, out_channels, *([10] * rank), generator=gen)
    if grad_last:
        g = g.contiguous(memory_format=fmt)
    grads = []
    for fn, dtype in ((getattr(oct, f"conv_transpose{rank}d"), torch.float32),
                      (getattr(torch.nn.functional, f"conv_transpose{rank}d"), torch.float32),
                      (getattr(torch.nn.functional, f"conv_transpose{rank}d"), torch.float64)):
        leaf = x.to(dtype).clone(memory_format=torch.preserve_format).requires_grad_()
        src = leaf * 1  # a non-leaf with x's layout
        src.register_hook(grads.append)
        fn(src, w.to(dtype), None, 2, 1).backward(g.to(dtype))
    ours, torchs, exact = grads
    assert ours.stride() == torchs.stride() == x.stride(), (ours.stride(), torchs.stride(), x.stride())
    assert_close(ours.numpy(), exact.numpy(), "f32", out_channels * 4 ** rank)


def test_output_padding_past_what_the_op_can_give_is_a_clear_error():
    """An output_padding below the dilation that adds positions past the full output beyond
    what pads_end and the op's output_padding (below the stride) can give: a ValueError
    naming the function, the arguments and the limit, not the op's message."""
    x, w = torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3)
    torch.nn.functional.conv_transpose2d(x, w, None, 1, 0, 1, 1, 2)  # torch computes it
    with pytest.raises(ValueError, match=r"conv_transpose2d: output_padding=\(1, 1\) with padding=\(0, 0\), "
                                         r"stride=\(1, 1\) and dilation=\(2, 2\): in spatial dim 0 it adds 1 "
                                         r"positions past .* \(at most stride - 1 = 0\)"):
        oct.conv_transpose2d(x, w, None, 1, 0, 1, 1, 2)


@pytest.mark.parametrize("weights_last", [False, True], ids=["w", "w_last"])
@pytest.mark.parametrize("input_last", [False, True], ids=["x", "x_last"])
@pytest.mark.parametrize("shape", [(3, 5, 1, 1), (2, 1, 3, 4), (2, 3, 1, 1, 1)], ids=["1x1", "one_channel", "3d"])
def test_dense_both_ways_inputs_give_torchs_result_layout(shape, input_last, weights_last):
    """An input dense as NCX and as channels-last (1x1 spatial, one channel: DCGAN's z) gives
    the result layout torch's layer gives, by the strides of the input and the weights, and
    torch's values and gradients (the fake registration agrees: opcheck)."""
    rank = len(shape) - 2
    fmt = torch.channels_last if rank == 2 else torch.channels_last_3d
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(*shape, generator=gen)
    w = torch.randn(shape[1], 4, *([3] * rank), generator=gen)
    if input_last:
        x = x.contiguous(memory_format=fmt)
    if weights_last:
        w = w.contiguous(memory_format=fmt)
    fn = getattr(oct, f"conv_transpose{rank}d")
    ours = [t.clone(memory_format=torch.preserve_format).requires_grad_() for t in (x, w)]
    got = fn(*ours, None, 2, 1)
    want = getattr(torch.nn.functional, f"conv_transpose{rank}d")(x, w, None, 2, 1)
    assert got.stride() == want.stride(), (got.stride(), want.stride())
    x64, w64 = (t.detach().double().requires_grad_() for t in (x, w))
    ref = getattr(torch.nn.functional, f"conv_transpose{rank}d")(x64, w64, None, 2, 1)
    g = torch.randn(ref.shape, generator=gen)
    got.backward(g)
    ref.backward(g.double())
    assert_close(got.detach().numpy(), ref.detach().numpy(), "f32", shape[1] * 3 ** rank)
    assert_close(ours[0].grad.numpy(), x64.grad.numpy(), "f32", 4 * 3 ** rank)
    assert_close(ours[1].grad.numpy(), w64.grad.numpy(), "f32", shape[0] * 4 ** rank)
    torch.library.opcheck(oct.conv_transpose_op, (x, w, None, [2] * rank, [1] * rank, [0] * rank, 1, [1] * rank))


def test_unsupported_arguments_are_clear_errors():
    with pytest.raises(ValueError, match='Only "zeros" padding mode'):  # torch's constructor
        oct.ConvTranspose2d(2, 2, 3, padding_mode="reflect")
    m = oct.ConvTranspose2d(2, 2, 3)
    m.padding_mode = "circular"
    with pytest.raises(ValueError, match='ConvTranspose2d: only padding_mode "zeros"'):
        m(torch.randn(1, 2, 4, 4))
    w = torch.randn(2, 2, 3, 3)
    with pytest.raises(TypeError, match="conv_transpose2d: argument 'input' is on device meta.*CPU only"):
        oct.conv_transpose2d(torch.empty(1, 2, 4, 4, device="meta"), w)
    with pytest.raises(ValueError, match="conv_transpose2d: argument 'output_padding' expected values smaller"):
        oct.conv_transpose2d(torch.randn(1, 2, 4, 4), w, stride=2, output_padding=2)
    with pytest.raises(ValueError, match="conv_transpose2d: argument 'stride' expected an int or 2 ints"):
        oct.conv_transpose2d(torch.randn(1, 2, 4, 4), w, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="conv_transpose2d: argument 'input' expected 3-D or 4-D"):
        oct.conv_transpose2d(torch.randn(2, 4, 4, 4, 4), w)
    with pytest.raises(TypeError, match="conv_transpose2d: argument 'weight' expected dtype torch.float32, .*got torch.float64"):
        oct.conv_transpose2d(torch.randn(1, 2, 4, 4), w.double())
    with pytest.raises(TypeError, match="conv_transpose2d: input, weight and bias must have one dtype, got input=torch.float32, weight=torch.bfloat16"):
        oct.conv_transpose2d(torch.randn(1, 2, 4, 4), w.bfloat16())


@pytest.mark.parametrize("kw, error, message", [
    (dict(stride=-1), ValueError, "argument 'stride' expected positive values, got -1"),
    (dict(stride=(2, 0)), ValueError, r"argument 'stride' expected positive values, got \(2, 0\)"),
    (dict(dilation=0), ValueError, "argument 'dilation' expected positive values"),
    (dict(padding=-1), ValueError, "argument 'padding' expected non-negative values"),
    (dict(output_padding=(0, -1)), ValueError, "argument 'output_padding' expected non-negative values"),
    (dict(groups=0), ValueError, "argument 'groups' expected a positive int, got 0"),
    (dict(groups=1.0), TypeError, "argument 'groups' expected an int, got float"),
    (dict(stride=2.0), TypeError, "argument 'stride' expected an int or a tuple of 2 ints, got float"),
    (dict(stride=True), TypeError, "argument 'stride' expected an int or a tuple of 2 ints, got bool"),
    (dict(padding=(1, "1")), TypeError, "argument 'padding' expected ints"),
])
def test_bad_attribute_values_name_the_argument(kw, error, message):
    """Each attribute is checked before anything is derived from it (a negative stride once
    surfaced as an output_padding limit of -2)."""
    with pytest.raises(error, match="conv_transpose2d: " + message):
        oct.conv_transpose2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3), **kw)
    x = np.int64(2)  # NumPy integers are integers
    assert oct.conv_transpose2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 3, 3), stride=x).shape == (1, 2, 9, 9)


def test_copy_and_pickle_of_a_module():
    m = oct.ConvTranspose2d(2, 3, 3)
    m2 = copy.deepcopy(m)
    x = torch.randn(1, 2, 4, 4)
    np.testing.assert_array_equal(m(x).detach().numpy(), m2(x).detach().numpy())

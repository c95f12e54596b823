"""Cross-check against PyTorch: torch.nn.functional.conv_transpose{1,2,3}d and its autograd
gradients, computed in float64 (an oracle independent of onednn_convt.reference).

PyTorch's layout is NCX activations and IOX weights (in, out/groups, k...), the library's
grouped layout (D4). Asymmetric pads, pads that crop past the kernel and output_padding
are applied to torch's uncropped output with ``F.pad`` (negative pads crop), so autograd
sees the same map. Skipped when torch is not installed.
"""

from __future__ import annotations

import numpy as np
import onednn_convt as oc
import pytest
from helpers import CASE_IDS, CASES, Config, assert_close, seeded_configs

torch = pytest.importorskip("torch")
F = torch.nn.functional
CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def to_ncx(a: np.ndarray, cfg: Config) -> np.ndarray:
    return a if cfg.data_format == "NCX" else np.moveaxis(a, -1, 1)


def from_ncx(a: np.ndarray, cfg: Config) -> np.ndarray:
    return a if cfg.data_format == "NCX" else np.moveaxis(a, 1, -1)


def to_iox(w: np.ndarray, cfg: Config) -> np.ndarray:
    return w if cfg.weights_format == "IOX" else np.moveaxis(w, (-1, -2), (0, 1))


def from_iox(w: np.ndarray, cfg: Config) -> np.ndarray:
    return w if cfg.weights_format == "IOX" else np.moveaxis(w, (0, 1), (-1, -2))


def torch_forward(cfg: Config, x, w, b=None):
    """dst of ConvTranspose in torch: the uncropped output, then crop/extend per spatial dim."""
    full = CONV_T[cfg.rank](x, w, None, stride=cfg.strides, padding=0, output_padding=0,
                            groups=cfg.groups, dilation=cfg.dilations)
    pb, pe = cfg.pads
    pad = []
    for b_, e_, op in reversed(list(zip(pb, pe, cfg.output_padding))):
        pad += [-b_, op - e_]  # F.pad lists the last dim first; negative values crop
    dst = F.pad(full, pad)
    if b is not None:
        dst = dst + b.reshape(1, -1, *([1] * cfg.rank))
    return dst


def torch_all(cfg: Config, t: dict[str, np.ndarray], bias: bool):
    """(dst, diff_src, diff_weights) from torch in float64, in cfg's layouts."""
    x = torch.tensor(to_ncx(t["src"], cfg).astype(np.float64), requires_grad=True)
    w = torch.tensor(to_iox(t["weights"], cfg).astype(np.float64), requires_grad=True)
    b = torch.tensor(t["bias"].astype(np.float64)) if bias else None
    dst = torch_forward(cfg, x, w, b)
    dst.backward(torch.tensor(to_ncx(t["diff_dst"], cfg).astype(np.float64)))
    return (from_ncx(dst.detach().numpy(), cfg), from_ncx(x.grad.numpy(), cfg), from_iox(w.grad.numpy(), cfg))


def check_against_torch(cfg: Config, seed: int, bias: bool) -> None:
    t = cfg.tensors(np.random.default_rng(seed))
    want_dst, want_dx, want_dw = torch_all(cfg, t, bias)
    dst = oc.ConvTranspose(**cfg.attrs())(t["src"], t["weights"], t["bias"] if bias else None)
    dx = oc.ConvTransposeBackwardData(**cfg.attrs("ConvTransposeBackwardData"))(t["diff_dst"], t["weights"])
    dw = oc.ConvTransposeBackwardWeights(**cfg.attrs("ConvTransposeBackwardWeights"))(t["src"], t["diff_dst"], cfg.weights_shape)
    assert_close(dst, want_dst, "f32", cfg.fwd_reduction, f"dst {cfg}")
    assert_close(dx, want_dx, "f32", cfg.bwd_data_reduction, f"diff_src {cfg}")
    assert_close(dw, want_dw, "f32", cfg.bwd_weights_reduction, f"diff_weights {cfg}")


@pytest.mark.parametrize("cfg", CASES, ids=CASE_IDS)
def test_cases_match_torch_and_autograd(cfg):
    check_against_torch(cfg, 41, cfg.bias)


@pytest.mark.parametrize("cfg", seeded_configs(20, seed=404), ids=str)
def test_random_configs_match_torch_and_autograd(cfg):
    check_against_torch(cfg, 42, cfg.bias)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_torch_symmetric_padding_and_output_padding(rank):
    """Torch's own padding/output_padding arguments (no F.pad) give the same dst and grads."""
    cfg = Config(src=(5, 4, 3)[:rank], kernel=(3, 2, 3)[:rank], ic=6, oc=4, groups=2, strides=(2, 3, 2)[:rank],
                 dilations=(2, 1, 1)[:rank], pads_begin=1, pads_end=1, output_padding=(1, 2, 1)[:rank])
    t = cfg.tensors(np.random.default_rng(43))
    x = torch.tensor(t["src"].astype(np.float64), requires_grad=True)
    w = torch.tensor(t["weights"].astype(np.float64), requires_grad=True)
    b = torch.tensor(t["bias"].astype(np.float64))
    dst = CONV_T[rank](x, w, b, stride=cfg.strides, padding=cfg.pads_begin, output_padding=cfg.output_padding,
                       groups=cfg.groups, dilation=cfg.dilations)
    dst.backward(torch.tensor(t["diff_dst"].astype(np.float64)))
    got = oc.conv_transpose(t["src"], t["weights"], t["bias"], **cfg.attrs())
    assert_close(got, dst.detach().numpy(), "f32", cfg.fwd_reduction)
    dx = oc.conv_transpose_backward_data(t["diff_dst"], t["weights"], **cfg.attrs("ConvTransposeBackwardData"))
    assert_close(dx, x.grad.numpy(), "f32", cfg.bwd_data_reduction)
    dw = oc.conv_transpose_backward_weights(t["src"], t["diff_dst"], cfg.weights_shape,
                                            **cfg.attrs("ConvTransposeBackwardWeights"))
    assert_close(dw, w.grad.numpy(), "f32", cfg.bwd_weights_reduction)


def test_nn_module_weight_layout_is_iox():
    """A torch.nn.ConvTranspose2d's weight tensor is usable as IOX weights as it is (D4)."""
    torch.manual_seed(0)
    layer = torch.nn.ConvTranspose2d(6, 9, kernel_size=(3, 2), stride=2, padding=1, groups=3, bias=True).double()
    x = np.random.default_rng(44).standard_normal((2, 6, 4, 5)).astype(np.float32)
    want = layer(torch.tensor(x, dtype=torch.float64)).detach().numpy()
    w = layer.weight.detach().numpy().astype(np.float32)
    b = layer.bias.detach().numpy().astype(np.float32)
    got = oc.conv_transpose(x, w, b, strides=2, pads_begin=1, pads_end=1, groups=3, data_format="NCX", weights_format="IOX")
    assert_close(got, want, "f32", 2 * 6)

"""The fused suite's int8 row: u8 src, s8 weights, f32 bias, ReLU, u8 dst, against its unfused form and PyTorch's quantized ConvTranspose."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from typing import Any, Callable

import numpy as np

from . import peers
from .fused_checks import (INT8_CASE, INT8_LSB, INT8_SHARE, TORCH_INT8_LSB, TORCH_INT8_SHARE, TORCH_QENGINES, Record,
                           check_u8, quantize_u8, torch_activation, torch_weights)
from .fused_rows import Inputs, Options, base_record, fusion_state, in_place_pass, time_row


def int8_row(inp: Inputs, opts: Options) -> Record:
    """The int8 row of an f32 layer: u8 src, s8 weights (per-tensor scales), f32 bias, ReLU,
    u8 dst (zero points 0; dst's scale from the largest f32 result). Its unfused form is the
    int8 ConvTranspose with an f32 dst (Dequantize, ConvTranspose and BiasAdd: one partition
    too), then ReLU and Quantize in NumPy, so that fused/unfused is the fusion of the ReLU
    and the Quantize alone, both with the int8 kernel."""
    import onednn_convt as oc

    cfg = inp.cfg
    rec = base_record(inp, INT8_CASE, "int8")
    attrs = cfg.attrs()
    s_src = 4.0 / 255
    src_u8 = np.clip(np.rint(np.abs(inp.src) / s_src), 0, 255).astype(np.uint8)
    s_w = float(np.max(np.abs(inp.w))) / 127 or 1.0
    w_s8 = np.clip(np.rint(inp.w / s_w), -127, 127).astype(np.int8)
    bias = inp.bias.astype(np.float32)
    src_dq, w_dq = oc.Dequantize(scales=s_src, zps=0), oc.Dequantize(scales=s_w)
    plain = oc.ConvTranspose(**attrs, src_dequantize=src_dq, weights_dequantize=w_dq)  # f32 dst
    shape = inp.dst_shape
    y = np.empty(shape, np.float32)
    plain(src_u8, w_s8, bias, out=y)
    s_dst = float(np.max(y)) / 255 or 1.0
    rec["scales"] = {"src": s_src, "weights": s_w, "dst": s_dst}
    fused = oc.ConvTranspose(**attrs, src_dequantize=src_dq, weights_dequantize=w_dq, dst_quantize=oc.Quantize(scales=s_dst, zps=0, dtype="u8"),
                             post_ops=[oc.PostOp("ReLU")])
    q_f, q_u = np.empty(shape, np.uint8), np.empty(shape, np.uint8)
    start = time.perf_counter()
    fused(src_u8, w_s8, bias, out=q_f)
    rec["compile_ms"] = (time.perf_counter() - start) * 1e3
    fusion_state(fused, rec)
    rec["plain_lowering"] = plain.lowering
    y0 = y.copy()
    buf, copy, q_p = np.empty(shape, np.float32), np.empty(shape, np.float32), np.empty(shape, np.uint8)

    def run_fused() -> None:
        fused(src_u8, w_s8, bias, out=q_f)

    def run_unfused() -> None:
        plain(src_u8, w_s8, bias, out=y)
        np.maximum(y, 0, out=y)
        quantize_u8(y, s_dst, q_u)

    def run_post() -> None:
        np.maximum(y0, 0, out=buf)
        quantize_u8(buf, s_dst, q_p)

    def run_copy() -> None:
        np.copyto(copy, y0)

    def run_fused_alloc() -> Any:
        return fused(src_u8, w_s8, bias)

    runners: dict[str, Callable[[], Any]] = {
        "fused": run_fused, "unfused": run_unfused, "post": run_post, "pass": in_place_pass(y0),
        "copy": run_copy, "fused_alloc": run_fused_alloc,
    }
    run_fused()
    run_unfused()
    what = rec["key"]
    rec["lsb_unfused"], rec["differ_unfused"] = check_u8(f"{what}: fused against unfused", q_f, q_u,
                                                         INT8_LSB, INT8_SHARE)
    # the unfused form shares the int8 kernel: also against the f32 op on the dequantized tensors
    f32_ref = oc.ConvTranspose(**attrs)(src_u8.astype(np.float32) * np.float32(s_src),
                                        w_s8.astype(np.float32) * np.float32(s_w), bias)
    q_ref = np.empty(shape, np.uint8)
    quantize_u8(np.maximum(f32_ref, 0, out=f32_ref), s_dst, q_ref)
    rec["lsb_f32"], rec["differ_f32"] = check_u8(f"{what}: fused against the f32 op", q_f, q_ref,
                                                 INT8_LSB, INT8_SHARE)
    del f32_ref, q_ref
    check_u8(f"{what}: fused allocating against out=", run_fused_alloc(), q_f, 0, 0.0)
    torch = peers.torch_module() if opts.torch else None
    if torch is not None:
        rejected: dict[str, str] = {}
        for engine in TORCH_QENGINES:
            if engine not in torch.backends.quantized.supported_engines:
                continue
            try:
                call = _torch_int8(torch, engine, inp, src_u8, w_s8, bias, (s_src, s_w, s_dst))
                with _quiet_quantized():
                    got = call()
                r = got.int_repr().contiguous().numpy()
                r = np.moveaxis(r, 1, -1) if inp.nxc else r
                rec["lsb_torch"], rec["differ_torch"] = check_u8(
                    f"PyTorch int8 ({engine})", q_f, r, TORCH_INT8_LSB, TORCH_INT8_SHARE)
            except (RuntimeError, AttributeError, NotImplementedError) as e:  # Mismatch too
                rejected[engine] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            rec["torch_engine"] = engine
            runners["torch"] = call
            break
        if rejected:
            rec["torch_rejected"] = rejected
        if "torch" not in runners:
            rec["torch_error"] = "no quantized engine gave the right result: " + "; ".join(
                f"{k}: {v}" for k, v in rejected.items())
    with _quiet_quantized():
        time_row(rec, runners, opts, y.nbytes)
    rec["pass_bytes_of"] = "f32 dst (the unfused intermediate)"
    return rec


@contextlib.contextmanager
def _quiet_quantized() -> Iterator[None]:
    """A context in which PyTorch's deprecation warning for quantized tensors is ignored."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions.*deprecated")
        yield


def _torch_int8(
    torch: Any, engine: str, inp: Inputs, src_u8: np.ndarray, w_s8: np.ndarray, bias: np.ndarray,
    scales: tuple[float, float, float],
) -> Callable[[], Any]:
    """PyTorch's quantized ConvTranspose (u8 in, s8 weights, u8 out) with its weights packed
    for quantized ``engine``, then its quantized ReLU."""
    lay, rank, nxc = inp.cfg.layer, inp.rank, inp.nxc
    s_src, s_w, s_dst = scales
    qnn = torch.ao.nn.quantized
    module = {1: qnn.ConvTranspose1d, 2: qnn.ConvTranspose2d, 3: qnn.ConvTranspose3d}[rank]
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine  # the weights are packed for this engine
    with _quiet_quantized():
        m = module(lay.ic, lay.oc, lay.kernel, stride=lay.stride, padding=lay.pad, groups=lay.groups)
        w = torch_weights(torch, torch.from_numpy(w_s8), inp.cfg.weights_format == "XOI", rank).contiguous()
        # the integers as quantized tensors of the same values (public API: quantize their
        # real values, which are exact multiples of the scale)
        qw = torch.quantize_per_tensor(w.float() * s_w, s_w, 0, torch.qint8)
        m.set_weight_bias(qw, torch.from_numpy(bias))
        m.scale, m.zero_point = s_dst, 0
        x = torch.quantize_per_tensor(torch.from_numpy(src_u8).float() * s_src, s_src, 0, torch.quint8)
        qx = torch_activation(torch, x, nxc, rank)
    torch.backends.quantized.engine = before
    relu = torch.relu

    def call() -> Any:
        with torch.inference_mode():
            return relu(m(qx))

    return call


# -- the suite ----------------------------------------------------------------------------

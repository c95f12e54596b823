"""A fused ConvTranspose call compiled and run: :func:`make_plan` checks a call's tensors
against its :class:`~onednn_convt.fusion.Fusion`, chooses how the graph runs here (one fused
partition, the same graph in f32, or the plain op then the post-ops in NumPy; see
:mod:`onednn_convt.fusion`) and gives the :class:`FusedPlan` that runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from . import dtypes, fusion, guards, limits, memory, native, reference, schema, shapes
from . import lowering as lowering_rules
from .errors import OneDNNError, UnsupportedError
from .fusion import F32, SLOW_STRIDE_1_EPILOGUE, Core, Fusion, graph_nodes, make_core, staged_core, tiles_core
from .lowering import base as lowerings
from .lowering import forward as forward_lowerings
from .plan import describe, finite_or_redone, fixed_view
from .post_ops import (INT8_DTYPES, INT8_SUM_AFTER_POST_OP, INT8_SUM_ZERO_POINT_FEW_CHANNELS, INT8_WITHOUT_VNNI,
                       POST_OPS, library_sum)

if TYPE_CHECKING:
    from .ops import ConvTranspose


@dataclass
class FusedLowering:
    """How a fused call ran: ``kind`` is the lowering string ``op.lowering`` shows."""

    kind: str
    out_shape: tuple[int, ...]
    partitions: int
    fused: bool
    guard: Optional[str] = None


def _code(a: np.ndarray) -> str:
    for code, dt in INT8_DTYPES.items():
        if a.dtype == dt:
            return code
    return dtypes.code_of(a.dtype) or str(a.dtype)


@dataclass
class FusedPlan:
    """A compiled fused call for one signature (or its unfused fallback)."""

    op: ConvTranspose
    fusion: Fusion
    lowering: FusedLowering
    out_dtype: np.dtype[Any]
    operand_shapes: tuple[tuple[int, ...], ...]  # each binary operand at dst's rank
    has_bias: bool
    compiled: Any = None
    prepare: Optional[Callable[[list[np.ndarray]], list[np.ndarray]]] = None  # Core.prepare
    library_shape: Optional[tuple[int, ...]] = None  # Core.out_shape: the library's view of dst
    emulated: bool = False  # bf16/f16 computed in f32
    finite_guard: bool = False  # native bf16/f16: redo in f32 if the result is non-finite
    executor: Any = None
    fallback: Optional[FusedPlan] = None
    before_bias: int = 2  # the graph's inputs before the bias: src, weights (a plain core: its result)

    def _library_inputs(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        return library_inputs(arrays, self.has_bias, self.operand_shapes, self.emulated, self.prepare)

    def run(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> np.ndarray:
        if self.compiled is None:
            return self._run_unfused(arrays, out)
        args = self._library_inputs(arrays)
        shape = self.lowering.out_shape
        compute = F32 if self.emulated else self.out_dtype
        direct = (not self.emulated and out is not None
                  and out.strides == tuple(st * out.itemsize for st in shapes.dense_strides(shape)))  # as compiled
        # out may be a binary post-op's tensor (ConvTranspose._check_aliasing): the library
        # writes it in place where it says it reads that input from the output's memory, else
        # reads a copy; where an f32 redo may need the tensor afterwards, it writes elsewhere
        shared = [] if out is None else [
            i for i in range(self.before_bias + self.has_bias, len(args)) if np.may_share_memory(args[i], out)]
        result: np.ndarray
        if out is not None and direct and not (shared and self.finite_guard):
            result = out
            for i in shared:
                if i not in self.compiled.inplace_inputs:
                    args[i] = args[i].copy()
        else:
            result = memory.empty(shape, compute)
        self.compiled.execute(args, result if self.library_shape is None else result.reshape(self.library_shape))
        if self.finite_guard:  # a non-finite native bf16/f16 result: the same graph in f32
            checked = finite_or_redone(result, self, lambda: make_plan(self.op, arrays, None, force_f32=True),
                                       arrays, out)
            if checked is not result:
                return checked
        if self.emulated:
            return dtypes.round_f32(result, self.out_dtype, out)
        if out is not None and result is not out:
            np.copyto(out, result)
            return out
        return result

    def _run_unfused(self, arrays: Sequence[Any], out: Optional[np.ndarray]) -> np.ndarray:
        """The plain ConvTranspose in f32, then post-ops and quantization in float64."""
        f = self.fusion
        src, w, bias, *operands = arrays
        if f.int8:
            assert f.src_dequantize is not None and f.weights_dequantize is not None
            src32 = f.src_dequantize.apply(src).astype(np.float32)
            wq = f.weights_dequantize
            w32 = reference.dequantize_weights(w, wq.scales, self.op.attrs["groups"],  # type: ignore[arg-type]
                                               self.op.attrs["weights_format"]).astype(np.float32)
            b32 = None if bias is None else bias.astype(np.float32)
        else:
            src32, w32 = dtypes.to_f32(src), dtypes.to_f32(w)
            b32 = None if bias is None else dtypes.to_f32(bias)
        y = np.asarray(self.op._plain()(src32, w32, b32), np.float64)
        binary = iter(operands)
        for p in f.post_ops:
            y = p.apply(y, next(binary) if p.is_binary else None)
        if f.dst_quantize is not None:
            y = f.dst_quantize.apply(y)
        result = y.astype(self.out_dtype) if self.out_dtype.kind in "iu" else dtypes.round_f32(
            y.astype(np.float32), self.out_dtype)
        if out is not None:
            np.copyto(out, result)
            return out
        return result


def is_whole(a: np.ndarray, out: np.ndarray) -> bool:
    """Whether ``a`` is exactly ``out``'s memory: same start, shape and strides."""
    return (a.shape == out.shape and a.strides == out.strides
            and a.__array_interface__["data"][0] == out.__array_interface__["data"][0])


def _positive(a: np.ndarray) -> np.ndarray:
    """``a`` as the plain op presents it to oneDNN (:func:`onednn_convt.plan.fixed_view`):
    itself; a view with positive strides where only size-1 dims have zero or negative ones
    (``x[None]``, a flipped size-1 kernel dim, which ``np.ascontiguousarray`` keeps as they
    are); or an aligned C-contiguous copy (other non-positive strides, strides that do not
    nest, misaligned data)."""
    fix = fixed_view(a)
    return a if fix is None else fix(a)


def library_inputs(arrays: Sequence[Any], has_bias: bool, operand_shapes: Sequence[tuple[int, ...]],
                   emulated: bool, prepare: Optional[Callable[[list[np.ndarray]], list[np.ndarray]]] = None,
                   ) -> list[np.ndarray]:
    """The arrays the library takes: src, weights (through ``prepare``, the core's weights
    flip, if any), the bias if given, each binary operand at dst's rank (a view); f32
    copies when emulated."""
    src, w, bias, *operands = arrays
    args = [src, w] + ([bias] if has_bias else []) + [x.reshape(s) for x, s in zip(operands, operand_shapes)]
    if emulated:
        args = [dtypes.to_f32(a) for a in args]
    if prepare is not None:  # the weights, second: the rest passes through
        args = prepare(args)
    return [_positive(a) for a in args]  # also after prepare (a flipped view)


def _width_reached(op: ConvTranspose, src_shape: Sequence[int], out_shape: Sequence[int],
                   kernel: Sequence[int], stride: int) -> bool:
    """Whether some tap of the ConvTranspose lands on a dst position along the width (the
    last spatial dim): some src column ``i`` and kernel tap ``j`` with ``0 <= stride * i +
    dilation * j - pads_begin < dst width``."""
    fmt = op.attrs["data_format"]
    x = src_shape[-1] if fmt == "NCX" else src_shape[-2]
    width = out_shape[-1] if fmt == "NCX" else out_shape[-2]
    geometry = op._geometry(len(kernel), kernel)
    d, pb = geometry.dilations[-1], geometry.pads_begin[-1]
    for j in range(kernel[-1]):
        lo = max(0, -((d * j - pb) // stride))  # ceil((pb - d*j) / stride)
        hi = min(x - 1, (pb - d * j + width - 1) // stride)
        if lo <= hi:
            return True
    return False


def make_plan(op: ConvTranspose, arrays: Sequence[Any], out: Optional[np.ndarray], *,
              force_f32: bool = False) -> FusedPlan:
    """Check a fused call's tensors and compile its graph (see the module's docstring)."""
    f = op.fusion
    assert f is not None
    name = op.op_name
    src, w, bias, *operands = arrays
    code, out_dtype = _check_dtypes(op, f, arrays)
    lowering = op._lower([src, w, bias])  # ranks, channels, geometry, bias: the plain op's checks
    out_shape = lowering.out_shape
    rank = len(out_shape)
    oc = out_shape[1] if op.attrs["data_format"] == "NCX" else out_shape[-1]
    if f.int8:
        assert f.src_dequantize is not None and f.weights_dequantize is not None
        q = f.weights_dequantize
        if q.qtype == "per_channel":
            axis = fusion.weights_axis(op.attrs["weights_format"], rank)
            if q.axis % rank != axis:
                msg = (f"{name}: weights_dequantize expected per-channel axis {axis} (the O dim of "
                       f"{op.attrs['weights_format']} weights), got {q.axis}")
                raise ValueError(msg)
            if len(q.scales) != oc:  # type: ignore[arg-type]
                msg = (f"{name}: weights_dequantize expected {oc} scales (one per output channel, "
                       f"O * groups), got {len(q.scales)}")  # type: ignore[arg-type]
                raise ValueError(msg)
    operand_shapes = []
    binary_labels = [f"post_ops[{i}] ({p.kind})" for i, p in enumerate(f.post_ops) if p.is_binary]
    for label, x in zip(binary_labels, operands):
        if x.ndim > rank or 0 in x.shape:
            msg = f"{name}: {label} tensor of shape {x.shape} does not broadcast to dst {out_shape}"
            raise ValueError(msg)
        full = (1,) * (rank - x.ndim) + x.shape
        if any(a not in (1, b) for a, b in zip(full, out_shape)):
            msg = f"{name}: {label} tensor of shape {x.shape} does not broadcast to dst {out_shape}"
            raise ValueError(msg)
        operand_shapes.append(full)
    if out is not None:  # the plain op's checks: type, dtype, shape, writable, strides, aliasing
        op._check_out(arrays, out, out_shape, out_dtype)
    # the plain op's limits: oneDNN's 32-bit shape range, the memory limit
    conv = lowerings.Lowering("ConvTranspose", op._convtranspose_attrs(src.shape, w.shape),
                    (0, 1) if bias is None else (0, 1, 2), out_shape, weights_arg=1)
    limits.check_plan(name, conv, arrays[:3], None, F32 if f.int8 else dtypes.FLOAT_DTYPES[code],
                      emulated=code != "f32")
    in_channels, _, kernel = shapes.split_weights(w.shape, op.attrs["weights_format"])
    spatial = len(kernel)
    strides = schema.per_dim(name, "strides", op.attrs["strides"], spatial)
    geometry = op._geometry(spatial, kernel)  # resolved pads (auto_pad) and dilations
    output_padding = schema.per_dim(name, "output_padding", op.attrs["output_padding"], spatial)
    sum_at = library_sum(f.post_ops, operand_shapes, out_shape)  # the post-op the library runs as its sum
    sum_dequantize = None if sum_at is None else f.post_ops[sum_at].dequantize
    sum_zero_point = sum_dequantize is not None and sum_dequantize.has_zero_points
    guarded = bool(guards.stride_not_below_kernel(code, kernel, strides))
    guard = guards.AMX_STRIDE_NOT_BELOW_KERNEL.name if guarded else None
    plan_args = dict(op=op, fusion=f, out_dtype=out_dtype, operand_shapes=tuple(operand_shapes),
                     has_bias=bias is not None)
    unfused = False  # the library splits this graph, or fuses it wrongly: plain op, then NumPy
    reason = ""
    if any(p.dequantize is not None and x.dtype != out_dtype for p, x in zip(f.binary, operands)):
        # oneDNN 3.2 fuses a dequantized Add (its "sum" post-op) whose tensor is s8 into a u8
        # dst, or u8 into s8, and returns wrong values (up to 65 quantization steps off;
        # measured on Sapphire Rapids under every ONEDNN_MAX_CPU_ISA from AVX2 to AMX): unfused
        unfused = True
        reason = "oneDNN 3.2 computes a fused sum whose tensor's dtype differs from dst's wrongly"
    isa = guards.dispatch_isa() if f.int8 and not unfused else ""
    if isa in INT8_WITHOUT_VNNI:
        # oneDNN 3.2's int8 kernels without VNNI (jit_uni_int8:sse41/avx2, jit_uni_int8_1x1,
        # jit_deconvolution:avx512_core, brgconv_1x1:avx512_core, x64:gemm_s8u8s32/s8s8s32:jit)
        # multiply with vpmaddubsw: a u8 src's pairs of products saturate at 16 bits (possible
        # once a weight exceeds 64 in magnitude), and for an s8 src the library shifts src by
        # 128 and halves the weights, dropping their low bit (weights 0/1 give 0). Measured on
        # an AMD Zen5 (AVX-512 VNNI/BF16, AVX-VNNI) under ONEDNN_MAX_CPU_ISA=SSE41, AVX, AVX2,
        # AVX512_CORE: 60-100% of random int8 problems wrong (full-range u8/s8 src and s8
        # weights), with or without post-ops and zero points; 0 of 100 under AVX2 with a u8 src and
        # weights within [-64, 63]; under AVX2_VNNI and every AVX-512 VNNI level, 0 of 400 without the
        # case below. The oneDNN guide "Nuances of int8 computations" documents the non-VNNI
        # saturation. Every int8 call, unfused: its f32 path is exact.
        unfused, guard = True, "int8_without_vnni"
        reason = (f"oneDNN 3.2's int8 kernels without VNNI (dispatch ISA {isa}) saturate u8 x s8 "
                  "products at 16 bits and halve s8-src weights")
    elif isa in INT8_SUM_AFTER_POST_OP and (sum_at or 0) > 0:
        # The library runs the first Add of a dst-shaped tensor as its "sum" post-op (a later
        # one stays a binary Add). After another post-op (ReLU, Abs, LeakyReLU, Square, any
        # unary; a per-channel or one-valued binary), its AVX-512 int8 deconvolution
        # (jit_deconvolution:avx512_core_vnni) refuses that chain, and where brgemm
        # (brgconv*:avx512_core_vnni) or gemm does not take the shape either (small channel
        # counts, 1x1, some strided shapes), oneDNN 3.2 falls back to jit_uni_int8:avx2: the
        # saturating kernel above, where the CPU lacks AVX-VNNI or the ISA cap excludes it.
        # Measured (ONEDNN_VERBOSE names the kernel) on a Zen5 under ONEDNN_MAX_CPU_ISA=
        # AVX512_CORE_VNNI and AVX512_CORE_BF16: every wrong result of 1,200 random int8
        # chains ran jit_uni_int8:avx2 with sum after another post-op (25 of 120 in the unary +
        # Add reproducer's scan), with any zero point, both data formats, any OC and stride; Add
        # before the unary, the unary alone and non-dst-shaped Adds were right. Uncapped, and
        # under AVX512_CORE_FP16 and AMX caps, the fallback is jit_uni_int8:avx2_vnni, right
        # (also Sapphire Rapids, which has AVX-VNNI); the dispatch ISA cannot tell AVX-VNNI
        # apart, so a Zen5 at avx512_core_bf16 is routed too (correct, unfused). Unfused.
        unfused, guard = True, "int8_sum_after_post_op"
        reason = (f"oneDNN 3.2 runs an int8 sum after another post-op on its avx2 kernel without "
                  f"VNNI (dispatch ISA {isa}), which saturates u8 x s8 products")
    elif (isa in INT8_SUM_AFTER_POST_OP and all(st == 1 for st in strides)
          and in_channels // op.attrs["groups"] <= INT8_SUM_ZERO_POINT_FEW_CHANNELS
          and sum_zero_point):
        # The library's sum with a zero point, stride 1, at most 4 src channels per group:
        # oneDNN 3.2's AVX-512 int8 kernels refuse it (its deconvolution kernel takes no sum
        # zero point, and brgconv not every such shape) and it falls back to
        # jit_uni_int8:avx2, the saturating kernel of int8_without_vnni where the CPU lacks
        # AVX-VNNI. Found by the fused fuzzer (AMD Zen4, avx512_core_bf16: 338 of 1,440 values
        # off by up to 21 steps, 4 src channels); a scan there (ONEDNN_VERBOSE naming the
        # kernel, 900 random u8/s8 problems with a sum): the avx2 kernel ran in 23, every one
        # stride 1 with 1-4 src channels per group and a nonzero sum zero point (zero point 0:
        # the AVX-512 deconvolution kernel), 10 of them wrong (u8 src, 2-4 channels, full-range
        # values: none with src values under 40). Which of those shapes brgconv takes is the
        # library's choice: every such call, unfused.
        unfused, guard = True, "int8_sum_zero_point_few_channels"
        reason = ("oneDNN 3.2 runs an int8 sum with a zero point at stride 1 and few src channels on "
                  f"its avx2 kernel without VNNI (dispatch ISA {isa}), which saturates u8 x s8 products")
    elif isa and f.src_dequantize is not None and f.src_dequantize.has_zero_points and kernel[-1] >= 5:
        # A src zero point with a kernel 5 or more wide: oneDNN 3.2's brgconv
        # (brg_conv:avx512_core_vnni) compensates the zero point wrongly in some shapes, most
        # of dst off (k5 pads 4/0 over 12 columns, OC 64: 347 of 768). Found by the fused
        # fuzzer (AMD Zen4, avx512_core_bf16); a scan there over pads, src widths 2-24 and OC
        # 64/128 (u8 src, zero point 5): 0 of 1,334 wrong with kernel widths 1-4, 16 of 1,130
        # at 5, 70 of 1,616 at 6, 75 of 2,184 at 7; 0 of 1,130 with a kernel height of 5 or a
        # dilated width of 5 (k3 d2), 0 without the zero point (u8 or s8). Which shapes fail
        # follows no rule measured (src width 12 but not 11 or 13): every such call, unfused.
        unfused, guard = True, "int8_src_zero_point_wide_kernel"
        reason = ("oneDNN 3.2's int8 brgconv compensates a src zero point wrongly in some shapes "
                  "with a kernel 5 or more wide")
    elif isa in INT8_SUM_AFTER_POST_OP and f.binary and all(
            d == 1 for d in (out_shape[2:] if op.attrs["data_format"] == "NCX" else out_shape[1:-1])):
        # A dst with one position per channel (every spatial size 1) and a binary post-op:
        # compiled first as NCX, the AVX-512 kernels refuse it and oneDNN 3.2 falls back to
        # jit_uni_int8:avx2, the saturating kernel of int8_without_vnni where the CPU lacks
        # AVX-VNNI (an AMD Zen4: 4 of 37 values off by up to 6 steps in the fused fuzzer's
        # case, ONEDNN_VERBOSE naming the kernel). The same call as NXC got brgconv, right,
        # when compiled first, and the avx2 kernel, wrong, after the NCX one (the two layouts
        # are one memory here, and the library reuses the kernel). Any layout and batch, unfused.
        unfused, guard = True, "int8_single_position_binary"
        reason = ("oneDNN 3.2 runs an int8 call with one dst position per channel and a binary "
                  "post-op on its avx2 kernel without VNNI, which saturates")
    elif isa and output_padding[-1] > geometry.pads_end[-1]:
        # oneDNN 3.2's int8 deconvolution kernels (jit_deconvolution:avx512_core_vnni, the
        # x8s8s32x kernel, and jit_uni_int8:avx2_vnni) drop the taps of the last src
        # column(s) where the width's output_padding exceeds its pads_end (the library's right
        # padding is then negative): k2 s2 output_padding 1 gives [1 1 2 2 0 0 0] for
        # [1 1 2 2 3 3 0]. Measured on a Zen5 (ONEDNN_VERBOSE names the kernel), u8 and s8
        # src, any zero point, with and without Quantize: in the width, 127 of 301 random 2-D
        # and 3-D problems on jit_deconvolution:avx512_core_vnni wrong (51 of 195 in a 1-D
        # sweep), 4 of 75 on jit_uni_int8:avx2_vnni (AVX2_VNNI cap); 0 of 296 with that in
        # the height or depth only, 0 on brgconv_strided and gemm, 0 of about 700 with
        # output_padding <= pads_end. Which kernel a shape gets is the library's choice (and
        # within it the width blocking depends on OC): every such int8 call, unfused.
        unfused, guard = True, "int8_output_padding_past_pads"
        reason = ("oneDNN 3.2's int8 deconvolution drops the last src taps where output_padding "
                  "exceeds pads_end")
    elif isa and (src.dtype == np.int8 or (f.src_dequantize is not None and f.src_dequantize.has_zero_points)) and any(
            st > d * (k - 1) + 1 or o - e > 1
            for st, k, d, o, e in zip(strides[:-1], kernel[:-1], geometry.dilations, output_padding[:-1],
                                      geometry.pads_end[:-1])):
        # The same kernels compute the compensation of an s8 src (the library shifts it to u8
        # and subtracts 128 x the weights' sums) and of a src zero point per output row; in a
        # depth or height dim whose stride exceeds the dilated kernel, the rows no tap reaches
        # get garbage (1e8 and more, different from run to run) in some of them. Measured
        # (Zen5, ONEDNN_VERBOSE): 48 of 137 such 2-D and 31 of 87 3-D random problems wrong on
        # jit_deconvolution:avx512_core_vnni, 38 of 112 on jit_uni_int8:avx2_vnni (AVX2_VNNI
        # cap); none with a u8 src and zero point 0, none with that gap in the width only,
        # none on brgconv and gemm. Rows past the full output are such rows too, from the
        # second on: where a depth or height dim's output_padding exceeds its pads_end by 2
        # or more, the fused fuzzer's k3x2 s3 output_padding 2/0 u8 zero point 35 problem got
        # 9e3 in its last row where Abs(bias) = 0.18 is right (AMD Zen4, avx512_core_bf16).
        # A scan there: 8 of 10 random problems wrong with that overhang of 2 (always in the
        # last row), none of 43 with an overhang of 1, none of 226 without an overhang or the
        # compensation. Unfused.
        unfused, guard = True, "int8_compensation_in_tapless_rows"
        reason = ("oneDNN 3.2's int8 deconvolution writes garbage into rows no tap reaches when "
                  "it compensates an s8 src or a src zero point")
    elif (isa and (src.dtype == np.int8 or (f.src_dequantize is not None and f.src_dequantize.has_zero_points))
          and not _width_reached(op, src.shape, out_shape, kernel, strides[-1])):
        # The same compensation where no tap reaches any dst position along the width (its
        # taps all fall in the pads or between dilated taps: k2 d2 pads 1/1 over a src width
        # of 1): brgconv:avx512_core_vnni (stride 1) returned garbage (1e6, differing from
        # run to run) for OC >= 512 in 4 of about 40 such 2-D problems measured (Zen5), none
        # for OC below 512; an output that is bias and compensation alone. Unfused.
        unfused, guard = True, "int8_compensation_in_tapless_rows"
        reason = ("oneDNN 3.2's int8 deconvolution writes garbage where no tap reaches the width "
                  "when it compensates an s8 src or a src zero point")
    elif (isa and f.dst_quantize is not None and f.dst_quantize.has_zero_points and op.attrs["data_format"] == "NCX"
          and oc % 64 == 0 and any(shape != out_shape and any(d != 1 for i, d in enumerate(shape) if i != 1)
                                   for shape in operand_shapes)):
        # Where the deconvolution kernel does not take a binary post-op's broadcast (per
        # batch, per channel and row, ...: the gemm kernel, x64:gemm_s8u8s32:jit, which the
        # library picks for a dilated strided problem, say), oneDNN 3.2 runs the post-ops as a
        # binary primitive and the Quantize as a reorder from channels-last f32 into the NCX
        # u8/s8 dst; that reorder (jit:uni) drops dst's zero point when OC is a multiple of
        # 64: results zps too low (clipped at the type's bound). Measured on a Zen5
        # (ONEDNN_VERBOSE): every such call with OC 64, 128, 192, 256, 320 wrong (20-100% of
        # the elements), none with OC 16-160 not a multiple of 64, with zero point 0, in NXC,
        # or with one-valued, per-channel or dst-shaped tensors (fused into the kernel).
        unfused, guard = True, "int8_quantize_zero_point_dropped"
        reason = ("oneDNN 3.2 drops a Quantize zero point in the reorder it runs after a split-off "
                  "binary post-op (NCX, OC a multiple of 64)")
    # the plain op's lowering by the measured rules: the MatMul core, or bf16/f16 in f32
    problem = op._problem([src, w, bias], code)
    plain_rule = "" if f.int8 else lowering_rules.rule(problem, native=op.strict)
    tiles = None if f.int8 or unfused else tiles_core(op, problem, plain_rule, code, operand_shapes)
    if tiles is not None:  # the MatMul first; where the library does not fuse it, the op's own core
        emulated = force_f32 or (code != "f32" and op._NATIVE_FUSED.get(code) is False)
        try:
            compiled = _compile(op, f, tiles, arrays, operand_shapes, out_shape, "f32" if emulated else code,
                                out_dtype, emulated)
        except UnsupportedError:
            pass
        else:
            return _fused_plan(tiles, compiled, emulated, code, out_shape, guard, arrays, plan_args)
    core = make_core(op, lowering, src.shape, w.shape)
    if not f.int8 and core.kind == lowerings.CONV_TRANSPOSE and guards.strided_deconvolution_epilogue(code, strides):
        core = staged_core(op, problem, plain_rule)
        guard = guard or guards.STRIDED_DECONVOLUTION_EPILOGUE.name
    elif not f.int8 and all(s == 1 for s in strides) and (
            plain_rule.removesuffix(lowering_rules.IN_F32) in (lowerings.CONV_TRANSPOSE, lowerings.CONVOLUTION_BACKWARD_DATA)):
        # speed rules (no guard): where the measured rules run the plain call on the library's
        # deconvolution, that op alone and the rest after it (fused, the deconvolution is
        # 10-20x slower: staged_core); and not the Convolution over flipped weights with them
        # fused: A/B on an AMD Zen5 (15 alternated pairs, medians), k3/k4 s1 layers of 8x32..256
        # channels, depthwise and 4 groups, f32/bf16, NCX/NXC, bias + ReLU, Add, or Add + ReLU +
        # per-channel Multiply: 0.47-1.13x its time, geomean about 0.85 (depthwise NCX f32 bias
        # + Add 0.43 against 0.84 ms; tiny 1x8x8x8 bias + ReLU 14 against 28 us)
        core = staged_core(op, problem, plain_rule, SLOW_STRIDE_1_EPILOGUE)
    elif not f.int8 and core.kind == lowerings.CONV_TRANSPOSE and all(s == 1 for s in strides):
        # a speed rule (no guard): the forward Convolution over flipped weights keeps its speed
        # with them fused; where it cannot run the call, the op alone and the rest after it
        flipped = lowerings.FLIPPED_CONVOLUTION in forward_lowerings.candidates(problem)
        core = (make_core(op, lowering_rules.build(problem, lowerings.FLIPPED_CONVOLUTION), src.shape, w.shape)
                if flipped else staged_core(op, problem, plain_rule, SLOW_STRIDE_1_EPILOGUE))
    elif (f.int8 and not unfused and core.kind == lowerings.CONV_TRANSPOSE
          and guards.strided_deconvolution_epilogue("f32", strides)
          and sum_at is not None):
        # the int8 deconvolution's 'sum' into an f32 dst on the strided kernel: wrong (3-D,
        # 256-512 channels: errors of 1-1.6x the output's scale on a Zen5, fuzz/fused_chains.py);
        # its ReLU, bias, scales and Quantize measured right. The int8 op, then the rest in f32
        core = replace(core, staged=True, how=f" (the int8 ConvTranspose, then the rest: "
                                              f"{guards.STRIDED_DECONVOLUTION_EPILOGUE.name})")
        guard = guard or guards.STRIDED_DECONVOLUTION_EPILOGUE.name
    if (f.int8 and isa and not unfused and not core.staged
            and sum_at is not None and sum_zero_point and any(p.is_binary for p in f.post_ops[sum_at + 1:])):
        # The library's sum of a dequantized tensor with a zero point, followed by a binary
        # post-op (Multiply, Add, Maximum, Minimum of any broadcast): oneDNN 3.2's fused int8
        # kernels get up to 12 quantization steps wrong in part of dst (a third to a half of
        # the elements of a k3 1-D problem). Found by the fused fuzzer (AMD Zen4,
        # avx512_core_bf16: 2 of 1,500 trials); in a scan there (6 seeds each), all 8
        # configurations with a zero point and a Multiply after the sum wrong, whatever the
        # src and dst zero points, none of 24 with the sum's zero point 0 or nothing after it,
        # none with ReLU, Abs or LeakyReLU after it. Unfused, unless
        # the int8 op runs alone with the rest after it (staged above: no fused sum).
        unfused, guard = True, "int8_sum_zero_point_before_binary"
        reason = ("oneDNN 3.2 applies a fused int8 sum's zero point wrongly when a binary post-op "
                  "follows it")
    # in f32 also where the measured rules run the plain op so (bf16 without AMX is slower
    # than f32 on some layers: docs/performance.md)
    in_f32 = plain_rule.endswith(lowering_rules.IN_F32)
    emulate = code in ("bf16", "f16") and (force_f32 or guarded or in_f32 or op._NATIVE_FUSED.get(code) is False)
    attempts = [] if unfused else [emulate] if emulate or code not in ("bf16", "f16") else [False, True]
    for emulated in attempts:
        compute = "f32" if emulated else code
        try:
            compiled = _compile(op, f, core, arrays, operand_shapes, out_shape, compute, out_dtype, emulated)
        except OneDNNError as e:
            if not isinstance(e, UnsupportedError):
                # a post-op partition the library refuses in bf16/f16 (oneDNN 3.2's eltwise has
                # no bf16 Round: status 2, where the staged route gives it a partition of its
                # own): the graph in f32; elsewhere a bug of ours, raised
                if emulated or code not in ("bf16", "f16") or not core.staged:
                    raise
                continue
            reason = str(e)
            if "one partition" in reason:  # the library does not fuse this graph: no retry,
                if not emulated and core.staged and code in ("bf16", "f16"):
                    continue  # except in f32 where a staged post-op has no bf16 kernel (Round)
                unfused = True
                break
            if not emulated and code in ("bf16", "f16"):
                op._NATIVE_FUSED[code] = False
                if op.strict:
                    msg = f"{name}: oneDNN has no fused {code} kernel for this call on this CPU (strict=True)"
                    raise UnsupportedError(msg, 3) from None
            continue
        if not emulated and code in ("bf16", "f16"):
            op._NATIVE_FUSED[code] = True
        return _fused_plan(core, compiled, emulated, code, out_shape, guard, arrays, plan_args)
    # an int8 graph the library builds as one partition and then has no kernel for (status 3:
    # a depthwise, dilated Convolution core, say) runs unfused too: the f32 path has kernels
    why = reason.split(": ", 1)[-1].split(" (oneDNN")[0] if reason else "not compiled"
    before = "Dequantize in NumPy, " if f.int8 else ""
    rest = ", ".join(f.after(bias is not None))
    kind = f"{before}ConvTranspose (f32){f', then {rest} in NumPy' if rest else ''} ({why})"
    return FusedPlan(lowering=FusedLowering(kind, out_shape, 1, False, guard), **plan_args)  # type: ignore[arg-type]


def _fused_plan(core: Core, compiled: Any, emulated: bool, code: str, out_shape: tuple[int, ...],
                guard: Optional[str], arrays: Sequence[Any], plan_args: dict[str, Any]) -> FusedPlan:
    """The plan of a graph compiled as one partition around ``core``."""
    f: Fusion = plan_args["fusion"]
    parts = compiled.partitions
    counted = "1 fused partition" if parts == 1 else f"{parts} partitions"
    if core.plain:  # the plain op's own partitions, then the graph's
        counted, parts = f"the plain op, then {'1 partition' if parts == 1 else counted}", parts + 1
    kind = f"{f.chain(plan_args['has_bias'], core.kind)}: {counted}{core.how}"
    plan = FusedPlan(lowering=FusedLowering(kind, out_shape, parts, parts == 1, guard), compiled=compiled,
                     emulated=emulated,
                     prepare=core.prepare, library_shape=core.out_shape,
                     finite_guard=not emulated and code in ("bf16", "f16"), before_bias=1 if core.plain else 2,
                     **plan_args)
    plan.executor = _executor(plan, arrays)
    return plan


def _check_dtypes(op: ConvTranspose, f: Fusion, arrays: Sequence[Any]) -> tuple[str, np.dtype[Any]]:
    """The call's compute code (``"f32"``, ``"bf16"``, ``"f16"``; int8 calls: ``"f32"``) and
    dst's dtype; TypeError naming the tensor whose dtype does not fit."""
    name = op.op_name
    names = f.input_names()

    def fail(arg: str, a: np.ndarray, want: str) -> None:
        msg = f"{name}: argument '{arg}' expected dtype {want}, got {a.dtype}"
        raise TypeError(msg)

    if f.int8:
        src, w, bias, *operands = arrays
        if _code(src) not in INT8_DTYPES:
            fail("src", src, "uint8 (u8) or int8 (s8) for an int8 ConvTranspose")
        if w.dtype != np.int8:
            fail("weights", w, "int8 (s8) for an int8 ConvTranspose")
        if bias is not None and bias.dtype != F32:
            fail("bias", bias, "float32 for an int8 ConvTranspose")
        for p, x, arg in zip(f.binary, operands, names[3:]):
            if p.dequantize is not None and _code(x) not in INT8_DTYPES:
                fail(arg, x, "uint8 or int8 (it is dequantized)")
            if p.dequantize is None and x.dtype != F32:
                fail(arg, x, "float32 (give the post-op a dequantize= for a u8/s8 tensor)")
        dq = f.dst_quantize
        return "f32", F32 if dq is None else INT8_DTYPES[dq.dtype]
    code = dtypes.common_code(name, list(zip(names, arrays)), "every tensor of a fused call must have one float dtype")
    return code, dtypes.FLOAT_DTYPES[code]


def _compile(op: ConvTranspose, f: Fusion, core: Core, arrays: Sequence[Any],
             operand_shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...], compute: str,
             out_dtype: np.dtype[Any], emulated: bool) -> Any:
    """Compile the graph for the arrays as library_inputs gives them (an emulated call: f32)."""
    src, w, bias, *_ = arrays
    has_bias = bias is not None
    out_code = _code(np.empty(0, out_dtype)) if out_dtype.kind in "iu" else compute  # bf16's kind is "V"
    inter = "f32" if f.int8 else compute
    if core.plain:  # the graph takes the plain op's result (as it will be: dense, in the compute dtype)
        rest = library_inputs(arrays, has_bias, operand_shapes, emulated)[2:]
        descs = [(tuple(out_shape), shapes.dense_strides(out_shape), inter)] + [describe(a, _code(a)) for a in rest]
        core_w_shape = tuple(w.shape)
    else:
        args = library_inputs(arrays, has_bias, operand_shapes, emulated, core.prepare)
        descs = [describe(a, _code(a)) for a in args]
        core_w_shape = tuple(args[1].shape)  # the weights as the core takes them (a flip's)
    nodes = graph_nodes(op, f, has_bias, out_shape, inter, out_code, operand_shapes, src.shape, core_w_shape, core)
    shape = core.out_shape or out_shape
    output = (list(shape), list(shapes.dense_strides(shape)), out_code)
    chain = f.chain(has_bias, core.kind)
    if core.plain:
        # no core node: the library must run the first stage as one partition (the C++ core's
        # rule for a graph's head), so where it splits that chain, its first node alone
        starts = _stage_starts(nodes, descs, 0)[1:]
        try:
            return native.compile(chain, {}, descs, output, nodes=nodes, stages=starts)
        except UnsupportedError as e:
            if "one partition" not in str(e) or len(nodes) == 1 or (starts and starts[0] == 1):
                raise
        return native.compile(chain, {}, descs, output, nodes=nodes, stages=[1] + [s for s in starts if s > 1])
    core_at = 2 if f.int8 else 0  # the core's node (after the two Dequantize nodes)
    stages = _stage_starts(nodes, descs, core_at + 1) if core.staged else []
    return native.compile(chain, {}, descs, output, nodes=nodes, stages=stages)


def _stage_starts(nodes: Sequence[tuple[str, dict[str, Any], list[int], Any]], descs: Sequence[Any],
                  first: int) -> list[int]:
    """Where the partitions of a staged call begin: the post-ops from node ``first`` on, and
    a new partition at each later binary post-op whose tensor broadcasts (not dst-shaped:
    per channel, one value, ...), at its Dequantize where it has one. oneDNN 3.2 runs such a
    partition as a binary primitive with the later ops as its post-ops, and a broadcast
    binary post-op sends that primitive to its reference kernel (``ref:any``, ONEDNN_VERBOSE):
    on an AMD Zen5, NXC bias + Add + ReLU + per-channel Multiply after the op took 12 ms for
    a 16x8x8x256 dst (fused call 5-52x the time of the op and NumPy on the fused bench's
    strided layers), NCX bias + ReLU + per-channel Multiply the same; as the first op of a
    partition of its own the same Multiply runs on ``jit:uni``."""
    starts = [first]
    for i in range(first + 1, len(nodes)):
        kind, _, inputs, out = nodes[i]
        if len(inputs) != 2 or kind not in POST_OPS or not POST_OPS[kind].is_binary:
            continue
        other = inputs[1]
        at = i
        if other < 0:  # a Dequantize node of the operand: the partition starts there
            at = -1 - other
            other = nodes[at][2][0]
        if list(descs[other][0]) != list(out[0]) and at > starts[-1]:
            starts.append(at)
    return starts


def _executor(plan: FusedPlan, arrays: Sequence[Any]) -> Any:
    """The C++ fast path, where the call's arrays go to the library as given; for a graph
    in f32 (emulated), where they are dense: C++ converts them into per-thread f32 staging
    memory and rounds the result into dst, as for the plain op (no f32 arrays per call)."""
    if plan.compiled is None or plan.prepare is not None:
        return None
    operands = arrays[3:]
    if any(x.shape != s for x, s in zip(operands, plan.operand_shapes)):
        return None
    call = list(arrays) if arrays[-1] is not None else list(arrays[:-1])  # as the op's call passes them
    given = [i for i, a in enumerate(call) if a is not None]
    emulated = (dtypes.code_of(plan.out_dtype) or "") if plan.emulated else ""
    if plan.emulated and not (native.fast_conversion and emulated in ("bf16", "f16")
                              and all(call[i].flags.c_contiguous and call[i].flags.aligned for i in given)):
        return None
    if any(call[i] is not _positive(call[i]) for i in given):
        return None
    finite = dtypes.code_of(plan.out_dtype) if plan.finite_guard else None
    return native.Executor(plan.compiled, [call[i].dtype for i in given], plan.out_dtype, finite or "",
                          given, emulated, len(call))


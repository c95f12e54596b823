"""Known-bad oneDNN 3.2 kernels, keyed by the CPU ISA oneDNN dispatches to, and which
problems this package keeps away from them (docs/cpus.md and docs/deviations.md).

oneDNN picks its kernels by the ISA it dispatches to: the CPU's own, or lower under
``ONEDNN_MAX_CPU_ISA`` (read once per process). A guard is active where its kernels run:
for a dtype code, on the ISA levels named in :attr:`Guard.isas`. Each guard says on which
CPU and ISA level it was measured, and the lowering code asks :func:`active` before it
routes a problem around it. :func:`report` is what ``info()`` shows.

``ONEDNN_CONVT_GUARDS=off`` (read at import) or :func:`set_enabled` turns every guard off,
for measuring what a guard costs and that it is still needed (``benchmarks/guards.py``,
``tests/isa_scan.py --unguarded``): results on guarded problems may then be wrong, and the
process may crash.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from . import environment, native

#: dnnl_cpu_isa_t values (dnnl_types.h) -> names, lowest first.
ISA_NAMES = {
    0x0: "default", 0x1: "sse41", 0x3: "avx", 0x7: "avx2", 0xF: "avx2_vnni",
    0x1F: "avx2_vnni_2", 0x27: "avx512_core", 0x67: "avx512_core_vnni",
    0xE7: "avx512_core_bf16", 0x1EF: "avx512_core_fp16", 0xFEF: "avx512_core_amx",
    0x1FEF: "avx512_core_amx_fp16",
}
AMX = frozenset({"avx512_core_amx", "avx512_core_amx_fp16"})
#: the levels with native bf16 kernels in oneDNN 3.2
BF16_NATIVE = frozenset({"avx512_core", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_fp16"}) | AMX


@functools.lru_cache(maxsize=None)
def dispatch_isa() -> str:
    """The ISA oneDNN dispatches to in this process (the CPU's, or the ``ONEDNN_MAX_CPU_ISA``
    cap), e.g. ``"avx512_core_amx"``."""
    value = native.cpu_isa()
    return ISA_NAMES.get(value, hex(value))


@dataclass(frozen=True)
class Guard:
    """One known-bad kernel class of oneDNN 3.2.

    Attributes:
        name: short identifier (``info()["guards"]``).
        isas: dtype code -> the dispatch ISAs on which the bad kernel runs for that dtype.
        condition: which problems, in words.
        route: what this package runs instead.
        evidence: where it was measured (CPU, ISA caps, scan figures) and the upstream fix.
    """

    name: str
    isas: dict[str, frozenset[str]]
    condition: str
    route: str
    evidence: str


AMX_STRIDE_NOT_BELOW_KERNEL = Guard(
    name="amx_stride_not_below_kernel",
    # bf16 runs on AMX-BF16 tiles from avx512_core_amx; f16 only from avx512_core_amx_fp16
    # (not measured: no such CPU here, kept away by the same kernels' rule)
    isas={"bf16": AMX, "f16": frozenset({"avx512_core_amx_fp16"})},
    condition=(
        "a spatial dim whose stride is > 1 and >= its kernel, in BackwardData (oneDNN's "
        "forward convolution on AMX, brgconv:avx512_core_amx) and in ConvTranspose (its "
        "backward-data kernel jit:avx512_core_amx, also inside jit_deconvolution:avx512_core_amx)"
    ),
    route=(
        "BackwardData whose guarded dims have kernel 1 and no pads_begin: every s-th row of "
        "diff_dst with stride 1 there (native); where the taps tile the output (stride = "
        "kernel, no pads, groups 1): one MatMul (lowering.matmul_tiles); else BackwardData: a "
        "Convolution over the weights with zero taps "
        "appended (kernel s + 1 along those dims, pads_end grown to match), native, where that "
        "costs at most 2.5x the multiply-adds; else f32"
    ),
    evidence=(
        "Intel Xeon (Sapphire Rapids, AMX-BF16), 2 threads: 10,000 unguarded bf16 problems, "
        "BackwardData wrong (errors of 0.2x to 1e36x the output's scale) or a segfault / "
        "free(): invalid size in 2.4% of those with a depth/height stride > kernel, 0.2% of "
        "those with stride >= kernel elsewhere (1-D and width included), 0 of 526 with every "
        "stride < kernel; ConvTranspose returned uninitialized values (1e35-1e36) in 3 of "
        "about 11,000 (3-D, NCX, stride >= kernel; with bias through the library's "
        "deconvolution, without it through ConvolutionBackwardData). oneDNN v3.13 fixed one "
        "cause (PR #5494: brgemm_convolution_fwd_t sized its input buffer with "
        "min(kernel, stride)); present in 3.2 and 3.12"
    ),
)

AMX_PADDING_ONLY_OUTPUTS = Guard(
    name="amx_padding_only_outputs",
    isas={"bf16": AMX, "f16": frozenset({"avx512_core_amx_fp16"})},
    condition=(
        "BackwardData where some diff_src position reads no element of diff_dst (all its "
        "taps fall in the pads: pads >= the dilated kernel, or a dilation and stride that "
        "step over every row)"
    ),
    route="f32",
    evidence=(
        "Intel Xeon (Sapphire Rapids, AMX-BF16): a segfault in oneDNN's AMX forward "
        "convolution on such a problem (diff_dst height 1, kernel 3, dilation 2, stride 2, "
        "pads 3/5), with or without the stride guard; right under every lower ISA cap"
    ),
)

BF16_BACKWARD_WEIGHTS_SHORT_SRC = Guard(
    name="bf16_backward_weights_short_src",
    isas={"bf16": BF16_NATIVE, "f16": frozenset()},
    condition="BackwardWeights where a spatial dim of src is no longer than the dilated kernel",
    route="a MatMul over frames of diff_dst (groups 1, >= 4M multiply-adds), else f32",
    evidence=(
        "AMD Zen4 (avx512_core_bf16): jit_bf16:avx512_core_bf16 returned uninitialized or "
        "wrong weight taps in 43 of 18,368 small problems; not found upstream"
    ),
)

#: the AVX-512 dispatch ISAs (oneDNN's avx512_core kernels and those built on them)
AVX512 = frozenset({"avx512_core", "avx512_core_vnni", "avx512_core_bf16", "avx512_core_fp16"}) | AMX

#: every dispatch ISA (a guard active wherever oneDNN 3.2 may pick the bad kernel)
EVERY_ISA = frozenset(ISA_NAMES.values())

STRIDED_DECONVOLUTION_EPILOGUE = Guard(
    name="strided_deconvolution_epilogue",
    isas={"f32": EVERY_ISA, "bf16": EVERY_ISA, "f16": EVERY_ISA},
    condition=(
        "a ConvTranspose with a stride > 1 and a bias or fused post-ops, run by the library's "
        "deconvolution (its strided brgemm kernel, brgconv_strided, applies them once per "
        "partial sum where it splits the taps)"
    ),
    route=(
        "the deconvolution without them (as ConvolutionBackwardData where groups is 1), then "
        "a second partition adds the bias and applies the post-ops in dst (a plain call's bias "
        "in a small f32 result: the package's core, after the op)"
    ),
    evidence=(
        "AMD Zen5 (EPYC, avx512_core_bf16), 2 threads: 68 of 696 f32 model-sized problems "
        "wrong under AVX512_CORE, 32 under AVX2 (brgconv_strided:avx2), by 0.3-2.3x the "
        "output's scale: every k4 s2 p1 layer with 512-1024 input channels, bias or ReLU "
        "alike (the bias landed 1 to 4 times per output, once per kernel tap); also k5 s2 "
        "and k4 s4 layers in a random scan; AMD Zen4 the same (DCGAN, pix2pix, CenterNet "
        "layers: errors 0.27-0.94). The kernel's blocking follows the cache sizes, so the "
        "guard holds on every CPU and ISA. Not seen on int8 graphs (their kernel blocks "
        "otherwise) nor with stride 1 (forward convolution kernels)"
    ),
)

AVX512_BACKWARD_WEIGHTS_DEPTH_PAD = Guard(
    name="avx512_backward_weights_depth_pad",
    isas={"f32": AVX512, "bf16": AVX512, "f16": AVX512},
    condition="3-D BackwardWeights with pads_begin >= 3 in depth (both library ops)",
    route=(
        "diff_dst given its cropped front rows back as zeros (copied into a larger array), "
        "pads_begin 0 in depth: the same products"
    ),
    evidence=(
        "AMD Zen5 (EPYC, avx512_core_bf16), 2 threads: of 724 3-D problems per setting (kernel "
        "1-7, src 1-5, stride 1-3, pads 0-8 in depth), 7-11 wrong (errors up to 1e32) or a heap "
        "corruption abort/segfault in jit:avx512_core and jit_bf16 backward_weights, f32 and "
        "bf16, ConvolutionBackwardWeights NXC and ConvTransposeBackwardWeights NCX, under "
        "AVX512_CORE and AVX512_CORE_BF16: every one with depth pads_begin >= 3; none in "
        "height or width, none under AVX2; found by fuzz/plain_ops.py"
    ),
)

STRIDED_1X1_BACKWARD_WEIGHTS = Guard(
    name="strided_1x1_backward_weights",
    isas={"f32": EVERY_ISA, "bf16": EVERY_ISA, "f16": EVERY_ISA},
    condition="BackwardWeights with a kernel of 1 in every dim and a stride > 1 (both library ops)",
    route=(
        "the stride-1 BackwardWeights of src and the diff_dst rows its taps read (every s-th, "
        "from -pads_begin; rows in the pads as zeros), copied into an array of src's spatial size"
    ),
    evidence=(
        "AMD Zen4 (EPYC, avx512_core_bf16), 2 threads: the f32 strided 1x1 backward-weights "
        "kernel (jit_1x1:avx512_core) on an NHWC diff_dst of 3 channels and 5x12 positions "
        "(stride 1x2, output_padding 0x1) crashed the process (segfault or abort) in 6 of 8 "
        "runs, at the next compile after it; its reduce-to-unit-stride copy writes past its "
        "scratchpad with fewer channels than the kernel's block (upstream issue 6035, open "
        "against oneDNN 3.12). Routed for every dtype, ISA and channel count: the route is the "
        "copy the library's kernel makes itself"
    ),
)

GUARDS = (AMX_STRIDE_NOT_BELOW_KERNEL, AMX_PADDING_ONLY_OUTPUTS, BF16_BACKWARD_WEIGHTS_SHORT_SRC,
          STRIDED_DECONVOLUTION_EPILOGUE, AVX512_BACKWARD_WEIGHTS_DEPTH_PAD, STRIDED_1X1_BACKWARD_WEIGHTS)

#: pads_begin in depth from which :data:`AVX512_BACKWARD_WEIGHTS_DEPTH_PAD` applies
DEPTH_PAD_LIMIT = 3

_enabled = environment.switch("ONEDNN_CONVT_GUARDS", True)


def set_enabled(enabled: bool) -> None:
    """Turn every guard on (the default) or off (for measurement only: see the module doc).
    Affects problems compiled afterwards, not plans already made."""
    global _enabled
    _enabled = bool(enabled)


def enabled() -> bool:
    """Whether the guards are on in this process (:func:`set_enabled`, ``ONEDNN_CONVT_GUARDS``)."""
    return _enabled


def active(guard: Guard, code: str) -> bool:
    """Whether ``guard`` applies to dtype ``code`` in this process."""
    return _enabled and dispatch_isa() in guard.isas.get(code, frozenset())


def report() -> list[dict[str, object]]:
    """The guards active in this process, with the dtypes they cover (for ``info()``)."""
    if not _enabled:
        return []
    isa = dispatch_isa()
    rows: list[dict[str, object]] = []
    for g in GUARDS:
        codes = sorted(c for c, isas in g.isas.items() if isa in isas)
        if codes:
            rows.append({"name": g.name, "dtypes": codes, "condition": g.condition, "route": g.route,
                         "evidence": g.evidence})
    return rows


def stride_not_below_kernel(code: str, kernel: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The spatial dims (indices) that make a call in dtype ``code`` a case of
    :data:`AMX_STRIDE_NOT_BELOW_KERNEL` (BackwardData, or a ConvTranspose run by either
    library lowering, ConvolutionBackwardData or the deconvolution): stride > 1 and
    stride >= kernel. Empty where the guard is inactive."""
    if not active(AMX_STRIDE_NOT_BELOW_KERNEL, code):
        return ()
    return tuple(i for i, (k, s) in enumerate(zip(kernel, strides)) if s > 1 and s >= k)


def strided_deconvolution_epilogue(code: str, strides: Sequence[int]) -> bool:
    """Whether a ConvTranspose in dtype ``code`` with these strides must keep its bias and
    post-ops out of the library's deconvolution (:data:`STRIDED_DECONVOLUTION_EPILOGUE`)."""
    return active(STRIDED_DECONVOLUTION_EPILOGUE, code) and any(s > 1 for s in strides)


def strided_1x1_backward_weights(code: str, kernel: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a BackwardWeights in dtype ``code`` must not hand the library its strides
    (:data:`STRIDED_1X1_BACKWARD_WEIGHTS`): a kernel of 1 in every dim, a stride above 1."""
    return (active(STRIDED_1X1_BACKWARD_WEIGHTS, code) and all(k == 1 for k in kernel)
            and any(s > 1 for s in strides))


def backward_weights_depth_pad(code: str, pads_begin: Sequence[int]) -> int:
    """The depth pads_begin a 3-D BackwardWeights in dtype ``code`` must not hand the library
    (:data:`AVX512_BACKWARD_WEIGHTS_DEPTH_PAD`): all of it where the guard applies, else 0."""
    if len(pads_begin) != 3 or pads_begin[0] < DEPTH_PAD_LIMIT or not active(AVX512_BACKWARD_WEIGHTS_DEPTH_PAD, code):
        return 0
    return pads_begin[0]


def padding_only_outputs(
    code: str, out: Sequence[int], given: Sequence[int], kernel: Sequence[int],
    strides: Sequence[int], dilations: Sequence[int], pads_begin: Sequence[int],
) -> bool:
    """Whether a forward convolution (BackwardData's form) in dtype ``code`` from ``given``
    to ``out`` spatial sizes is a case of :data:`AMX_PADDING_ONLY_OUTPUTS`: some output
    position along some dim whose taps ``o*s - pb + j*d`` all miss ``[0, given)``. False
    where the guard is inactive."""
    if not active(AMX_PADDING_ONLY_OUTPUTS, code):
        return False
    for x, y, k, s, d, pb in zip(out, given, kernel, strides, dilations, pads_begin):
        # the last output's first tap past the end, or the first output's last tap before row 0
        if (x - 1) * s - pb >= y or (k - 1) * d - pb < 0:
            return True
        if y >= d:  # between those, taps d apart cannot step over y rows
            continue
        # outputs whose first tap is before row 0 may step over all y rows: check each
        count = min(x, pb // s + 1)
        for start in range(0, count, 1 << 16):
            first = np.arange(start, min(count, start + (1 << 16))) * s - pb
            j = np.maximum(0, -(first // d))  # the first tap at or after row 0
            if not np.all((j < k) & (first + j * d < y)):
                return True
    return False

"""Which library op runs each op: the rules chosen from measurement (README, "Lowerings").

Every choice below computes the same op; they differ in the kernels and reorders oneDNN 3.2
picks for them (benchmarks/NOTES.md has the side-by-side timings behind each rule):

- ConvTranspose runs as the library's ``ConvTranspose`` (or as ``MatMul`` + overlap-add for
  large 1-D kernels, :mod:`onednn_convt.matmul_lowering`).
- ConvTransposeBackwardData runs as ``MatMul`` over frames of diff_dst for large 1-D kernels
  (:mod:`onednn_convt.matmul_lowering`); otherwise as the library's forward ``Convolution`` over the same
  weights memory (IOX read as OIX, XOI as XIO; spec D9), which handles dilations, except
  where :func:`backward_data_kind` picks the library's own ``ConvTransposeBackwardData``:
  every dilation 1 (oneDNN 3.2 drops dilations there) and either one spatial dim or NCX.
  Measured side by side on the models suite (AVX-512 machine, 2 threads, f32 and bf16), the
  library's op took 0.24-0.38x the Convolution lowering's time in 1-D (gemm-based kernels)
  and 0.42-1.07x in 2-D/3-D NCX (geometric mean 0.83x: no activation reorders); in 2-D/3-D
  NXC it took 0.88-2.8x, so there the Convolution lowering stays (its kernels read NXC).
- ConvTransposeBackwardWeights runs as the library's ``ConvTransposeBackwardWeights``.
"""

from __future__ import annotations

from typing import Sequence

CONVOLUTION = "Convolution"
CONV_TRANSPOSE_BACKWARD_DATA = "ConvTransposeBackwardData"


def backward_data_kind(dilations: Sequence[int], data_format: str) -> str:
    """The library op kind that runs a ConvTransposeBackwardData call."""
    if all(d == 1 for d in dilations) and (len(dilations) == 1 or data_format == "NCX"):
        return CONV_TRANSPOSE_BACKWARD_DATA
    return CONVOLUTION

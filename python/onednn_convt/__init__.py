"""oneDNN Graph API ConvTranspose ops on NumPy arrays.

``ConvTranspose``, ``ConvTransposeBackwardData`` and ``ConvTransposeBackwardWeights`` as op
classes (attributes at construction, inputs at call) and functions, plus the legacy
``ConvTransposeBackpropFilters``; ``ConvTranspose(post_ops=[PostOp("ReLU"), ...])`` fuses bias and post-ops into one
library partition, and with ``src_dequantize``/``weights_dequantize``/``dst_quantize`` runs
int8; ``op.with_constant_weights(w)`` gives a ``ConstantWeights``
callable whose weights the library reorders once; ``set_autotune(True)`` times the
lowerings of each new signature and keeps the fastest (cached across processes); ``reference`` is an independent NumPy
float64 oracle.
"""

from __future__ import annotations

from . import guards, reference
from ._version import __version__ as __version__
from .constant_weights import ConstantWeights
from .errors import OneDNNError, UnsupportedError
from .functional import (
    conv_transpose,
    conv_transpose_backward_data,
    conv_transpose_backward_weights,
)
from .info import cache_info, clear_cache, host_memory_info, info, set_cache_capacity
from .legacy import ConvTransposeBackpropFilters
from .limits import debug_fill, memory_limit, set_debug_fill, set_memory_limit
from .native import LIBDNNL_PATH
from .lowering.autotune import enabled as autotune_enabled
from .lowering.autotune import set_autotune
from .lowering.tuning_cache import clear as clear_tuning_cache
from .ops import ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights
from .post_ops import Dequantize, PostOp, Quantize

__all__ = [
    "ConstantWeights",
    "ConvTranspose",
    "ConvTransposeBackpropFilters",
    "ConvTransposeBackwardData",
    "ConvTransposeBackwardWeights",
    "Dequantize",
    "LIBDNNL_PATH",
    "OneDNNError",
    "PostOp",
    "Quantize",
    "UnsupportedError",
    "autotune_enabled",
    "cache_info",
    "clear_cache",
    "clear_tuning_cache",
    "conv_transpose",
    "conv_transpose_backward_data",
    "conv_transpose_backward_weights",
    "debug_fill",
    "host_memory_info",
    "info",
    "memory_limit",
    "reference",
    "set_autotune",
    "set_cache_capacity",
    "set_debug_fill",
    "set_memory_limit",
]

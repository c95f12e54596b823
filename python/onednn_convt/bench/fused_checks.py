"""The fused suite's cases and checks: the post-op chains of its rows, the layers, the
NumPy post-ops its unfused form runs, the checks a row passes before it is timed, and
PyTorch's tensors for the peer."""


from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .. import dtypes
from . import peers, suites, timing


Record = dict[str, Any]


@dataclass(frozen=True)
class PostCase:
    """A chain of post-ops after the bias.

    Attributes:
        name: short name in tables (``"bias+ReLU"``).
        kinds: the library post-op kinds, in order.
        operands: per binary post-op, its second tensor: ``"full"`` (dst's shape, a
            residual) or ``"channel"`` (one value per output channel).
    """

    name: str
    kinds: tuple[str, ...]
    operands: tuple[str, ...] = ()


#: the post-op chains of every float row
CASES = (
    PostCase("bias+ReLU", ("ReLU",)),
    PostCase("bias+Add", ("Add",), ("full",)),
    PostCase("bias+GELU", ("GELU",)),
    PostCase("bias+Add+ReLU+Mul", ("Add", "ReLU", "Multiply"), ("full", "channel")),
)

#: the int8 row's chain: u8 src, s8 weights, f32 bias, ReLU, u8 dst
INT8_CASE = "bias+ReLU->u8"

#: dtypes of the suite (int8 rows go with f32)
DTYPES = ("f32", "bf16")

#: int8 rows: largest difference from the unfused result, in units of the u8 output's
#: last place (rounding boundaries: f32 accumulation against the library's integer one),
#: and the largest share of elements that may differ by that much
INT8_LSB, INT8_SHARE = 1, 0.01
#: the same against PyTorch's quantized ConvTranspose (it requantizes its own way)
TORCH_INT8_LSB, TORCH_INT8_SHARE = 2, 0.05

#: quantized engines of the PyTorch int8 peer, in the order tried: the first whose result
#: passes the check is timed (x86 is PyTorch's default on x86 CPUs; on PyTorch 2.13 it and
#: onednn return wrong results for ConvTranspose with in != out channels, fbgemm is right)
TORCH_QENGINES = ("x86", "onednn", "fbgemm")

#: seconds of sleep before PyTorch's batch and the allocating fused call's (the next one):
#: the other OpenMP runtime's threads stop spinning meanwhile
GAP = 0.02


class Mismatch(RuntimeError):
    """A row's fused result differs from the unfused (or PyTorch's) one beyond tolerance."""


# -- layers -------------------------------------------------------------------------------
def layers(names: Optional[Sequence[str]] = None) -> list[suites.Layer]:
    """The models suite's layers (without the slow one), or those named, from the models
    and tiny suites.

    Raises:
        ValueError: a name that is in neither suite.
    """
    pool = {lay.name: lay for s in ("models", "tiny") for lay in suites.layers(s)}
    if names is None:
        return [lay for lay in suites.layers("models") if not lay.slow]
    unknown = [n for n in names if n not in pool]
    if unknown:
        msg = f"bench: unknown layer(s) {', '.join(unknown)} for the fused suite; expected {', '.join(pool)}"
        raise ValueError(msg)
    return [pool[n] for n in names]


# -- NumPy post-ops -----------------------------------------------------------------------
def _scipy_erf() -> Optional[Callable[..., Any]]:
    """scipy.special.erf, or None without SciPy (not a dependency)."""
    try:
        return importlib.import_module("scipy.special").erf  # type: ignore[no-any-return]
    except ImportError:
        return None


def erf_name() -> str:
    if _scipy_erf() is None:
        return "NumPy polynomial (Abramowitz-Stegun 7.1.26, error < 1.5e-7)"
    return "scipy.special.erf"


def _erf(x: np.ndarray) -> None:
    """erf of a float32 array, in place."""
    erf = _scipy_erf()
    if erf is not None:
        erf(x, out=x)
        return
    a = np.abs(x)
    t = 1.0 / (1.0 + np.float32(0.3275911) * a)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (
        np.float32(1.421413741) + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    y = 1.0 - poly * np.exp(-a * a)
    np.copysign(y, x, out=x)


def numpy_post(
    src: np.ndarray, dst: np.ndarray, kinds: Sequence[str], operands: Sequence[np.ndarray], tmp: Optional[np.ndarray]
) -> None:
    """The post-ops ``kinds`` in NumPy: the first reads ``src`` and writes ``dst`` (the same
    array: in place), the others run in place on ``dst``. ``operands``: the binary
    post-ops' second tensors, in order; ``tmp``: a float32 buffer of dst's shape (GELU)."""
    pending = iter(operands)
    x = src
    for kind in kinds:
        if kind == "ReLU":
            np.maximum(x, 0, out=dst)
        elif kind == "Add":
            np.add(x, next(pending), out=dst)
        elif kind == "Multiply":
            np.multiply(x, next(pending), out=dst)
        elif kind == "GELU":  # 0.5 x (1 + erf(x / sqrt 2)), in float32
            assert tmp is not None
            np.multiply(x, np.float32(1 / math.sqrt(2)), out=tmp, dtype=np.float32)
            _erf(tmp)
            np.multiply(tmp, np.float32(0.5), out=tmp)
            np.add(tmp, np.float32(0.5), out=tmp)
            np.multiply(x, tmp, out=dst, dtype=np.float32, casting="unsafe")
        else:  # pragma: no cover - CASES names only the kinds above
            msg = f"bench: no NumPy post-op for {kind}"
            raise ValueError(msg)
        x = dst


def quantize_u8(y: np.ndarray, scale: float, q: np.ndarray) -> None:
    """The library's Quantize to u8 (zero point 0) of float32 ``y`` into ``q``; ``y`` is
    overwritten."""
    np.divide(y, np.float32(scale), out=y)
    np.rint(y, out=y)
    np.clip(y, 0, 255, out=y)
    np.copyto(q, y, casting="unsafe")


# -- checks -------------------------------------------------------------------------------
def check_close(what: str, got: np.ndarray, want: np.ndarray, tolerance: float) -> float:
    """The relative error of ``got`` against ``want`` (max abs difference over max abs).

    Raises:
        Mismatch: above ``tolerance``, or NaN.
    """
    err = peers.relative_error(got, want)
    if not err <= tolerance:
        msg = f"{what}: relative error {err:.3g} above the tolerance {tolerance:.3g}"
        raise Mismatch(msg)
    return err


def check_u8(what: str, got: np.ndarray, want: np.ndarray, lsb: int, share: float) -> tuple[int, float]:
    """(largest difference, share of elements that differ) of two u8 arrays.

    Raises:
        Mismatch: a difference above ``lsb``, or more than ``share`` of the elements differ.
    """
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    worst = int(diff.max()) if diff.size else 0
    differ = float(np.count_nonzero(diff)) / max(1, diff.size)
    if worst > lsb or differ > share:
        msg = (f"{what}: u8 results differ by up to {worst} (allowed {lsb}) in {100 * differ:.2f}% of the "
               f"elements (allowed {100 * share:.2f}%)")
        raise Mismatch(msg)
    return worst, differ


# -- PyTorch ------------------------------------------------------------------------------
def tensor(torch: Any, a: np.ndarray) -> Any:
    """A torch tensor on ``a``'s memory (bf16 through a uint16 view)."""
    if a.dtype == dtypes.FLOAT_DTYPES["bf16"]:
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _memory_format(torch: Any, rank: int) -> Any:
    from ..torch_run import channels_last_format  # torch is imported: so may this be

    return channels_last_format(rank)


def torch_activation(torch: Any, a: Any, nxc: bool, rank: int) -> Any:
    """An activation of our layout as PyTorch's (N, C, X...) in the matching memory format
    (channels_last for NXC; in 1-D a channels-last strided view)."""
    if not nxc:
        return a.contiguous()
    t = a.movedim(-1, 1)
    fmt = _memory_format(torch, rank)
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def torch_weights(torch: Any, w: Any, xoi: bool, rank: int) -> Any:
    """Weights of our layout as PyTorch's (I, O/groups, X...), in the activations' memory format."""
    if xoi:
        w = w.movedim((-1, -2), (0, 1))
        fmt = _memory_format(torch, rank)
        return w.contiguous(memory_format=fmt) if fmt is not None else w.contiguous()
    return w.contiguous()


def conv_function(torch: Any, rank: int) -> Any:
    f = torch.nn.functional
    return {1: f.conv_transpose1d, 2: f.conv_transpose2d, 3: f.conv_transpose3d}[rank]


def torch_to_numpy(result: Any, nxc: bool) -> np.ndarray:
    """A PyTorch result as float32 NumPy in our layout."""
    r = result.float().contiguous().numpy()
    return np.moveaxis(r, 1, -1) if nxc else r


# -- one row ------------------------------------------------------------------------------

def median(values: Sequence[float]) -> float:
    return timing.quartiles(sorted(values))[1]



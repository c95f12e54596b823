"""The conformance runner's data: a :class:`Case` (one op call from a graph JSON and its
overrides, or the status that keeps it from running), its tensors (:class:`TensorSpec`),
the overrides of a harness line (:class:`Overrides`) and the statuses.

A case that cannot run carries a status instead of a call: ``INVALID`` (the file or the
overrides are malformed or violate the library's schema: the reason says which) or
``SKIPPED`` (a valid graph this runner does not cover). ``ERROR`` is a bug of this package.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional


if TYPE_CHECKING:
    from .patterns import Pattern

INVALID = "INVALID"
SKIPPED = "SKIPPED"
#: A case whose check raised what it should not (a bug of this package; the runner's outcome)
ERROR = "ERROR"

#: Input roles of each op, in index order, and the output's.
INPUT_ROLES = {
    "ConvTranspose": ("src", "weights", "bias"),
    "ConvTransposeBackwardData": ("diff_dst", "weights"),
    "ConvTransposeBackwardWeights": ("src", "diff_dst", "weights_shape"),
}
OUTPUT_ROLE = {
    "ConvTranspose": "dst",
    "ConvTransposeBackwardData": "diff_src",
    "ConvTransposeBackwardWeights": "diff_weights",
}
#: Roles of activation tensors (their dim 0 is the batch that --mb rewrites).
ACTIVATIONS = ("src", "diff_dst")
FLOAT_CODES = ("f32", "bf16", "f16")


class CaseError(Exception):
    """A case that cannot run: ``status`` is INVALID or SKIPPED, ``reason`` says why."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Overrides:
    """The benchdnn settings of one case (one element of each sweep).

    Attributes:
        in_shapes: (tensor id, shape or None, memory tag or None) per ``--in-shapes`` entry.
        op_attrs: (op id, ((name, value text), ...)) per ``--op-attrs`` op.
        dt: ``--dt`` for every f32 tensor, or None.
        dt_ids: (tensor id, dtype) per ``--dt=ID:DT`` entry.
        mb: ``--mb`` (0 = keep).
        texts: the option texts as written, for the case's line (``--dt=...``, ...).
    """

    in_shapes: tuple[tuple[int, Optional[tuple[int, ...]], Optional[str]], ...] = ()
    op_attrs: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    dt: Optional[str] = None
    dt_ids: tuple[tuple[int, str], ...] = ()
    mb: int = 0
    texts: tuple[str, ...] = ()

    @property
    def reshapes(self) -> bool:
        """Whether the output shape is to be recomputed (shapes or attributes overridden)."""
        return bool(self.in_shapes or self.op_attrs or self.mb)


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of a case.

    Attributes:
        id: logical tensor id in the JSON.
        role: ``src``, ``weights``, ``bias``, ``diff_dst``, ``weights_shape``, the output's,
            or in a pattern case ``post_ops[i]`` (the second tensor of binary post-op i).
        shape: logical shape (the op's layout, e.g. NCX); None for an output that cannot be
            computed (the call then reports why).
        dtype: ``f32``, ``bf16``, ``f16`` (``s32`` for weights_shape; ``u8``/``s8`` for the
            quantized tensors of an int8 pattern).
        order: memory order of the dims, outermost first (``(0, 2, 3, 1)`` = tag ``acdb``).
        values: the values of a ``weights_shape`` input (the format holds no data).
    """

    id: int
    role: str
    shape: Optional[tuple[int, ...]]
    dtype: str
    order: tuple[int, ...] = ()
    values: Optional[tuple[int, ...]] = None


@dataclass
class Case:
    """One problem: an op call, or the reason it cannot run.

    Attributes:
        id: the benchdnn-style line that defines it (``--reset ... --case=PATH``).
        location: where it came from (``harness_f32:12``, a JSON path).
        root: directory the ``--case`` path is relative to (for the repro command).
        path: the resolved JSON file ('' when not found).
        kind: op kind (None when the file could not be read).
        attrs: keyword attributes of the public op class.
        inputs: input tensors in index order; ``output``: the output tensor. A pattern
            case: src, weights, bias (when there is one), then the binary post-ops' tensors
            in chain order; the output is the chain's last tensor.
        status: None if runnable, else INVALID or SKIPPED; ``reason`` says why.
        pattern: for a graph of several ops, what it adds to the ConvTranspose.
    """

    id: str
    location: str
    root: str = "."
    path: str = ""
    kind: Optional[str] = None
    attrs: dict[str, Any] = field(default_factory=dict)
    inputs: list[TensorSpec] = field(default_factory=list)
    output: Optional[TensorSpec] = None
    status: Optional[str] = None
    reason: str = ""
    pattern: Optional[Pattern] = None

    @property
    def label(self) -> Optional[str]:
        """The op kind, or a pattern's op kinds joined by '+'."""
        return self.pattern.label if self.pattern is not None else self.kind

    @property
    def dtype(self) -> Optional[str]:
        """The dtype of the call's output (None when unknown): f32, bf16, f16, or the u8/s8
        of an int8 pattern's Quantize."""
        if self.output is not None:
            return self.output.dtype
        floats = [t.dtype for t in self.inputs if t.role != "weights_shape"]
        return floats[0] if floats else None

    def repro(self) -> str:
        """A shell command that runs this case alone."""
        return (
            f"onednn-convt conformance --cases-root {shlex.quote(os.path.abspath(self.root))} "
            f"--line={shlex.quote(self.id)}"
        )



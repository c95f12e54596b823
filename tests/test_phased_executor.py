"""The phased calls' C++ executor (``native.PhasedExecutor``, made by ``plan._phased_executor``):
a polyphase or depth-taps call's later calls run every phase's op from C++, on fresh
memory, bit for bit as the Python path runs them, within tolerance of the reference; calls
it does not fit take the Python path; and it refuses steps that would reach outside their
arrays."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np
import pytest

import onednn_convt as oc
from helpers import assert_close
from onednn_convt import lowering, native, plan, reference
from onednn_convt.lowering import base
from onednn_convt.problem import BACKWARD_DATA

BF16 = np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class Case:
    """One phased call: the op, its arrays' shapes, the lowering forced on it."""

    name: str
    op: str  # fwd, bwd_d, bwd_w
    shapes: tuple[tuple[int, ...], tuple[int, ...]]  # the op's two array inputs
    kernel: tuple[int, ...]
    strides: int
    pads: int
    lowering: str
    data_format: str = "NXC"
    weights_format: str = "XOI"
    groups: int = 1
    dtype: Any = np.float32
    weights_shape: Optional[tuple[int, ...]] = None  # bwd_w
    output_padding: int = 0
    bias: bool = False  # fwd: a third array, one value per output channel

    def attrs(self) -> dict[str, Any]:
        extra = {"output_padding": self.output_padding} if self.output_padding else {}
        return dict(strides=self.strides, pads_begin=self.pads, pads_end=self.pads, groups=self.groups,
                    data_format=self.data_format, weights_format=self.weights_format, **extra)

    def make(self) -> Any:
        if self.op == "fwd":
            return oc.ConvTranspose(**self.attrs())
        if self.op == "bwd_d":
            return oc.ConvTransposeBackwardData(**self.attrs())
        return oc.ConvTransposeBackwardWeights(weights_shape=self.weights_shape, **self.attrs())

    def arrays(self, seed: int) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        arrays = [rng.standard_normal(s).astype(self.dtype) for s in self.shapes]
        if self.bias:
            channels = self.shapes[1][-2] if self.weights_format == "XOI" else self.shapes[1][1]
            arrays.append(rng.standard_normal(channels * self.groups).astype(self.dtype))
        return arrays

    def reference(self, arrays: list[np.ndarray]) -> np.ndarray:
        x, y, *rest = (np.asarray(a, np.float64) for a in arrays)
        if self.op == "fwd":
            return reference.conv_transpose(x, y, *rest, **self.attrs())
        if self.op == "bwd_d":
            return reference.conv_transpose_backward_data(x, y, **self.attrs())
        assert self.weights_shape is not None
        return reference.conv_transpose_backward_weights(x, y, self.weights_shape, **self.attrs())

    @property
    def code(self) -> str:
        return "bf16" if np.dtype(self.dtype) == BF16 else "f32"

    @property
    def reduction(self) -> int:
        """Products summed per output element, at most (the tolerance's reduction length)."""
        channels = self.shapes[0][-1] if self.data_format == "NXC" else self.shapes[0][1]
        if self.op == "bwd_w":
            return self.shapes[0][0] * math.prod(self.shapes[0][1:-1] if self.data_format == "NXC" else self.shapes[0][2:])
        return channels // self.groups * math.prod(self.kernel)


CASES = [
    Case("polyphase fwd NXC", "fwd", ((2, 5, 5, 6), (4, 4, 4, 6)), (4, 4), 2, 1, base.POLYPHASE),
    Case("polyphase fwd NCX", "fwd", ((2, 6, 5, 7), (6, 4, 4, 4)), (4, 4), 2, 1, base.POLYPHASE, "NCX", "IOX"),
    Case("polyphase bwd_d NXC", "bwd_d", ((2, 10, 10, 4), (4, 4, 4, 6)), (4, 4), 2, 1, base.POLYPHASE),
    Case("polyphase bwd_d 3-D NXC", "bwd_d", ((1, 6, 6, 6, 4), (2, 2, 2, 4, 3)), (2, 2, 2), 2, 0, base.POLYPHASE),
    Case("polyphase bwd_w NXC", "bwd_w", ((2, 5, 5, 6), (2, 10, 10, 4)), (4, 4), 2, 1, base.POLYPHASE,
         weights_shape=(4, 4, 4, 6)),
    # depth taps whose merged batches keep planes out of the sum (Phase.zero)
    Case("depth taps k3 s2", "bwd_d", ((2, 7, 7, 7, 8), (3, 3, 3, 1, 8)), (3, 3, 3), 2, 1, base.DEPTH_TAPS,
         groups=8),
    Case("depth taps k4 s2", "bwd_d", ((3, 8, 6, 6, 8), (4, 4, 4, 1, 8)), (4, 4, 4), 2, 1, base.DEPTH_TAPS,
         groups=8),
    # forward depth taps that tile dst write their planes (no sum): the fills of the planes
    # no tap meets (output_padding), the bias after them
    Case("depth taps fwd k2 s2", "fwd", ((2, 4, 5, 5, 8), (2, 2, 2, 1, 8)), (2, 2, 2), 2, 0, base.DEPTH_TAPS,
         groups=8),
    Case("depth taps fwd k2 s2 op1 bias", "fwd", ((2, 4, 5, 5, 8), (2, 2, 2, 1, 8)), (2, 2, 2), 2, 0,
         base.DEPTH_TAPS, groups=8, output_padding=1, bias=True),
    Case("polyphase bwd_w NXC bf16", "bwd_w", ((2, 5, 5, 16), (2, 10, 10, 16)), (4, 4), 2, 1, base.POLYPHASE,
         dtype=BF16, weights_shape=(4, 4, 16, 16)),
    # zero fills: outputs of a phase that its taps do not reach (output_padding)
    Case("polyphase fwd fills op1", "fwd", ((2, 5, 5, 6), (3, 3, 4, 6)), (3, 3), 2, 0, base.POLYPHASE,
         output_padding=1),
    # a bias over a result past HOST_BIAS_ELEMENTS: one BiasAdd after the phases
    Case("polyphase fwd bias stage", "fwd", ((2, 16, 16, 8), (4, 4, 40, 8)), (4, 4), 2, 1, base.POLYPHASE,
         bias=True),
    Case("polyphase fwd bias stage NCX", "fwd", ((2, 8, 16, 16), (8, 40, 4, 4)), (4, 4), 2, 1, base.POLYPHASE,
         "NCX", "IOX", bias=True),
    # emulated plans: f32 phases of a bf16 call, its arrays converted in C++
    Case("polyphase in f32 bwd_d bf16", "bwd_d", ((2, 10, 10, 4), (4, 4, 4, 6)), (4, 4), 2, 1,
         base.POLYPHASE + lowering.IN_F32, dtype=BF16),
    Case("depth taps in f32 k4 s2 bf16", "bwd_d", ((3, 8, 6, 6, 8), (4, 4, 4, 1, 8)), (4, 4, 4), 2, 1,
         base.DEPTH_TAPS + lowering.IN_F32, groups=8, dtype=BF16),
    Case("depth taps in f32 fwd k2 s2 bf16", "fwd", ((2, 4, 5, 5, 8), (2, 2, 2, 1, 8)), (2, 2, 2), 2, 0,
         base.DEPTH_TAPS + lowering.IN_F32, groups=8, dtype=BF16),
]
NATIVE_BF16 = next(c for c in CASES if c.name == "polyphase bwd_w NXC bf16")
EMULATED = [c for c in CASES if c.lowering.endswith(lowering.IN_F32)]
#: one library op per step into out= windows, kept planes, zero fills, a BiasAdd after
INTO_OUT = [c for c in CASES if c.code == "f32" and c.name not in ("polyphase fwd NXC", "polyphase fwd NCX")]


def _force(monkeypatch: Any, name: str) -> None:
    """The rules choose ``name`` for every problem that has it. A BackwardData phase runs as
    a Convolution, the kind whose sum the library fuses (which the executor needs: a part
    NumPy adds keeps the Python path), so that the plans are the same whatever this CPU's
    table or ISA cap chooses for the phases; other phases keep their rules."""
    original = lowering.rule

    def rule(p: Any, native: bool = False, phase: bool = False) -> str:
        if phase:
            if p.op == BACKWARD_DATA and base.CONVOLUTION in lowering.candidates(p, native=native):
                return base.CONVOLUTION
            return original(p, native=native, phase=phase)
        if name not in lowering.candidates(p, native=native):
            return original(p, native=native, phase=phase)
        return name

    monkeypatch.setattr(lowering, "rule", rule)


class PythonRuns:
    """Counts the calls that ran the phased plan's Python path, and keeps the arrays the
    first one was given (to run that path on other arrays)."""

    def __init__(self, monkeypatch: Any) -> None:
        self.count = 0
        self.arrays: list[Any] = []
        self.run: Callable[..., Any] = plan.PhasedPlan.run

        def counted(this: Any, arrays: Any, out: Any) -> Any:
            self.count += 1
            self.arrays = list(arrays)
            return self.run(this, arrays, out)

        monkeypatch.setattr(plan.PhasedPlan, "run", counted)

    def python_path(self, phased: Any, arrays: list[np.ndarray], out: Optional[np.ndarray] = None) -> Any:
        """The plan's Python path on ``arrays`` in place of the first call's arrays."""
        given = iter(arrays)
        full = [next(given) if isinstance(a, np.ndarray) else a for a in self.arrays]
        return self.run(phased, full, out)


def _has_executor(phased: Any, name: str) -> None:
    """Assert the phased plan has its executor, or skip where this CPU's library fuses no
    sum for its phases (a CPU whose guards forbid the Convolution phases): NumPy adds them
    there, on the Python path."""
    unfused = [i for i, ph in enumerate(phased.lowering.phases) if ph.accumulate and not (phased.sums and phased.sums[i])]
    if unfused and phased.executor is None:
        pytest.skip("the library fuses no sum for these phases here: NumPy adds them, on the Python path")
    assert isinstance(phased.executor, native.PhasedExecutor), name


def _planned(monkeypatch: Any, case: Case, out: Optional[np.ndarray] = None) -> tuple[Any, Any, PythonRuns]:
    """The case's op after one call, its phased plan, and the counter of Python runs."""
    emulated = case.lowering.endswith(lowering.IN_F32)
    if case.code == "bf16" and not emulated and not base.parts_native("bf16"):
        pytest.skip("no native bf16 phases on this CPU")
    if emulated and not native.fast_conversion:
        pytest.skip("no AVX2 and F16C: the emulated executor's conversions need them")
    _force(monkeypatch, case.lowering)
    runs = PythonRuns(monkeypatch)
    op = case.make()
    op(*case.arrays(0), out=out)
    phased = op.last_plan
    assert isinstance(phased, plan.PhasedPlan), op.lowering
    assert op.lowering.startswith(case.lowering.removesuffix(lowering.IN_F32)), op.lowering
    assert phased.emulated == emulated
    _has_executor(phased, op.lowering)
    assert phased.executor.steps >= sum(p is not None for p in phased.plans)  # (and zero fills, a BiasAdd)
    assert runs.count == 1
    return op, phased, runs


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_later_calls_run_the_executor(monkeypatch: Any, case: Case) -> None:
    """Calls after the first, on fresh arrays, skip the Python path and give its bits and the
    reference's values."""
    op, phased, runs = _planned(monkeypatch, case)
    for seed in (1, 2):
        arrays = case.arrays(seed)
        got = op(*arrays)
        assert runs.count == 1, "a later call ran the Python path"
        assert_close(got, case.reference(arrays), case.code, case.reduction, case.name)
        slow = runs.python_path(phased, arrays)
        assert got.dtype == slow.dtype
        assert np.array_equal(got.view(np.uint8), slow.view(np.uint8)), "the executor's bits differ from Python's"


@pytest.mark.parametrize("case", INTO_OUT, ids=[c.name for c in INTO_OUT])
def test_out_arrays(monkeypatch: Any, case: Case) -> None:
    """A plan made for an out= array runs later calls into other out= arrays of its layout;
    an out= that overlaps an input is refused on the op's path, as without the executor."""
    shape = case.reference(case.arrays(0)).shape
    op, _, runs = _planned(monkeypatch, case, out=np.empty(shape, case.dtype))
    arrays = case.arrays(3)
    out = np.full(shape, np.nan, case.dtype)
    assert op(*arrays, out=out) is out
    assert runs.count == 1
    assert_close(out, case.reference(arrays), case.code, case.reduction, case.name)
    # out= sharing memory with an input: the executor declines, the op's check refuses it
    shared = np.empty(math.prod(shape) + arrays[0].size, case.dtype)
    first = shared[: arrays[0].size].reshape(arrays[0].shape)
    first[...] = arrays[0]
    with pytest.raises(ValueError, match="overlap|share|alias"):
        op(first, *arrays[1:], out=shared[: math.prod(shape)].reshape(shape))


def test_other_layouts_take_the_python_path(monkeypatch: Any) -> None:
    """Arrays of the same shapes in another memory layout do not match the executor: the
    call plans them anew (its own executor) and stays right; the first plan's executor
    serves its layout again after."""
    case = CASES[2]
    op, _, runs = _planned(monkeypatch, case)
    arrays = case.arrays(4)
    strided = np.empty((*arrays[0].shape[:-1], 2 * arrays[0].shape[-1]), case.dtype)[..., ::2]
    strided[...] = arrays[0]
    got = op(strided, arrays[1])
    assert runs.count == 2
    assert_close(got, case.reference(arrays), case.code, case.reduction, "strided diff_dst")
    again = op(*case.arrays(5))
    assert runs.count == 3  # the op's fast path holds the last plan's executor only
    assert_close(again, case.reference(case.arrays(5)), case.code, case.reduction, "dense again")


@pytest.mark.parametrize("case", EMULATED, ids=[c.name for c in EMULATED])
def test_emulated_executor_reads_strided_arrays(monkeypatch: Any, case: Case) -> None:
    """An emulated plan made for a strided bf16 diff_dst (every other channel of a wider
    array) converts such arrays from their strides on later calls: the Python path's bits."""

    def strided(a: np.ndarray) -> np.ndarray:
        wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)[..., 1::2]
        wide[...] = a
        return wide

    _force(monkeypatch, case.lowering)
    runs = PythonRuns(monkeypatch)
    op = case.make()
    first = case.arrays(0)
    op(strided(first[0]), first[1])
    phased = op.last_plan
    assert phased.emulated
    _has_executor(phased, op.lowering)
    for seed in (1, 2):
        arrays = case.arrays(seed)
        got = op(strided(arrays[0]), arrays[1])
        assert runs.count == 1
        assert_close(got, case.reference(arrays), case.code, case.reduction, case.name)
        slow = runs.python_path(phased, [strided(arrays[0]), arrays[1]])
        assert np.array_equal(got.view(np.uint16), slow.view(np.uint16))


def test_non_finite_bf16_results_are_redone(monkeypatch: Any) -> None:
    """A native bf16 phased call whose result holds an Inf or NaN leaves the executor (which
    checks the whole result after its steps) for the Python path, which redoes it as
    without the executor: the same bits."""
    case = NATIVE_BF16
    op, phased, runs = _planned(monkeypatch, case)
    arrays = case.arrays(6)
    arrays[0][0, 1, 1, 3] = np.inf
    got = op(*arrays)
    assert runs.count == 2
    slow = runs.python_path(phased, arrays)
    assert np.array_equal(got.view(np.uint16), slow.view(np.uint16))


def _reorder(n: int) -> Any:
    """A compiled library op of one input (a dense f32 copy of n elements)."""
    desc = ([n], [1], "f32")
    return native.compile("Reorder", {}, [desc], desc)


def _layout(n: int) -> tuple[Any, list[int], list[int]]:
    return (np.dtype(np.float32), [n], [4])


@pytest.mark.parametrize("step, why", [
    ((0, [1], "sources"), "a source"),
    ((8, [0], "input"), "outside its array"),
    ((-4, [0], "input"), "outside its array"),
    ((0, [-2], "sources"), "a source"),
])
def test_steps_outside_their_arrays_are_refused(step: Any, why: str) -> None:
    """The constructor checks every step's tensors against the layouts it was given: an
    offset or source that would read or write outside an array is a ValueError, never a
    step that runs."""
    offset, sources, _ = step
    with pytest.raises(ValueError, match=why):
        native.PhasedExecutor([(_reorder(4), sources, [offset], 0, [])], [_layout(5)], _layout(4))
    with pytest.raises(ValueError, match="outside the result"):
        native.PhasedExecutor([(_reorder(4), [0], [0], 4, [])], [_layout(4)], _layout(4))
    with pytest.raises(ValueError, match="kept plane"):
        native.PhasedExecutor([(_reorder(4), [0], [0], 0, [4])], [_layout(4)], _layout(4))
    with pytest.raises(ValueError, match="zeroed window"):
        native.PhasedExecutor([(12, [2], [4])], [_layout(4)], _layout(4))
    with pytest.raises(ValueError, match="zeroed window"):
        native.PhasedExecutor([(0, [2], [-4])], [_layout(4)], _layout(4))


def test_a_hand_made_executor_runs_its_steps() -> None:
    """Two steps on one input at byte offsets: each copies its window into the result's; a
    third sets a window of the result to zeros."""
    executor = native.PhasedExecutor([(_reorder(3), [0], [0], 0, []), (_reorder(3), [0], [8], 12, [])],
                                     [_layout(5)], _layout(6))
    x = np.arange(5, dtype=np.float32)
    got = executor.run((x,), None)
    np.testing.assert_array_equal(got, [0, 1, 2, 2, 3, 4])
    zeroed = native.PhasedExecutor([(_reorder(3), [0], [0], 0, []), (_reorder(3), [0], [8], 12, []), (4, [2], [8])],
                                   [_layout(5)], _layout(6))
    np.testing.assert_array_equal(zeroed.run((x,), None), [0, 0, 2, 0, 3, 4])
    with pytest.raises(native.SignatureMismatch):
        executor.run((x[:4],), None)
    with pytest.raises(native.SignatureMismatch):
        executor.run((x.astype(np.float64),), None)


def test_torch_calls_run_the_executor(monkeypatch: Any) -> None:
    """onednn_convt.torch runs a polyphase signature's later calls on the tensors' addresses
    (``run_pointers``): torch's values on fresh tensors, one call through the op's path."""
    torch = pytest.importorskip("torch")
    oct = pytest.importorskip("onednn_convt.torch")
    from onednn_convt import torch_run

    _force(monkeypatch, base.POLYPHASE)
    monkeypatch.setattr(torch_run, "_FAST", {})
    torch_run._op.cache_clear()
    through_op = []
    original = torch_run._run_op
    monkeypatch.setattr(torch_run, "_run_op", lambda *a, **k: through_op.append(1) or original(*a, **k))
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(6, 4, 4, 4, generator=gen)  # IOX: (IC, OC, kH, kW)
    for _ in range(3):
        x = torch.randn(2, 6, 5, 5, generator=gen).to(memory_format=torch.channels_last)  # NXC
        got = oct.conv_transpose2d(x, w, None, 2, 1)
        want = torch.nn.functional.conv_transpose2d(x.double(), w.double(), None, 2, 1)
        assert_close(got.numpy(), want.numpy(), "f32", 6 * 16)
    assert len(through_op) == 1
    (fast,) = [f for f in torch_run._FAST.values() if f is not None]
    assert isinstance(fast.executor, native.PhasedExecutor)


def test_a_hand_made_executor_emulates() -> None:
    """An f32 executor made to take bf16 arrays converts them (any strides), runs its steps
    in f32 and rounds the result; other shapes, or an executor that is not f32, refused."""
    if not native.fast_conversion:
        pytest.skip("no AVX2 and F16C")
    executor = native.PhasedExecutor([(_reorder(3), [0], [0], 0, []), (_reorder(3), [0], [8], 12, [])],
                                     [_layout(5)], _layout(6))
    x = (np.arange(10, dtype=np.float32) / 4).astype(BF16)[::2]  # 0, 0.5, ..., 2: strided bf16
    emulating = executor.emulating([(BF16, [5], [4])], (BF16, [6], [2]), "bf16")
    got = emulating.run((x,), None)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got.astype(np.float32), [0, 0.5, 1, 1, 1.5, 2])
    with pytest.raises(ValueError, match="emulation"):
        executor.emulating([(BF16, [4], [2])], (BF16, [6], [2]), "bf16")
    with pytest.raises(ValueError, match="emulation"):
        emulating.emulating([(BF16, [5], [2])], (BF16, [6], [2]), "bf16")
    with pytest.raises(ValueError, match="emulation"):
        executor.emulating([(BF16, [5], [2])], (BF16, [6], [2]), "f32")

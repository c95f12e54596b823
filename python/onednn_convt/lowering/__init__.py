"""How each call is lowered onto the library: the candidates, the rules, autotuning.

A call's op checks it and describes it as a :class:`onednn_convt.problem.Problem`. This
package does the rest:

- :func:`candidates` lists the lowerings that can run the problem (the library's own op,
  its Convolution forms on the same weights memory, MatMuls; per op in :mod:`.forward`,
  :mod:`.backward_data`, :mod:`.backward_weights`), leaving out those a guard of
  :mod:`onednn_convt.guards` forbids on this CPU;
- a strided problem also has its polyphase form (:mod:`.polyphase`: stride-1 ops on strided
  views), each phase lowered by the rules; a problem of 2-8 groups its per-group form
  (:mod:`.per_group`: an ungrouped op per group on channel slices), for the tuner; a bf16/f16 one also has it in f32
  (``"Polyphase in f32"``: the inputs converted once, the f32 phases, the result rounded
  once), the polyphase form there is where the CPU has no native kernels for the dtype;
  a 3-D depthwise one its depth taps (:mod:`.depth_taps`: 2-D ops on plane views, summed;
  ``"Depth taps in f32"`` for bf16/f16), which the rules choose where they were measured
  faster, and an NCX one whose NXC taps merge its samples those taps between reorders
  (``"Channels-last depth taps"``);
- a native bf16 NXC BackwardData with few diff_dst channels and a stride along its last
  spatial dim has its space-to-depth form (:mod:`.space_to_depth`: a stride-1 op there over
  diff_dst's blocks, their elements as channels), the blocked problem's op chosen by the rules;
- an NCX problem also has its channels-last form (:mod:`.channels_last`: the NXC problem's
  library op between reorders of the activations), the NXC op chosen by the rules;
- a bf16/f16 problem also has each library op computed in f32 (``"<name> in f32"``: the
  inputs converted, the f32 kernel, the result rounded), since some of oneDNN 3.2's native
  low-precision kernels are far slower than its f32 ones (f16 BackwardWeights on an
  AVX512-FP16 CPU: 15 s where f32 takes 0.03 s);
- :func:`rule` picks one of them when autotuning is off: the choice of the table measured on
  this CPU at its ISA class, or of the conservative default table, for the problem class
  (:mod:`.rules_table`), else the hand-written rules (:func:`onednn_convt.lowering.rules.fallback`);
- :mod:`.autotune` (when on) times them all on the first call of each signature and keeps
  the fastest, in a cache that persists across processes;
- :func:`build` turns a name into the :class:`Lowering` that the op compiles.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Problem
from . import (
    backward_data, backward_weights, base, channels_last, depth_taps, forward, lifted, per_group, polyphase, rules,
    space_to_depth,
)
from .base import (
    CHANNELS_LAST, DEPTH_TAPS, DEPTH_TAPS_CHANNELS_LAST, LIFTED, MATMUL, PER_GROUP, POLYPHASE, SPACE_TO_DEPTH, Lowering,
)

__all__ = ["IN_F32", "Lowering", "build", "candidates", "rule"]

#: the suffix of a candidate computed in f32 (a bf16/f16 problem's library op)
IN_F32 = " in f32"

_CANDIDATES: dict[str, Callable[[Problem], list[str]]] = {
    FORWARD: forward.candidates, BACKWARD_DATA: backward_data.candidates,
    BACKWARD_WEIGHTS: backward_weights.candidates,
}
_BUILD: dict[str, Callable[[Problem, str], Lowering]] = {
    FORWARD: forward.build, BACKWARD_DATA: backward_data.build, BACKWARD_WEIGHTS: backward_weights.build,
}


def candidates(p: Problem, *, native: bool = False) -> list[str]:
    """Names of the lowerings that can run ``p`` on this CPU, the rules' choice first.
    ``native`` (a ``strict=True`` op): without the library ops computed in f32 for speed."""
    names = _valid(p, native)
    chosen = _choose(p, names)
    return [chosen] + [n for n in names if n != chosen]


def rule(p: Problem, *, native: bool = False, phase: bool = False) -> str:
    """The lowering that runs ``p`` when autotuning is off: the measured table's choice
    (:func:`onednn_convt.lowering.rules.measured`) where it has one that can run ``p``,
    else the hand-written rules' (:func:`onednn_convt.lowering.rules.fallback`).
    ``native`` as for :func:`candidates`; ``phase``: ``p`` is a part of a polyphase or
    per-group lowering (chosen for by the table's layers that choose phases)."""
    return _choose(p, _valid(p, native), phase)


#: the lowerings the rules choose apart from the tables, by name: each module's
#: ``MEASURED_ON`` (its rule per CPU measured) and ``ELSEWHERE`` (on other CPUs)
MEASURED_APART = {LIFTED: lifted, DEPTH_TAPS: depth_taps}


def measured_apart() -> dict[str, str]:
    """Which rule each lowering of :data:`MEASURED_APART` follows on this CPU, by lowering
    name (``info()["rules"]["measured_apart"]``): the one measured on it, else where it ran
    faster on every CPU measured, else none."""
    here = rules.this_cpu()
    out = {}
    for name, module in MEASURED_APART.items():
        measured = ", ".join(f"{arch} at {isa}" for arch, isa in sorted(module.MEASURED_ON))
        if here in module.MEASURED_ON:
            out[name] = f"this CPU's own rule ({here[0]} at {here[1]})"
        elif module.ELSEWHERE is not None:
            out[name] = f"not measured on {here[0]} at {here[1] or 'its ISA'}: where it ran faster on every CPU measured ({measured})"
        else:
            out[name] = "none: the tables choose"
    out[DEPTH_TAPS_CHANNELS_LAST] = (f"this CPU's own rule ({here[0]} at {here[1]})" if here in depth_taps.CHANNELS_LAST_ON
                                     else f"not measured on {here[0]} at {here[1] or 'its ISA'}: the tuner's alone")
    return out


def _choose(p: Problem, names: list[str], phase: bool = False) -> str:
    chosen = lifted.choice(p, names) or depth_taps.choice(p, names)  # measured apart from the tables
    if chosen is None:
        chosen = rules.measured(p, names, phase=phase)
    if chosen not in names:
        chosen = rules.fallback(p)
    assert chosen in names, (chosen, names)
    return chosen


def _valid(p: Problem, native: bool) -> list[str]:
    own = _CANDIDATES[p.op](p)
    names = list(own)
    in_f32: list[str] = []
    if p.dtype in ("bf16", "f16") and len(names) > 1 and not native:
        built = [_BUILD[p.op](p, n) for n in names]
        in_f32 = [n + IN_F32 for n, low in zip(names, built) if not low.f32_only and low.kind != MATMUL]
    # (the NXC problem has the same guards: under a guard's route, channels-last runs it too)
    if channels_last.applies(p) and _wrapped_names(channels_last.nxc_problem(p)):
        names.append(CHANNELS_LAST)
    if lifted.applies(p, own) and _wrapped_names(lifted.plane_problem(p)):
        names.append(LIFTED)
    # (a guarded problem has one candidate of its own, the guard's route: it keeps it alone)
    if space_to_depth.applies(p) and len(own) > 1 and _space_to_depth_inner(space_to_depth.blocked_problem(p)):
        names.append(SPACE_TO_DEPTH)
    names += in_f32
    if polyphase.applies(p):  # its stride-1 phases are kept from every stride guard's kernels too
        names.append(POLYPHASE)
    if polyphase.applies_in_f32(p) and not native:
        names.append(POLYPHASE + IN_F32)
    if per_group.applies(p):
        names.append(PER_GROUP)
    if depth_taps.applies(p):
        names.append(DEPTH_TAPS)
    if depth_taps.applies_in_f32(p) and not native:
        names.append(DEPTH_TAPS + IN_F32)
    if depth_taps.applies_channels_last(p):
        names.append(DEPTH_TAPS_CHANNELS_LAST)
    if depth_taps.applies_channels_last_in_f32(p) and not native:
        names.append(DEPTH_TAPS_CHANNELS_LAST + IN_F32)
    return names


#: the lowerings made of several ops (a part of one cannot be one of them)
_PARTED = (POLYPHASE, POLYPHASE + IN_F32, PER_GROUP, DEPTH_TAPS, DEPTH_TAPS + IN_F32, DEPTH_TAPS_CHANNELS_LAST,
           DEPTH_TAPS_CHANNELS_LAST + IN_F32)


def _part_rule(p: Problem) -> str:
    """The lowering of ``p``, a part of a polyphase or per-group lowering: :func:`rule`'s
    (``phase``), unless that is itself made of parts (a grouped stride-1 phase's per-group
    form); then the rules' choice among the lowerings that run as one op."""
    chosen = rule(p, native=True, phase=True)
    if chosen not in _PARTED:
        return chosen
    return _choose(p, [n for n in _valid(p, True) if n not in _PARTED], phase=True)


def _wrapped_names(q: Problem) -> list[str]:
    """The candidates of ``q`` (the problem a wrapping lowering computes: an NCX problem's
    NXC form, a 1-D problem's 2-D one) that the wrapper can run (one library op on the
    arrays: :func:`.base.one_library_op`), native."""
    return [n for n in _CANDIDATES[q.op](q) if base.one_library_op(_BUILD[q.op](q, n))]


def _space_to_depth_inner(q: Problem) -> Optional[str]:
    """The rules' choice among the lowerings of ``q`` (:func:`.space_to_depth.blocked_problem`)
    that can run inside the space-to-depth form: one library op, native, under no guard (a
    guard's route, or one computed in f32, would skip the check of the result for the NaNs
    its zeros can make); None if there is none."""
    names = []
    for n in _CANDIDATES[q.op](q):
        low = _BUILD[q.op](q, n)
        if base.one_library_op(low) and low.guard is None and not low.f32_only:
            names.append(n)
    return _ruled(q, names)


def _wrapped_inner(q: Problem) -> Optional[str]:
    """The rules' choice among :func:`_wrapped_names` of ``q``; None if there is none."""
    return _ruled(q, _wrapped_names(q))


def _ruled(q: Problem, names: list[str]) -> Optional[str]:
    """The rules' choice among ``names`` of ``q``; None if there is none."""
    if not names:
        return None
    chosen = rules.measured(q, names)
    if chosen not in names:
        chosen = rules.fallback(q)
    return chosen if chosen in names else names[0]


def build(p: Problem, name: str) -> Lowering:
    """The lowering called ``name`` (one of :func:`candidates`) of ``p``."""
    small = rules.single_threaded(p)
    if name == POLYPHASE:  # each phase's stride-1 problem lowered by the rules
        return replace(polyphase.build(p, lambda sub: build(sub, _part_rule(sub))), single_thread=small)
    if name == PER_GROUP:  # each group's ungrouped problem lowered by the rules
        return replace(per_group.build(p, lambda sub: build(sub, _part_rule(sub))), single_thread=small)
    if name == DEPTH_TAPS:  # each tap's 2-D problem lowered by the rules
        return replace(depth_taps.build(p, lambda sub: build(sub, _part_rule(sub))), single_thread=small)
    if name == DEPTH_TAPS_CHANNELS_LAST:  # the NXC problem's depth taps, between reorders
        taps = build(channels_last.nxc_problem(p), DEPTH_TAPS)
        return replace(channels_last.build(p, taps), name=name, single_thread=small)
    if name in (POLYPHASE + IN_F32, DEPTH_TAPS + IN_F32, DEPTH_TAPS_CHANNELS_LAST + IN_F32):
        # the f32 problem's parts, its inputs converted once
        return replace(build(replace(p, dtype="f32"), name[: -len(IN_F32)]), f32_only=True, name=name)
    if name == CHANNELS_LAST:
        q = channels_last.nxc_problem(p)
        inner = _wrapped_inner(q) if channels_last.applies(p) else None
        if inner is None:
            raise ValueError(f"{p.op}: no lowering named {name!r} for this problem")
        return replace(channels_last.build(p, build(q, inner)), single_thread=small)
    if name == LIFTED:
        q = lifted.plane_problem(p)
        inner = _wrapped_inner(q) if lifted.applies(p, _CANDIDATES[p.op](p)) else None
        if inner is None:
            raise ValueError(f"{p.op}: no lowering named {name!r} for this problem")
        return replace(lifted.build(p, build(q, inner)), single_thread=small)
    if name == SPACE_TO_DEPTH:
        q = space_to_depth.blocked_problem(p)
        inner = _space_to_depth_inner(q) if space_to_depth.applies(p) else None
        if inner is None:
            raise ValueError(f"{p.op}: no lowering named {name!r} for this problem")
        own_op = _BUILD[p.op](p, rules.backward_data_kind(p.geometry.dilations, p.data_format))
        return replace(space_to_depth.build(p, build(q, inner), own_op), single_thread=small)
    if name.endswith(IN_F32):
        base_name = name[: -len(IN_F32)]
        low = forward.build(p, base_name, in_f32=True) if p.op == FORWARD else _BUILD[p.op](p, base_name)
        return replace(low, f32_only=True, name=name, single_thread=small)
    low = _BUILD[p.op](p, name)
    return replace(low, single_thread=small) if small else low

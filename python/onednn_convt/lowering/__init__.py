"""How each call is lowered onto the library: the candidates, the rules, autotuning.

A call's op checks it and describes it as a :class:`onednn_convt.problem.Problem`. This
package does the rest:

- :func:`candidates` lists the lowerings that can run the problem (the library's own op,
  its Convolution forms on the same weights memory, MatMuls; per op in :mod:`.forward`,
  :mod:`.backward_data`, :mod:`.backward_weights`), leaving out those a guard of
  :mod:`onednn_convt.guards` forbids on this CPU;
- :func:`onednn_convt.lowering.rules.rule` picks one of them from measured rules;
- :mod:`.autotune` (when on) times them all on the first call of each signature and keeps
  the fastest, in a cache that persists across processes;
- :func:`build` turns a name into the :class:`Lowering` that the op compiles.
"""

from __future__ import annotations

from typing import Callable

from ..problem import BACKWARD_DATA, BACKWARD_WEIGHTS, FORWARD, Problem
from . import backward_data, backward_weights, forward
from .base import Lowering
from .rules import rule

__all__ = ["Lowering", "build", "candidates", "rule"]

_CANDIDATES: dict[str, Callable[[Problem], list[str]]] = {
    FORWARD: forward.candidates, BACKWARD_DATA: backward_data.candidates,
    BACKWARD_WEIGHTS: backward_weights.candidates,
}
_BUILD: dict[str, Callable[[Problem, str], Lowering]] = {
    FORWARD: forward.build, BACKWARD_DATA: backward_data.build, BACKWARD_WEIGHTS: backward_weights.build,
}


def candidates(p: Problem) -> list[str]:
    """Names of the lowerings that can run ``p`` on this CPU, the rules' choice first."""
    names = _CANDIDATES[p.op](p)
    chosen = rule(p)
    assert chosen in names, (chosen, names)
    return [chosen] + [n for n in names if n != chosen]


def build(p: Problem, name: str) -> Lowering:
    """The lowering called ``name`` (one of :func:`candidates`) of ``p``."""
    return _BUILD[p.op](p, name)

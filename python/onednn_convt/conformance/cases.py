"""Cases from graphs: :func:`build_case` applies a harness line's overrides to a graph JSON
and checks the result (:mod:`.op_case` for one op, :mod:`.patterns` for a fused graph of
several), and the bounds of one collect (:class:`Budget`, :class:`Loader`).

A graph of several ops is a *pattern* case when it is a ConvTranspose with the ops the
package fuses around it (Dequantize, BiasAdd, post-ops, Quantize:
:mod:`onednn_convt.conformance.patterns`); the case then carries a :class:`~.patterns.Pattern`
and runs as one fused ``ConvTranspose`` call. Each case is checked with work proportional to
its graph's size (a graph of more ops than a pattern has is SKIPPED before anything else).
"""

from __future__ import annotations

import traceback
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Union

from . import graph_json, op_case, patterns
from .graph import Graph, GraphJSONError
from .graph_json import FileTooLarge, short
from .model import ERROR, INVALID, SKIPPED, Case, CaseError, Overrides


def build_case(
    graph: Union[Graph, GraphJSONError],
    ov: Overrides,
    *,
    id: str,
    location: str,
    root: str,
    path: str,
) -> Case:
    """Apply the overrides to a graph and check the result.

    Args:
        graph: the parsed JSON, or the error that reading it raised.
        ov: the case's settings.
        id, location, root, path: see :class:`Case`.

    Returns:
        A runnable case, or one whose status is INVALID or SKIPPED with the reason.
    """
    case = Case(id=id, location=location, root=root, path=path)
    try:
        if isinstance(graph, FileTooLarge):
            raise CaseError(SKIPPED, str(graph))
        if isinstance(graph, GraphJSONError):
            raise CaseError(INVALID, str(graph))
        _fill(case, graph, ov)
    except CaseError as e:
        case.status, case.reason = e.status, e.reason
    except Exception as e:  # noqa: BLE001 - a bug here: this case is an ERROR, the others run
        case.status = ERROR
        case.reason = f"checking the case: {type(e).__name__}: {short(str(e))}\n{traceback.format_exc(limit=-3)}"
    return case


def _fill(case: Case, graph: Graph, ov: Overrides) -> None:
    if not graph.ops:
        raise CaseError(
            INVALID, "the graph has 0 ops (none); the runner takes a single ConvTranspose op"
        )
    if len(graph.ops) > 1:
        patterns.build(case, graph, ov)
        return
    op_case.fill_single(case, graph, ov)


#: Most cases one :func:`collect` expands to (a bundled harness file has a few hundred; a
#: harness file that sweeps or includes itself into more is INVALID past this).
MAX_CASES = 20_000
#: Most harness files one :func:`collect` reads (``--batch`` inclusions included).
MAX_HARNESS_FILES = 1_000
#: Most work one :func:`collect` does: the characters of the cases' lines plus the entries
#: (ops, attributes, tensors) of the graph each case checks, summed over the cases.
MAX_WORK = 1 << 26
#: Parsed graph files kept for the next case that names them: at most this many entries
#: (ops, attributes, tensors; a bundled case has about 15) in all.
LOADER_CACHE = 200_000


@dataclass
class Budget:
    """What one :func:`collect` may still expand to: cases, harness files to read, and
    work (:data:`MAX_WORK`)."""

    cases: int = field(default_factory=lambda: MAX_CASES)
    files: int = field(default_factory=lambda: MAX_HARNESS_FILES)
    work: int = field(default_factory=lambda: MAX_WORK)


class Loader:
    """Reads each JSON file once (the files read last are kept, up to :data:`LOADER_CACHE`
    graph entries, so that memory stays bounded)."""

    def __init__(self) -> None:
        self._graphs: OrderedDict[str, Union[Graph, GraphJSONError]] = OrderedDict()
        self._entries = 0

    def __call__(self, path: str) -> Union[Graph, GraphJSONError]:
        graph = self._graphs.pop(path, None)
        if graph is None:
            try:
                graph = graph_json.load(path)
            except GraphJSONError as e:
                graph = e
            self._entries += _weight(graph)
        self._graphs[path] = graph  # the most recent last
        while self._entries > LOADER_CACHE and len(self._graphs) > 1:
            _, old = self._graphs.popitem(last=False)
            self._entries -= _weight(old)
        return graph


def _weight(graph: Union[Graph, GraphJSONError]) -> int:
    return graph.entries() if isinstance(graph, Graph) else 1



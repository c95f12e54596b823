"""Conformance runner: oneDNN graph JSON cases and benchdnn-style harness files in, verdicts out.

- :mod:`.graph_json`: read and check the graph JSON format; :mod:`.export`: write it (:func:`to_graph_json`).
- :mod:`.harness`: benchdnn's harness-file syntax.
- :mod:`.model`: a case and its tensors; :mod:`.op_case`: one op's case checked;
  :mod:`.cases`: a case (a JSON with overrides) built; :mod:`.collect`: :func:`collect` finds them.
- :mod:`.patterns`: graphs of several ops (ConvTranspose with Dequantize, BiasAdd,
  post-ops, Quantize) as one fused ``ConvTranspose`` call.
- :mod:`.fill`: benchdnn's deterministic integer fills.
- :mod:`.runner`: runs a case through the public API and judges it against the reference.
- :mod:`.report`: progress, JUnit XML, JSON, the summary line.
- :mod:`.cli`: ``onednn-convt conformance``; :mod:`.pytest_plugin`: ``pytest --conformance``.

The runner's contract on hostile input (:mod:`.runner` has the details): a malformed input
is INVALID with the file and the reason; a case the library refuses is SKIPPED or INVALID,
never ERROR (ERROR is a bug of this package); no input makes it hang, crash or exceed the
memory limit (``ONEDNN_CONVT_MEMORY_LIMIT``), and one bad file never stops the other cases.
"""

from __future__ import annotations

from .collect import collect
from .export import to_graph_json
from .graph import GraphJSONError
from .graph_json import load, loads
from .model import Case
from .judge import Result
from .runner import run_case, run_cases

__all__ = [
    "Case",
    "GraphJSONError",
    "Result",
    "collect",
    "load",
    "loads",
    "run_case",
    "run_cases",
    "to_graph_json",
]

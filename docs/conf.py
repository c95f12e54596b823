"""Sphinx configuration of the onednn-convt documentation.

Build (warnings are errors):

    pip install '.[docs]'
    sphinx-build -W --keep-going -b html docs docs/_build/html

Pages are MyST Markdown; the API reference comes from the docstrings (autodoc, with
napoleon for their Google-style sections), the CLI reference from the argument parser
(``_ext/cli_reference.py``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import onednn_convt

project = "onednn-convt"
author = "the onednn-convt developers"
copyright = "the onednn-convt developers, Apache-2.0"
release = onednn_convt.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "cli_reference",
    "package_tables",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

myst_heading_anchors = 3  # [text](page.md#a-heading) links
myst_enable_extensions = ["colon_fence"]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_type_aliases = {"ArrayLike": "numpy.typing.ArrayLike", "npt.ArrayLike": "numpy.typing.ArrayLike"}
autodoc_default_options = {"members": True, "undoc-members": False}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_attr_annotations = False
napoleon_use_ivar = True  # a dataclass's "Attributes:" as fields: autodoc documents its members too
if importlib.util.find_spec("torch") is None:  # onednn_convt.torch imports torch
    autodoc_mock_imports = ["torch"]

html_theme = "alabaster"
html_title = f"onednn-convt {release}"
html_theme_options = {"description": "oneDNN's ConvTranspose ops on NumPy arrays", "fixed_sidebar": True}

# Docstrings cite the project's decisions as "spec D9" or "spec.md D1-D6" (decisions D1-D14,
# documented on the deviations page): link each to its entry there.
_DECISION = re.compile(r"\bspec(?:\.md)? (D(\d+))(?:-D(\d+))?\b")
_BARE_DECISION = re.compile(r"\((D1[0-4]|D[1-9])\)")  # "... (D8)"


# The op classes list their attributes under "Attributes (keyword-only; ...):" with
# "name: text" entries, not a section napoleon knows: present them as a bullet list.
_ATTRIBUTES = re.compile(r"^(\s*)Attributes \(keyword-only; .*\):\s*$")
_ENTRY = re.compile(r"^([\w, ]+): (.*)$")


def _attribute_list(lines: list[str]) -> None:
    start = next((i for i, line in enumerate(lines) if _ATTRIBUTES.match(line)), None)
    if start is None:
        return
    indent = len(lines[start]) - len(lines[start].lstrip())
    out = [lines[start], ""]
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        line = lines[end]
        depth = len(line) - len(line.lstrip())
        entry = _ENTRY.match(line.strip())
        if entry and depth == indent + 4:  # "name: text" -> "- ``name``: text"
            out.append(" " * indent + f"- ``{entry.group(1)}``: {entry.group(2)}")
        elif line.strip():  # a continuation line of the entry above
            out.append(" " * (indent + 2) + line.strip())
        end += 1
    lines[start:end] = out + [""]


_RETURNS = re.compile(r"^(\s*)Returns:\s*$")


def _returns_field(lines: list[str]) -> None:
    """A "Returns:" section as a plain ``:returns:`` field: napoleon would read the text
    before a colon in it ("dst, (N, OC, X...) ... (an int8 op: f32 ...") as a type."""
    for start, line in enumerate(lines):
        m = _RETURNS.match(line)
        if m is None:
            continue
        indent = len(m.group(1))
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
            end += 1
        body = [ln.strip() for ln in lines[start + 1:end] if ln.strip()]
        if body:
            lines[start:end] = [" " * indent + ":returns: " + body[0], *(" " * (indent + 3) + b for b in body[1:]), ""]
        return


def _process_docstring(app, what, name, obj, options, lines) -> None:
    _attribute_list(lines)
    _returns_field(lines)
    _link_decisions(lines)


def _link_decisions(lines: list[str]) -> None:
    def link(m: re.Match[str]) -> str:
        first = int(m.group(2))
        text = f"decision D{first}" if m.group(3) is None else f"decisions D{first}-D{m.group(3)}"
        return f":ref:`{text} <decision-d{first}>`"

    for i, line in enumerate(lines):
        line = _DECISION.sub(link, line).replace("(spec seed 002)", "(:ref:`decision D14 <decision-d14>`)")
        lines[i] = _BARE_DECISION.sub(lambda m: f"(:ref:`{m.group(1)} <decision-d{m.group(1)[1:]}>`)", line)


def setup(app) -> None:
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)  # before napoleon

"""The package's import structure (README, "Files"): no import circle among its modules, no
module importing another's underscore names, and the C++ core imported in one place.

Read from the source with ``ast``: imports under ``if TYPE_CHECKING:`` do not run and do
not count; imports inside functions do.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "onednn_convt"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module imported, name taken from it or "") of each run-time import of the package's."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.dump(node.test) for n in ast.walk(node)}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if not base.startswith("onednn_convt"):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full, "") if full in modules or alias.name == "_core" else (base, alias.name))
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("onednn_convt")]
    return found


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, str]]]]:
    modules = _modules()
    imports = {name: _imports(name, path, modules) for name, path in modules.items()}
    edges: dict[str, set[str]] = {}
    for name, found in imports.items():
        # a package's own __init__ (its re-exports) is not a layer of its modules
        edges[name] = {m for m, _ in found if m in modules and m != name and not name.startswith(m + ".")}
    return edges, imports


def test_no_import_circle() -> None:
    edges, _ = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, f"import circles: {circles}"


def test_no_module_imports_another_modules_private_names() -> None:
    _, imports = _graph()
    private = [(name, f"{m}.{n}") for name, found in imports.items() for m, n in found
               if n.startswith("_") and n != "__version__" and m != name]
    assert not private, private


def test_only_native_imports_the_core() -> None:
    _, imports = _graph()
    importers = sorted(name for name, found in imports.items() if ("onednn_convt._core", "") in found)
    assert importers == ["onednn_convt.native"]

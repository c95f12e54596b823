"""``guards-table`` and ``rules-tables``: two tables generated from the package's own data,
so the pages never disagree with what the code does.

* ``{guards-table}``: :data:`onednn_convt.guards.GUARDS`, each known-bad oneDNN 3.2 kernel
  class with the dispatch ISAs and dtypes it is active on, its condition, route and evidence.
* ``{rules-tables}``: the shipped measured rules tables
  (:func:`onednn_convt.lowering.rules_table.tables` and the default), with their provenance.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("*", "\\*").replace("|", "\\|").replace("`", "\\`")


def _list_table(header: list[str], rows: list[list[str]], widths: str) -> list[str]:
    lines = [".. list-table::", "   :header-rows: 1", f"   :widths: {widths}", ""]
    for row in [header, *rows]:
        lines += [f"   * - {row[0]}", *(f"     - {c}" for c in row[1:])]
    return lines + [""]


class _Generated(Directive):
    has_content = False
    source = ""

    def lines(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(self.lines(), source=self.source), 0, container)
        return container.children


class GuardsTable(_Generated):
    source = "onednn_convt.guards.GUARDS"

    def lines(self) -> list[str]:
        from onednn_convt import guards

        rows = []
        for g in guards.GUARDS:
            where = []
            for code, isas in sorted(g.isas.items()):
                if not isas:
                    continue
                names = "every level" if isas == guards.EVERY_ISA else ", ".join(sorted(isas))
                where.append(f"{code}: {names}")
            rows.append([f"``{g.name}``", _cell("; ".join(where)), _cell(g.condition), _cell(g.route),
                         _cell(g.evidence)])
        return _list_table(["guard", "dtype: dispatch ISAs", "condition", "route", "evidence"], rows,
                           "14 16 22 22 26")


class RulesTables(_Generated):
    source = "onednn_convt.lowering.rules_table"

    def lines(self) -> list[str]:
        from onednn_convt.lowering import rules_table

        rows = []
        every = sorted(rules_table.tables().items())
        default = rules_table.default()
        for (cpu, isa), t in every + ([(("default", "any"), default)] if default else []):
            p = t.provenance
            rows.append([f"``{t.name}.json``", _cell(p.get("cpu_name") or cpu), _cell(isa),
                         _cell("yes" if p.get("capped") else "no"), _cell(", ".join(p.get("suites", []))),
                         str(len(t.entries)), _cell(p.get("date", "")), _cell(p.get("note", ""))])
        return _list_table(["table", "measured on", "dispatch ISA", "capped", "suites", "rules", "date", "note"],
                           rows, "14 16 10 6 12 6 8 28")


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("guards-table", GuardsTable)
    app.add_directive("rules-tables", RulesTables)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

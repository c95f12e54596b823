"""``cli-reference``: the ``onednn-convt`` command line, generated from its argument parser
(:func:`onednn_convt.cli.build_parser`), so the page never disagrees with ``--help``.

For the main command and each subcommand: its description, usage, and a table of its
positional arguments and options with their help texts.
"""

from __future__ import annotations

import argparse
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if "%(" in text:
        text = text % {"default": action.default, "prog": "onednn-convt", "choices": action.choices}
    return " ".join(text.replace("%%", "%").split())


def _rst_text(text: str) -> str:
    """Plain help text as reST: literal where it would be markup."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("`", "\\`").replace("|", "\\|").replace("_", "\\_")


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar if isinstance(action.metavar, str) else action.dest
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return ", ".join(f"{o} {metavar}" for o in action.option_strings)


def _paragraphs(text: str) -> list[str]:
    """A description or epilog as reST: a paragraph with indented lines (examples) as a
    literal block, the others as text."""
    lines: list[str] = []
    for para in text.strip("\n").split("\n\n"):
        if any(ln[:1].isspace() for ln in para.splitlines()):
            lines += ["::", ""] + ["    " + ln for ln in para.splitlines()] + [""]
        else:
            lines += [_rst_text(" ".join(para.split())), ""]
    return lines


def _parser_lines(parser: argparse.ArgumentParser, title: str, underline: str) -> list[str]:
    lines = [title, underline * len(title), ""]
    if parser.description:
        lines += _paragraphs(parser.description)
    formatter = parser._get_formatter()
    usage = formatter._format_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, "").strip()
    lines += ["::", ""] + ["    " + ln for ln in usage.splitlines()] + [""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            rows += [(name, _help(choice)) for name, choice in ((c.dest, c) for c in action._choices_actions)]
            continue
        if action.help == argparse.SUPPRESS:
            continue
        rows.append((_invocation(action), _help(action)))
    if rows:
        lines += [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", "",
                  "   * - argument", "     - meaning"]
        for name, text in rows:
            lines += [f"   * - ``{name}``", f"     - {_rst_text(text) or '(no help)'}"]
        lines.append("")
    if parser.epilog:
        lines += _paragraphs(parser.epilog)
    return lines


class CliReference(Directive):
    """``.. cli-reference::`` (MyST: a ``{cli-reference}`` fence): the whole command line."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from onednn_convt.cli import build_parser

        parser = build_parser()
        lines = _parser_lines(parser, "onednn-convt", "-")
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        for name, subparser in sub.choices.items():
            lines += _parser_lines(subparser, f"onednn-convt {name}", "-")
        container = nodes.section()
        container.document = self.state.document
        self.state.nested_parse(StringList(lines, source="onednn_convt.cli.build_parser()"), 0, container,
                                match_titles=True)
        return container.children


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("cli-reference", CliReference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

"""The documentation (``docs/``): every Python example on its pages runs, every command line
in them is one the CLI accepts, the site builds with warnings as errors (where the ``docs``
extra is installed), and the CLI reference it is generated from is complete: a description
for every subcommand, a help text for every option, ``--version``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import onednn_convt
import pytest
from onednn_convt import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```\s*$", re.DOTALL | re.MULTILINE)
HAS_TORCH = importlib.util.find_spec("torch") is not None


def blocks(page: Path, language: str) -> list[str]:
    """The fenced code blocks of ``page`` in ``language``, in order."""
    return [m.group(2) for m in FENCE.finditer(page.read_text(encoding="utf-8")) if m.group(1) == language]


def _name(page: Path) -> str:
    return str(page.relative_to(DOCS))


def test_the_pages_are_found() -> None:
    names = {_name(p) for p in PAGES}
    assert {"index.md", "api.md", "cli.md", "deviations.md", "performance.md", "cpus.md",
            "guide/quickstart.md"} <= names
    assert sum(len(blocks(p, "python")) for p in PAGES) >= 8


PYTHON_PAGES = [p for p in PAGES if blocks(p, "python")]

# Runs a page's blocks in order, in one namespace, each compiled with the page and block
# number as its file name so that a traceback says where it failed.
RUNNER = """
import json, sys
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for i, code in enumerate(blocks):
    if code is None:
        print(f"block {i + 1}: skipped (needs torch)")
        continue
    exec(compile(code, f"<{sys.argv[1]}, python block {i + 1}>", "exec"), namespace)
    print(f"block {i + 1}: ok")
"""


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_name)
def test_python_examples_run(page: Path, tmp_path: Path) -> None:
    """Each page's ``python`` blocks run in a fresh interpreter (autotuning's cache in a
    temporary folder); a block that uses torch is skipped where torch is not installed."""
    code = [None if ("torch" in b and not HAS_TORCH) else b for b in blocks(page, "python")]
    env = dict(os.environ, ONEDNN_CONVT_CACHE_DIR=str(tmp_path / "cache"), MPLBACKEND="Agg")
    env.pop("ONEDNN_CONVT_AUTOTUNE", None)
    proc = subprocess.run([sys.executable, "-c", RUNNER, _name(page)], input=json.dumps(code), cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.count(": ok") == sum(c is not None for c in code)


def _command_lines(page: Path) -> list[str]:
    """The ``onednn-convt ...`` commands of a page's ``sh`` blocks (continuations joined,
    leading ``VAR=value`` assignments dropped)."""
    out = []
    for block in blocks(page, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            words = [w for w in shlex.split(line, comments=True) if w not in ("(", ")")]
            while words and words[0].startswith("("):  # a subshell: ( VAR=x cmd ...
                words[0] = words[0][1:]
                words = [w for w in words if w]
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            if words and words[0] == "onednn-convt":
                out.append(shlex.join(words))
    return out


COMMANDS = [(_name(p), line) for p in PAGES for line in _command_lines(p)]


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[f"{p}: {c[:60]}" for p, c in COMMANDS])
def test_command_lines_parse(page: str, line: str) -> None:
    """Every ``onednn-convt`` command shown in the docs is accepted by the command's parser
    (not run: some take minutes)."""
    words = shlex.split(line)[1:]
    chosen = next((w for w in words if not w.startswith("-")), None)
    stdout = io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout):
            cli.build_parser({chosen}).parse_args(words)
    except SystemExit as e:  # --version and --help exit 0 after printing
        assert e.code == 0, f"{page}: {line}"


def test_json_examples_parse() -> None:
    for page in PAGES:
        for block in blocks(page, "json"):
            json.loads(block)


def test_the_api_reference_covers_the_package() -> None:
    api = (DOCS / "api.md").read_text(encoding="utf-8")
    missing = [name for name in onednn_convt.__all__
               if name not in ("LIBDNNL_PATH", "reference") and f"onednn_convt.{name}" not in api]
    assert not missing


def test_decisions_have_anchors() -> None:
    """Docstrings cite decisions D1-D14; the deviations page has a target for each."""
    text = (DOCS / "deviations.md").read_text(encoding="utf-8")
    assert [int(n) for n in re.findall(r"^\(decision-d(\d+)\)=$", text, re.MULTILINE)] == list(range(1, 15))


@pytest.mark.skipif(importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("myst_parser") is None,
                    reason="the docs extra is not installed (pip install '.[docs]')")
def test_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                           str(tmp_path / "html")], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    cli_page = (tmp_path / "html" / "cli.html").read_text(encoding="utf-8")
    assert "onednn-convt tune" in cli_page and "--layers-json" in cli_page


# -- the command line the CLI reference is generated from -------------------------------------
def _subparsers() -> dict:
    import argparse

    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_a_description_and_every_option_a_help() -> None:
    subs = _subparsers()
    assert set(subs) == set(cli.SUBCOMMANDS)
    for name, parser in subs.items():
        assert parser.description and len(parser.description) > 40, name
        for action in parser._actions:
            if action.dest != "help":
                assert action.help, f"onednn-convt {name} {action.option_strings or action.dest}: no help"


def test_help_texts_are_for_users() -> None:
    for name, parser in {"": cli.build_parser(), **_subparsers()}.items():
        text = parser.format_help()
        assert "issue" not in text.lower() and "``" not in text, name
    assert "Subcommands live" not in cli.build_parser().format_help()


def test_tune_help_gives_the_layers_json_format() -> None:
    text = " ".join(_subparsers()["tune"].format_help().split())
    for key in ('"name"', '"n"', '"ic"', '"oc"', '"spatial"', '"kernel"', '"stride"', '"pad"', "groups"):
        assert key in text, key


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"onednn-convt {onednn_convt.__version__} (oneDNN 3.")


def test_info_reports_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert onednn_convt.info()["onednn_convt_version"] == onednn_convt.__version__
    assert cli.main(["info"]) == 0
    assert json.loads(capsys.readouterr().out)["onednn_convt_version"] == onednn_convt.__version__

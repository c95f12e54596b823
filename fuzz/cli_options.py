"""Hostile command lines, files and environment of the ``onednn-convt`` command.

Each trial draws a subcommand (``conformance``, ``bench``, ``tune``, ``info``, ``demo``),
a few of its options, taken from the command's own parser (a new option is fuzzed with no
change here), and values for them: valid ones, odd spellings of valid ones, and hostile
ones (empty, blank, negative, NaN, inf, 400 digits, unicode, commas alone, paths to nothing,
to a directory, to ``/proc``, to ``/dev/zero``, above the working directory; a FIFO nobody
writes only where the command refuses FIFOs, the conformance inputs: elsewhere reading or
writing one blocks, as in any Unix tool, and a pipe from ``<(...)`` is a fair input). Files
it passes (``--compare``, ``--layers-json``, conformance PATHs, the autotuning cache) are
valid, or hostile: nested 100,000 deep, truncated, of the wrong shape, with wrong types,
NaN, huge numbers, bytes that are not UTF-8. The environment gets hostile values of the
package's variables (``ONEDNN_CONVT_*``) and of ``OMP_NUM_THREADS`` in some trials.

The command then runs as ``python -m onednn_convt ...`` in a child process whose working,
home and cache directories are a fresh temporary directory. ``bench`` and ``tune`` always
run with options that keep them short (the tiny suite, ``--quick``), placed first so the
fuzzed options override them.

A trial fails when the command prints a Python traceback, dies by a signal, exits with a
status other than 0 (done), 1 (a check or a run failed, said so) or 2 (refused, said so),
exits non-zero with no message, runs past :data:`COMMAND_TIMEOUT`, or writes a file
in the temporary directory outside the paths it was given.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
from harness import Failure
from onednn_convt import cli
from onednn_convt.conformance.collect import bundled_suite

NAME = "cli"
PER_PROCESS = 20
TIMEOUT = 240.0
#: what it fuzzes (options, files, environment) is the same at every ONEDNN_MAX_CPU_ISA level:
#: the slow tests run it natively only
ISA_DEPENDENT = False
#: seconds one command may run (the bench and tune runs are a few seconds)
COMMAND_TIMEOUT = 150.0

#: subcommand -> options given first, before the fuzzed ones (argparse keeps the last)
FIXED = {
    "bench": ["--suite", "tiny", "--quick", "--budget", "0.003", "--repeat", "2", "--no-chart"],
    "tune": ["--suite", "tiny"],
    "conformance": [],
    "info": [],
    "demo": [],
}
#: options a trial never gives: they only print and exit, or make a run long
NEVER = {"-h", "--help", "--version"}
#: options whose good values would run a long suite: only these values are drawn valid
SHORT_SUITES = ["tiny", "TINY", "tiny,tiny", " tiny"]
#: the package's environment variables -> good values (hostile ones are drawn apart)
ENVIRONMENT = {
    "ONEDNN_CONVT_MEMORY_LIMIT": ["2G", "64M", "1073741824", "0", "1", "1k"],
    "ONEDNN_CONVT_AUTOTUNE": ["1", "0", "on", "off", "true", "no"],
    "ONEDNN_CONVT_GUARDS": ["1", "0", "on", "off"],
    "ONEDNN_CONVT_CPU": ["zen4", "sapphire_rapids", "none", "default", "intel", "amd"],
    "ONEDNN_CONVT_CACHE_DIR": ["{tmp}/cache2", "{tmp}", "{tmp}/a file", "relative/dir"],
    "ONEDNN_CONVT_DEBUG_FILL": ["1", "0"],
    "OMP_NUM_THREADS": ["1", "2", "3"],
}
#: the bundled conformance suite's graph JSON cases (PATH arguments, good or mutated)
CASES = sorted(Path(bundled_suite()).glob("cases/**/*.json"))
#: hostile strings, for any value (not "/": as the cache folder or --out, root writes there)
HOSTILE = ["", " ", "-1", "0", "-0", "nan", "NaN", "inf", "-inf", "1e308", "1e-320", "9" * 400,
           "0x10", "1_000", "½", "é", "\u202e", "🙂", "a" * 3000, ",", ",,", "a,", ",a", "--", "-",
           "../x", "..", "/proc/self/mem", "/proc/nonexistent/x", "/dev/null", "~",
           "None", "true", "{}", "[]", "1/0", "0/0", "2/1", "1/1", "-1/2", "1.5", "1e3", "  3 "]


# -- values of each option ---------------------------------------------------------------------
def _pick(rng: np.random.Generator, items: list[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def _subset(rng: np.random.Generator, items: list[str]) -> str:
    k = int(rng.integers(1, len(items) + 1))
    return ",".join(str(x) for x in rng.permutation(items)[:k])


class Context:
    """A trial's temporary directory and what it hands the command."""

    def __init__(self, rng: np.random.Generator, root: Path) -> None:
        self.rng, self.root = rng, root
        self.allowed: list[Path] = []  # paths the command may write under
        self.given: list[Path] = []  # every output path given: their folders may be made
        self.fifo = root / "fifo"
        os.mkfifo(self.fifo)
        (root / "a dir").mkdir()
        (root / "a file").write_text("not a directory\n")

    def output_path(self, kind: str) -> str:
        """A path the command may write (a file or a directory), or a hostile one."""
        r = self.rng.random()
        if r < 0.6:
            p = self.root / "out" / f"{kind}{int(self.rng.integers(100))}"
            if kind == "dir" and self.rng.random() < 0.5:
                p.mkdir(parents=True, exist_ok=True)
            self.allowed.append(p)
            return str(p)
        p = _pick(self.rng, [self.root / "a file", self.root / "a dir", "/proc/x/y", "/dev/null",
                             "/proc/self/status", self.root / "a file" / "below", "", self.root / "out" / ("x" * 300)])
        self.given.append(Path(p))
        return str(p)

    def input_file(self, content: bytes | str | None) -> str:
        """A file holding ``content``, or (None) a hostile path."""
        if content is None:
            return str(_pick(self.rng, [self.root / "missing.json", self.root / "a dir", "/dev/null",
                                        "/proc/self/mem", "", "/dev/zero", "/proc/self/status"]))
        p = self.root / f"in{int(self.rng.integers(1 << 30))}.json"
        p.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
        return str(p)


def _json_variant(rng: np.random.Generator, good: Any) -> bytes | str | None:
    """``good`` as JSON, or mutated: wrong shapes and types, deep nesting, truncation, bytes."""
    text = json.dumps(good)
    r = int(rng.integers(14))
    if r < 4:
        return text
    if r == 4:
        return "[" * 100_000 + "]" * 100_000
    if r == 5:
        return text[: int(rng.integers(len(text)))]
    if r == 6:
        return b"\xff\xfe" + text.encode("utf-16-le")
    if r == 7:
        return _pick(rng, ["null", "1", '"x"', "{}", "[]", "[[]]", '{"results": 3}', "NaN", "[1e999]"])
    if r == 8:
        return None
    return json.dumps(_mutate(rng, json.loads(text)), allow_nan=True)


def _mutate(rng: np.random.Generator, doc: Any, depth: int = 0) -> Any:
    """One random change somewhere in a JSON document."""
    oddities: list[Any] = [None, True, -1, 0, 2.5, float("nan"), float("inf"), 10**400, "x", "", [], {},
                           [1, 2], {"a": 1}, "9" * 50]
    if isinstance(doc, dict) and doc and rng.random() < 0.85:
        key = _pick(rng, sorted(doc))
        r = rng.random()
        if r < 0.2:
            del doc[key]
        elif r < 0.3:
            doc[_pick(rng, ["", "x", key.upper(), key + " "])] = doc[key]
        else:
            doc[key] = _mutate(rng, doc[key], depth + 1)
        return doc
    if isinstance(doc, list) and doc and rng.random() < 0.85:
        i = int(rng.integers(len(doc)))
        r = rng.random()
        if r < 0.15:
            doc.pop(i)
        elif r < 0.3:
            doc.extend([doc[i]] * int(rng.integers(1, 4)))
        else:
            doc[i] = _mutate(rng, doc[i], depth + 1)
        return doc
    return _pick(rng, oddities)


#: a bench result file --compare reads (the tiny suite's keys)
def _bench_result(rng: np.random.Generator) -> dict[str, Any]:
    keys = [f"tiny/tiny/{op}/{dt}/{fmt}" for op in ("fwd", "bwd_d", "bwd_w")
            for dt in ("f32", "bf16", "f16") for fmt in ("NCX", "NXC")]
    return {"meta": {"onednn_version": "3.2.0"},
            "results": [{"key": k, "median_ms": float(rng.uniform(0.001, 1))} for k in keys]}


def _layers(rng: np.random.Generator) -> list[dict[str, Any]]:
    dims = int(rng.integers(1, 4))
    return [{"name": _pick(rng, ["up1", "l", "é", "a/b", "x" * 100]), "n": int(rng.integers(1, 3)),
             "ic": 4, "oc": 2, "spatial": [int(rng.integers(2, 5))] * dims,
             "kernel": [int(rng.integers(1, 4))] * dims, "stride": int(rng.integers(1, 3)),
             "pad": int(rng.integers(0, 2)), "groups": _pick(rng, [1, 2])}]


def _long(value: str) -> bool:
    """Whether ``value`` reads as a number above 10 (as seconds or repeats: a valid, long run)."""
    try:
        return float(value) > 10
    except (ValueError, OverflowError):
        return False


#: options naming a file or folder the command writes
OUTPUTS = {"--out", "--dump-failures", "--json", "--junit-xml", "--output", "-o"}
#: options whose large valid values only make a run long (bench's budget, samples, waits)
DURATIONS = {"--budget", "--repeat", "--wait-idle", "--torch-limit", "--retry-busy", "--retry-noisy"}


def _value(option: str, command: str, ctx: Context) -> str:
    """A value for ``option`` of ``command``: mostly valid, often hostile."""
    rng = ctx.rng
    hostile = [v for v in HOSTILE if not (option in DURATIONS and _long(v))]
    if rng.random() < 0.25:
        return str(_pick(rng, hostile))
    good: dict[str, Callable[[], str]] = {
        "--suite": lambda: _pick(rng, SHORT_SUITES + ["models,bogus", "step,tiny", "fused,tiny", "tiny,"]),
        "--ops": lambda: _subset(rng, ["fwd", "bwd_d", "bwd_w", "ConvTranspose", "FWD"]),
        "--dtypes": lambda: _subset(rng, ["f32", "bf16", "f16", "int8", "F32"]),
        "--dt": lambda: _subset(rng, ["f32", "bf16", "f16", "int8"]),
        "--formats": lambda: _subset(rng, ["NCX", "NXC", "ncx"]),
        "--layers": lambda: _pick(rng, ["tiny", "tiny,tiny", "nope", "tiny,nope"]),
        "--threads": lambda: _pick(rng, ["1", "2", "3", "100000"]),
        "--repeat": lambda: str(rng.integers(1, 4)),
        "--budget": lambda: f"{rng.uniform(0.0005, 0.01):.4f}",
        "--out": lambda: ctx.output_path("dir"),
        "--dump-failures": lambda: ctx.output_path("dir"),
        "--json": lambda: ctx.output_path("file"),
        "--junit-xml": lambda: ctx.output_path("file"),
        "--output": lambda: ctx.output_path("file"),
        "-o": lambda: ctx.output_path("file"),
        "--name": lambda: _pick(rng, ["run", "r.1", "a b", "x" * 200, "../escape", "/abs", ".", "sub/x"]),
        "--compare": lambda: ctx.input_file(_json_variant(rng, _bench_result(rng))),
        "--layers-json": lambda: ctx.input_file(_json_variant(rng, _layers(rng))),
        "--wait-idle": lambda: _pick(rng, ["0", "0.01"]),
        "--retry-busy": lambda: str(rng.integers(0, 2)),
        "--retry-noisy": lambda: str(rng.integers(0, 2)),
        "--torch-limit": lambda: _pick(rng, ["0.01", "1", "0"]),
        "--peers": lambda: _pick(rng, ["onnxruntime", "openvino", "onnxruntime,openvino", "openvino,openvino",
                                       "ONNXRUNTIME", "onnxruntime,", "tensorflow", ",", "openvino,nope"]),
        "-k": lambda: _pick(rng, ["f32", "deconv", "bf16", "int8", "NOPE", "[", "*", "\\"]),
        "--shard": lambda: _pick(rng, ["1/1", "1/2", "2/2", "3/40", "40/40", "1/100000"]),
        "--jobs": lambda: _pick(rng, ["1", "2", "64", "100000"]),
        "-j": lambda: _pick(rng, ["1", "2"]),
        "--cases-root": lambda: _pick(rng, [str(ctx.root), str(ctx.root / "a dir"), str(ctx.root / "missing")]),
        "--line": lambda: _pick(rng, ["--reset --case=op/f32/deconv.json", "--reset --mb=0 --case=x.json",
                                      "--case=" + "a" * 500, "--reset --dt=f32 --case=../../../etc/passwd",
                                      "--batch=" + str(ctx.fifo), "--batch=/dev/zero", "'", "--mb=1,2,3"]),
        "--dump": lambda: _pick(rng, ['ConvTranspose(strides=2, auto_pad="same_upper")',
                                      "ConvTransposeBackwardData(strides=[2,2])", "ConvTranspose(strides=-1)",
                                      "__import__('os').getcwd()", "ConvTranspose(**{})", "ConvTranspose(",
                                      "ConvTransposeBackwardWeights(groups=10**100)", "[1]*10**9"]),
        "--shapes": lambda: _pick(rng, ["1x4x5x5", "1x4x5x5 4x3x3x3", "0x4x5x5", "a", "1x" * 300 + "1"]),
    }
    make = good.get(option)
    return make() if make else str(_pick(rng, hostile))


def _positionals(command: str, ctx: Context) -> list[str]:
    """Conformance PATH arguments: files and folders, good and hostile."""
    rng = ctx.rng
    if command != "conformance" or rng.random() < 0.6:
        return []
    case = json.loads(_pick(rng, CASES).read_text(encoding="utf-8"))
    paths = []
    for _ in range(int(rng.integers(1, 3))):
        paths.append(ctx.input_file(_json_variant(rng, case)) if rng.random() < 0.7
                     else str(_pick(rng, [ctx.root / "a dir", ctx.fifo, ctx.root / "missing", "/proc/self",
                                          "/dev/null"])))
    return paths


def _options(parser: argparse.ArgumentParser, command: str) -> list[argparse.Action]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [a for a in sub.choices[command]._actions if a.option_strings
            and not set(a.option_strings) & NEVER]


def _environment(ctx: Context) -> dict[str, str]:
    rng = ctx.rng
    env = {k: v for k, v in os.environ.items() if k not in ENVIRONMENT and not k.startswith("ONEDNN_CONVT_")}
    env.update(HOME=str(ctx.root / "home"), XDG_CACHE_HOME=str(ctx.root / "cache"),
               ONEDNN_CONVT_CACHE_DIR=str(ctx.root / "cache"), OMP_NUM_THREADS="2",
               MPLCONFIGDIR=str(ctx.root / "mpl"))
    ctx.allowed += [ctx.root / "home", ctx.root / "cache", ctx.root / "cache2", ctx.root / "mpl",
                    ctx.root / "relative", ctx.root / "a dir"]
    if rng.random() < 0.5:
        for name in rng.permutation(sorted(ENVIRONMENT))[: int(rng.integers(1, 4))]:
            value = _pick(rng, ENVIRONMENT[name]) if rng.random() < 0.5 else _pick(rng, HOSTILE)
            env[str(name)] = str(value).replace("{tmp}", str(ctx.root))
    cache = Path(env.get("ONEDNN_CONVT_CACHE_DIR", ""))
    ctx.allowed.append((cache if cache.is_absolute() else ctx.root / "work" / cache) / "autotune.json")
    if rng.random() < 0.15:  # a hostile autotuning cache file
        try:
            if cache.is_absolute() and not cache.exists():
                cache.mkdir(parents=True)
            if cache.is_absolute() and cache.is_dir():
                content = _json_variant(rng, _cache_variant(rng))
                (cache / "autotune.json").write_bytes(content.encode() if isinstance(content, str) else content or b"")
        except OSError:  # a hostile name (too long, under a file): the command meets it as it is
            pass
    return env


_tuned_cache: dict[str, Any] = {}


def _real_cache() -> dict[str, Any]:
    """The cache file ``onednn-convt tune --suite tiny`` writes here (made once per fuzzing
    process, in a process of its own): entries a trial's commands look up, in the context
    their environment has unless a trial changes it."""
    if not _tuned_cache:
        with tempfile.TemporaryDirectory(prefix="fuzz-cli-cache-") as tmp:
            env = dict(os.environ, ONEDNN_CONVT_CACHE_DIR=tmp, OMP_NUM_THREADS="2")
            env.pop("ONEDNN_CONVT_AUTOTUNE", None)
            try:
                subprocess.run([sys.executable, "-m", "onednn_convt", "tune", "--suite", "tiny"], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_TIMEOUT, check=False)
                _tuned_cache.update(json.loads((Path(tmp) / "autotune.json").read_text()))
            except (OSError, ValueError, subprocess.TimeoutExpired):  # no tuning here: an empty file
                _tuned_cache.update({"format": 1, "contexts": {}})
    return _tuned_cache


def _cache_variant(rng: np.random.Generator) -> dict[str, Any]:
    """A copy of :func:`_real_cache`, where some entries choose another of their candidates,
    checked by any number of processes (the next process times such a choice again)."""
    doc = json.loads(json.dumps(_real_cache()))
    for entries in doc.get("contexts", {}).values():
        for entry in entries.values():
            if rng.random() < 0.5 and entry.get("candidates"):
                entry["name"] = _pick(rng, entry["candidates"])
                entry["checks"] = _pick(rng, [0, 1, 2, -1, 10**6])
                if rng.random() < 0.3:
                    entry["batch"] = _pick(rng, [1, 0, -3, 10**9])
    return doc


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    command = _pick(rng, ["bench", "bench", "tune", "tune", "conformance", "conformance", "info", "demo"])
    parser = cli.build_parser({command})
    actions = _options(parser, command)
    with tempfile.TemporaryDirectory(prefix="fuzz-cli-") as tmp:
        root = Path(tmp)
        ctx = Context(rng, root)
        argv = [command, *FIXED[command]]
        for action in rng.permutation(np.array(actions, dtype=object))[: int(rng.integers(0, 5))]:
            flag = str(_pick(rng, list(action.option_strings)))
            if action.nargs == 0:
                argv.append(flag)
                continue
            option = flag if flag in ("-k", "-o", "-j") else action.option_strings[-1]
            value = _value(option, command, ctx)
            if option in OUTPUTS and value:  # a path given is the command's to write, relative to its folder
                ctx.allowed.append(Path(value) if Path(value).is_absolute() else root / "work" / value)
            if value.startswith("-") and rng.random() < 0.5:
                argv.append(f"{flag}={value}" if flag.startswith("--") else flag + value)
            else:
                argv += [flag, value]
        argv += _positionals(command, ctx)
        env = _environment(ctx)
        (root / "work").mkdir()
        before = _files(root)
        shown = "onednn-convt " + " ".join(shlex.quote(a[:80]) for a in argv)
        try:
            proc = subprocess.run([sys.executable, "-m", "onednn_convt", *argv], cwd=root / "work", env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise Failure(f"{shown}: still running after {COMMAND_TIMEOUT:.0f} s") from None
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        changed = {k: env[k] for k in ENVIRONMENT if k in env and env[k] != os.environ.get(k)}
        where = f"{shown} (environment {changed})" if changed else shown
        if "Traceback (most recent call last)" in out + err:
            raise Failure(f"{where}: a traceback, exit {proc.returncode}:\n{err[-1500:] or out[-1500:]}")
        if proc.returncode not in (0, 1, 2):
            raise Failure(f"{where}: exit status {proc.returncode}:\n{err[-1500:]}")
        if proc.returncode != 0 and not (err + out).strip():
            raise Failure(f"{where}: exit status {proc.returncode} and no message")
        allowed = [p.resolve() for p in [*ctx.allowed, root / "work"]]
        given = [p.resolve() for p in [*ctx.allowed, *ctx.given, root / "work"]]
        stray = sorted(str(p) for p in _files(root) - before
                       if not any(p.resolve().is_relative_to(a) for a in allowed)  # in a path given
                       and not (p.is_dir() and any(a.is_relative_to(p.resolve()) for a in given)))  # its folder
        if stray:
            raise Failure(f"{where}: wrote outside the paths it was given: {stray[:5]}")
        return f"{shown[:200]} -> {proc.returncode}"


"""The fuzz runner: seeded trials, each in a child interpreter with a timeout.

A fuzzer is a module of this folder with

- ``NAME``: its name on the command line;
- ``PER_PROCESS``: how many consecutive trials one child runs (1 for fuzzers whose trial
  owns the process: threads, fork);
- ``TIMEOUT``: seconds one trial may take before it counts as a hang;
- ``ISA_DEPENDENT`` (optional, default True): False for a fuzzer whose surfaces do not
  change with ``ONEDNN_MAX_CPU_ISA`` (the slow tests then run it natively only);
- ``REQUIRES`` (optional): modules its trials import that the package does not need (torch);
  :func:`missing_modules` names those not installed;
- ``trial(rng, index)``: one trial. It returns a short description of what it tried, or
  raises :class:`Failure` (a wrong value, a wrong exception) naming what went wrong.
  Anything else it raises is a failure too (a bug in the package or in the fuzzer).

The parent (:func:`run`) starts children that run trials ``index`` with the generator
``numpy.random.default_rng([seed, index])``, so any trial can be re-run alone. A child
prints one JSON line before each trial and one after it; a child that dies (a signal, an
abort) or stays silent past the timeout is a failure of the trial in flight, and the next
trials go to a new child. Each failure prints the one command that reproduces it::

    python fuzz/run.py fork --seed 3 --trial 17

with the environment the trial ran in (``ONEDNN_MAX_CPU_ISA``) in front.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Optional

import numpy as np

HERE = Path(__file__).resolve().parent
#: every fuzzer, by name -> module (the modules of this folder)
FUZZERS = {
    "conformance": "conformance_files",
    "api": "api_arguments",
    "fused": "fused_chains",
    "plain": "plain_ops",
    "reuse": "op_reuse",
    "threads": "threads",
    "fork": "fork",
    "torch": "torch_layers",
    "torch_reuse": "torch_reuse",
    "cli": "cli_options",
    "address_space": "address_space",
}
#: the environment of every child (the memory limit makes a huge allocation an error
#: that names the op, not a machine out of memory)
CHILD_ENV = {"ONEDNN_CONVT_MEMORY_LIMIT": "2G", "OMP_WAIT_POLICY": "PASSIVE"}
#: the address-space cap of every child, bytes: an allocation past it fails in the child
ADDRESS_SPACE = 12 << 30


class Failure(AssertionError):
    """A trial found a defect: a wrong value, a wrong exception or message."""


def load(name: str) -> ModuleType:
    """The fuzzer called ``name`` (of :data:`FUZZERS`; another name is taken as a module
    name on ``sys.path``, for the harness's own tests)."""
    sys.path.insert(0, str(HERE))
    try:
        return importlib.import_module(FUZZERS.get(name, name))
    except ImportError as e:
        raise SystemExit(f"fuzz: no fuzzer {name!r} ({e}); choose from {', '.join(FUZZERS)}") from None


def missing_modules(name: str) -> list[str]:
    """The modules fuzzer ``name``'s trials import (its ``REQUIRES``, if any) that are not
    installed here: such a fuzzer cannot run (the tests skip it)."""
    import importlib.util

    return [m for m in getattr(load(name), "REQUIRES", ()) if importlib.util.find_spec(m) is None]


def rng_for(seed: int, index: int) -> np.random.Generator:
    """The generator of trial ``index`` of a run seeded ``seed``."""
    return np.random.default_rng([seed, index])


# -- the child ------------------------------------------------------------------------------
def child(name: str, seed: int, first: int, count: int) -> None:
    """Run trials ``first .. first + count - 1``, one JSON line before and after each."""
    module = load(name)
    for index in range(first, first + count):
        print(json.dumps({"start": index}), flush=True)
        try:
            what = module.trial(rng_for(seed, index), index)
            row = {"done": index, "ok": True, "what": str(what or "")}
        except Failure as e:
            row = {"done": index, "ok": False, "what": f"{type(e).__name__}: {e}"}
        except BaseException as e:  # noqa: BLE001 - every escape is a finding
            row = {"done": index, "ok": False,
                   "what": f"unexpected {type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"}
        print(json.dumps(row), flush=True)


def _limit_address_space() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    except (ImportError, ValueError, OSError):
        pass


# -- the parent -----------------------------------------------------------------------------
@dataclass
class Finding:
    """One failed trial."""

    fuzzer: str
    seed: int
    index: int
    kind: str  # "failed", "crashed", "hung"
    detail: str
    isa: Optional[str] = None

    def command(self) -> str:
        env = f"ONEDNN_MAX_CPU_ISA={self.isa} " if self.isa else ""
        return f"{env}python fuzz/run.py {self.fuzzer} --seed {self.seed} --trial {self.index}"

    def __str__(self) -> str:
        return f"{self.kind}: trial {self.index}: {self.detail.strip()}\n  reproduce: {self.command()}"


@dataclass
class Report:
    """What a run of one fuzzer found."""

    fuzzer: str
    seed: int
    trials: int = 0
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> str:
        return (f"{self.fuzzer}: {self.trials} trials (seed {self.seed}), {len(self.findings)} failed, "
                f"{self.seconds:.1f} s")


def _spawn(name: str, seed: int, first: int, count: int, isa: Optional[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, **CHILD_ENV}
    if isa:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import harness; "
            f"harness._limit_address_space(); harness.child({name!r}, {seed}, {first}, {count})")
    return subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


class _Lines:
    """A child's stdout read line by line with a timeout (``select`` on the raw pipe: a
    buffered reader would hide lines already read from the pipe)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, timeout: float) -> Optional[str]:
        """The next line, "" at the end of the output, None after ``timeout`` of silence."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.fd], [], [], max(0.0, left))
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return ""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode("utf-8", "replace")


def _end(proc: subprocess.Popen[bytes], kill: bool) -> tuple[int, str]:
    if kill:
        proc.kill()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, (err or b"").decode("utf-8", "replace")[-2000:]


def run(name: str, seed: int, trials: int, *, first: int = 0, isa: Optional[str] = None,
        echo: bool = False, verbose: bool = False) -> Report:
    """Run trials ``first .. first + trials - 1`` of fuzzer ``name`` in children."""
    module = load(name)
    per, timeout = int(module.PER_PROCESS), float(module.TIMEOUT)
    report = Report(name, seed)
    start = time.monotonic()
    index, end = first, first + trials
    while index < end:
        count = min(per, end - index)
        proc = _spawn(name, seed, index, count, isa)
        lines = _Lines(proc)
        in_flight: Optional[int] = None
        while True:
            line = lines.next(timeout + (20 if in_flight is None else 0))  # + the import
            if line is None or line == "":
                hung = line is None
                code, err = _end(proc, kill=hung)
                if in_flight is not None:  # the trial in flight hung or killed its child
                    kind = "hung" if hung else "crashed"
                    detail = (f"no result after {timeout:.0f} s" if hung else f"child exited with {code}")
                    report.findings.append(Finding(name, seed, in_flight, kind, f"{detail}\n{err}", isa))
                    report.trials += 1
                    if echo:
                        print(report.findings[-1], flush=True)
                    index = in_flight + 1
                elif index < end and code != 0:  # died before its first trial: the fuzzer is broken
                    report.findings.append(Finding(name, seed, index, "crashed", f"child exited with {code}\n{err}", isa))
                    index = end
                else:
                    index += count  # every trial reported
                break
            row = json.loads(line)
            if "start" in row:
                in_flight = row["start"]
                continue
            report.trials += 1
            in_flight = None
            if not row["ok"]:
                report.findings.append(Finding(name, seed, row["done"], "failed", row["what"], isa))
                if echo:
                    print(report.findings[-1], flush=True)
            elif verbose:
                print(f"ok: trial {row['done']}: {row['what']}", flush=True)
            if row["done"] == index + count - 1:
                _end(proc, kill=False)
                index += count
                break
    report.seconds = time.monotonic() - start
    return report


def main(argv: Optional[list[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python fuzz/run.py",
        description="Run a fuzzer of the package: seeded trials, each in a child interpreter with a "
                    "timeout; prints one command per failure that reproduces it.")
    parser.add_argument("fuzzer", choices=[*FUZZERS, "all"], help="which fuzzer ('all': each in turn)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    parser.add_argument("--trials", type=int, default=20, help="how many trials (default 20)")
    parser.add_argument("--trial", type=int, default=None, help="run this one trial alone (a reproducer)")
    parser.add_argument("--isa", default=os.environ.get("ONEDNN_MAX_CPU_ISA"),
                        help="ONEDNN_MAX_CPU_ISA for the children (default: the environment's)")
    parser.add_argument("--verbose", action="store_true", help="also print what each passing trial tried")
    args = parser.parse_args(argv)
    names = list(FUZZERS) if args.fuzzer == "all" else [args.fuzzer]
    failed = 0
    for name in names:
        missing = missing_modules(name)
        if missing:
            print(f"{name}: skipped: its trials need {', '.join(missing)}, which is not installed", flush=True)
            failed += args.fuzzer != "all"  # asked for by name: an error
            continue
        if args.trial is not None:
            report = run(name, args.seed, 1, first=args.trial, isa=args.isa, echo=True, verbose=args.verbose)
        else:
            report = run(name, args.seed, args.trials, isa=args.isa, echo=True, verbose=args.verbose)
        print(report.summary() + (f" [ONEDNN_MAX_CPU_ISA={args.isa}]" if args.isa else ""), flush=True)
        failed += len(report.findings)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

"""Fork fuzzer: os.fork() at random moments while other threads run ops.

Each trial (its own process) draws a few small problems (as the threads fuzzer does), may
run some of them first (so the parent has OpenMP threads and compiled plans), starts 0-4
threads that call them (new signatures too: they compile), and forks 2-6 times at random
moments. Each child calls one op (old or new signature, a new op object or an inherited
one) and exits 0 when the result matches the reference; the parent waits for it with a
deadline: a child that hangs, dies or answers wrong fails the trial. Where torch is
installed, half the trials mix ``onednn_convt.torch`` calls among the problems (the threads
fuzzer's): the torch path's executors, made for the parent's threads, must not run in a
child as they are.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np

from harness import Failure
from threads import _make, _problem, _torch_call, _torch_problem, torch_or_none

NAME = "fork"
PER_PROCESS = 1
TIMEOUT = 240.0
#: seconds a child may take
CHILD_DEADLINE = 60.0


def _child(p: dict, inherited: object) -> int:
    try:
        if p["op"] == "torch":
            import torch

            return 0 if not _torch_call(p, torch) else 3
        op = inherited if inherited is not None else _make(p)
        got = op(*p["args"])
        err = float(np.max(np.abs(np.asarray(got, np.float64) - p["ref"])))
        return 0 if err <= p["tol"] else 3
    except BaseException:  # noqa: BLE001 - reported by the exit code
        return 4


def trial(rng: np.random.Generator, index: int) -> str:  # noqa: ARG001 - the harness's signature
    torch = torch_or_none(rng)
    with_torch = torch is not None
    problems = [_torch_problem(rng, torch) if with_torch and rng.random() < 0.5 else _problem(rng)
                for _ in range(int(rng.integers(2, 6)))]
    ops = [_make(p) for p in problems]

    def call(k: int, op: object) -> None:
        if problems[k]["op"] == "torch":
            _torch_call(problems[k], torch)
        else:
            op(*problems[k]["args"])  # type: ignore[operator]

    warm = rng.random() < 0.8
    if warm:
        for k, op in enumerate(ops):
            call(k, op)
    stop = threading.Event()
    workers = int(rng.integers(0, 5))
    seeds = rng.integers(0, 2**31, workers)

    def work(seed: int) -> None:
        r = np.random.default_rng(seed)
        while not stop.is_set():
            k = int(r.integers(len(problems)))
            call(k, ops[k] if r.random() < 0.5 else _make(problems[k]))

    pool = [threading.Thread(target=work, args=(int(s),), daemon=True) for s in seeds]
    for t in pool:
        t.start()
    failures = []
    forks = int(rng.integers(2, 7))
    for f in range(forks):
        time.sleep(float(rng.uniform(0, 0.05)))
        k = int(rng.integers(len(problems)))
        inherit = ops[k] if rng.random() < 0.5 else None
        pid = os.fork()
        if pid == 0:
            os._exit(_child(problems[k], inherit))
        deadline = time.monotonic() + CHILD_DEADLINE
        status = None
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            failures.append(f"fork {f}: the child hung (problem {k}, {problems[k]['op']} {problems[k]['attrs']})")
            continue
        if os.WIFSIGNALED(status):
            failures.append(f"fork {f}: the child died of signal {os.WTERMSIG(status)}")
        elif os.WEXITSTATUS(status) != 0:
            what = {3: "a wrong result", 4: "an exception"}.get(os.WEXITSTATUS(status), "exit status")
            failures.append(f"fork {f}: the child ended with {what} ({os.WEXITSTATUS(status)})")
    stop.set()
    for t in pool:
        t.join(timeout=60)
    if failures:
        raise Failure("; ".join(failures))
    n_torch = sum(p["op"] == "torch" for p in problems)
    return f"{forks} forks beside {workers} threads ({'warm' if warm else 'cold'} parent; {n_torch} torch problems)"

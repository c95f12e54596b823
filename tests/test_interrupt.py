"""A KeyboardInterrupt during a long batch of calls leaves the package usable: the same op
objects give the same results afterwards, new signatures compile, and no lock stays held.

Each scenario runs in a child interpreter (an interrupt that escaped would otherwise stop
pytest itself). Interrupts arrive at random moments: from ``_thread.interrupt_main`` on a
timer thread, and as real SIGINTs sent by this process, so they land everywhere in the call
path (argument checks, planning, compiling, the C++ fast path, two threads sharing the
BackwardWeights partition).
"""

from __future__ import annotations

import json
import random
import select
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent(
    """
    import _thread, json, random, signal, sys, threading, time
    import numpy as np
    import onednn_convt as oc

    # Ctrl-C semantics even when started with SIGINT ignored (a background job of a
    # non-interactive shell inherits SIG_IGN; interrupt_main then does nothing)
    signal.signal(signal.SIGINT, signal.default_int_handler)

    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 12, 12, 8)).astype(np.float32)      # NXC
    W = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)        # XOI
    Y = rng.standard_normal((2, 23, 23, 8)).astype(np.float32)
    A = dict(strides=2, pads_begin=1, pads_end=1)
    fwd, bwd_d = oc.ConvTranspose(**A), oc.ConvTransposeBackwardData(**A)
    bwd_w = oc.ConvTransposeBackwardWeights(weights_shape=W.shape, **A)
    half = oc.ConvTranspose(**A)
    OUT = np.empty((2, 23, 23, 8), np.float32)
    CALLS = {
        "fwd": lambda: fwd(X, W), "fwd_out": lambda: fwd(X, W, out=OUT).copy(),
        "bwd_d": lambda: bwd_d(Y, W), "bwd_w": lambda: bwd_w(X, Y),
        "f16": lambda: half(X.astype(np.float16), W.astype(np.float16)).astype(np.float32),
        "functional": lambda: oc.conv_transpose(X, W, **A),
    }
    EXPECTED = {name: call() for name, call in CALLS.items()}
    counter = [0]

    def batch():
        # until interrupted: the fixed calls, and now and then a new signature (planning and
        # compiling); a minute without an interrupt ends it (reported, rather than hanging)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for call in CALLS.values():
                call()
            counter[0] += 1
            n = 3 + counter[0] % 50
            oc.ConvTranspose(**A)(np.ones((1, n, 5, 8), np.float32), W)

    def check():
        bad = [name for name, call in CALLS.items() if not np.array_equal(call(), EXPECTED[name])]
        out = oc.ConvTranspose(**A)(np.ones((1, 7, 9, 8), np.float32), W)  # a new signature
        assert out.shape == (1, 13, 17, 8)
        done = []  # the BackwardWeights lock is free: another thread gets through
        t = threading.Thread(target=lambda: done.append(np.array_equal(bwd_w(X, Y), EXPECTED["bwd_w"])))
        t.start()
        t.join(30)
        return bad + ([] if done == [True] else ["bwd_w from another thread: " + repr(done)])

    mode, count = sys.argv[1], int(sys.argv[2])
    failures, interrupted = [], 0
    random.seed(1)
    for trial in range(count):
        timer = threading.Timer(random.uniform(0.0, 0.05), _thread.interrupt_main)
        try:
            if mode == "interrupt_main":
                timer.start()
            else:
                print("ready", flush=True)  # the parent sends SIGINT after a random delay
            batch()
            failures.append(f"trial {trial}: no KeyboardInterrupt within 60 s")
        except KeyboardInterrupt:
            interrupted += 1
        if mode == "interrupt_main":
            timer.join()
        failures += [f"trial {trial}: {f}" for f in check()]

    # an interrupt while another thread runs the same BackwardWeights partition: the main
    # thread's calls wait for it on the C++ lock (GIL released), and the interrupt surfaces
    # when a call returns
    stop = threading.Event()
    def other():
        while not stop.is_set():
            bwd_w(X, Y)
    t = threading.Thread(target=other)
    t.start()
    main = threading.main_thread().ident
    timer = threading.Timer(0.2, lambda: signal.pthread_kill(main, signal.SIGINT))
    try:
        timer.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            bwd_w(X, Y)
        failures.append("no interrupt while two threads ran BackwardWeights")
    except KeyboardInterrupt:
        interrupted += 1
    stop.set()
    t.join()
    timer.join()
    failures += [f"after the lock wait: {f}" for f in check()]
    print(json.dumps({"interrupted": interrupted, "failures": failures, "batches": counter[0]}), flush=True)
    """
)


def run_child(mode: str, count: int) -> dict:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(count)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as proc:
        assert proc.stdout is not None
        try:
            if mode == "sigint":
                rng = random.Random(2)
                for _ in range(count):
                    ready, _, _ = select.select([proc.stdout], [], [], 120)
                    line = proc.stdout.readline() if ready else "(nothing for 120 s)"
                    assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
                    time.sleep(rng.uniform(0.0, 0.05))
                    proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=300)
        except BaseException:
            proc.kill()  # then leaving the with block closes the pipes and reaps it
            raise
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


def test_interrupt_main_during_a_batch_leaves_the_package_usable():
    report = run_child("interrupt_main", 40)
    assert report["failures"] == []
    assert report["interrupted"] == 41


def test_sigint_during_a_batch_leaves_the_package_usable():
    report = run_child("sigint", 25)
    assert report["failures"] == []
    assert report["interrupted"] == 26

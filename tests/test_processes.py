"""Processes: ``multiprocessing`` with fork, spawn and forkserver (and a bare ``os.fork``)
after the package has run, and before.

GNU OpenMP cannot start its threads again in a child forked after the parent ran a parallel
region: before ``onednn_convt.native``'s fork hook such a child hung forever on its first op. Now the
child runs on one OpenMP thread and computes the same results; spawn and forkserver start a
fresh interpreter and keep every thread. Each scenario runs in its own interpreter (a script
file, as spawn needs), so the parent's state is exactly the scenario's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCENARIO = textwrap.dedent(
    """
    import json, multiprocessing as mp, os, sys
    import numpy as np
    import onednn_convt as oc
    from onednn_convt import reference

    rng = np.random.default_rng(0)
    X = rng.standard_normal((2, 9, 8, 6)).astype(np.float32)     # NXC
    W = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)     # XOI: IC=6, OC/G=4
    A = dict(strides=2, pads_begin=1, pads_end=1, groups=2, dilations=(1, 2))
    Y = rng.standard_normal((2, 17, 17, 8)).astype(np.float32)   # dst / diff_dst
    OPS = (oc.ConvTranspose(**A), oc.ConvTransposeBackwardData(**A),
           oc.ConvTransposeBackwardWeights(weights_shape=W.shape, **A),
           oc.ConvTransposeBackpropFilters(filter_shape=(3, 3, 6, 4), filter_format="XIO", **A))

    def run(ops):
        fwd, bwd_d, bwd_w, legacy = ops
        return [fwd(X, W), bwd_d(Y, W), bwd_w(X, Y), legacy(X, Y),
                oc.conv_transpose(X.astype(np.float16), W.astype(np.float16), **A).astype(np.float32)]

    def expected():
        return [reference.conv_transpose(X, W, **A), reference.conv_transpose_backward_data(Y, W, **A),
                reference.conv_transpose_backward_weights(X, Y, W.shape, **A), None,
                reference.conv_transpose(X.astype(np.float16), W.astype(np.float16), **A)]

    def task(ops, fresh):
        results = run(OPS if ops is None else ops)
        if fresh:  # new op objects made in the child too
            results += run((oc.ConvTranspose(**A), oc.ConvTransposeBackwardData(**A),
                            oc.ConvTransposeBackwardWeights(weights_shape=W.shape, **A),
                            oc.ConvTransposeBackpropFilters(filter_shape=(3, 3, 6, 4), filter_format="XIO", **A)))
        return {"pid": os.getpid(), "threads": oc.info()["threads"], "results": results}

    def child(queue, ops):
        queue.put(task(ops, fresh=True))

    def pool_task(i):
        return task(None, fresh=False)

    def errors(got):
        ref = expected()
        out = []
        for k, g in enumerate(got):
            r = ref[k % len(ref)]
            if r is None:  # the legacy op: the same numbers as bwd_w, channel axes swapped
                r = np.swapaxes(ref[2], -1, -2)
            out.append(float(np.max(np.abs(g - r)) / np.max(np.abs(r))))
        return out

    if __name__ == "__main__":
        method, used = sys.argv[1], sys.argv[2] == "used"
        report = {"parent_threads": oc.info()["threads"] if used else None}
        if used:
            report["parent_errors"] = errors(run(OPS))
        if method == "os.fork":
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, json.dumps(errors(task(OPS, fresh=True)["results"])).encode())
                os._exit(0)
            os.close(w)
            with os.fdopen(r) as fh:
                report["child_errors"] = [json.loads(fh.read() or "null")]
            report["exit"] = os.waitpid(pid, 0)[1]
        else:
            ctx = mp.get_context(method)
            queue = ctx.Queue()
            proc = ctx.Process(target=child, args=(queue, OPS))  # spawn pickles the op objects
            proc.start()
            got = queue.get(timeout=120)
            proc.join(60)
            report["exit"] = proc.exitcode
            report["child_threads"] = got["threads"]
            report["child_errors"] = [errors(got["results"])]
            with ctx.Pool(2) as pool:  # a pool, several tasks per worker
                done = pool.map(pool_task, range(4), chunksize=1)
            report["pool_errors"] = [errors(d["results"]) for d in done]
            report["pool_threads"] = sorted({d["threads"] for d in done})
        print(json.dumps(report))
    """
)


def run_scenario(tmp_path, method: str, used: bool, **env: str) -> dict:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    proc = subprocess.run(
        [sys.executable, str(script), method, "used" if used else "fresh"], check=False,
        capture_output=True, text=True, timeout=300, env={**os.environ, **env}, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"{method}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_all_close(report: dict) -> None:
    for key in ("parent_errors", "child_errors", "pool_errors"):
        for errors in [report[key]] if key == "parent_errors" else report.get(key, []):
            assert errors is not None, (key, report)
            assert max(errors) < 1e-3, (key, errors)  # f16 rounding; f32 is ~1e-7


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver", "os.fork"])
def test_children_work_after_the_parent_ran_ops(tmp_path, method):
    """The parent ran every op on 2 OpenMP threads; children compute the same results, with
    op objects made in the parent (inherited, or pickled for spawn) and new ones."""
    report = run_scenario(tmp_path, method, used=True)
    assert report["exit"] == 0
    assert_all_close(report)
    if method == "fork":  # forked after OpenMP ran: one thread in the child
        assert report["child_threads"] == 1 and report["pool_threads"] == [1]
    elif method != "os.fork":  # a fresh interpreter keeps every thread
        assert report["child_threads"] == report["parent_threads"]
        assert report["pool_threads"] == [report["parent_threads"]]


def test_fork_before_any_op_keeps_every_thread(tmp_path):
    """A parent that only imported the package has no OpenMP pool: children are left alone."""
    report = run_scenario(tmp_path, "fork", used=False)
    assert report["exit"] == 0
    assert report["child_threads"] == report["pool_threads"][0] > 1 or os.cpu_count() == 1
    assert_all_close({**report, "parent_errors": [0.0]})


def test_fork_with_one_openmp_thread_is_left_alone(tmp_path):
    report = run_scenario(tmp_path, "fork", used=True, OMP_NUM_THREADS="1")
    assert report["parent_threads"] == report["child_threads"] == 1
    assert_all_close(report)


def test_used_op_objects_pickle_without_their_plans():
    import pickle

    import numpy as np
    import onednn_convt as oc

    op = oc.ConvTransposeBackwardWeights(strides=2, weights_shape=(3, 3, 4, 2))
    x = np.ones((1, 5, 5, 2), np.float32)
    y = np.ones((1, 11, 11, 4), np.float32)
    expected = op(x, y)
    copy = pickle.loads(pickle.dumps(op))
    assert repr(copy) == repr(op) and copy.last_plan is None and op.last_plan is not None
    np.testing.assert_array_equal(copy(x, y), expected)


_DAEMON_AT_EXIT = """
import threading, time, numpy as np, onednn_convt as oc
op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1)
x = np.ones((8, 32, 32, 64), np.float32); w = np.ones((3, 3, 64, 64), np.float32)
def loop():
    while True:
        op(x, w)
threading.Thread(target=loop, daemon=True).start()
time.sleep(0.3)
print("exiting", flush=True)
"""


def test_interpreter_exit_while_a_daemon_thread_is_in_an_op():
    """The main thread returns while a daemon thread runs an op. CPython ends such a thread
    with pthread_exit when it takes the GIL back; its forced unwinding through pybind11's
    GIL-release destructor aborted the process ('terminate called without an active
    exception', 5 of 5 runs) until the binding took the GIL back in plain code
    (src/cpp/gil.hpp). Three runs, each must exit 0."""
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", _DAEMON_AT_EXIT], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "exiting", (proc.returncode, proc.stderr[-2000:])


_FORK_BESIDE_THREADS = """
import os, sys, threading, time, numpy as np, onednn_convt as oc
op = oc.ConvTranspose(strides=2, pads_begin=1, pads_end=1, groups=2)
def arrays(i):
    return np.ones((1 + i % 3, 5 + i % 4, 5, 2 * (1 + i % 5)), np.float32), np.ones((3, 3, 2, 2 * (1 + i % 5)), np.float32)
stop = threading.Event()
def work(seed):
    i = seed
    while not stop.is_set():
        op(*arrays(i)); i += 7  # new signatures: compiles, as well as runs
threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in range(3)]
for t in threads:
    t.start()
time.sleep(float(sys.argv[1]))  # 0: the main thread forks before any op finished anywhere
hung = failed = 0
for k in range(10):
    pid = os.fork()
    if pid == 0:
        x, w = arrays(1000 + k)
        want = oc.reference.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1, groups=2)
        os._exit(0 if np.allclose(op(x, w), want) else 3)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            failed += status != 0
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9); os.waitpid(pid, 0); hung += 1; break
        time.sleep(0.01)
stop.set()
print("hung", hung, "failed", failed)
"""


@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_fork_while_other_threads_compile_and_run(delay):
    """os.fork() while other threads are inside op calls, compiling new signatures: the child
    inherited locks held by threads it does not have, or OpenMP pools started by them, and
    hung in a parallel region (fuzz/fork.py). A fork now waits at the binding's gate until no
    thread is inside the library, and a child of a parent where any thread ran the library
    computes on one thread."""
    proc = subprocess.run([sys.executable, "-c", _FORK_BESIDE_THREADS, str(delay)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0 and proc.stdout.split() == ["hung", "0", "failed", "0"], (proc.stdout, proc.stderr[-2000:])

"""Autotuning: the first call of a signature times the candidates and keeps the fastest that
agrees with the rules' lowering; the choice persists in a cache file that another process
uses without timing; a corrupt, foreign or unwritable cache is never trusted blindly.

The tuner reads time from ``autotune.clock``; here that is a fake clock (:class:`FakeClock`),
so what the tuner measures, and so what it chooses, does not depend on the machine's load:
no test asserts on a wall-clock measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace

import numpy as np
import pytest
from helpers import assert_close

import onednn_convt as oc
from onednn_convt import reference
from onednn_convt.lowering import autotune, base, rules_table, tuning_cache

#: a DCGAN-like layer, small (k4 s2 p1): two candidates, ConvolutionBackwardData (the
#: rules' choice) and ConvTranspose
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
SRC, W = (2, 8, 4, 4), (8, 4, 4, 4)


class FakeClock:
    """The tuner's clock in these tests: each reading is :data:`TICK` seconds after the one
    before, and :meth:`advance` adds time (a slow compile), so every interval the tuner
    measures is known: a single run takes one tick, a timed sample of k runs one tick too."""

    TICK = 1e-3  # short enough that no call counts as long (LONG_CALL_SECONDS), few repeats

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.TICK
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def tuning(tmp_path, monkeypatch):
    """Autotuning on, with a cache directory of the test's own, over the hand-written rules
    (the measured table's choice differs per CPU; which candidate comes first is all the
    tuner takes from the rules), timed by a :class:`FakeClock`."""
    monkeypatch.setattr(autotune, "clock", FakeClock())
    monkeypatch.setattr(rules_table, "TABLES", {})
    monkeypatch.setattr(rules_table, "_use_shipped_default", False)
    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(tmp_path))
    tuning_cache.forget()
    before = autotune.enabled()
    oc.set_autotune(True)
    yield tmp_path
    oc.set_autotune(before)
    tuning_cache.forget()


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(SRC).astype(np.float32), rng.standard_normal(W).astype(np.float32)


def test_first_call_tunes_and_says_so(tuning):
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    got = op(x, w)
    t = op.tuning
    assert t is not None and not t.cached and t.seconds > 0
    assert t.rule == base.CONVOLUTION_BACKWARD_DATA
    assert {base.CONVOLUTION_BACKWARD_DATA, base.CONV_TRANSPOSE} <= set(t.times_us)
    assert all(v > 0 for v in t.times_us.values()) and t.name in t.times_us
    assert t.batch == SRC[0]  # a short call: timed on its own batch
    # every candidate measured the same (one tick per sample): the rules' choice stays (MARGIN)
    assert t.name == t.rule
    assert op.lowering.endswith(f"(tuned: {t.name})")
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)
    assert_close(got, want, "f32", 8 * 16)
    # the cache file holds the choice under this process's context
    data = json.loads((tuning / tuning_cache.FILE_NAME).read_text())
    entries = data["contexts"][tuning_cache.context()]
    (entry,) = entries.values()
    assert entry["name"] == t.name and entry["candidates"][0] == t.rule


def test_a_second_op_and_a_second_process_use_the_cache(tuning):
    x, w = arrays()
    first = oc.ConvTranspose(**ATTRS)
    first(x, w)
    second = oc.ConvTranspose(**ATTRS)
    second(x, w)
    assert second.tuning.cached and second.tuning.seconds == 0 and second.tuning.name == first.tuning.name
    code = (
        "import numpy as np, onednn_convt as oc\n"
        f"op = oc.ConvTranspose(**{ATTRS!r})\n"
        f"op(np.ones({SRC}, np.float32), np.ones({W}, np.float32))\n"
        "print(op.tuning.cached, op.tuning.name)\n"
    )
    env = dict(os.environ, ONEDNN_CONVT_AUTOTUNE="1", ONEDNN_CONVT_CACHE_DIR=str(tuning))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", first.tuning.name]


def test_turning_it_on_reads_the_file_so_a_tuned_first_call_does_not(tuning, monkeypatch):
    x, w = arrays()
    first = oc.ConvTranspose(**ATTRS)
    first(x, w)  # tuned and stored
    tuning_cache.forget()  # a new process
    oc.set_autotune(True)

    def no_read(*args, **kwargs):
        raise AssertionError("the first call read the cache file")

    monkeypatch.setattr(tuning_cache, "_read", no_read)
    second = oc.ConvTranspose(**ATTRS)
    np.testing.assert_array_equal(second(x, w), first(x, w))
    assert second.tuning.cached and second.tuning.name == first.tuning.name


def test_a_long_call_is_timed_on_a_smaller_batch(tuning, monkeypatch):
    monkeypatch.setattr(autotune, "LONG_CALL_SECONDS", 1e-9)  # every call counts as long
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    got = op(x, w)
    t = op.tuning
    assert t.batch == 1 and {base.CONVOLUTION_BACKWARD_DATA, base.CONV_TRANSPOSE} <= set(t.times_us)
    assert op.last_plan.lowering.out_shape[0] == SRC[0]  # the call itself runs its own batch
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)
    assert_close(got, want, "f32", 8 * 16)
    again = oc.ConvTranspose(**ATTRS)
    again(x, w)
    assert again.tuning.cached and again.tuning.batch == 1


def test_off_means_the_rules(tuning):
    oc.set_autotune(False)
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    assert op.tuning is None and op.lowering == base.CONVOLUTION_BACKWARD_DATA
    assert not (tuning / tuning_cache.FILE_NAME).exists()


@pytest.mark.parametrize("read_at", ["set_autotune", "first call"])
@pytest.mark.parametrize("content", ["{not json", '{"format": 99, "contexts": {}}', "[1, 2]", "[" * 100_000,
                                     '{"format": 1, "contexts": {"c": {"k": {"name": 3}}}}',
                                     *(f'{{"format": 1, "contexts": {{"c": {{"k": {{"name": "a", "candidates": ["a"], '
                                       f'"times_us": {{"a": 1}}, {bad}}}}}}}}}'
                                       for bad in ('"rejected": 5', '"confirm_us": [1]', '"batch": "2"',
                                                   '"confirm_us": {"a": true}', '"checks": true',
                                                   '"recheck_us": [1]')),
                                     b'\xff\xfe{\x00}\x00'])  # UTF-16: not UTF-8
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_rewritten(tuning, content, read_at):
    (tuning / tuning_cache.FILE_NAME).write_bytes(content if isinstance(content, bytes) else content.encode())
    tuning_cache.forget()  # as a process starting with this file
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    with pytest.warns(tuning_cache.TuningCacheWarning, match="ignoring the autotuning cache") as caught:
        if read_at == "set_autotune":  # turning it on reads the file
            oc.set_autotune(True)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                op(x, w)
        else:  # the cache directory changed after that: the first lookup reads it
            op(x, w)
    assert len(caught) == 1  # once: not again when the tuned choice is written
    assert not op.tuning.cached
    data = json.loads((tuning / tuning_cache.FILE_NAME).read_text())
    assert data["format"] == tuning_cache.FORMAT and tuning_cache.context() in data["contexts"]


def test_an_entry_for_other_candidates_or_another_context_is_not_used(tuning):
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    file = tuning / tuning_cache.FILE_NAME
    data = json.loads(file.read_text())
    (key, entry), = data["contexts"][tuning_cache.context()].items()
    # a choice outside today's candidates (another version's lowering), under this context,
    # and a valid-looking one under another oneDNN
    data["contexts"][tuning_cache.context()][key] = dict(entry, name="Winograd", candidates=["Winograd"])
    data["contexts"]["oneDNN 9.9.9 x; isa avx2; threads 1; onednn-convt 0.1.0"] = {key: entry}
    file.write_text(json.dumps(data))
    tuning_cache.forget()
    again = oc.ConvTranspose(**ATTRS)
    again(x, w)
    assert not again.tuning.cached and again.tuning.name != "Winograd"
    kept = json.loads(file.read_text())["contexts"]
    assert len(kept) == 2  # the other context's entry is kept, not trusted


def test_a_disagreeing_candidate_is_rejected(tuning, monkeypatch):
    """A candidate whose result is wrong (here: built with doubled weights) is never chosen."""
    real = autotune.build

    def wrong_conv_transpose(problem, name):
        low = real(problem, name)
        if name != base.CONV_TRANSPOSE:
            return low
        return replace(low, prepare=lambda args: [args[0], args[1] * 2, *args[2:]])

    monkeypatch.setattr(autotune, "build", wrong_conv_transpose)
    # no screening: a microsecond call's first runs can differ 4x by noise, and a screened-out
    # candidate is estimated, not run (nothing to disagree with)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    assert op.tuning.rejected == {base.CONV_TRANSPOSE: "disagreed with the rules' lowering"}
    assert op.tuning.name == base.CONVOLUTION_BACKWARD_DATA


def test_a_slow_compile_does_not_count_as_a_slow_run(tuning, monkeypatch):
    """The first-run screen (SLOW_FACTOR) compares runs, not compiles: a candidate that
    compiles slowly (0.3 s on the tuner's clock) is still timed, at its call's speed."""
    from onednn_convt import plan

    real = plan.plan_for

    def slow_compile(target, low, *args):
        if low.name == base.CONV_TRANSPOSE:
            autotune.clock.advance(0.3)
        return real(target, low, *args)

    monkeypatch.setattr(plan, "plan_for", slow_compile)
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    times = op.tuning.times_us
    assert times[base.CONV_TRANSPOSE] < 0.1e6  # microseconds: not the 0.3 s compile
    assert times[base.CONV_TRANSPOSE] == times[base.CONVOLUTION_BACKWARD_DATA]  # timed alike


def test_a_problem_past_the_memory_limit_is_not_tuned(tuning):
    """The tuner's own arrays (random inputs, a result and an out= per candidate, in f32)
    must fit under the memory limit; past it the call is not tuned and runs the rules'
    lowering, whose own checks decide (here it fits)."""
    x, w = arrays()
    need = (x.size + w.size + 3 * 2 * 4 * 8 * 8) * 4  # the result: 2 x 4 x 8 x 8
    oc.set_memory_limit(need - 4)
    try:
        op = oc.ConvTranspose(**ATTRS)
        got = op(x, w)
    finally:
        oc.set_memory_limit(None)
    assert op.tuning is None and "(tuned:" not in op.lowering
    np.testing.assert_allclose(got, oc.ConvTranspose(**ATTRS)(x, w), rtol=1e-5, atol=1e-5)
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    assert op.tuning is not None  # under no limit: tuned


@pytest.mark.parametrize("stalls", [1, 2])
def test_one_stalled_screening_run_does_not_drop_a_candidate(tuning, monkeypatch, stalls):
    """The screening keeps the faster of SCREEN_RUNS runs after a candidate's first: one run
    that stalls (a second on the tuner's clock) leaves it timed like the others; a candidate
    whose every screening run stalls is left out as slow, its stalled run as its time."""
    real = autotune._runner

    def stalling(plan, arrays, out):
        run = real(plan, arrays, out)
        if plan.lowering.name != base.CONV_TRANSPOSE:
            return run
        left = [stalls]

        def stalled():
            if left[0]:
                left[0] -= 1
                autotune.clock.advance(1.0)
            run()

        return stalled

    monkeypatch.setattr(autotune, "_runner", stalling)
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    times = op.tuning.times_us
    assert autotune.SCREEN_RUNS == 2
    if stalls < autotune.SCREEN_RUNS:
        assert times[base.CONV_TRANSPOSE] < 1e3  # microseconds: timed in rounds, not the stall
    else:
        assert times[base.CONV_TRANSPOSE] > 0.9e6  # microseconds: the stalled run stands


@pytest.mark.parametrize(("other", "chosen"), [(0.97, "rule"), (0.90, "other"), (1.5, "rule")])
def test_the_rules_choice_stays_unless_another_is_clearly_faster(tuning, monkeypatch, other, chosen):
    """MARGIN: within 5% of the rules' time the rules' lowering is kept (noise cannot flip it)."""
    def fake_time(runs, once):  # any further candidate is slower than both
        times = {base.CONVOLUTION_BACKWARD_DATA: 1e-3, base.CONV_TRANSPOSE: other * 1e-3}
        return {name: times.get(name, 2e-3) for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))  # no first-run screening: timing alone
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    t = op.tuning
    assert t.name == (t.rule if chosen == "rule" else base.CONV_TRANSPOSE)
    assert t.rule == base.CONVOLUTION_BACKWARD_DATA
    assert (t.times_us[t.rule], t.times_us[base.CONV_TRANSPOSE]) == (1000.0, round(other * 1000, 2))


@pytest.mark.parametrize(("again", "chosen"), [(0.90, "other"), (0.97, "rule"), (1.5, "rule")])
def test_a_change_from_the_rules_choice_is_timed_again(tuning, monkeypatch, again, chosen):
    """Where another candidate beat the rules' choice, the two are timed once more, alone:
    the change stands only if that timing shows it MARGIN faster too (the first timing's
    rounds may have caught the rules' choice in a stall), and the op says both timings."""
    timings = []

    def fake_time(runs, once):
        first = not timings
        timings.append(sorted(runs))
        other = 0.5 if first else again  # the first timing: the other one twice as fast
        times = {base.CONVOLUTION_BACKWARD_DATA: 1e-3, base.CONV_TRANSPOSE: other * 1e-3}
        return {name: times.get(name, 2e-3) for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    result = op(x, w)
    t = op.tuning
    assert t.rule == base.CONVOLUTION_BACKWARD_DATA
    assert t.name == (base.CONV_TRANSPOSE if chosen == "other" else t.rule)
    assert timings[1] == sorted([base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA])  # the two alone
    assert t.times_us[base.CONV_TRANSPOSE] == 500.0
    assert t.confirm_us == {base.CONVOLUTION_BACKWARD_DATA: 1000.0, base.CONV_TRANSPOSE: round(again * 1000, 2)}
    assert_close(result, reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS), "f32", 8 * 16)
    assert t.checks == (1 if chosen == "other" else 0)
    # a second op of this process takes the choice from the cache, untimed
    again_here = oc.ConvTranspose(**ATTRS)
    again_here(x, w)
    assert again_here.tuning.cached and len(timings) == 2
    # the second process reads both timings and the choice from the cache; a change it times
    # once more (the same `again` as the tuning process's second timing: it holds or not alike)
    tuning_cache.forget()
    op2 = oc.ConvTranspose(**ATTRS)
    op2(x, w)
    assert (op2.tuning.name, op2.tuning.confirm_us) == (t.name, t.confirm_us)
    if chosen == "other":
        assert not op2.tuning.cached and len(timings) == 3 and op2.tuning.checks == autotune.CHECKS
        assert op2.tuning.recheck_us == t.confirm_us
    else:
        assert op2.tuning.cached and len(timings) == 2


@pytest.mark.parametrize(("recheck", "kept"), [(0.90, True), (0.97, False), (1.5, False)])
def test_a_change_is_timed_again_by_the_next_process_before_it_is_trusted(tuning, monkeypatch, recheck, kept):
    """CHECKS: a change from the rules' choice, confirmed in the tuning process, is timed
    again (the two alone) by the first process that uses it; it stays only if that timing
    shows it MARGIN faster too, and either way a third process takes the settled choice
    from the cache untimed. A choice made in a slow phase of the machine is not kept for good."""
    timings = []

    def fake_time(runs, once):
        timings.append(sorted(runs))
        other = 0.5 if len(timings) <= 2 else recheck  # the tuning process: twice as fast, twice
        times = {base.CONVOLUTION_BACKWARD_DATA: 1e-3, base.CONV_TRANSPOSE: other * 1e-3}
        return {name: times.get(name, 2e-3) for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    x, w = arrays()
    want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS)
    first = oc.ConvTranspose(**ATTRS)
    first(x, w)
    assert (first.tuning.name, first.tuning.checks, first.tuning.settled) == (base.CONV_TRANSPOSE, 1, False)
    tuning_cache.forget()  # the next process
    second = oc.ConvTranspose(**ATTRS)
    assert_close(second(x, w), want, "f32", 8 * 16)
    t = second.tuning
    assert timings[2] == sorted([base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA]) and not t.cached
    assert t.recheck_us == {base.CONVOLUTION_BACKWARD_DATA: 1000.0, base.CONV_TRANSPOSE: round(recheck * 1000, 2)}
    assert t.name == (base.CONV_TRANSPOSE if kept else base.CONVOLUTION_BACKWARD_DATA) and t.settled
    assert t.times_us == first.tuning.times_us and t.confirm_us == first.tuning.confirm_us  # kept as evidence
    entry = next(iter(json.loads((tuning / tuning_cache.FILE_NAME).read_text())["contexts"].values()))
    assert next(iter(entry.values()))["checks"] == (autotune.CHECKS if kept else 0)
    tuning_cache.forget()  # a third process: settled, untimed
    third = oc.ConvTranspose(**ATTRS)
    assert_close(third(x, w), want, "f32", 8 * 16)
    assert third.tuning.cached and third.tuning.name == t.name and len(timings) == 3


def test_an_entry_of_an_earlier_version_that_overturned_the_rules_is_timed_again(tuning, monkeypatch):
    """An entry with no ``checks`` (written before the field existed) that overturned the
    rules' choice counts as checked by its tuning process alone: the next process times it."""
    timings = []

    def fake_time(runs, once):
        timings.append(sorted(runs))
        return {name: 1e-3 for name in runs}  # level: the rules' choice is kept

    monkeypatch.setattr(autotune, "_time", fake_time)
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)  # tuned: the rules' choice, stored
    file = tuning / tuning_cache.FILE_NAME
    data = json.loads(file.read_text())
    entry = next(iter(next(iter(data["contexts"].values())).values()))
    entry["name"] = base.CONV_TRANSPOSE
    for field_name in ("checks", "recheck_us"):
        del entry[field_name]
    file.write_text(json.dumps(data))
    tuning_cache.forget()
    again = oc.ConvTranspose(**ATTRS)
    again(x, w)
    assert timings[-1] == sorted([base.CONV_TRANSPOSE, base.CONVOLUTION_BACKWARD_DATA])
    assert again.tuning.name == base.CONVOLUTION_BACKWARD_DATA and again.tuning.recheck_us


def test_a_change_the_library_refuses_when_timed_again_falls_back_to_the_rules(tuning, monkeypatch):
    def fake_time(runs, once):
        times = {base.CONVOLUTION_BACKWARD_DATA: 1e-3, base.CONV_TRANSPOSE: 0.5e-3}
        return {name: times.get(name, 2e-3) for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    x, w = arrays()
    first = oc.ConvTranspose(**ATTRS)
    first(x, w)
    assert first.tuning.name == base.CONV_TRANSPOSE
    tuning_cache.forget()
    real_build = autotune.build

    def refusing(problem, name):
        if name == base.CONV_TRANSPOSE:
            raise ValueError("refused in this process")
        return real_build(problem, name)

    monkeypatch.setattr(autotune, "build", refusing)
    second = oc.ConvTranspose(**ATTRS)
    assert_close(second(x, w), reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **ATTRS),
                 "f32", 8 * 16)
    assert second.tuning.name == base.CONVOLUTION_BACKWARD_DATA
    assert "refused in this process" in second.tuning.rejected[base.CONV_TRANSPOSE]


def test_the_rules_choice_kept_is_not_timed_again(tuning, monkeypatch):
    timings = []

    def fake_time(runs, once):
        timings.append(sorted(runs))
        return {name: 1e-3 for name in runs}

    monkeypatch.setattr(autotune, "_time", fake_time)
    monkeypatch.setattr(autotune, "SLOW_FACTOR", float("inf"))
    x, w = arrays()
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)
    assert len(timings) == 1 and op.tuning.name == op.tuning.rule and op.tuning.confirm_us == {}


def test_backward_ops_and_constant_weights_are_tuned(tuning):
    rng = np.random.default_rng(1)
    x, w = arrays()
    dd = rng.standard_normal((2, 4, 8, 8)).astype(np.float32)
    bwd_d = oc.ConvTransposeBackwardData(**ATTRS)
    got_d = bwd_d(dd, w)
    bwd_w = oc.ConvTransposeBackwardWeights(weights_shape=W, **ATTRS)
    got_w = bwd_w(x, dd)
    for op in (bwd_d, bwd_w):
        assert op.tuning is not None and len(op.tuning.times_us) >= 2, op.tuning
    f64 = {k: v.astype(np.float64) for k, v in dict(x=x, w=w, dd=dd).items()}
    assert_close(got_d, reference.conv_transpose_backward_data(f64["dd"], f64["w"], **ATTRS), "f32", 4 * 16)
    assert_close(got_w, reference.conv_transpose_backward_weights(f64["x"], f64["dd"], W, **ATTRS), "f32", 2 * 64)
    layer = oc.ConvTranspose(**ATTRS).with_constant_weights(w)
    np.testing.assert_allclose(layer(x), oc.ConvTranspose(**ATTRS)(x, w), rtol=1e-5, atol=1e-5)
    assert layer.op.tuning is not None and not layer.op.tuning.cached  # a signature of its own


def test_one_candidate_is_not_tuned(tuning):
    """A 1-D kernel of 128 or more has the overlap-add MatMul alone where its stride has
    more phases than the polyphase lowering takes (up to 64, each with a short kernel)."""
    rng = np.random.default_rng(2)
    op = oc.ConvTranspose(strides=65, data_format="NCX", weights_format="IOX")
    op(rng.standard_normal((1, 2, 3)).astype(np.float32), rng.standard_normal((2, 2, 130)).astype(np.float32))
    assert op.tuning is None and op.lowering == "MatMul"


def test_an_unwritable_cache_directory_warns_once_and_still_tunes(tuning, monkeypatch):
    blocker = tuning / "file"
    blocker.write_text("")
    monkeypatch.setenv("ONEDNN_CONVT_CACHE_DIR", str(blocker / "sub"))  # under a file: cannot exist
    x, w = arrays()
    with pytest.warns(tuning_cache.TuningCacheWarning, match="cannot write the autotuning cache"):
        oc.ConvTranspose(**ATTRS)(x, w)
    op = oc.ConvTranspose(**ATTRS)
    op(x, w)  # remembered in this process, no second warning (filterwarnings = error)
    assert op.tuning.cached


def test_a_cache_file_that_is_no_regular_file_is_not_read(tuning):
    """A FIFO in the cache file's place would block the read forever: it is refused unread."""
    os.mkfifo(tuning / tuning_cache.FILE_NAME)
    tuning_cache.forget()
    x, w = arrays()
    with pytest.warns(tuning_cache.TuningCacheWarning, match="cannot read the autotuning cache .* not a regular file"):
        oc.ConvTranspose(**ATTRS)(x, w)


def test_set_autotune_takes_a_bool():
    with pytest.raises(TypeError, match="set_autotune: argument 'on' expected a bool"):
        oc.set_autotune(1)  # type: ignore[arg-type]


def test_the_environment_variable_turns_it_on(tmp_path):
    code = "import onednn_convt as oc; print(oc.autotune_enabled())"
    for value, want in (("1", "True"), ("0", "False"), ("", "False")):
        env = dict(os.environ, ONEDNN_CONVT_AUTOTUNE=value, ONEDNN_CONVT_CACHE_DIR=str(tmp_path))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


@pytest.mark.parametrize("op_name", ["fwd", "fwd+bias", "bwd_d", "bwd_w"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_candidates_are_timed_as_the_call_runs_them(op_name, dtype):
    """The tuner times each candidate the way a call runs it: through the plan's C++
    executor where it has one (per-call costs decide small problems), and the call it
    times computes the op (checked against the reference, f16 computed in f32 included)."""
    from onednn_convt.lowering import candidates

    rng = np.random.default_rng(1)
    dt = np.float16 if dtype == "f16" else np.float32
    x = rng.standard_normal(SRC).astype(dt)
    w = rng.standard_normal(W).astype(dt)
    dd = rng.standard_normal((2, 4, 8, 8)).astype(dt)
    wide = [a.astype(np.float64) for a in (x, w, dd)]
    bias = rng.standard_normal(4).astype(dt)
    if op_name.startswith("fwd"):
        op, call = oc.ConvTranspose(**ATTRS), [x, w, bias if op_name == "fwd+bias" else None]
        want = reference.conv_transpose(wide[0], wide[1], bias.astype(np.float64) if call[2] is not None else None, **ATTRS)
    elif op_name == "bwd_d":
        op, call = oc.ConvTransposeBackwardData(**ATTRS), [dd, w]
        want = reference.conv_transpose_backward_data(wide[2], wide[1], **ATTRS)
    else:
        op, call = oc.ConvTransposeBackwardWeights(**ATTRS, weights_shape=W), [x, dd, None]
        want = reference.conv_transpose_backward_weights(wide[0], wide[2], W, **ATTRS)
    problem = op._problem(call, dtype)
    executors = 0
    for name in candidates(problem):
        plan = op._target().plan(autotune.build(problem, name), call, None, problem.dtype)
        out = np.full(problem.out_shape, np.nan, dt)
        run = autotune._runner(plan, call, out)
        run()
        executors += plan.executor is not None
        assert_close(out, want, dtype, 8 * 16)
    assert executors, "no candidate had an executor: the test shows nothing"


#: a process that tunes one call (writing a real cache entry), replaces one field of the
#: entry (or one value inside it) with a hostile value chosen by the seed, and calls the op
#: again as a new process would: the call must still return the right result
_HOSTILE_CACHE = r"""
import json, os, random, sys, warnings
import numpy as np
import onednn_convt as oc
from onednn_convt import reference
from onednn_convt.lowering import tuning_cache

seed = int(sys.argv[1])
attrs = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
rng = np.random.default_rng(0)
x = rng.standard_normal((2, 8, 4, 4)).astype(np.float32)
w = rng.standard_normal((8, 4, 4, 4)).astype(np.float32)
oc.set_autotune(True)
oc.ConvTranspose(**attrs)(x, w)
path = tuning_cache.path()
data = json.loads(path.read_text())
(entries,) = data["contexts"].values()
(entry,) = entries.values()
pick = random.Random(seed)
hostile = [None, True, 0, -1, 2**70, 1.5, float("nan"), "", "x", [], [1], ["x", 2], {}, {"a": 1}, {"a": "b"},
           {"a": [1]}, {"a": True}, {"": None}, {"ConvTranspose": -1e308}]
field = sys.argv[2] if len(sys.argv) > 2 else pick.choice(
    ["name", "candidates", "times_us", "rejected", "batch", "confirm_us", "checks", "recheck_us", "extra", "drop",
     "other"])
if field == "other":  # another candidate, checked by any count of processes: timed again or not
    entry["name"] = pick.choice(entry["candidates"][1:])
    entry["checks"] = pick.choice([0, 1, -1, 2, 2**70])
    entry["batch"] = pick.choice([entry.get("batch", 2), 0, -5, 2**70])
elif field == "drop":
    entry.pop(pick.choice(sorted(entry)))
elif isinstance(entry.get(field), dict) and entry[field] and pick.random() < 0.5:
    entry[field][pick.choice(sorted(entry[field]))] = pick.choice(hostile)
else:
    entry[field] = pick.choice(hostile)
path.write_text(json.dumps(data))
tuning_cache.forget()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # a TuningCacheWarning where the file is refused
    got = oc.ConvTranspose(**attrs)(x, w)
want = reference.conv_transpose(x.astype(np.float64), w.astype(np.float64), **attrs)
assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), field
print("ok", field)
"""


@pytest.mark.parametrize(("seed", "field"), [*((s, "") for s in range(6)), (0, "other"), (1, "other"),
                                            *(pytest.param(s, "", marks=pytest.mark.slow) for s in range(6, 16)),
                                            *(pytest.param(s, "other", marks=pytest.mark.slow) for s in range(2, 6))])
def test_a_hostile_cache_entry_never_breaks_a_call(tmp_path, seed, field):
    """Fuzz the cache file's entries (each trial a process of its own, with a timeout): a
    field of the wrong type, a hostile value inside one, a field dropped or added, or
    (``other``) another candidate chosen, checked by any count of processes, at any batch,
    which the call may time again (:data:`autotune.CHECKS`). The call reads the file as a
    new process does and returns the right result: the entry is used, skipped, timed again,
    or the file ignored with a warning, never an exception."""
    env = dict(os.environ, ONEDNN_CONVT_CACHE_DIR=str(tmp_path), ONEDNN_CONVT_AUTOTUNE="")
    out = subprocess.run([sys.executable, "-c", _HOSTILE_CACHE, str(seed), *([field] if field else [])], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("variable, value, expect, warns", [
    ("ONEDNN_CONVT_AUTOTUNE", "maybe", "False True", True),
    ("ONEDNN_CONVT_AUTOTUNE", " On ", "True True", False),
    ("ONEDNN_CONVT_GUARDS", "of", "False True", True),
    ("ONEDNN_CONVT_GUARDS", "OFF", "False False", False),
    ("ONEDNN_CONVT_GUARDS", "", "False True", False),
])
def test_an_unknown_switch_value_warns_and_keeps_the_default(variable, value, expect, warns):
    """A typo in an on/off environment variable keeps the default, with a warning naming it."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_CONVT_AUTOTUNE", "ONEDNN_CONVT_GUARDS")}
    env[variable] = value
    out = subprocess.run([sys.executable, "-c", "import onednn_convt as oc; print(oc.autotune_enabled(), "
                          "oc.guards.enabled())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == expect, out.stderr[-2000:]
    assert (f"{variable}={value!r}: expected one of" in out.stderr) is warns

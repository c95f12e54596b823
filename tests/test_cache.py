"""The compiled-partition cache: hits and misses, the LRU bound, clearing, threads.

An op object keeps its own compiled plans, so a repeated call on the *same* object does not
even reach the global cache; a new object with the same attributes and arrays does, and
hits it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import onednn_convt as oc
import pytest
from helpers import Config, assert_close

NCX = {"data_format": "NCX", "weights_format": "IOX"}
RNG = np.random.default_rng(81)


def problem(length: int) -> tuple[np.ndarray, np.ndarray]:
    """A distinct 1-D forward problem per ``length`` (each needs its own compiled partition)."""
    return (RNG.standard_normal((1, 3, length)).astype(np.float32),
            RNG.standard_normal((3, 2, 3)).astype(np.float32))


def run_new_op(length: int) -> np.ndarray:
    x, w = PROBLEMS[length]
    return oc.ConvTranspose(strides=2, **NCX)(x, w)


PROBLEMS = {n: problem(n) for n in (4, 5, 6, 7)}


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    capacity = oc.cache_info()["capacity"]
    oc.clear_cache()
    yield
    oc.set_cache_capacity(capacity)
    oc.clear_cache()


def counters() -> tuple[int, int, int]:
    i = oc.cache_info()
    return i["hits"], i["misses"], i["size"]


def test_cache_info_fields():
    info = oc.cache_info()
    assert set(info) == {"hits", "misses", "size", "capacity"}
    assert info["hits"] == info["misses"] == info["size"] == 0 and info["capacity"] > 0


def test_a_new_op_with_the_same_problem_hits():
    run_new_op(4)
    assert counters() == (0, 1, 1)
    for k in range(1, 4):
        run_new_op(4)
        assert counters() == (k, 1, 1)


def test_the_same_op_object_reuses_its_plan_without_the_cache():
    x, w = PROBLEMS[5]
    op = oc.ConvTranspose(strides=2, **NCX)
    first = op(x, w)
    assert counters() == (0, 1, 1)
    for _ in range(3):
        np.testing.assert_array_equal(op(x, w), first)
    assert counters() == (0, 1, 1)


def test_everything_that_changes_the_code_is_in_the_key():
    x, w = PROBLEMS[6]
    run_new_op(6)
    variants = [
        lambda: oc.ConvTranspose(strides=3, **NCX)(x, w),  # attributes
        lambda: oc.ConvTranspose(strides=2, **NCX)(np.asfortranarray(x), w),  # strides of an input
        lambda: oc.ConvTranspose(strides=2, **NCX)(np.concatenate([x, x]), w),  # shape
        lambda: oc.ConvTranspose(strides=2, **NCX)(x, w, np.zeros(2, np.float32)),  # a bias input
        lambda: oc.ConvTranspose(strides=2, **NCX)(x, w, out=np.empty((1, 2, 13, 3), np.float32)[..., 0]),  # out strides
    ]
    for k, call in enumerate(variants, start=2):
        call()
        assert counters() == (0, k, k)


def test_capacity_bounds_the_size():
    oc.set_cache_capacity(2)
    for n in (4, 5, 6, 7):
        run_new_op(n)
    hits, misses, size = counters()
    assert (hits, misses, size) == (0, 4, 2)
    assert oc.cache_info()["capacity"] == 2


def test_least_recently_used_is_evicted():
    oc.set_cache_capacity(2)
    run_new_op(4)  # A
    run_new_op(5)  # B
    run_new_op(4)  # A hit: now B is the least recently used
    run_new_op(6)  # C evicts B
    assert counters() == (1, 3, 2)
    run_new_op(4)  # A still cached
    assert counters() == (2, 3, 2)
    run_new_op(5)  # B was evicted: compiled again (and evicts C)
    assert counters() == (2, 4, 2)
    run_new_op(6)
    assert counters() == (2, 5, 2)


def test_shrinking_the_capacity_evicts_and_zero_disables():
    for n in (4, 5, 6):
        run_new_op(n)
    oc.set_cache_capacity(1)
    assert counters()[2] == 1
    run_new_op(6)  # the most recent one stayed
    assert counters() == (1, 3, 1)
    oc.set_cache_capacity(0)
    assert counters()[2] == 0
    run_new_op(7)
    run_new_op(7)
    assert counters() == (1, 5, 0)


def test_clear_cache_resets_and_ops_keep_working():
    x, w = PROBLEMS[7]
    op = oc.ConvTranspose(strides=2, **NCX)
    want = op(x, w)
    run_new_op(4)
    oc.clear_cache()
    assert counters() == (0, 0, 0)
    np.testing.assert_array_equal(op(x, w), want)  # the op holds its compiled partition
    run_new_op(7)
    assert counters() == (0, 1, 1)
    cfg = Config(src=(7,), kernel=(3,), ic=3, oc=2, strides=2)
    assert_close(want, cfg.ref_forward(x, w), "f32", cfg.fwd_reduction)


@pytest.mark.parametrize(("value", "exc"), [(-1, ValueError), (2.5, TypeError), ("8", TypeError), (None, TypeError)])
def test_bad_capacity(value, exc):
    with pytest.raises(exc, match="set_cache_capacity: argument 'capacity' expected an int in \\[0, 2\\*\\*63 - 1\\]"):
        oc.set_cache_capacity(value)


def test_threads_share_the_cache_safely():
    """Many threads compiling and running the same few problems: right results, exact counts."""
    oc.set_cache_capacity(2)  # force evictions while other threads hold partitions
    want = {n: run_new_op(n) for n in PROBLEMS}
    oc.clear_cache()
    errors: list[BaseException] = []
    calls_per_thread = 12

    def work(seed: int) -> None:
        try:
            for i in range(calls_per_thread):
                n = list(PROBLEMS)[(seed + i) % len(PROBLEMS)]
                np.testing.assert_array_equal(run_new_op(n), want[n])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    hits, misses, size = counters()
    assert hits + misses == 4 * calls_per_thread
    assert size <= 2

"""The kept host memory (``src/cpp/host_memory.hpp``, :mod:`onednn_convt.memory`): oneDNN's
temporary buffers and the package's large arrays come from blocks kept between calls, so a
repeated call takes no fresh pages. Reuse must never show in a result (a kept block holds
the last call's bytes), the kept total stays bounded, :func:`onednn_convt.clear_cache` frees
it, arrays still held survive that, and a forked child can use the memory it inherited.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onednn_convt as oc
import pytest
from helpers import assert_close
from onednn_convt import limits, memory, reference

MB = 2**20

# a 1-D k4 s2 up-sampler in NCX (HiFi-GAN's form, smaller): its partitions reorder src and
# dst to channels-last through the library's temporary memory, 2 MiB each
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
SRC, WEIGHTS = (4, 64, 2048), (64, 32, 4)


def inputs(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(SRC).astype(np.float32), rng.standard_normal(WEIGHTS).astype(np.float32)


def test_a_repeated_call_reuses_kept_blocks_and_stays_right():
    """After the first call, calls whose results are dropped take no new large block; each
    call's result matches the reference although its memory held another call's values."""
    op = oc.ConvTranspose(**ATTRS)
    x, w = inputs(0)
    op(x, w)  # compiles; its result is dropped at once, and the blocks are kept
    before = oc.host_memory_info()
    for seed in range(1, 5):
        x, w = inputs(seed)
        got = op(x, w)
        assert_close(got, reference.conv_transpose(x, w, **ATTRS), "f32", 64 * 4, f"seed {seed}")
        del got
    after = oc.host_memory_info()
    assert after["allocated"] == before["allocated"]
    assert after["reused"] >= before["reused"] + 4  # at least the result of each call


def test_zeros_from_a_reused_block_are_zeros():
    shape = (3 * MB // 4,)  # 3 MiB of f32
    a = memory.empty(shape, np.float32)
    a.fill(np.nan)
    del a
    before = oc.host_memory_info()["reused"]
    z = memory.zeros(shape, np.float32)
    assert oc.host_memory_info()["reused"] == before + 1
    assert z.shape == shape and z.dtype == np.float32 and z.flags.c_contiguous and z.flags.writeable
    assert not z.any()


def test_small_arrays_come_from_numpy():
    before = oc.host_memory_info()
    a = memory.empty((memory.KEPT_FROM // 4 - 1,), np.float32)
    assert a.flags.owndata
    assert oc.host_memory_info()["allocated"] == before["allocated"]
    assert memory.empty((2, 0, 3), np.float32).shape == (2, 0, 3)


def test_kept_memory_is_bounded_and_clear_cache_frees_it():
    count = memory.KEPT_BYTES // (8 * MB) * 3 // 2  # 1.5x the bound held at once, then freed
    blocks = [memory.empty((8 * MB,), np.uint8) for _ in range(count)]
    del blocks
    info = oc.host_memory_info()
    assert 0 < info["kept_bytes"] <= memory.KEPT_BYTES
    oc.clear_cache()
    assert oc.host_memory_info()["kept_bytes"] == 0
    assert oc.host_memory_info()["kept_blocks"] == 0
    assert oc.info()["host_memory"]["kept_bytes"] == 0


def test_kept_blocks_go_back_before_a_memory_error(monkeypatch):
    """Near the memory limit the kept blocks go back to the system before a call is refused.
    The system's free memory is simulated: 32 MiB less what this process keeps, 64 MiB."""
    monkeypatch.setattr(limits, "_limit", None)
    monkeypatch.setattr(limits, "available_memory", lambda: 0)
    oc.clear_cache()
    op = oc.ConvTranspose(**ATTRS)
    x, w = inputs(11)
    with pytest.raises(MemoryError, match="memory available now"):
        op(x, w)
    blocks = [memory.empty((8 * MB,), np.uint8) for _ in range(8)]
    del blocks
    assert oc.host_memory_info()["kept_bytes"] >= 64 * MB
    monkeypatch.setattr(limits, "available_memory", lambda: 32 * MB - oc.host_memory_info()["kept_bytes"])
    assert_close(op(x, w), reference.conv_transpose(x, w, **ATTRS), "f32", 64 * 4)


def test_results_outlive_clear_cache():
    """clear_cache frees only the kept blocks: a result still held keeps its memory."""
    op = oc.ConvTranspose(**ATTRS)
    x, w = inputs(7)
    got = op(x, w)
    held = got.copy()
    oc.clear_cache()
    filler = [memory.empty(got.shape, got.dtype) for _ in range(4)]  # would take a freed block
    for f in filler:
        f.fill(np.nan)
    np.testing.assert_array_equal(got, held)


def test_a_forked_child_uses_the_kept_blocks():
    """A child forked while blocks are kept allocates and computes right (one OpenMP thread
    there, see onednn_convt.native); its parent still does too."""
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        import onednn_convt as oc
        from onednn_convt import reference
        A = {ATTRS!r}
        rng = np.random.default_rng(3)
        x = rng.standard_normal({SRC}).astype(np.float32)
        w = rng.standard_normal({WEIGHTS}).astype(np.float32)
        op = oc.ConvTranspose(**A)
        want = reference.conv_transpose(x, w, **A)
        op(x, w)
        assert oc.host_memory_info()["kept_blocks"] > 0
        def right():
            return float(np.abs(op(x, w) - want).max()) < 1e-3 * float(np.abs(want).max())
        pid = os.fork()
        if pid == 0:
            os._exit(0 if right() and right() else 3)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status) or (0 if right() else 4))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr

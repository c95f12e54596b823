"""The kept host memory (``src/cpp/host_memory.hpp``, :mod:`onednn_convt.memory`): oneDNN's
temporary buffers and the package's large arrays come from blocks kept between calls, so a
repeated call takes no fresh pages. Reuse must never show in a result (a kept block holds
the last call's bytes), the kept total stays bounded, :func:`onednn_convt.clear_cache` frees
it, arrays still held survive that, and a forked child can use the memory it inherited.
"""

from __future__ import annotations

import json
import os
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
    monkeypatch.setattr(limits, "_system_available", lambda: 0)
    oc.clear_cache()
    op = oc.ConvTranspose(**ATTRS)
    x, w = inputs(11)
    with pytest.raises(MemoryError, match="memory available now"):
        op(x, w)
    blocks = [memory.empty((8 * MB,), np.uint8) for _ in range(8)]
    del blocks
    assert oc.host_memory_info()["kept_bytes"] >= 64 * MB
    monkeypatch.setattr(limits, "_system_available", lambda: 32 * MB - oc.host_memory_info()["kept_bytes"])
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


# A child under a real address-space limit (RLIMIT_AS): an 8x32x64x64 f32 NCX k4 s2 forward,
# whose partitions take about 12 MiB of the library's temporary memory, then a larger call.
_ULIMIT_SCRIPT = textwrap.dedent("""
    import json, resource
    import numpy as np
    import onednn_convt as oc
    from onednn_convt import native

    def vm_size():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))

    A = dict(strides=[2, 2], pads_begin=[1, 1], pads_end=[1, 1], data_format="NCX", weights_format="IOX")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((8, 32, 64, 64), np.float32)
    w = rng.standard_normal((32, 16, 4, 4), np.float32)
    op = oc.ConvTranspose(**A)
    first = op(x, w)  # compiled and run with no limit
    out = np.full_like(first, np.nan)
    temporary = oc.host_memory_info()["kept_bytes"]  # the library's temporaries, freed and kept
    native.release_host_memory()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    errors = []
    # 1. the compiled call, its temporary memory past the limit: the allocator's failure
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + temporary // 2, hard))
    try:
        op(x, w, out=out)
        errors.append(None)
    except MemoryError as e:
        errors.append(str(e))
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    again = op(x, w, out=out)
    # 2. a new call past what the limit leaves: refused before the library sees it
    big = rng.standard_normal((8, 32, 88, 88), np.float32)  # about 40 MB to allocate
    native.release_host_memory()  # (else the check gives the kept blocks back and finds more room)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + oc.limits.address_space_reserve() + 16 * 2**20, hard))
    try:
        op(big, w)
        errors.append(None)
    except MemoryError as e:
        errors.append(str(e))
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    np.save("first.npy", first); np.save("again.npy", again); np.save("big.npy", op(big, w))
    np.save("x.npy", x); np.save("w.npy", w); np.save("bigx.npy", big)
    print(json.dumps([temporary, errors]))
""")


def test_running_out_of_address_space_is_a_memory_error_and_the_package_recovers(tmp_path):
    """Under ``ulimit -v`` oneDNN 3.2's graph executor wrote its temporary buffers through
    the null pointer an allocator returns (SIGSEGV, found with a polyphase forward); the
    allocator raises instead, so the call raises MemoryError. A new call that would pass
    what the limit leaves (less the reserve the library's compile needs) is refused before
    the library. With the limit lifted, both ops give the reference's results."""
    done = subprocess.run([sys.executable, "-c", _ULIMIT_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    temporary, (at_run, at_plan) = json.loads(done.stdout)
    if temporary < 8 * MB:
        pytest.skip(f"the library took {temporary} bytes of temporary memory here: nothing to deny it")
    assert at_run is not None and "ConvTranspose: oneDNN could not allocate" in at_run and "ulimit -v" in at_run
    assert at_plan is not None and "ulimit" in at_plan and "kept for the library and its threads" in at_plan
    load = {name: np.load(tmp_path / f"{name}.npy") for name in ("first", "again", "big", "x", "w", "bigx")}
    attrs = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="IOX")
    np.testing.assert_array_equal(load["again"], load["first"])
    assert_close(load["first"], reference.conv_transpose(load["x"], load["w"], **attrs), "f32", 32 * 16)
    assert_close(load["big"], reference.conv_transpose(load["bigx"], load["w"], **attrs), "f32", 32 * 16)


def test_an_address_space_limit_lowers_every_limit(monkeypatch, tmp_path):
    """Under ``ulimit -v`` (RLIMIT_AS, against VmSize) or ``ulimit -d`` (RLIMIT_DATA, against
    VmData) a call may take what is left less address_space_reserve() (the compiles' reserve
    and a stack per OpenMP thread: OMP_STACKSIZE, else ulimit -s), below the memory
    available and below a limit the user set; without either, neither is read."""
    import resource

    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmSize:\t 2000000 kB\nVmData:\t 1000000 kB\n")
    monkeypatch.setattr(limits, "STATUS", str(status))
    monkeypatch.setattr(limits, "MEMINFO", str(tmp_path / "missing"))
    monkeypatch.setattr(limits, "CGROUP_V1", (str(tmp_path / "a"), str(tmp_path / "b")))
    monkeypatch.setattr(limits, "CGROUP_V2", (str(tmp_path / "a"), str(tmp_path / "b")))
    caps = {resource.RLIMIT_AS: resource.RLIM_INFINITY, resource.RLIMIT_DATA: resource.RLIM_INFINITY,
            resource.RLIMIT_STACK: 8 * MB}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (caps.get(which, resource.RLIM_INFINITY), -1))
    monkeypatch.setattr(limits.omp, "max_threads", lambda: 4)
    monkeypatch.delenv("OMP_STACKSIZE", raising=False)
    assert limits.address_space_reserve() == limits.COMPILE_RESERVE + 4 * 8 * MB
    monkeypatch.setenv("OMP_STACKSIZE", "16M")
    assert limits.address_space_reserve() == limits.COMPILE_RESERVE + 4 * 16 * MB
    monkeypatch.setenv("OMP_STACKSIZE", "512")  # kilobytes without a unit
    assert limits.address_space_reserve() == limits.COMPILE_RESERVE + 4 * 512 * 1024
    monkeypatch.delenv("OMP_STACKSIZE")
    reserve = limits.COMPILE_RESERVE + 4 * 8 * MB
    assert limits.address_space_left() is None and limits.available_memory() is None
    caps[resource.RLIMIT_AS] = 2_000_000 * 1024 + 1000 * MB
    assert limits.address_space_left() == 1000 * MB
    assert limits.available_memory() == 1000 * MB - reserve
    caps[resource.RLIMIT_DATA] = 1_000_000 * 1024 + 500 * MB  # the data limit leaves less
    assert limits.address_space_left() == 500 * MB
    monkeypatch.setattr(limits, "_limit", 8 * 2**30)  # a user's limit above what is left
    assert limits.memory_limit() == 500 * MB - reserve
    monkeypatch.setattr(limits, "_limit", 100 * MB)  # and below it
    assert limits.memory_limit() == 100 * MB


# A child that calls a compiled bf16 1-D grouped NXC forward once under an address-space
# limit of VmSize + HEADROOM MiB, then again without it (address_space fuzzer, seed 4018,
# trial 15). Between about 9 and 19 MiB here, the engine's allocator has the call's blocks
# but an allocation of the library's own fails, which it reports as a status.
_OWN_ALLOCATION_SCRIPT = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import onednn_convt as oc

    def vm_size():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))

    bf16 = oc.dtypes.FLOAT_DTYPES["bf16"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 19164, 40), np.float32).astype(bf16)
    w = rng.standard_normal((3, 22, 40), np.float32).astype(bf16)
    op = oc.ConvTranspose(groups=2, data_format="NXC", weights_format="XOI")
    want = op(x, w)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + int(sys.argv[1]) * 2**20, hard))
    got = None
    try:
        got = op(x, w)
        outcome = "ran"
    except MemoryError as e:
        outcome = "MemoryError: " + str(e)
    except Exception as e:
        outcome = type(e).__name__ + ": " + str(e)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    if got is not None:  # (compared without the limit: the comparison allocates)
        outcome = "same" if np.array_equal(got.view(np.uint16), want.view(np.uint16)) else "different"
    after = op(x, w)
    print(json.dumps([outcome, bool(np.array_equal(after.view(np.uint16), want.view(np.uint16)))]))
""")


def test_the_library_running_out_of_its_own_memory_is_a_memory_error():
    """Where oneDNN 3.2 allocates outside the engine's allocator and fails, it reports
    out_of_memory as a status: that call raises MemoryError naming the op, as the
    allocator's own failures do (it escaped as OneDNNError), and the op runs right once
    the limit is lifted. Each headroom in a fresh process: a warm op under the limit must
    give the same bytes or raise MemoryError."""
    outcomes = {}
    for headroom in (9, 11, 12, 13, 15, 17):
        done = subprocess.run([sys.executable, "-c", _OWN_ALLOCATION_SCRIPT, str(headroom)], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "ONEDNN_CONVT_MEMORY_LIMIT": "2G"})
        assert done.returncode == 0, done.stderr[-3000:]
        outcome, after = json.loads(done.stdout)
        outcomes[headroom] = outcome
        assert after, (headroom, outcome)
        assert outcome == "same" or (outcome.startswith("MemoryError: ConvTranspose: oneDNN ")
                                     and "ulimit -v" in outcome), outcomes

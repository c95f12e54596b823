"""``onednn-convt info`` says whether NumPy's BLAS threads spin beside ours: an OpenBLAS of
more than one thread, neither ``OPENBLAS_NUM_THREADS=1`` nor ``OPENBLAS_THREAD_TIMEOUT`` set
(docs/performance.md, "Beside NumPy's matrix products")."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import onednn_convt as oc
from onednn_convt import arguments

info_module = importlib.import_module("onednn_convt.info")


def _openblas(monkeypatch, name="scipy-openblas"):
    def show_config(mode="stdout"):
        assert mode == "dicts"
        return {"Build Dependencies": {"blas": {"name": name, "version": "0.3.31"}}}

    monkeypatch.setattr(np, "show_config", show_config)
    for variable in info_module.OPENBLAS_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(arguments, "usable_cpus", lambda: 2)


@pytest.mark.parametrize(("env", "spins"), [
    ({}, True),
    ({"OPENBLAS_NUM_THREADS": "1"}, False),
    ({"OPENBLAS_NUM_THREADS": " 1 "}, False),
    ({"OPENBLAS_NUM_THREADS": "2"}, True),
    ({"OPENBLAS_THREAD_TIMEOUT": "4"}, False),
])
def test_openblas_spins_unless_one_thread_or_a_short_timeout(monkeypatch, env, spins):
    _openblas(monkeypatch)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    got = oc.info()["numpy_blas"]
    assert got == {"library": "scipy-openblas", "version": "0.3.31",
                   "OPENBLAS_NUM_THREADS": env.get("OPENBLAS_NUM_THREADS"),
                   "OPENBLAS_THREAD_TIMEOUT": env.get("OPENBLAS_THREAD_TIMEOUT"), "spins": spins}


def test_one_cpu_or_another_blas_does_not_spin_beside_ours(monkeypatch):
    _openblas(monkeypatch, name="mkl")
    assert info_module.numpy_blas_info()["spins"] is False
    _openblas(monkeypatch)
    monkeypatch.setattr(arguments, "usable_cpus", lambda: 1)
    assert info_module.numpy_blas_info()["spins"] is False


def test_a_numpy_that_does_not_say_its_blas(monkeypatch):
    def old_show_config():  # NumPy before 1.26: no mode argument
        print("blas_opt_info: ...")

    monkeypatch.setattr(np, "show_config", old_show_config)
    got = info_module.numpy_blas_info()
    assert got["library"] is None and got["version"] is None and got["spins"] is False


def test_this_numpy_is_read():
    got = oc.info()["numpy_blas"]
    want = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    assert (got["library"], got["version"]) == (want.get("name"), want.get("version"))

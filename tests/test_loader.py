"""The package finds and loads oneDNN 3.2 by itself, and says how to fix it when it cannot."""

from __future__ import annotations

import os
import subprocess
import sys

import onednn_convt


def test_loaded_onednn_is_3_2():
    info = onednn_convt.info()
    assert info["onednn_version"].startswith("3.2.")
    assert info["cpu_runtime"] == "OpenMP"


def test_loaded_library_is_the_one_in_the_process():
    path = os.path.realpath(onednn_convt.LIBDNNL_PATH)
    with open("/proc/self/maps") as maps:
        mapped = {line.split()[-1] for line in maps if "libdnnl" in line}
    assert path in mapped


def test_missing_library_override_gives_a_fix_it_message():
    env = dict(os.environ, ONEDNN_CONVT_LIBDNNL="/nonexistent/libdnnl.so.3")
    proc = subprocess.run(
        [sys.executable, "-c", "import onednn_convt"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr
    assert "ONEDNN_CONVT_LIBDNNL" in proc.stderr
    assert "pip install onednn-cpu-gomp==2023.2.0" in proc.stderr


def test_override_with_the_real_library_works():
    env = dict(os.environ, ONEDNN_CONVT_LIBDNNL=os.path.realpath(onednn_convt.LIBDNNL_PATH))
    code = "import onednn_convt as oc; print(oc.info()['onednn_version'])"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith("3.2.")


def test_console_script_and_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "onednn_convt", "info"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert '"onednn_version": "3.2.' in proc.stdout

"""Shared test setup: say what oneDNN actually ran, so CI logs show it."""

from __future__ import annotations

import onednn_convt


def pytest_report_header(config):  # noqa: ARG001 - pytest hook signature
    i = onednn_convt.info()
    return [
        f"onednn_convt: oneDNN {i['onednn_version']} ({i['onednn_commit'][:12]}) from {i['libdnnl']}",
        f"onednn_convt: cpu_isa={i['cpu_isa']} runtime={i['cpu_runtime']} threads={i['threads']} "
        f"dtypes={ {op: d for op, d in i['dtypes'].items()} }",
    ]

"""Fixtures for the jobs integration tests: a private data dir and job cleanup.

Every job a test submits is registered with ``track`` and scancelled by id at the end
(never ``scancel -u``: other engineers share the cluster)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient

@pytest.fixture
def slurm() -> SlurmClient:
    return SlurmClient()


@pytest.fixture
def jobs_env(tmp_path, monkeypatch) -> Path:
    """GPUHPC_DATA_DIR (logs, checkpoints) in a per-test dir, ledger off unless a test opts in."""
    from ledger_helpers import private_data_dir

    return private_data_dir(tmp_path, monkeypatch, "GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT")


@pytest.fixture
def track(slurm):
    ids: list[str] = []
    yield ids.append
    for job_id in ids:
        slurm.run(["scancel", str(job_id)], check=False)


class _Hook(BaseHTTPRequestHandler):
    """A webhook receiver: each POST's JSON body kept under its path (``server.got``)."""

    def do_POST(self):  # noqa: N802
        self.server.got[self.path] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def hook():
    """A local HTTP server for notify's webhooks: ``hook.server_port``, ``hook.got`` {path: body}."""
    srv = HTTPServer(("127.0.0.1", 0), _Hook)
    srv.got = {}
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()

"""An alert end to end on the local stack (scripts/services/prometheus.sh): the real
``GpuhpcTargetDown`` rule (the role's rules, rendered with ``for: 0s``) fires for a scrape target
this test points at a closed loopback port, Prometheus hands it to Alertmanager, and Alertmanager
POSTs it to a webhook receiver this test runs on 127.0.0.1; taking the target away resolves it.

The target goes into the ``probe`` scrape job's file_sd file with a ``gpuhpc_test`` label: the
local Alertmanager routes alerts with that label (only those) to the webhook port."""
from __future__ import annotations

import json
import os
import socket
import threading
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]     # services only: no Slurm command

ALERTMANAGER = os.environ.get("GPUHPC_ALERTMANAGER_URL", "http://127.0.0.1:9093")
WEBHOOK_PORT = int(os.environ.get("GPUHPC_ALERT_WEBHOOK_PORT", "9096"))
PROBE_FILE = Path(os.environ.get("GPUHPC_ALERT_PROBE_FILE", "/var/tmp/gpuhpc-prometheus/probe-targets.json"))


def _write_targets(targets: list[str], labels: dict | None = None) -> None:
    # always one group (source "file:0"), empty to remove the target: a provider that a concurrent
    # `prometheus.sh start` (a reload) restarted and that reads `[]` would keep the old target
    tmp = PROBE_FILE.with_suffix(".test-tmp")
    tmp.write_text(json.dumps([{"targets": targets, "labels": labels or {}}]))
    tmp.replace(PROBE_FILE)             # one rename: Prometheus never reads half a file


@pytest.fixture()
def webhook():
    """The receiver: every POSTed Alertmanager notification (its JSON body), in arrival order."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", WEBHOOK_PORT), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]       # closed again when the socket is: nothing listens there


def _alerts(received: list[dict], token: str, status: str) -> list[dict]:
    return [a for msg in received for a in msg.get("alerts", [])
            if a["labels"].get("gpuhpc_test") == token and a["status"] == status]


def test_target_down_alert_reaches_the_webhook_and_resolves(webhook):
    with urllib.request.urlopen(f"{ALERTMANAGER}/-/ready", timeout=10) as resp:
        assert resp.status == 200
    token = uuid.uuid4().hex[:12]
    target = f"127.0.0.1:{_closed_port()}"
    try:
        _write_targets([target], {"gpuhpc_test": token})
        firing = wait_for(lambda: _alerts(webhook, token, "firing"), 120,
                          lambda: f"GpuhpcTargetDown for {target} at the webhook (received {webhook})")
        alert = firing[0]
        assert alert["labels"]["alertname"] == "GpuhpcTargetDown"
        assert alert["labels"]["job"] == "probe" and alert["labels"]["instance"] == target
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["summary"].startswith(f"probe target {target} ")
        assert alert["generatorURL"].endswith("/graph?g0.expr=up+%3D%3D+0&g0.tab=1")     # the rule's query
        _write_targets([])
        wait_for(lambda: _alerts(webhook, token, "resolved"), 120,
                 lambda: f"the resolved GpuhpcTargetDown for {target} (received {webhook})")
    finally:
        _write_targets([])

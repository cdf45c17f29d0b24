"""The waste notifier on Prometheus-shaped alerts: once per alert, log and webhook."""
from __future__ import annotations

import http.server
import json
import threading

from gpuhpc.monitoring import notify

ALERTS = [
    {"labels": {"alertname": "GpuhpcIdleGpuHeld", "job_id": "7", "user": "a", "node": "n1", "gpu": "3"},
     "annotations": {"summary": "job 7 (a) holds idle GPU 3 on n1"}, "state": "firing",
     "activeAt": "2026-11-30T10:00:00Z", "value": "0e+00"},
    {"labels": {"alertname": "GpuhpcIdleGpuHeld", "job_id": "8", "node": "n1", "gpu": "4"}, "state": "pending",
     "activeAt": "2026-11-30T10:05:00Z"},
    {"labels": {"alertname": "Other"}, "state": "firing", "activeAt": "x"},
]


def test_select_and_send_once(tmp_path):
    recs = notify.select(ALERTS)
    assert [r["job_id"] for r in recs] == ["7"]
    assert [r["job_id"] for r in notify.select(ALERTS, states=("firing", "pending"))] == ["7", "8"]
    log, state = tmp_path / "waste.log", tmp_path / "state" / "sent.json"
    got = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}/hook"
        assert len(notify.notify(recs, state_file=str(state), log=str(log), webhook=url)) == 1
        assert notify.notify(recs, state_file=str(state), log=str(log), webhook=url) == []
    finally:
        srv.shutdown()
    lines = log.read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["job_id"] == "7" and got[0]["gpu"] == "3"
    # the alert ended: forgotten; when the GPU idles again (new activeAt) it is sent again
    notify.notify([], state_file=str(state), log=str(log))
    again = [{**recs[0], "active_at": "2026-11-30T12:00:00Z"}]
    assert len(notify.notify(again, state_file=str(state), log=str(log))) == 1


def test_main_needs_a_destination():
    assert notify.main(["--prometheus", "http://127.0.0.1:1"]) == 2


def test_price_names_job_user_gpu_and_idle_cost():
    import datetime as dt
    from types import SimpleNamespace

    class Client:
        def accounting(self, job_ids):
            assert job_ids == ["7"]
            return [SimpleNamespace(job_id="7", job_id_raw="7", gpus={"h100": 4}, partition="gpu", qos="normal",
                                    start="2026-11-30T09:00:00")]

    class Book:
        def effective_rate(self, gpu_type, partition, qos, at):
            assert (gpu_type, partition, qos) == ("h100", "gpu", "normal")
            return "2.50"

    now = dt.datetime(2026, 11, 30, 10, 12, tzinfo=dt.timezone.utc)
    (rec,) = notify.price(notify.select(ALERTS), client=Client(), book=Book(), now=now)
    assert rec["message"] == "job 7 (a) holds idle GPU 3 on n1 (h100) for 12 min: 0.50 so far at 2.50/GPU-hour"
    assert (rec["idle_cost"], rec["rate_per_gpu_hour"], rec["idle_minutes"]) == ("0.50", "2.500000", 12.0)
    class NoPrice:
        def effective_rate(self, *args):
            return None

    (unpriced,) = notify.price(notify.select(ALERTS), client=Client(), book=NoPrice(), now=now)
    assert unpriced["message"].endswith("for 12 min: no price in the ledger")

"""The node-side spot notice watcher (issue 38.7) against a tiny local HTTP stand-in for the
instance metadata service (IMDSv2: PUT for a token, 401 without one or with an expired one, 404
until EC2 posts the notice): the watcher drains the node and signals its jobs within a poll of the
notice, renews an expired token, and survives the service failing."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuhpc.elastic.spotwatch import Imds, Notice, watch
from polling import wait_for

from .fakes import RecordingSlurm


class FakeImds:
    def __init__(self):
        self.tokens: set[str] = set()
        self.issued = 0
        self.notice: dict | None = None
        self.fail = 0                      # the next N metadata reads answer 500
        self.polls = 0
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, body=b""):
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_PUT(self):
                if self.path != "/latest/api/token" or "X-aws-ec2-metadata-token-ttl-seconds" not in self.headers:
                    return self._send(400)
                stand_in.issued += 1
                tok = f"tok{stand_in.issued}"
                stand_in.tokens.add(tok)
                self._send(200, tok.encode())

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") not in stand_in.tokens:
                    return self._send(401)
                if stand_in.fail > 0:
                    stand_in.fail -= 1
                    return self._send(500)
                if self.path == "/latest/meta-data/instance-id":
                    return self._send(200, b"i-0spot")
                if self.path == "/latest/meta-data/spot/instance-action":
                    stand_in.polls += 1
                    if stand_in.notice is None:
                        return self._send(404)
                    return self._send(200, json.dumps(stand_in.notice).encode())
                self._send(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class NodeSlurm(RecordingSlurm):
    def __init__(self, jobs):
        super().__init__()
        self.jobs = jobs

    def drain(self, nodes, reason):
        self.calls.append(("drain", nodes, reason))
        return True

    def jobs_on(self, nodes):
        return [(j, nodes) for j in self.jobs]

    def signal_jobs(self, jobs, sig):
        self.calls.append(("signal_jobs", list(jobs), sig))
        return True


@pytest.fixture
def imds():
    fake = FakeImds()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def run_watch(imds, slurm, interval=0.05):
    out: dict = {}
    stop = threading.Event()
    t = threading.Thread(target=lambda: out.setdefault("notice", watch(
        "spot7", Imds(imds.url), slurm, interval=interval, stop=stop.is_set)), daemon=True)
    t.start()
    return t, out, stop


def test_a_notice_drains_the_node_and_signals_its_jobs_within_a_poll(imds):
    slurm = NodeSlurm(["41", "42"])
    t, out, stop = run_watch(imds, slurm)
    try:
        wait_for(lambda: imds.polls >= 3, 10, "the watcher polling instance-action")
        assert slurm.calls == []                                      # no notice: nothing done
        seen = imds.polls
        imds.notice = {"action": "terminate", "time": "2026-12-03T04:00:00Z"}
        t.join(10)
        assert not t.is_alive() and out["notice"] == Notice("terminate", "2026-12-03T04:00:00Z")
        assert imds.polls <= seen + 2                 # acted on the next poll (one may have been in flight)
        assert slurm.calls == [
            ("drain", "spot7", "gpuhpc: spot interruption of i-0spot (node notice, terminate at 2026-12-03T04:00:00Z)"),
            ("signal_jobs", ["41", "42"], "USR2")]
    finally:
        stop.set()


def test_an_expired_token_is_renewed_and_a_failing_service_is_polled_again(imds):
    slurm = NodeSlurm([])
    t, out, stop = run_watch(imds, slurm)
    try:
        wait_for(lambda: imds.polls >= 2, 10, "the watcher polling")
        imds.tokens.clear()                                            # every token expired
        imds.fail = 2                                                  # then two 500s
        wait_for(lambda: imds.issued >= 2 and imds.fail == 0 and imds.polls >= 4, 10,
                 lambda: f"a new token and polls after the errors (issued {imds.issued}, polls {imds.polls})")
        assert t.is_alive()
        imds.notice = {"action": "stop", "time": "t"}
        t.join(10)
        assert out["notice"].action == "stop" and [c[0] for c in slurm.calls] == ["drain"]   # no jobs: no signal
    finally:
        stop.set()


def test_without_a_token_the_metadata_is_refused():
    """The stand-in behaves as IMDSv2 with HttpTokens=required: a GET without a token is 401."""
    import urllib.error
    import urllib.request

    fake = FakeImds()
    try:
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"{fake.url}/latest/meta-data/spot/instance-action", timeout=5)
        assert exc.value.code == 401
    finally:
        fake.server.shutdown()
        fake.server.server_close()

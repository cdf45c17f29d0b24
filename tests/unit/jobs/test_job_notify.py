"""``notify:`` without Slurm: the field is checked (exit 2 naming it), mail becomes sbatch's
--mail-type/--mail-user, webhooks are registered at submission and POSTed once by the notifier
(a real HTTP server in a thread here; Slurm's answers from a stand-in client)."""
from __future__ import annotations

import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import notify
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Notify, Resources, check_webhook


def _spec(**kw):
    return JobSpec.from_mapping({"command": ["true"], **kw})


# ---------------------------------------------------------------- the field
def test_mail_becomes_slurms_mail_options():
    text = render(_spec(notify={"mail": "me@example.org", "events": ["fail", "requeue_cap"]}))
    assert "#SBATCH --mail-type=FAIL\n" in text and "#SBATCH --mail-user=me@example.org\n" in text
    text = render(_spec(notify={"mail": "alice"}))
    assert "#SBATCH --mail-type=END,FAIL\n" in text
    assert "--mail-" not in render(_spec(notify={"webhook": "https://h.example.org/x"}))
    assert "--mail-" not in render(_spec())


@pytest.mark.parametrize("notify_value, field", [
    ({"webhook": "ftp://h.example.org/x"}, "notify.webhook[0]"),
    ({"webhook": "file:///etc/passwd"}, "notify.webhook[0]"),
    ({"webhook": "https:///nohost"}, "notify.webhook[0]"),
    ({"webhooks": ["https://ok.example.org", "http://a b"]}, "notify.webhook[1]"),
    ({"webhook": "https://h.example.org/$(id)\n"}, "notify.webhook[0]"),
    ({"mail": "a@b.org; rm -rf ~"}, "notify.mail"),
    ({"mail": "a@b.org", "events": ["end", "begin"]}, "notify.events[1]"),
    ({"mail": "a@b.org", "events": []}, "notify.events"),
    ({"events": ["end"]}, "notify"),
    ({"mail": "a@b.org", "on": ["end"]}, "notify.on"),
    ({"mail": "a@b.org", "sms": "1"}, "notify.sms"),
    ("https://h.example.org/x", "notify"),
])
def test_bad_notify_names_the_field(notify_value, field):
    with pytest.raises(UserInputError) as err:
        _spec(notify=notify_value)
    assert err.value.field == field


def test_mail_twice_and_array_webhooks_are_refused():
    with pytest.raises(UserInputError) as err:
        JobSpec(command=("true",), resources=Resources(extra=("--mail-type=END",)), notify={"mail": "a@b.org"})
    assert err.value.field == "notify.mail"
    with pytest.raises(UserInputError) as err:
        JobSpec(command=("true",), array="0-3", notify={"webhook": "https://h.example.org/x"})
    assert err.value.field == "notify.webhook"
    assert JobSpec(command=("true",), array="0-3", notify={"mail": "a@b.org"}).notify.mail == "a@b.org"


def test_webhook_urls_are_http_or_https():
    assert check_webhook("https://hooks.example.org/T/x?y=1", "w") == "https://hooks.example.org/T/x?y=1"
    assert check_webhook("http://127.0.0.1:8080/", "w")
    assert Notify(webhooks="http://h.example.org").webhooks == ("http://h.example.org",)


def test_yamls_on_key_is_named():
    import yaml

    with pytest.raises(UserInputError) as err:
        _spec(notify=yaml.safe_load("mail: a@b.org\non: [end]\n"))      # YAML 1.1: `on` is true
    assert err.value.field == "notify.events" and "events:" in str(err.value)


def test_cli_notify_items_add_to_the_job_files(tmp_path):
    from gpuhpc.cli.submit import build_spec

    job = tmp_path / "job.yaml"
    job.write_text("command: [/bin/true]\nnotify:\n  webhook: https://a.example.org/1\n  events: [end]\n")
    ns = SimpleNamespace(file=str(job), env=None, command=None, notify=("webhook=https://b.example.org/2", "events=fail"))
    spec = build_spec(ns)
    assert spec.notify == Notify(events=("fail",), webhooks=("https://a.example.org/1", "https://b.example.org/2"))
    with pytest.raises(UserInputError) as err:
        build_spec(SimpleNamespace(file=None, env=None, command=["true"], notify=("webhook",)))
    assert err.value.field == "--notify"


# ---------------------------------------------------------------- the notifier
class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.got.append((self.path, body))
        code = 500 if self.path.startswith("/broken") and self.server.broken else 200
        if self.path.startswith("/moved"):
            self.send_response(303)
            self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/elsewhere")
            self.end_headers()
            return
        self.send_response(code)
        self.end_headers()

    def do_GET(self):  # noqa: N802  (where a followed redirect would go)
        self.server.got.append((self.path, None))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def hook():
    srv = HTTPServer(("127.0.0.1", 0), _Hook)
    srv.got, srv.broken = [], True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


class _Slurm:
    """show_job for the jobs slurmctld knows, accounting for the rest."""

    def __init__(self, live, ended=()):
        self.live, self.ended = live, list(ended)

    def show_job(self, job_id):
        return self.live.get(job_id)

    def accounting(self, job_ids=()):
        return [a for a in self.ended if a.job_id in job_ids]

    def restarts(self, job_id):
        return 2


def test_register_writes_a_private_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    path = notify.register("12", "n", Notify(webhooks=("https://h.example.org/x",)))
    assert path == f"{tmp_path}/notify/12.json" and stat.S_IMODE((tmp_path / "notify" / "12.json").stat().st_mode) == 0o600
    assert json.loads((tmp_path / "notify" / "12.json").read_text())["webhooks"] == ["https://h.example.org/x"]
    assert notify.register("13", "n", Notify(mail="a@b.org")) is None


def test_each_ended_job_is_posted_once_with_the_most_specific_event(tmp_path, monkeypatch, hook):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    base = f"http://127.0.0.1:{hook.server_port}"
    for job_id, on in (("1", NOTIFY_ALL), ("2", NOTIFY_ALL), ("3", NOTIFY_ALL), ("4", ("end",)), ("5", ("fail",)),
                       ("6", NOTIFY_ALL), ("7", NOTIFY_ALL)):
        notify.register(job_id, f"n{job_id}", Notify(events=on, webhooks=(f"{base}/j{job_id}",)))
    from gpuhpc.slurm.parsers import AcctRow
    from gpuhpc.slurm.state import SlurmState

    def row(job_id, state, code):
        return AcctRow(job_id, job_id, "n", SlurmState.parse(state), 1, "", "", "", {}, {}, "cpu", "a", "u", "n1",
                       code, 0, "1:00", "normal", "c")

    slurm = _Slurm({"1": {"JobState": "FAILED", "ExitCode": "75:0", "Restarts": "3", "UserId": "u(1)"},
                    "2": {"JobState": "COMPLETED", "ExitCode": "0:0", "Restarts": "0"},
                    "3": {"JobState": "RUNNING", "ExitCode": "0:0"},
                    "4": {"JobState": "FAILED", "ExitCode": "75:0"},
                    "5": {"JobState": "COMPLETED", "ExitCode": "0:0"},
                    "6": {"JobState": "PREEMPTED", "ExitCode": "0:15", "Requeue": "1"}},
                   ended=[row("7", "TIMEOUT", "0:15")])
    sent = notify.run_once(client=slurm)
    got = {p: b for p, b in hook.got}
    assert sorted(got) == ["/j1", "/j2", "/j4", "/j7"], got
    assert got["/j1"]["event"] == "requeue_cap" and "requeue cap" in got["/j1"]["message"]
    assert got["/j1"]["restarts"] == 3 and got["/j1"]["user"] == "u"
    assert got["/j2"]["event"] == "end" and got["/j2"]["state"] == "COMPLETED"
    assert got["/j4"]["event"] == "end" and got["/j7"]["event"] == "fail" and got["/j7"]["restarts"] == 2
    assert len(sent) == 4
    # the running and the requeued-after-preemption jobs stay registered, the others are gone
    assert sorted(p.name for p in (tmp_path / "notify").iterdir()) == ["3.json", "6.json"]
    hook.got.clear()
    assert notify.run_once(client=slurm) == [] and hook.got == []      # nothing twice


NOTIFY_ALL = ("end", "fail", "requeue_cap")


def test_a_failed_post_is_tried_again_and_redirects_are_not_followed(tmp_path, monkeypatch, hook):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    base = f"http://127.0.0.1:{hook.server_port}"
    notify.register("1", "n", Notify(webhooks=(f"{base}/broken", f"{base}/ok")))
    notify.register("2", "n", Notify(webhooks=(f"{base}/moved",)))
    slurm = _Slurm({"1": {"JobState": "COMPLETED", "ExitCode": "0:0"}, "2": {"JobState": "COMPLETED", "ExitCode": "0:0"}})
    assert [r["url"] for r in notify.run_once(client=slurm)] == [f"{base}/ok"]
    assert [p for p, _ in hook.got] == ["/broken", "/ok", "/moved"]          # /elsewhere never asked
    assert json.loads((tmp_path / "notify" / "1.json").read_text())["sent"] == [f"{base}/ok"]
    hook.got.clear()
    hook.broken = False
    assert [r["url"] for r in notify.run_once(client=slurm)] == [f"{base}/broken"]
    assert [p for p, _ in hook.got] == ["/broken", "/moved"]     # /ok not again
    assert sorted(p.name for p in (tmp_path / "notify").iterdir()) == ["2.json"]


def test_a_registration_file_edited_to_another_scheme_is_not_fetched(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    (tmp_path / "notify").mkdir()
    (tmp_path / "notify" / "1.json").write_text(json.dumps({"job_id": "1", "events": ["end"], "webhooks": ["file:///etc/passwd"]}))
    slurm = _Slurm({"1": {"JobState": "COMPLETED", "ExitCode": "0:0"}})
    assert notify.run_once(client=slurm) == []
    assert (tmp_path / "notify" / "1.json").exists()

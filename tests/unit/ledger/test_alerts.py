"""Budget alerts to PIs at 80 % and 100 % (issue 34.10): contacts and thresholds checked at the
edge (exit 2, one line naming the field), each threshold sent once per period per quota, to a
real HTTP server and a real SMTP server in a thread of the test (docs/ledger.md, "Budget alerts
and allocation windows")."""
from __future__ import annotations

import datetime as dt
import email
import json
import threading
import warnings
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import adjust, admin, alerts, audit, db, ingest
from gpuhpc.ledger.orm import QuotaAlert

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)


def at(y, mo, d, h=0, mi=0) -> dt.datetime:
    return dt.datetime(y, mo, d, h, mi, tzinfo=UTC)


def run_row(job: str, start: dt.datetime, seconds: int, **kw) -> str:
    def sacct_time(t: dt.datetime) -> str:
        return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

    return row(job, "COMPLETED", sacct_time(start), sacct_time(start + dt.timedelta(seconds=seconds)), seconds, **kw)


class Hook:
    """A real HTTP server on 127.0.0.1 in a thread: records each POST, answers ``status``."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict, dict]] = []
        self.status = 200
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.posts.append((self.path, dict(self.headers), json.loads(body)))
                self.send_response(hook.status)
                if hook.status in (301, 302, 307):
                    self.send_header("Location", f"http://127.0.0.1:{hook.port}/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hooks/T0K3N?secret=s3cr3t") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture()
def smtp_server():
    """A real SMTP server (the standard library's smtpd, present in 3.11) in a thread."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import asyncore
        import smtpd

    got: list[tuple[str, list[str], bytes]] = []

    class Sink(smtpd.SMTPServer):
        def process_message(self, peer, mailfrom, rcpttos, data, **kw):
            got.append((mailfrom, rcpttos, data))

    sockets: dict = {}
    server = Sink(("127.0.0.1", 0), None, map=sockets, decode_data=False)
    t = threading.Thread(target=asyncore.loop, kwargs={"timeout": 0.05, "map": sockets}, daemon=True)
    t.start()
    yield server.socket.getsockname()[1], got
    for ch in list(sockets.values()):
        ch.close()
    t.join(10)


@pytest.fixture()
def site(tmp_path, monkeypatch):
    path = tmp_path / "site.toml"
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))

    def write(text: str) -> None:
        path.write_text(text)
    write("")
    return write


@pytest.fixture()
def ledger(ledger_url, site):
    admin.add_account("research", url=ledger_url, grant="ERC-42")
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=ledger_url)     # 0.001 per GPU-second
    admin.set_quota("research", money=Decimal("100"), period="month", url=ledger_url)
    return ledger_url


def spend(url, job: str, amount: int, start: dt.datetime) -> None:
    """Charge ``amount`` (whole currency units: 1000 GPU-seconds each) in the month of ``start``."""
    ingest.ingest_rows(rows(run_row(job, start, amount * 1000, gpus=1)), url=url)


def sent_rows(url) -> list[tuple]:
    with db.session_scope(url) as s:
        return [(r.period_start, r.measure, r.threshold, r.status, r.attempts)
                for r in s.scalars(select(QuotaAlert).order_by(QuotaAlert.id))]


# ------------------------------------------------------------------ what an admin types
def test_contacts_and_thresholds_are_checked_at_the_edge():
    assert alerts.contact_arg("mailto:pi@example.org") == "mailto:pi@example.org"
    assert alerts.contact_arg("mailto:pi@example.org,lab@uni.example.ac.uk").endswith("lab@uni.example.ac.uk")
    assert alerts.contact_arg("https://hooks.example.org/T/B/x?y=1") == "https://hooks.example.org/T/B/x?y=1"
    assert alerts.contact_arg("http://127.0.0.1:8080/hook") == "http://127.0.0.1:8080/hook"
    assert alerts.contact_arg("") == ""
    for bad in ("http://hooks.example.org/x", "ftp://example.org/", "mailto:", "mailto:pi", "mailto:pi@example.org;x",
                "https://a b/", "https://x/\n", "$(reboot)", "`id`@example.org", "javascript:alert(1)",
                "https://host:99999/", "pi@example.org", "https://" + "x" * 1100 + ".org/"):
        with pytest.raises(UserInputError) as exc:
            alerts.contact_arg(bad)
        assert exc.value.exit_code == 2 and exc.value.field == "--contact", bad
    assert alerts.thresholds_arg("100, 80,80") == "80,100"
    assert alerts.thresholds_arg("none") == "" and alerts.thresholds_of("") == ()
    assert alerts.thresholds_of(None) == (80, 100)
    for bad in ("80;100", "0", "1001", "-5", "eighty", "80,", "٨٠"):
        with pytest.raises(UserInputError) as exc:
            alerts.thresholds_arg(bad)
        assert exc.value.field == "--alert-at", bad
    assert alerts.shown("https://hooks.example.org/T0K3N?secret=1") == "https://hooks.example.org/..."


def test_cli_contact_bad_input_exits_2_in_one_line_and_a_good_one_is_audited(ledger, capsys):
    from gpuhpc.cli.main import main

    for value, field in (("http://hooks.example.org/x", "--contact"), ("mailto:not-an-address", "--contact")):
        assert main(["ledger", "account", "set", "research", "--contact", value]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and field in err and "Traceback" not in err, err
    assert main(["quota", "set", "research", "--alert-at", "80;100"]) == 2
    assert "--alert-at" in capsys.readouterr().err
    assert alerts.contacts(url=ledger) == {}
    assert main(["ledger", "account", "set", "research", "--contact", "https://hooks.example.org/T0K3N"]) == 0
    assert alerts.contacts(url=ledger) == {"research": "https://hooks.example.org/T0K3N"}
    assert main(["quota", "set", "research", "--alert-at", "50,90"]) == 0          # thresholds only
    (st,) = admin.quota_status("research", url=ledger)
    assert st.money_budget == Decimal(100)
    with db.session_scope(ledger) as s:
        trail = audit.entries(s, action="account.contact") + audit.entries(s, action="quota.alerts")
    assert [e["after"] for e in trail] == [{"contact": "https://hooks.example.org/..."}, {"alert_at": "50,90"}]
    assert "T0K3N" not in json.dumps(trail)                                          # the token is not in the trail


# ------------------------------------------------------------------ sending, once
def test_webhook_alerts_at_80_and_100_once_per_period(ledger, hook):
    alerts.set_contact("research", hook.url(), url=ledger)
    spend(ledger, "1", 79, at(2026, 12, 1, 1))
    assert alerts.run(url=ledger, now=at(2026, 12, 10)) == [] and hook.posts == []
    spend(ledger, "2", 2, at(2026, 12, 2, 1))                                        # 81 %
    due = alerts.run(url=ledger, now=at(2026, 12, 10), dry_run=True)
    assert [(a.threshold, a.status) for a in due] == [(80, "due")]
    assert hook.posts == [] and sent_rows(ledger) == []                              # a dry run sends and records nothing
    (a,) = alerts.run(url=ledger, now=at(2026, 12, 10))
    assert a.status == "sent"
    (path, headers, body) = hook.posts[0]
    assert path == "/hooks/T0K3N?secret=s3cr3t" and headers["Content-Type"] == "application/json"
    assert body["event"] == "gpuhpc.budget_alert" and body["account"] == "research" and body["grant"] == "ERC-42"
    assert (body["measure"], body["threshold"], body["used"], body["budget"]) == ("money", 80, "81.000000",
                                                                                    "100.000000")
    assert body["period_label"] == "2026-12" and body["text"].startswith("account research has used 81% of its money")
    assert alerts.run(url=ledger, now=at(2026, 12, 11)) == [] and len(hook.posts) == 1     # once
    # 100 %; a credit below 100 % afterwards sends nothing again
    spend(ledger, "3", 20, at(2026, 12, 3, 1))
    (a,) = alerts.run(url=ledger, now=at(2026, 12, 12))
    assert (a.threshold, a.status, a.as_dict()["contact"]) == (100, "sent", f"http://127.0.0.1:{hook.port}/...")
    assert len(hook.posts) == 2 and hook.posts[1][2]["threshold"] == 100
    adjust.adjust("research", kind="credit", amount="30", reason="goodwill", url=ledger)
    spend(ledger, "4", 25, at(2026, 12, 4, 1))
    assert alerts.run(url=ledger, now=at(2026, 12, 20)) == [] and len(hook.posts) == 2
    # the next period starts afresh: both thresholds crossed at once are one message naming 100
    spend(ledger, "5", 120, at(2027, 1, 2, 1))
    (a,) = alerts.run(url=ledger, now=at(2027, 1, 10))
    assert (a.thresholds, a.threshold, a.label) == ((80, 100), 100, "2027-01")
    assert len(hook.posts) == 3 and alerts.run(url=ledger, now=at(2027, 1, 11)) == []
    assert [(r[0].month, r[2], r[3]) for r in sent_rows(ledger)] == [(12, 80, "sent"), (12, 100, "sent"),
                                                                    (1, 80, "sent"), (1, 100, "sent")]


def test_a_failed_webhook_exits_1_and_is_tried_again(ledger, hook, capsys):
    """Through the CLI, as cron runs it (a ``total`` quota: the wall clock's month does not matter)."""
    from gpuhpc.cli.main import main

    admin.set_quota("research", money=Decimal("100"), period="total", url=ledger)
    alerts.set_contact("research", hook.url("/down"), url=ledger)
    spend(ledger, "1", 85, at(2026, 11, 1, 1))
    assert main(["ledger", "alerts", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would send: account research has used 85% of its money budget for "
                                              "all time") and hook.posts == []
    for status in (500, 302):                                 # an error, and a redirect (never followed)
        hook.status = status
        assert main(["ledger", "alerts"]) == 1
        cap = capsys.readouterr()
        assert "failed: account research has used 85%" in cap.out and f"HTTP {status}" in cap.out
        assert cap.err.startswith("error: 1 of 1 budget alert(s) could not be sent")
    assert [p[0] for p in hook.posts] == ["/down", "/down"]          # nothing went to /elsewhere
    assert [(r[2], r[3], r[4]) for r in sent_rows(ledger)] == [(80, "failed", 2)]
    hook.status = 200
    assert main(["ledger", "alerts", "--json"]) == 0
    assert [(x["threshold"], x["status"]) for x in json.loads(capsys.readouterr().out)] == [(80, "sent")]
    assert [(r[2], r[3], r[4]) for r in sent_rows(ledger)] == [(80, "sent", 3)]
    assert main(["ledger", "alerts"]) == 0 and len(hook.posts) == 3


def test_no_contact_or_no_thresholds_sends_nothing_and_user_quotas_alert_the_account_contact(ledger, hook):
    spend(ledger, "1", 90, at(2026, 12, 1, 1))                    # 90 % of the money, 25 GPU-h
    assert alerts.run(url=ledger, now=at(2026, 12, 10)) == []               # no contact
    alerts.set_contact("research", hook.url(), url=ledger)
    alerts.set_thresholds("research", "none", url=ledger)
    admin.set_quota("research", user="alice", gpu_hours=Decimal("50"), period="month", url=ledger)
    assert alerts.run(url=ledger, now=at(2026, 12, 10)) == []               # alice: 25 of 50 GPU-h
    spend(ledger, "2", 60, at(2026, 12, 2, 1))                    # alice: 41.67 GPU-h (83 %)
    (a,) = alerts.run(url=ledger, now=at(2026, 12, 10))
    assert (a.user, a.measure, a.threshold, a.status) == ("alice", "gpu_hours", 80, "sent")
    assert hook.posts[0][2]["text"].startswith("user alice in account research has used 83% of its GPU-hour budget")
    assert alerts.run(url=ledger, now=at(2026, 12, 10)) == []


def test_mail_through_a_real_smtp_server(ledger, smtp_server, site):
    port, got = smtp_server
    site(f'[ledger]\nalert_mail = "smtp://127.0.0.1:{port}"\nalert_from = "hpc-accounting@example.org"\n')
    alerts.set_contact("research", "mailto:pi@example.org,lab@example.org", url=ledger)
    spend(ledger, "1", 101, at(2026, 12, 1, 1))
    (a,) = alerts.run(url=ledger, now=at(2026, 12, 10))
    assert a.status == "sent" and a.threshold == 100
    (mailfrom, rcpt, data) = got[0]
    msg = email.message_from_bytes(data)
    assert (mailfrom, rcpt) == ("hpc-accounting@example.org", ["pi@example.org", "lab@example.org"])
    assert " ".join(msg["Subject"].split()) == "gpuhpc budget: account research has used 101% of its money budget for 2026-12"
    body = msg.get_payload()
    assert "101.00 of 100.00 (money)" in body and "grant: ERC-42" in body
    # a bad setting is exit 2 naming it, before anything is claimed
    site('[ledger]\nalert_from = "not an address"\n')
    spend(ledger, "2", 1, at(2027, 1, 1, 1))
    admin.set_quota("research", money=Decimal("1"), period="month", url=ledger)
    with pytest.raises(UserInputError, match="ledger.alert_from"):
        alerts.run(url=ledger, now=at(2027, 1, 10))
    assert len(sent_rows(ledger)) == 2                        # 80 and 100 of December only


def test_mail_through_sendmail_is_an_argv(ledger, site, tmp_path):
    """``alert_mail = "sendmail:PATH"``: the program gets -t -oi and the message on stdin, no shell."""
    out = tmp_path / "mail.txt"
    prog = tmp_path / "sendmail"
    prog.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {out}.argv\ncat > {out}\n')
    prog.chmod(0o755)
    site(f'[ledger]\nalert_mail = "sendmail:{prog}"\nalert_from = "hpc@example.org"\n')
    alerts.set_contact("research", "mailto:pi@example.org", url=ledger)
    spend(ledger, "1", 80, at(2026, 12, 1, 1))
    (a,) = alerts.run(url=ledger, now=at(2026, 12, 10))
    assert a.status == "sent"
    assert (tmp_path / "mail.txt.argv").read_text().split() == ["-t", "-oi"]
    msg = email.message_from_bytes(out.read_bytes())
    assert msg["To"] == "pi@example.org" and "80%" in msg["Subject"]

"""Budget alerts and allocation windows on the running PostgreSQL AND SQLite (issue 34.10): a
quota with a fiscal-year window counts its own window; two cron runs at the same moment send
its 80 % alert once, as a gpuhpc_admin member on PostgreSQL, to a real HTTP server; the next
window alerts again; a reader may read neither the contacts (webhook tokens) nor the sent
alerts; migration 0010 refuses to go down while a window quota exists, then goes down and up.
On the local cluster: sync-slurm resets the account association's usage when its 90-day window
rolls over, not at the month's end inside it."""
from __future__ import annotations

import datetime as dt
import getpass
import json
import threading
import uuid
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DatabaseError

from gpuhpc.ledger import admin, alerts, db, ingest, periods, slurm_sync
from gpuhpc.slurm.commands import SACCT_RUN_FIELDS, SEP
from gpuhpc.slurm.parsers import parse_sacct
from polling import wait_for

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
FISCAL = "2026-07-01/P12M"


def _rows(job: str, start: dt.datetime, seconds: int):
    """One sacct row: 1 h100 (3.60 an hour: 0.001 a second) for ``seconds`` from ``start``."""
    tres = "cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1"
    t = start.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    e = (start + dt.timedelta(seconds=seconds)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    d = {"JobID": job, "JobIDRaw": job, "JobName": "train", "State": "COMPLETED", "Elapsed": "",
         "ElapsedRaw": str(seconds), "Submit": t, "Start": t, "End": e, "AllocTRES": tres, "ReqTRES": tres,
         "Partition": "gpu", "Account": "research", "User": "alice", "QOS": "normal", "Cluster": "local",
         "Timelimit": "01:00:00"}
    return parse_sacct(SEP.join(d[f] for f in SACCT_RUN_FIELDS), fields=SACCT_RUN_FIELDS)


@pytest.fixture()
def hook():
    """A real HTTP server on 127.0.0.1 in a thread; the POSTed JSON bodies."""
    posts: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            posts.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook/T0K3N", posts
    server.shutdown()
    server.server_close()


@pytest.fixture()
def as_admin_role(any_url):
    """PostgreSQL: the URL of a new login role in gpuhpc_admin (what the controller's credential is), and a
    new reader; SQLite: the file's own URL for both."""
    db.upgrade(any_url)
    if not any_url.startswith("postgresql"):
        yield any_url, None
        return
    tag = uuid.uuid4().hex[:8]
    roles = {"admin": f"gpuhpc_a_{tag}", "reader": f"gpuhpc_r_{tag}"}
    sup = create_engine(any_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f"CREATE ROLE {roles['admin']} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_admin"))
        c.execute(text(f"CREATE ROLE {roles['reader']} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_reader"))
    urls = [make_url(any_url).set(username=r, password=tag).render_as_string(hide_password=False)
            for r in roles.values()]
    yield tuple(urls)
    for u in urls:
        db.get_engine(u).dispose()
    with sup.connect() as c:
        for r in roles.values():
            c.execute(text(f"DROP OWNED BY {r}"))
            c.execute(text(f"DROP ROLE {r}"))
    sup.dispose()


@pytest.mark.isolated
def test_window_alerts_once_under_concurrent_runs(any_url, as_admin_role, hook, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(tmp_path / "site.toml"))
    (tmp_path / "site.toml").write_text('[ledger]\ntimezone = "Europe/Berlin"\n')
    url, reader = as_admin_role
    target, posts = hook
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=url)
    admin.set_quota("research", money=Decimal("100"), period=periods.window_arg("2026-07-01/1y"), url=url)
    alerts.set_contact("research", target, url=url)
    # 50 000 s = 50.00 before the fiscal year (30 June), 85.00 inside it (1 July, Berlin)
    ingest.ingest_rows(_rows("900", dt.datetime(2026, 6, 29, tzinfo=UTC), 50_000), url=url)
    ingest.ingest_rows(_rows("901", dt.datetime(2026, 7, 1, tzinfo=UTC), 85_000), url=url)
    now = dt.datetime(2026, 12, 3, tzinfo=UTC)
    (st,) = admin.quota_status("research", url=url, now=now)
    assert (st.period, st.period_start, st.used_money) == (FISCAL, dt.datetime(2026, 6, 30, 22, tzinfo=UTC),
                                                           Decimal(85))
    # two cron runs at the same moment: one claims and sends, the other finds it claimed. On
    # PostgreSQL the first to claim waits, inside its transaction, until the other is seen waiting
    # for the quota rows' lock (pg_stat_activity), so the two really overlap
    gate, results, errors = threading.Barrier(2), [], []
    if any_url.startswith("postgresql"):
        claim, waited = alerts.claim, []
        watcher = create_engine(any_url)

        def lock_waiters() -> int:
            with watcher.connect() as c:
                return c.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                      "AND wait_event_type = 'Lock'")).scalar()

        def claim_when_the_other_waits(s, due, at):
            if due and not waited:
                waited.append(wait_for(lock_waiters, 30, "the other run to wait for the quota rows' lock",
                                       interval=0.05))
            return claim(s, due, at)

        monkeypatch.setattr(alerts, "claim", claim_when_the_other_waits)

    def cron() -> None:
        try:
            gate.wait(10)
            results.append(alerts.run(url=url, now=now))
        except Exception as exc:                 # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=cron) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == [] and sorted(len(r) for r in results) == [0, 1]
    if any_url.startswith("postgresql"):
        watcher.dispose()
        monkeypatch.setattr(alerts, "claim", claim)
        assert waited == [1]
    assert len(posts) == 1 and (posts[0]["threshold"], posts[0]["period_label"]) == (80, "2026-07-01 to 2027-06-30")
    assert alerts.run(url=url, now=now) == [] and len(posts) == 1
    # the next fiscal year: a new window, alerted again
    ingest.ingest_rows(_rows("902", dt.datetime(2027, 7, 2, tzinfo=UTC), 100_000), url=url)
    (a,) = alerts.run(url=url, now=dt.datetime(2027, 7, 10, tzinfo=UTC))
    assert (a.status, a.thresholds, a.period_start) == ("sent", (80, 100), dt.datetime(2027, 6, 30, 22, tzinfo=UTC))
    assert len(posts) == 2
    if reader is not None:
        eng = create_engine(reader)
        try:
            for table in ("alert_contacts", "quota_alerts"):
                with eng.connect() as c, pytest.raises(DatabaseError, match="permission denied"):
                    c.execute(text(f"SELECT count(*) FROM {table}"))
        finally:
            eng.dispose()
    # 0010 goes down only when no quota has a window (an older gpuhpc could not read it), then up again
    with pytest.raises(Exception, match="allocation window"):
        db.downgrade(any_url, "0009")
    # SQLite runs each migration in its own transaction: the later ones (0011 on) went down, 0010 refused
    db.upgrade(any_url)
    admin.set_quota("research", money=Decimal("100"), period="month", url=url)
    db.downgrade(any_url, "0009")
    with db.get_engine(any_url).connect() as c:
        assert "alert_contacts" not in {r[0] for r in c.execute(text(
            "SELECT name FROM sqlite_master" if any_url.startswith("sqlite") else
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}
    assert db.upgrade(any_url) == ("0009", db.SCHEMA_HEAD)


def test_sync_slurm_resets_usage_when_the_window_rolls_over(sqlite_url, client, monkeypatch, tmp_path):
    """On the local cluster's slurmdbd: a 90-day window from 10 days ago; a month's end inside it
    resets nothing, the window's end resets the account association's usage (RawUsage=0)."""
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(tmp_path / "site.toml"))
    (tmp_path / "site.toml").write_text('[ledger]\ntimezone = "UTC"\n')
    url = sqlite_url
    db.upgrade(url)
    user = getpass.getuser()
    acct = f"gpuhpc-win-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(UTC)
    first = now.date() - dt.timedelta(days=10)
    window = periods.window_arg(f"{first.isoformat()}/90d")
    end = dt.datetime(first.year, first.month, first.day, tzinfo=UTC) + dt.timedelta(days=90)
    month_end = periods.period_end("month", periods.period_start("month", now))
    assert now < month_end < end
    admin.add_account(acct, description="gpuhpc window test", url=url)
    admin.add_user(user, acct, url=url)
    admin.set_quota(acct, gpu_hours=Decimal("2"), period=window, url=url)
    reset = "RawUsage=0"

    def sync_at(t: dt.datetime) -> list[str]:
        plans = slurm_sync.plan(url=url, accounts=[acct], now=t)
        done = slurm_sync.sync(client, plans).as_dict()["commands"]
        slurm_sync.record_periods(plans, url=url)
        return [c for c in done if reset in c]

    try:
        (c,) = sync_at(now)                                          # the first sync: the window's reset
        assert f"name={acct}" in c
        (a,) = [r for r in client.sacctmgr_list("association", f"cluster={client.cluster_name()}",
                                                fields=["Account", "User", "GrpTRESMins"])
                if r["Account"] == acct and not r["User"]]
        assert a["GrpTRESMins"] == "gres/gpu=118"                    # 120 GPU-minutes, 2 of headroom
        assert sync_at(now + dt.timedelta(hours=1)) == []
        assert sync_at(month_end) == []                              # a calendar month ends inside the window
        (c,) = sync_at(end)                                          # the window rolls over
        assert f"name={acct}" in c
        assert sync_at(end + dt.timedelta(days=1)) == []
    finally:
        client.sacctmgr_delete("user", [("name", user), ("account", acct)], check=False)
        client.sacctmgr_delete("account", [("name", acct)], check=False)
    assert not [r for r in client.sacctmgr_list("account", fields=["Account"]) if r["Account"] == acct]

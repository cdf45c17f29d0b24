"""A ledger outage at rollover (issue 34 point 4), on the local cluster and PostgreSQL.

* The reset plan and ``gpuhpc ledger rollover``: a day quota on an account of the test's own;
  sync-slurm puts the budget in Slurm; a GPU job uses some of it; then the accounting zone becomes
  one whose midnight is 20 s away (a fixed UTC offset: the short test period; ``ledger.timezone``
  itself takes IANA names, so the test sets the zone the ledger's periods read) and sync-slurm's
  plan is written in it; the database becomes unreachable; ``gpuhpc ledger rollover`` (the CLI, as cron runs it) leaves the
  association alone before the boundary and resets its usage (``RawUsage=0``) and limit at it.
* The figures the alerts read, from the CLI against the real ledger and Slurm: ingest's and
  sync-slurm's success times (a failed ingest leaves its time as it was), and check's drift count
  in step and after a limit changed by hand; and an ingest's time through the local node exporter's
  textfile collector into Prometheus, where the rules record its age.
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from decimal import Decimal

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from cli_helpers import gpuhpc
from gpuhpc.cli.main import main
from gpuhpc.ledger import admin, db, periods, rollover, slurm_sync
from polling import wait_for

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
PROM = os.environ.get("GPUHPC_PROMETHEUS_URL", "http://127.0.0.1:9090")
# Debian's node exporter (the local one of scripts/services/prometheus.sh, and the monitoring role's)
TEXTFILE_DIR = Path("/var/lib/prometheus/node-exporter")


def figures(path) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(path.read_text()) for s in fam.samples
            if not s.labels}


def zone_with_midnight_at(instant: dt.datetime) -> dt.tzinfo:
    """A fixed-offset zone whose local midnight is ``instant``: its day ends there."""
    sod = instant.hour * 3600 + instant.minute * 60 + instant.second
    off = (-sod) % 86400
    return dt.timezone(dt.timedelta(seconds=off - 86400 if off >= 43200 else off))


def unreachable(url: str) -> str:
    """The same database on a port nothing listens on: the ledger is down."""
    bad = make_url(url).set(host="127.0.0.1", port=1).render_as_string(hide_password=False)
    with pytest.raises(Exception):
        create_engine(bad, connect_args={"connect_timeout": 3}).connect()
    return bad


@pytest.fixture()
def own_account(client):
    acct = f"gpuhpc-roll-{uuid.uuid4().hex[:8]}"
    yield acct
    client.sacctmgr_delete("user", [("name", getpass.getuser()), ("account", acct)], check=False)
    client.sacctmgr_delete("account", [("name", acct)], check=False)


def _used(client, acct: str):
    """The account association's AssocUsage in slurmctld (limits, used and running TRES-minutes)."""
    rows = [a for a in client.assoc_usage([acct]) if a.account == acct and a.user == ""]
    return rows[0] if rows else None


def test_rollover_resets_usage_at_the_boundary_with_the_database_down(pg_url, client, jobs, own_account, tmp_path,
                                                                      monkeypatch):
    url, acct, user = pg_url, own_account, getpass.getuser()
    db.upgrade(url)
    admin.add_account(acct, description="issue 34.4 rollover test", url=url)
    admin.add_user(user, acct, url=url)
    admin.set_quota(acct, gpu_hours=Decimal(10), period="day", url=url)                 # 598 GPU-minutes
    plans = slurm_sync.plan(url=url, accounts=[acct])
    slurm_sync.sync(client, plans)
    slurm_sync.record_periods(plans, url=url)
    assert _used(client, acct).limits["gres/gpu"] == 598

    # some of the budget used: 4 GPUs for 20 s (80 GPU-seconds: Slurm counts 1 GPU-minute)
    jobs.append(client.submit_script("#!/bin/bash\nsleep 20\n", extra=[
        "-A", acct, "-p", "gpu", "--gres=gpu:h100:4", "-t", "2", "-J", "gpuhpc-rollover-test", "-o", "/dev/null"]))
    wait_for(lambda: (a := _used(client, acct)) and a.used.get("gres/gpu", 0) >= 1 and not
                    a.running.get("gres/gpu", 0) and a, 180,
                    lambda: f"the job's GPU-minutes in the association's usage ({_used(client, acct)})", interval=2)

    # the short period: the accounting day (in the zone the ledger's periods read) ends in lead_s seconds
    lead_s = 20
    boundary = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(seconds=lead_s)
    tz = zone_with_midnight_at(boundary)
    monkeypatch.setattr(periods, "ledger_zone", lambda env=None: tz)
    monkeypatch.setattr(slurm_sync, "ledger_zone", lambda env=None: tz)

    # sync-slurm's plan (the CLI writes it where the rollover reads it: the data directory)
    base = tmp_path / "data"
    rollover.publish(client.cluster_name(), url=url, path=rollover.plan_path(base))
    entry = {e.key: e for e in rollover.read_plan(rollover.plan_path(base)).entries}[f"{acct}/"]
    assert entry.resets, (entry, boundary, tz)
    assert entry.resets[0].at == int(boundary.timestamp()) and entry.resets[0].limits["gres/gpu"] == 598

    # the ledger goes away; the rollover, as cron runs it, reads the plan only
    env = {"GPUHPC_DB_URL": unreachable(url), "GPUHPC_DATA_DIR": str(base)}
    prom = tmp_path / "rollover.prom"

    def roll():
        r = gpuhpc("ledger", "rollover", "--textfile", str(prom), env=env, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    # nothing is due a second before the boundary, whatever the clock says now
    plan = rollover.read_plan(rollover.plan_path(base))
    assert rollover.due(plan, {}, boundary.timestamp() - 1) == []
    at_boundary = rollover.due(plan, {}, boundary.timestamp())
    assert [(e.key, r.at) for e, r in at_boundary] == [(f"{acct}/", entry.resets[0].at)]

    def reset():
        r = roll()
        return r if time.time() >= boundary.timestamp() and "1 resets" in r.stderr else None

    after = wait_for(reset, lead_s + 60, "the rollover to reset the account at the boundary", interval=2)
    assert "RawUsage=0" in after.stdout and f"name={acct}" in after.stdout
    assert figures(prom)["gpuhpc_ledger_rollover_next_reset_timestamp_seconds"] == entry.resets[1].at
    a = wait_for(lambda: (u := _used(client, acct)) and u.used.get("gres/gpu", 0) == 0 and u, 30,
                 lambda: f"slurmctld to count the new day from zero ({_used(client, acct)})")
    assert a.limits["gres/gpu"] == 598
    assert rollover.read_state(rollover.state_path(base)) == {f"{acct}/": int(boundary.timestamp())}
    assert figures(prom)["gpuhpc_ledger_rollover_resets"] == 1
    # once: the next run leaves it alone
    assert "0 resets" in roll().stderr
    # the database back: sync-slurm makes no second reset of the day the rollover began
    plans = rollover.without_done(slurm_sync.plan(url=url, accounts=[acct]), rollover.read_state(rollover.state_path(base)))
    assert not [c for c in slurm_sync.sync(client, plans, dry_run=True).commands if "RawUsage=0" in c]


def test_ledger_figures_from_the_real_ledger(pg_url, client, own_account, tmp_path, monkeypatch, capsys):
    url, acct = pg_url, own_account
    db.upgrade(url)
    for k, v in {"GPUHPC_DB_URL": url, "GPUHPC_DATA_DIR": str(tmp_path / "data"),
                 "GPUHPC_BUDGET_SNAPSHOT": str(tmp_path / "budgets.txt"),
                 "GPUHPC_BILLING_FILE": str(tmp_path / "billing.json")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    admin.add_account(acct, description="issue 34.4 figures test", url=url)
    admin.set_quota(acct, gpu_hours=Decimal(1), period="day", url=url)
    sync_prom, ingest_prom, check_prom = (tmp_path / f"{n}.prom" for n in ("sync", "ingest", "check"))

    t0 = time.time()
    assert main(["ledger", "sync-slurm", "--account", acct, "--textfile", str(sync_prom)]) == 0
    assert t0 - 1 <= figures(sync_prom)["gpuhpc_ledger_sync_success_timestamp_seconds"] <= time.time()
    plan = rollover.read_plan(rollover.plan_path(tmp_path / "data"))      # and the reset plan beside it
    assert plan is not None and f"{acct}/" in {e.key for e in plan.entries}

    since = "2m"
    t1 = time.time()
    assert main(["ledger", "ingest", "--since", since, "--textfile", str(ingest_prom)]) == 0
    done = figures(ingest_prom)["gpuhpc_ledger_ingest_success_timestamp_seconds"]
    assert t1 - 1 <= done <= time.time()
    # an ingest that cannot reach the ledger fails and leaves the time of the last success
    r = gpuhpc("ledger", "ingest", "--since", since, "--textfile", str(ingest_prom),
               env={"GPUHPC_DB_URL": unreachable(url)}, timeout=120)
    assert r.returncode != 0
    assert figures(ingest_prom)["gpuhpc_ledger_ingest_success_timestamp_seconds"] == done

    capsys.readouterr()
    assert main(["ledger", "check", "--account", acct, "--textfile", str(check_prom)]) == 0, capsys.readouterr().err
    assert figures(check_prom)["gpuhpc_ledger_drift_associations"] == 0
    # an admin raises the budget in Slurm by hand: one association drifts
    client.sacctmgr_modify("account", [("name", acct), ("cluster", client.cluster_name())],
                           [("GrpTRESMins", "gres/gpu=999")])
    assert main(["ledger", "check", "--account", acct, "--textfile", str(check_prom)]) == 1
    got = figures(check_prom)
    assert got["gpuhpc_ledger_drift_associations"] == 1 and got["gpuhpc_ledger_check_timestamp_seconds"] >= t1 - 1


def _query(expr: str) -> list[dict]:
    with urllib.request.urlopen(f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_ingest_time_reaches_prometheus_and_its_age_is_recorded(pg_url, monkeypatch):
    """`ledger ingest --textfile` into the node exporter's collector directory: the local node
    exporter serves the time, Prometheus scrapes it and the packaged rule records its age
    (gpuhpc:ledger_ingest_age_seconds), which LedgerIngestStale reads; the file is removed after."""
    monkeypatch.setenv("GPUHPC_DB_URL", pg_url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    db.upgrade(pg_url)
    prom = TEXTFILE_DIR / f"gpuhpc_ledger_test_{uuid.uuid4().hex[:8]}.prom"
    try:
        assert main(["ledger", "ingest", "--since", "1m", "--textfile", str(prom)]) == 0
        done = figures(prom)["gpuhpc_ledger_ingest_success_timestamp_seconds"]

        def recorded():
            # the node exporter served this time and Prometheus scraped it: the rule's age of it
            this = f"gpuhpc_ledger_ingest_success_timestamp_seconds == {int(done)}"
            ages = _query(f"gpuhpc:ledger_ingest_age_seconds and ({this})")
            return ages or None

        ages = wait_for(recorded, 60, lambda: "Prometheus to record the age of the ingest's time (now "
                        f"{_query('gpuhpc:ledger_ingest_age_seconds')})", interval=2)
        now = time.time()
        assert {r["metric"].get("job") for r in ages} == {"node"}
        assert all(-1 <= float(r["value"][1]) <= now - done + 1 for r in ages), (ages, now, done)
    finally:
        prom.unlink(missing_ok=True)

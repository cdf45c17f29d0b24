"""Several clusters on one ledger (issue 34.6), for real: the shared local cluster and a private
controller under another ClusterName on the same slurmdbd, a job of the same id on each, one
ledger (SQLite and PostgreSQL) ingesting both: a watermark per cluster, two runs for the one job
id, a quota for every cluster counting both clusters' usage, a cluster's quota its own, and
sync-slurm's limit on each cluster (the budget for every cluster less the other's usage).

Not ``isolated``: it runs a job on the shared cluster (and reads its slurmdbd) besides its own
private controller (ports 17107, 17108, 17611). About 40 s."""
from __future__ import annotations

import datetime as dt
import getpass
import json
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import select

from cli_helpers import gpuhpc
from gpuhpc.ledger import admin, budget, db, ingest, slurm_sync
from gpuhpc.ledger.orm import IngestState, UsageRecord
from polling import wait_for
from private_slurm import PrivateSlurm, gpu_shape

pytestmark = pytest.mark.integration

NAME = "gpuhpcmc"                    # the second cluster's ClusterName
PORTS = (17107, 17108, 17611)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
SCRIPT = "#!/bin/bash\nsleep 2\n"


def _finished(client, since: dt.datetime, want: set[tuple[str, str]]) -> bool:
    """Both jobs listed finished by the time-window query ingest runs (slurmdbd learns of an end, and
    the eligible time the window needs, a moment after squeue)."""
    have = {(r.cluster, r.array_job_id) for r in client.job_runs(since, clusters=["local", NAME])
            if r.state.state.is_finished and ingest.parse_time(r.start)}
    return want <= have


def test_two_clusters_on_one_ledger(sqlite_url, pg_url, client, jobs, tmp_path):
    user = getpass.getuser()
    local = client.cluster_name()
    assert local == "local"
    acct = f"mc{uuid.uuid4().hex[:8]}"
    since = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)).replace(microsecond=0)
    client.sacctmgr("add", "account", acct, f"Cluster={local}", "Description=gpuhpc-test", "Organization=gpuhpc")
    try:
        client.sacctmgr("add", "user", user, f"Account={acct}", f"Cluster={local}")
        a = client.submit_script(SCRIPT, extra=["-p", "gpu", "--gres=gpu:h100:1", "-t", "1", "-A", acct,
                                                "-J", "gpuhpc-test-clusters", "-o", "/dev/null"])
        jobs.append(a)
        shape = gpu_shape(["mc-node1"], accounting=True)
        # the second cluster's first job id is the shared cluster's job's: job `a` on both
        other = PrivateSlurm(NAME, PORTS, shape["nodes"], shape["partitions"], accounting=True,
                             extra={"SlurmdParameters": "config_overrides", **shape["extra"], "FirstJobId": a})
        with other.in_slurmdbd(before_start=shape["before_start"]):
            client.sacctmgr("add", "account", acct, f"Cluster={NAME}", "Description=gpuhpc-test",
                            "Organization=gpuhpc")
            client.sacctmgr("add", "user", user, f"Account={acct}", f"Cluster={NAME}")
            b = other.client.submit_script(SCRIPT, extra=["-p", "gpu", "--gres=gpu:h100:1", "-t", "1", "-A", acct,
                                                          "-J", "gpuhpc-test-clusters", "-o", "/dev/null"])
            assert b == a, (a, b)
            wait_for(lambda: _finished(client, since, {(local, a), (NAME, a)}), 90,
                     f"job {a} on {local} and on {NAME} to finish in sacct", interval=1)
            for url in (sqlite_url, pg_url):
                _one_ledger(url, acct, user, a, since, other, client, tmp_path)
    finally:
        client.sacctmgr("delete", "user", f"name={user}", f"account={acct}", check=False)
        client.sacctmgr("delete", "account", f"name={acct}", check=False)


def _ingest(url, tmp_path, *args: str) -> dict:
    res = gpuhpc("ledger", "ingest", "--metrics-dir", str(tmp_path / "metrics"), "--json", *args,
                 env={"GPUHPC_DB_URL": url})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _ours(url, acct) -> dict[tuple[str, str], tuple[Decimal, Decimal]]:
    with db.session_scope(url) as s:
        return {(r.cluster, r.job_id): (r.gpu_hours, r.amount)
                for r in s.scalars(select(UsageRecord).where(UsageRecord.account_name == acct))}


def _marks(url) -> dict[str, dt.datetime | None]:
    with db.session_scope(url) as s:
        return {st.name: st.last_since for st in s.scalars(select(IngestState).where(IngestState.name.like("sacct:%")))}


def _one_ledger(url, acct, user, job, since, other, client, tmp_path) -> None:
    db.upgrade(url)
    admin.add_account(acct, url=url)
    admin.add_user(user, acct, default=True, url=url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=url)
    admin.set_quota(acct, money=Decimal("100"), url=url)                       # for every cluster
    admin.set_quota(acct, gpu_hours=Decimal("10"), cluster=NAME, url=url)      # the second cluster's own
    (tmp_path / "metrics").mkdir(exist_ok=True)

    # the cluster this host's slurm.conf names, by default: its watermark only
    _ingest(url, tmp_path, "--since", since.isoformat())
    assert set(_ours(url, acct)) == {("local", job)}
    assert _marks(url) == {ingest.watermark_name("local"): since}
    # the other cluster through the same slurmdbd (sacct -M): job `job` again, a run of its own
    _ingest(url, tmp_path, "--cluster", NAME, "--since", since.isoformat())
    runs = _ours(url, acct)
    assert set(runs) == {("local", job), (NAME, job)}
    assert _marks(url) == {ingest.watermark_name("local"): since, ingest.watermark_name(NAME): since}
    # both at once, from each one's own watermark: nothing new of ours, nothing charged twice
    _ingest(url, tmp_path, "--clusters", f"local,{NAME}")
    assert _ours(url, acct) == runs
    (_, a_money), (b_hours, b_money) = runs[("local", job)], runs[(NAME, job)]
    assert a_money > 0 and b_money > 0

    used = {st.cluster: st for st in admin.quota_status(acct, url=url)}
    assert used[None].used_money == a_money + b_money                           # counts both clusters
    assert used[NAME].used_gpu_hours == b_hours                                 # counts its own

    # sync-slurm on each cluster: the budget for every cluster less the other's usage; the second
    # cluster's own GPU-hour quota there only
    def billing(elsewhere: Decimal) -> int:
        return budget.money_to_billing_minutes(Decimal(100) - elsewhere) - slurm_sync.HEADROOM_MINUTES

    (on_local,) = slurm_sync.plan(url=url, accounts=[acct], cluster="local")
    (on_other,) = slurm_sync.plan(url=url, accounts=[acct], cluster=NAME)
    assert on_local.limits == {"gres/gpu": slurm_sync.UNSET, "billing": billing(b_money)}
    assert on_other.limits == {"gres/gpu": 10 * 60 - slurm_sync.HEADROOM_MINUTES, "billing": billing(a_money)}
    # the shared cluster's account is only looked at (a dry run); the second cluster's is set for real
    dry = slurm_sync.sync(client, [on_local], dry_run=True)
    assert any(f"GrpTRESMins=billing={billing(b_money)}" in " ".join(c) for c in dry.commands), dry.commands
    slurm_sync.sync(other.client, [on_other])
    (row,) = [r for r in client.sacctmgr_list("association", f"cluster={NAME}", f"account={acct}",
                                              fields=["Account", "User", "GrpTRESMins"]) if not r["User"]]
    assert slurm_sync.parse_tres(row["GrpTRESMins"]) == {"billing": billing(a_money),
                                                         "gres/gpu": 10 * 60 - slurm_sync.HEADROOM_MINUTES}

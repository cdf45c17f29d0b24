"""Issue 34 point 9 at submit, on the local cluster: the installed job_submit.lua counts a MIG slice
by its fraction of a GPU, with the weights the ledger writes into the budget snapshot (one source,
gpuhpc.ledger.pricing.gpu_weight; the cluster's types from sync-slurm's publish, so a slice without
a price is weighed too). A GPU-hour budget of 0.5 for an account of the test's own admits three
1-hour ``1g.10gb`` slices and not four, one ``3g.40gb`` and not two, an array of three slices and
not four, and a budget of exactly three slice-hours (0.428571) the three; a slice counted as a
whole GPU (as before) would have been refused at one. Jobs are
submitted held and cancelled; the account, its association and the snapshot as it was are put
back. (Unit tests of the snapshot: tests/unit/ledger/test_mig_snapshot.py.)

And the max_share leftovers on PostgreSQL (no cluster: ``isolated``): the hold at submit is the
max-share price of what the request names, and ``ledger reprice`` prices a run's node share as
ingest does (SQLite: tests/unit/ledger/test_hold_max_share.py, test_reprice_max_share.py)."""
from __future__ import annotations

import datetime as dt
import getpass
from dataclasses import replace
from decimal import Decimal

import pytest

from gpuhpc.ledger import adjust, admin, budget, db, hooks, ingest, pricing, slurm_sync
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.commands import SACCT_RUN_FIELDS, SEP
from gpuhpc.slurm.parsers import NodeInfo, parse_sacct
from polling import wait_for

pytestmark = pytest.mark.integration

ACCOUNT = "mig-budget"
LEFT = "account mig-budget: budget 0.50 GPU-hours for "


@pytest.fixture()
def mig_budget(sqlite_url, client, jobs, tmp_path):
    """The account in the ledger (0.5 GPU-hours a month, no MIG price) and in Slurm, published."""
    url = sqlite_url
    db.upgrade(url)
    admin.add_account(ACCOUNT, description="issue 34.9 MIG at submit", url=url)
    admin.add_user(getpass.getuser(), ACCOUNT, url=url)
    admin.set_quota(ACCOUNT, gpu_hours=Decimal("0.5"), url=url)
    path = budget.snapshot_path()
    before = path.read_bytes() if path.exists() else None
    try:
        slurm_sync.sync(client, slurm_sync.plan(url=url, accounts=[ACCOUNT]))
        slurm_sync.publish(url=url, billing_file=tmp_path / "billing.json")
        yield path
    finally:
        for j in jobs:
            client.run(cmd.scancel(j), check=False)
        wait_for(lambda: all(r.state.state.is_finished for r in client.queue(job_ids=jobs)) if jobs else True, 60,
                 "the held test jobs to end")
        jobs.clear()
        if before is None:
            path.unlink(missing_ok=True)
        else:
            budget.write_atomic(path, before.decode())
        client.sacctmgr_delete("user", [("name", getpass.getuser()), ("account", ACCOUNT)], check=False)
        client.sacctmgr_delete("account", [("name", ACCOUNT)], check=False)


def test_job_submit_lua_admits_n_mig_slices_and_not_one_more(mig_budget, client, jobs):
    text = mig_budget.read_text()
    assert "weight\t1g.10gb\t1/7\n" in text and "weight\t3g.40gb\t3/7\n" in text, text   # the cluster's types

    def sbatch(*args: str):
        r = client.run(cmd.sbatch(extra=["-H", "-A", ACCOUNT, "-p", "mig", "-t", "60", "-o", "/dev/null", *args,
                                         "--wrap", "true"]), check=False)
        if r.ok:
            jobs.append(r.stdout.strip().split(";")[0])
        return r

    for admitted, refused, uses in ((["--gres=gpu:1g.10gb:3"], ["--gres=gpu:1g.10gb:4"], "0.57"),
                                    (["--gres=gpu:3g.40gb:1"], ["--gres=gpu:3g.40gb:2"], "0.86"),
                                    (["--gres=gpu:1g.10gb:1", "--array=0-2"],
                                     ["--gres=gpu:1g.10gb:1", "--array=0-3"], "0.57")):
        r = sbatch(*admitted)
        assert r.ok, (admitted, r.stderr)
        r = sbatch(*refused)
        assert not r.ok and LEFT in r.stderr and f"0.50 GPU-hours left; this job may use {uses} GPU-hours" \
            in r.stderr, (refused, r.stdout, r.stderr)


def test_job_submit_lua_rounds_the_need_as_the_ledger_does(mig_budget, sqlite_url, client, jobs, tmp_path):
    """A budget of exactly three slice-hours in the ledger's 6 decimals (0.428571) admits them."""
    admin.set_quota(ACCOUNT, gpu_hours=Decimal("0.428571"), url=sqlite_url)
    slurm_sync.publish(url=sqlite_url, billing_file=tmp_path / "billing.json")
    r = client.run(cmd.sbatch(extra=["-H", "-A", ACCOUNT, "-p", "mig", "-t", "60", "-o", "/dev/null",
                                     "--gres=gpu:1g.10gb:3", "--wrap", "true"]), check=False)
    if r.ok:
        jobs.append(r.stdout.strip().split(";")[0])
    assert r.ok, r.stderr


NODES = [NodeInfo("gpu-node1", "IDLE", 16, 0, 64000, 0, ("gpu",), {"h100": 8})]
START = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)


def _runs():
    """1 h on gpu-node1: 800 with 1 h100 and all 16 CPUs (the node, 20.00), 801 CPU-only with 8 (10.00)."""
    t, e = (x.astimezone().strftime("%Y-%m-%dT%H:%M:%S") for x in (START, START + dt.timedelta(hours=1)))
    lines = []
    for job, tres in (("800", "cpu=16,gres/gpu:h100=1,gres/gpu=1,mem=8000M,node=1"), ("801", "cpu=8,mem=1000M,node=1")):
        d = {"JobID": job, "JobIDRaw": job, "JobName": "train", "State": "COMPLETED", "Elapsed": "",
             "ElapsedRaw": "3600", "Submit": t, "Start": t, "End": e, "AllocTRES": tres, "ReqTRES": tres,
             "Partition": "gpu", "Account": "research", "User": "alice", "QOS": "normal", "Cluster": "local",
             "Timelimit": "01:00:00"}
        lines.append(SEP.join(d[f] for f in SACCT_RUN_FIELDS))
    return [replace(r, nodelist="gpu-node1") for r in parse_sacct("\n".join(lines), fields=SACCT_RUN_FIELDS)]


@pytest.mark.isolated
def test_max_share_hold_and_reprice_on_postgresql(pg_url, monkeypatch):
    url = pg_url
    db.upgrade(url)
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                    url=url)
    admin.set_quota("research", money=Decimal("100"), url=url)
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=url)
    # the hold: a quarter of the node's CPUs is 5.00 an hour, more than its GPU
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    res = hooks.reserve(hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="gpu",
                                            qos=None, gpu_type="h100", gpus=1, time_limit_s=3600, cpus=4,
                                            mem_mb=8000, shapes=(pricing.fleet(NODES).shapes["gpu-node1"],)))
    assert res.amount == Decimal("5.000000")
    res.release()
    # reprice: both runs at the node's corrected price, as ingest prices them
    data = _runs()
    ingest.ingest_rows(data, url=url, nodes=pricing.fleet(NODES))
    (st,) = admin.quota_status("research", url=url)
    assert st.used_money == Decimal("30.000000")
    held = [r for v in ingest.group_jobs(data) for r in v.runs]
    window = dict(since=START - dt.timedelta(days=1), until=START + dt.timedelta(days=1), reason="h100 was 2.50",
                  url=url, runs=held, nodes=pricing.fleet(NODES))
    b = adjust.reprice("h100", "2.00", **window)
    assert (b.charges, b.amount) == (2, Decimal("-6.000000"))                     # 16.00 and 8.00
    assert adjust.reprice("h100", "2.00", **window).charges == 0
    (st,) = admin.quota_status("research", url=url)
    assert st.used_money == Decimal("24.000000")

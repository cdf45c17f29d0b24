"""The ledger against the real local Slurm cluster: preemption + requeue billing, and Slurm-side
enforcement of a synced quota for a user who calls sbatch directly."""
from __future__ import annotations

import datetime as dt
import getpass
import uuid
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.ledger import admin, db, hooks, ingest, quota, slurm_sync
from gpuhpc.ledger.pricing import to_decimal
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm import parsers
from polling import wait_for

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
ACCOUNT = "research"      # exists on the local cluster (docs/DEVELOPING.md)




def _state(client, job_id: str):
    rows = client.queue(job_ids=[job_id])
    return rows[0] if rows else None


def _runs(client, job_id: str) -> list[parsers.AcctRow]:
    return [r for r in client.accounting(job_ids=[job_id], duplicates=True) if ingest.parse_time(r.start)]


def _wait_sacct_final(client, job_id: str) -> None:
    """slurmdbd learns of a job's end a moment after squeue does."""
    wait_for(lambda: (lambda rs: bool(rs) and rs[-1].state.state.is_finished)(_runs(client, job_id)), 30,
          f"sacct to show job {job_id} finished")


def _fetch_window(client, since: dt.datetime, need: dict[str, int]) -> list[parsers.AcctRow]:
    """sacct's time-window query (what `ledger ingest` runs) lists a job only once slurmdbd
    has its eligible time, a second or two after it ended; the periodic ingest picks such a
    job up next time (its window overlaps), the test waits for it."""
    def ready():
        rows = client.job_runs(since)
        have: dict[str, int] = {}
        for r in rows:
            if ingest.parse_time(r.start):
                have[r.array_job_id] = have.get(r.array_job_id, 0) + 1
        return rows if all(have.get(j, 0) >= n for j, n in need.items()) else None

    return wait_for(ready, 30, f"sacct's time window to list {need}", interval=1)


PREEMPTEE = """#!/bin/bash
# first run: wait to be preempted; after Slurm requeues it: finish quickly
if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then sleep 2; exit 0; fi
sleep 300
"""


def test_preempted_and_requeued_job_is_charged_for_each_run_once(sqlite_url, client, jobs):
    url = sqlite_url
    db.upgrade(url)
    user = getpass.getuser()
    cluster = client.config().get("ClusterName", "")
    admin.add_account(ACCOUNT, url=url)
    admin.add_user(user, ACCOUNT, default=True, url=url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    # A runs in `all` (PriorityTier 1 on the GPU nodes, no GraceTime): gpu-hi preempts it at once. (In
    # `gpu`, GraceTime=30 would hold it 30 s: with preempt_send_user_signal only a job's --signal is
    # sent at the start of the grace, and a job that exits then ends COMPLETED, not requeued.)
    admin.set_multiplier("partition", "all", Decimal("0.6"), effective_from=T0, url=url)
    admin.set_multiplier("partition", "gpu-hi", Decimal("1.5"), effective_from=T0, url=url)
    admin.set_quota(ACCOUNT, money=Decimal("100000"), url=url)
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)

    # the submit path: reserve (committed) -> sbatch -> attach in a new transaction
    req = hooks.ChargeRequest(cluster=cluster, user=user, account=ACCOUNT, partition="all", qos=None,
                              gpu_type="h100", gpus=8, time_limit_s=300, job_name="gpuhpc-ledger-test-a")
    res = quota.reserve(req, url=url)
    assert res.amount == Decimal("1.000000")          # 8 × 5 min × 2.50 × 0.6
    a = client.submit_script(PREEMPTEE, extra=["-p", "all", "-N", "1", "--gres=gpu:h100:8", "--requeue", "-t", "5",
                                               "-A", ACCOUNT, "-J", "gpuhpc-ledger-test-a", "-o", "/dev/null"])
    jobs.append(a)
    quota.attach_job(res.id, a, url=url)
    row = wait_for(lambda: (s := _state(client, a)) and s.state.state.value == "RUNNING" and s, 60, "job A to run")
    node = row.nodelist
    b = client.submit_script("#!/bin/bash\nsleep 2\n", extra=[
        "-p", "gpu-hi", "-w", node, "--gres=gpu:h100:8", "-t", "2", "-A", ACCOUNT, "-J", "gpuhpc-ledger-test-b",
        "-o", "/dev/null"])
    jobs.append(b)
    # A is preempted at once, requeued, and reruns after B (cred_expire + 1 s later)
    def done(job: str) -> bool:
        s = _state(client, job)
        return s is None or s.state.state.is_finished

    wait_for(lambda: done(a) and len(_runs(client, a)) >= 2, 150, "job A to be preempted, rerun and finish", interval=2)
    wait_for(lambda: done(b), 30, "job B to finish")
    _wait_sacct_final(client, a)
    _wait_sacct_final(client, b)

    runs_a = _runs(client, a)
    assert len(runs_a) >= 2, [(r.state.raw, r.elapsed_s) for r in runs_a]
    assert runs_a[0].state.state.value in ("PREEMPTED", "REQUEUED")
    (run_b,) = _runs(client, b)

    def cost(r: parsers.AcctRow, mult: Fraction) -> Decimal:
        return to_decimal(Fraction(8 * r.elapsed_s, 3600) * Fraction(5, 2) * mult)

    want_a = sum(cost(r, Fraction(3, 5)) for r in runs_a)
    want_b = cost(run_b, Fraction(3, 2))

    def ingest_now():
        active = client.active_job_ids([a, b])
        rows = _fetch_window(client, since, {a: len(runs_a), b: 1})
        return ingest.ingest_rows(rows, url=url, active=active)

    ingest_now()
    ingest_now()                                          # re-ingest: idempotent
    from sqlalchemy import func, select

    from gpuhpc.ledger.orm import Charge, Reservation, UsageRecord

    with db.session_scope(url) as s:
        def charged(job):
            return Decimal(s.scalar(select(func.coalesce(func.sum(Charge.amount), 0)).join(
                UsageRecord, Charge.usage_id == UsageRecord.id).where(UsageRecord.job_id == job,
                                                                      UsageRecord.cluster == cluster)))
        assert charged(a) == want_a
        assert charged(b) == want_b
        assert s.scalar(select(func.count()).select_from(UsageRecord).where(UsageRecord.job_id == a)) == len(runs_a)
        assert s.get(Reservation, res.id).status.value == "settled"
    (st,) = admin.quota_status(ACCOUNT, url=url)
    assert st.held_money == 0


def test_sync_slurm_limit_holds_direct_sbatch(sqlite_url, client, jobs):
    url = sqlite_url
    db.upgrade(url)
    user = getpass.getuser()
    acct = f"gpuhpc-test-{uuid.uuid4().hex[:8]}"
    admin.add_account(acct, description="gpuhpc ledger test", url=url)
    admin.add_user(user, acct, url=url)
    admin.set_quota(acct, gpu_hours=Decimal("1"), url=url)           # 60 GPU-minutes
    try:
        plans = slurm_sync.plan(url=url, accounts=[acct])
        first = slurm_sync.sync(client, plans)
        assert first.commands
        slurm_sync.record_periods(plans, url=url)                      # the period's RawUsage=0 is done
        plans = slurm_sync.plan(url=url, accounts=[acct])
        assert slurm_sync.sync(client, plans).commands == []          # idempotent
        # the budget is on the account's association: every user's job under it counts
        (a,) = [r for r in client.sacctmgr_list("association", f"cluster={client.cluster_name()}",
                                                fields=["Account", "User", "GrpTRESMins"])
                if r["Account"] == acct and not r["User"]]
        assert a["GrpTRESMins"] == "gres/gpu=58"                        # 60 GPU-minutes, 2 of headroom
        # a user going around gpuhpc: 8 GPUs × 60 min = 480 GPU-min > 60. sbatch takes it (the
        # account is in no budget snapshot: job_submit.lua lets it through; any refusal, "Invalid
        # qos" or "Invalid gres", is a SlurmError that fails here) and Slurm holds it on the
        # association's GrpTRESMins (AccountingStorageEnforce=...,safe): it never starts
        j = client.submit_script("#!/bin/bash\nsleep 1\n", extra=[
            "-A", acct, "-p", "gpu", "--gres=gpu:h100:8", "-t", "60", "-J", "gpuhpc-ledger-test-limit",
            "-o", "/dev/null"])
        jobs.append(j)
        row = wait_for(lambda: (s := _state(client, j)) and s.reason == "AssocGrpGRESMinutes" and s, 30,
                       lambda: f"job {j} held on the association's GPU-minutes (now: {_state(client, j)})")
        assert row.state.state.value == "PENDING", row
        # a job within the limit runs: 1 GPU × 1 min
        ok = client.submit_script("#!/bin/bash\nexit 0\n", extra=[
            "-A", acct, "-p", "gpu", "--gres=gpu:h100:1", "-t", "1", "-J", "gpuhpc-ledger-test-ok", "-o", "/dev/null"])
        jobs.append(ok)
        def within_limits(s) -> bool:
            # it runs, or waits only for GPUs other tests hold (the cluster is shared), not for the QOS
            return s is None or s.state.state.value in ("RUNNING", "COMPLETED", "COMPLETING") or (
                s.state.state.value == "PENDING" and s.reason in ("Resources", "Priority"))

        def small_job():
            s = _state(client, ok)
            return (s or "left the queue") if within_limits(s) else None

        wait_for(small_job, 60, "the small job to start or wait for resources only")
    finally:
        for jid in jobs:
            client.run(cmd.scancel(jid), check=False)
        wait_for(lambda: all((lambda s: s is None or s.state.state.is_finished)(_state(client, x)) for x in jobs), 60,
              "test jobs to leave the queue")
        client.sacctmgr_delete("user", [("name", user), ("account", acct)], check=False)
        client.sacctmgr_delete("account", [("name", acct)], check=False)
    assert not [r for r in client.sacctmgr_list("account", fields=["Account"]) if r["Account"] == acct]


def test_job_reports_throughput_and_gets_cost_per_sample(sqlite_url, client, jobs, tmp_path, repo_root):
    import shlex
    import sys

    from gpuhpc.ledger import reports

    url = sqlite_url
    db.upgrade(url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=url)
    metrics_dir = tmp_path / "metrics"
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
    py = shlex.quote(sys.executable)
    script = (f"#!/bin/bash\nexport PYTHONPATH={shlex.quote(str(repo_root))}\n"
              f"export GPUHPC_METRICS_DIR={shlex.quote(str(metrics_dir))}\n"
              f"{py} -c 'import gpuhpc, time; gpuhpc.report(samples_per_s=1000.0); time.sleep(2); "
              f"gpuhpc.report(samples_per_s=3000.0)'\n")
    j = client.submit_script(script, extra=["-p", "gpu", "--gres=gpu:h100:1", "-t", "2", "-A", ACCOUNT,
                                            "-J", "gpuhpc-ledger-test-metrics", "-o", str(tmp_path / "out.txt")])
    jobs.append(j)
    wait_for(lambda: (lambda s: s is None or s.state.state.is_finished)(_state(client, j)), 90, "the metrics job")
    _wait_sacct_final(client, j)
    ingest.ingest_rows(_fetch_window(client, since, {j: 1}), url=url)
    assert ingest.ingest_metrics(metrics_dir, url=url) == 1
    (run,) = _runs(client, j)
    assert run.state.state.value == "COMPLETED", (tmp_path / "out.txt").read_text()
    rep = reports.cost_report(by="gpu-type", period="day", since=since, url=url)
    (row,) = [r for r in rep.rows if r.key == "h100" and any(job.endswith(f":{j}") for job in r.jobs)]
    assert "samples_per_s" in rep.metrics
    # cost = 1 GPU × elapsed × 3.60/h = elapsed/1000; samples = 2000/s × elapsed -> 0.5 per 1M samples
    cost_j = to_decimal(Fraction(run.elapsed_s, 3600) * Fraction(18, 5))
    if len(row.jobs) == 1:
        assert row.cost == cost_j
        assert row.per_million("samples_per_s") == (cost_j * 1_000_000 / (2000 * run.elapsed_s)).quantize(Decimal("0.0001"))


def test_cli_ingest_with_reprice(sqlite_url, monkeypatch, capsys):
    """`gpuhpc ledger ingest --reprice` against the real sacct: runs, then the reprice pass."""
    import json

    from gpuhpc.cli.main import main

    monkeypatch.setenv("GPUHPC_DB_URL", sqlite_url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["ledger", "ingest", "--since", "1h", "--reprice", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["repriced_runs"] == 0 and "runs_seen" in out
    assert main(["ledger", "ingest", "--since", "1h", "--reprice"]) == 0
    assert "repriced 0 runs settled without a price" in capsys.readouterr().out

"""Month end on the local cluster: a run across a period boundary counts in each period for the
part inside it, as Slurm counts it (docs/ledger.md, "Month end, for finance").

* A boundary inside the test: GPU jobs (partition ``gpu``, the fake h100s) that run across an
  instant B a few seconds after they start, in two accounts. The ledger's GPU-hours per account
  in ``[T0, B)`` and ``[B, T1)`` (the report API with explicit windows, cut as ingest cuts its
  charges) equal ``sacct --truncate`` for the same windows, to the second. sreport reads
  slurmdbd's hourly rollups, which exist only for hours that are over (slurmdbd rolls an hour
  up after it ends), so a boundary a few seconds away can only be checked against
  ``sacct --truncate``, which cuts runs to the window exactly as the rollup does.
* sreport itself: the last three whole hours that are rolled up, every run on the cluster, into
  a ledger of its own (SQLite, then PostgreSQL); the ledger's GPU-hours per account in each hour
  equal ``sreport -t seconds cluster AccountUtilizationByUser``'s. Which runs cross an hour's
  edge depends on what the cluster ran then (the output says how many did).
"""
from __future__ import annotations

import datetime as dt
import shlex
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.ledger import admin, db, ingest, periods, reports
from gpuhpc.ledger.pricing import gpu_weight, to_decimal
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm import parsers
from polling import wait_for

pytestmark = pytest.mark.integration

UTC = dt.timezone.utc
T_PRICE = dt.datetime(2026, 1, 1, tzinfo=UTC)
RATE = Decimal("3.60")                  # per GPU-hour: 0.001 per GPU-second
RESOLUTION_S = Decimal("0.0018")        # the ledger keeps GPU-hours to 6 decimals: half of 3.6 ms


@pytest.fixture()
def berlin(tmp_path, monkeypatch):
    """The site config's accounting zone: Europe/Berlin (an explicit window does not depend on
    it; the report's period labels do)."""
    site = tmp_path / "site.toml"
    site.write_text('[ledger]\ntimezone = "Europe/Berlin"\n')
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(site))
    return periods.ledger_zone()


def _table(title: str, rows: list[tuple]) -> str:
    lines = [title, f"  {'window':<34} {'account':<24} {'ledger GPU-s':>14} {'Slurm GPU-s':>12}"]
    lines += [f"  {w:<34} {a:<24} {float(l):>14.4f} {s:>12}" for w, a, l, s in rows]
    return "\n".join(lines)


def _ledger_seconds(url: str, since: dt.datetime, until: dt.datetime) -> dict[str, Decimal]:
    rep = reports.cost_report(by="account", period="month", since=since, until=until, url=url)
    out: dict[str, Decimal] = {}
    for r in rep.rows:
        out[r.key] = out.get(r.key, Decimal(0)) + r.gpu_hours * 3600
    return out


def _sreport_weighted(client, since: dt.datetime, until: dt.datetime) -> dict[str, Decimal]:
    """sreport's GPU-seconds per account with a MIG slice counted as the ledger counts it, by its
    fraction of a GPU (sreport's gres/gpu counts it whole; the typed TRES say how much of it was
    slices, issue 34.9)."""
    out = {a: Fraction(v) for a, v in client.sreport_gpu_seconds(since, until).items()}
    local = {t: t.astimezone().strftime("%Y-%m-%dT%H:%M:%S") for t in (since, until)}
    for mig in ("1g.10gb", "3g.40gb"):                  # the local cluster's MIG profiles (AccountingStorageTRES)
        text = client.run(cmd.sreport_account_user(local[since], local[until], tres=f"gres/gpu:{mig}")).stdout
        for u in parsers.parse_sreport_account_user(text):
            if u.user:
                out[u.account] = out.get(u.account, Fraction(0)) - u.seconds * (1 - gpu_weight(mig))
    return {a: to_decimal(v) for a, v in out.items()}


def test_runs_across_a_boundary_split_as_sacct_truncates_them(sqlite_url, client, jobs, berlin, tmp_path):
    url = sqlite_url
    db.upgrade(url)
    admin.set_price("h100", rate=RATE, effective_from=T_PRICE, url=url)
    t0 = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=2)
    # two runs in each of two accounts (research, the user's root), 1 and 2 GPUs; each runs until
    # the test says go (whenever the others got their GPUs), then 10 s more
    go = tmp_path / "go"
    script = f"#!/bin/bash\nwhile [ ! -e {shlex.quote(str(go))} ]; do sleep 0.2; done\nsleep 10\n"
    spec = [("research", 1), ("research", 2), ("root", 1), ("root", 2)]
    for account, gpus in spec:
        jobs.append(client.submit_script(script, extra=[
            "-p", "gpu", f"--gres=gpu:h100:{gpus}", "-t", "5", "-A", account, "-J", "gpuhpc-month-end",
            "-o", "/dev/null"]))

    def running() -> bool:
        rows = client.queue(job_ids=jobs)
        return len(rows) == len(jobs) and all(r.state.state.value == "RUNNING" for r in rows)

    wait_for(running, 120, lambda: f"the month-end jobs to run ({client.queue(job_ids=jobs)})", interval=1)
    # the boundary: 3 s from now, inside every run (each started by now and ends 10 s after go)
    boundary = dt.datetime.now(UTC).replace(microsecond=0) + dt.timedelta(seconds=3)
    go.touch()
    wait_for(lambda: all(r.state.state.is_finished for r in client.queue(job_ids=jobs)), 90,
             "the month-end jobs to end", interval=1)

    def settled():
        rows = [r for r in client.job_runs(t0, job_ids=jobs) if r.array_job_id in jobs]
        done = [r for r in rows if ingest.parse_time(r.start) and r.state.state.is_finished]
        return rows if len(done) == len(jobs) else None

    rows = wait_for(settled, 30, "sacct to show every month-end job finished", interval=1)
    res = ingest.ingest_rows(rows, url=url)
    assert res.runs_new == len(jobs)
    t1 = max(ingest.parse_time(r.end) for r in rows) + dt.timedelta(seconds=1)
    for r in rows:                          # each run spans the boundary
        assert ingest.parse_time(r.start) < boundary < ingest.parse_time(r.end), (r.job_id, r.start, r.end, boundary)

    table, whole = [], {}
    for since, until in ((t0, boundary), (boundary, t1)):
        ledger = _ledger_seconds(url, since, until)
        slurm = client.window_gpu_seconds(since, until, job_ids=jobs)
        name = f"{since:%H:%M:%S}-{until:%H:%M:%S} UTC"
        table += [(name, a, ledger.get(a, Decimal(0)), slurm.get(a, 0)) for a in sorted(set(ledger) | set(slurm))]
        assert set(ledger) == set(slurm) == {"research", "root"}, (ledger, slurm)
        for a in slurm:
            assert slurm[a] > 0                               # both parts of the runs are counted
            # a run's part is C(b) - C(a) of 6-decimal GPU-hours: within 2 × 1.8 ms of Slurm's per run
            assert abs(ledger[a] - slurm[a]) <= 2 * RESOLUTION_S * 2, (name, a, ledger[a], slurm[a])
            whole[a] = whole.get(a, Decimal(0)) + ledger[a]
    print("\n" + _table(f"ledger vs sacct --truncate, boundary {boundary:%H:%M:%S} UTC "
                        f"(ledger.timezone {berlin})", table))

    # the parts add up exactly to what was charged: GPU-hours and money, per account
    rep = reports.cost_report(by="account", period="month", since=t0, until=t1, url=url)
    charged = {r.key: (r.gpu_hours, r.cost) for r in rep.rows}
    for a in ("research", "root"):
        runs = [r for r in rows if r.account == a]
        hours = sum((to_decimal(Fraction(sum(r.gpus.values()) * r.elapsed_s, 3600)) for r in runs), Decimal(0))
        assert charged[a][0] == hours
        assert charged[a][1] == sum((to_decimal(Fraction(sum(r.gpus.values()) * r.elapsed_s, 3600) * Fraction(RATE))
                                     for r in runs), Decimal(0))
        assert whole[a] == hours * 3600


def test_ledger_equals_sreport_on_rolled_up_hours(any_url, client):
    url = any_url                               # SQLite and PostgreSQL
    db.upgrade(url)
    now = dt.datetime.now(UTC)
    # slurmdbd rolls an hour up just after it ends: the last three hours that ended 10 min ago,
    # each on its own (a run across an hour's edge is split between two of them)
    until = (now - dt.timedelta(minutes=10)).replace(minute=0, second=0, microsecond=0)
    hours = [(until - dt.timedelta(hours=k + 1), until - dt.timedelta(hours=k)) for k in (2, 1, 0)]
    rows = client.job_runs(hours[0][0], until)
    ingest.ingest_rows(rows, url=url)
    edges = {b for _, b in hours[:-1]}
    across = sum(1 for r in rows if ingest.parse_time(r.start) and any(
        ingest.parse_time(r.start) < e < ingest.parse_time(r.start) + dt.timedelta(seconds=r.elapsed_s) for e in edges))
    table, compared = [], []
    for since, end in hours:
        ledger = {a: v for a, v in _ledger_seconds(url, since, end).items() if v}
        slurm = {a: v for a, v in _sreport_weighted(client, since, end).items() if v}
        table += [(f"{since:%H:%M}-{end:%H:%M} UTC", a, ledger.get(a, Decimal(0)), slurm.get(a, 0))
                  for a in sorted(set(ledger) | set(slurm))]
        compared.append((since, ledger, slurm))
    # an account deleted in Slurm since (a test's throwaway account): sreport no longer lists its
    # usage, the ledger keeps what it was charged; compared are the accounts Slurm still has
    existing = {r["Account"] for r in client.sacctmgr_list("account", fields=["Account"])}
    gone = sorted({a for _, ledger, slurm in compared for a in (*ledger, *slurm)} - existing)
    print("\n" + _table(f"ledger vs sreport (AccountUtilizationByUser, -t seconds): {len(rows)} runs, "
                        f"{across} across an hour's edge; deleted in Slurm since, not compared: {gone or 'none'}",
                        table))
    for since, ledger, slurm in compared:
        assert set(ledger) - set(gone) == set(slurm) - set(gone), (since, ledger, slurm)
        for a in set(slurm) - set(gone):
            assert abs(ledger[a] - slurm[a]) <= 2 * RESOLUTION_S * len(rows), (since, a, ledger[a], slurm[a])


def _association_usage(account: str) -> tuple[int, Fraction]:
    """Slurm's usage of ``account``'s association: ``GrpTRESRaw``'s gres/gpu (whole GPU-minutes, as
    limits count them) and ``RawUsage`` (billing-seconds, undecayed here: PriorityDecayHalfLife=0)."""
    import subprocess

    out = subprocess.run(["sshare", "-A", account, "-o", "Account,User,RawUsage,GrpTRESRaw%300", "-l", "-P", "-n"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    row = next(line.split("|") for line in out.splitlines() if line.split("|")[1] == "")      # the account's own
    tres = dict(kv.split("=", 1) for kv in row[3].split(","))
    return int(tres.get("gres/gpu", 0)), Fraction(row[2] or 0)


def test_ledger_equals_slurms_association_usage_to_the_minute(sqlite_url, client, jobs, tmp_path):
    """Issue 34.1: the ledger's GPU-hours of an account equal what Slurm counted on its association,
    the usage its ``GrpTRESMins`` budget is held against: ``GrpTRESRaw`` gres/gpu to the minute, and
    ``RawUsage`` (billing-seconds; partition gpu bills only GPUs) to the second. A fresh account
    (usage 0) runs a 1-GPU and a 2-GPU job of 45 s each on partition gpu; sacct's runs are ingested."""
    import subprocess
    import uuid

    account = f"me{uuid.uuid4().hex[:8]}"
    cluster = client.cluster_name()
    weights = client.partition_billing_weights()["gpu"] or ""
    per_gpu = Fraction(dict(kv.split("=", 1) for kv in weights.split(","))["GRES/gpu"])
    subprocess.run(["sacctmgr", "-i", "add", "account", account, f"cluster={cluster}"], check=True, timeout=60,
                   capture_output=True)
    try:
        subprocess.run(["sacctmgr", "-i", "add", "user", "root", f"account={account}", f"cluster={cluster}"],
                       check=True, timeout=60, capture_output=True)
        url = sqlite_url
        db.upgrade(url)
        admin.set_price("h100", rate=RATE, effective_from=T_PRICE, url=url)
        t0 = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(seconds=2)
        for gpus in (1, 2):
            jobs.append(client.submit_script("#!/bin/bash\nsleep 45\n", extra=[
                "-p", "gpu", f"--gres=gpu:h100:{gpus}", "-t", "5", "-A", account, "-J", "gpuhpc-assoc-usage",
                "-o", "/dev/null"]))

        def settled():
            rows = [r for r in client.job_runs(t0, job_ids=jobs) if r.array_job_id in jobs]
            done = [r for r in rows if ingest.parse_time(r.start) and r.state.state.is_finished]
            return rows if len(done) == len(jobs) else None

        rows = wait_for(settled, 240, "sacct to show both jobs finished", interval=1)
        assert ingest.ingest_rows(rows, url=url).runs_new == len(jobs)
        ledger_s = _ledger_seconds(url, t0, dt.datetime.now(UTC) + dt.timedelta(seconds=1))[account]
        # Slurm adds a finished job's usage at its next PriorityCalcPeriod (1 minute here)
        wait_for(lambda: _association_usage(account)[1] / per_gpu >= ledger_s - 1, 180,
                 lambda: f"Slurm to count {account}'s usage (now {_association_usage(account)}, "
                         f"ledger {ledger_s} GPU-s)", interval=2)
        minutes, billing_s = _association_usage(account)
        print(f"\n{account}: ledger {ledger_s} GPU-s; Slurm RawUsage {float(billing_s / per_gpu):.1f} GPU-s, "
              f"GrpTRESRaw gres/gpu {minutes} GPU-min")
        assert minutes == int(ledger_s // 60)                  # GrpTRESRaw: whole minutes, as a limit counts
        assert abs(billing_s / per_gpu - Fraction(ledger_s)) <= 1     # RawUsage: to the second
        sacct_s = sum(sum(r.gpus.values()) * r.elapsed_s for r in rows)
        assert sacct_s >= 120 and abs(ledger_s - sacct_s) <= 2 * RESOLUTION_S            # 3 GPUs × 45 s
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], timeout=60, capture_output=True)
        subprocess.run(["sacctmgr", "-i", "delete", "account", account, f"cluster={cluster}"], timeout=60,
                       capture_output=True)

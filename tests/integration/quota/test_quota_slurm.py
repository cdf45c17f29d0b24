"""Budgets that bind every job, on the real local cluster (issue 14).

* a Unix user the test creates, added to the account with sacctmgr only, submits 10 concurrent
  plain-sbatch 1-GPU jobs against a 6 GPU-minute budget: together they never exceed it, the rest
  pend with Slurm's budget reason (AssocGrpGRESMinutes), which `gpuhpc jobs` puts in words, and a
  job that alone cannot fit is refused at submit by job_submit.lua;
* that user cannot change the ledger (price set, quota set, ingest: one line each, nothing
  changed) but `gpuhpc submit` works and shows the budget;
* a money budget with two GPU types is consumed in proportion to their prices (billing weights
  from the price book, applied by the collection with `scontrol reconfigure`: slurmctld keeps its
  pid, a running job is untouched); after ingest the ledger and Slurm agree per job; a period
  rollover frees the budget in both.
* that `scripts/cluster.sh up` is the local cluster's second converge (the CI's set-up ran the
  first): idempotence, as README/DEVELOPING promise ("a second run reports changed=0 and restarts
  nothing"), asserted on the one input that changed: only slurm.conf's TRESBillingWeights line
  differs among the deployed files, only the tasks that write it and reconfigure report changed,
  and no daemon (slurmctld, any slurmd) restarts. (This was a test of its own,
  test_local_cluster.py's second `cluster.sh up` with nothing changed: a whole site play more.)

Own accounts only (quota-t1, quota-t2); every limit and the published snapshot are removed in
finally blocks, so no other test's job pends on them.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import pwd
import re
import subprocess
import shutil
import sys
import sysconfig
import tempfile
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from gpuhpc.ledger import admin, budget, db, ingest, slurm_sync
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
USER = "gpuhpc-quota-u1"
# the user runs gpuhpc from this checkout with the system Python 3.11 (the venv's interpreter lives
# under /root, which other users cannot enter); the venv's site-packages are world-readable: the
# running interpreter's (a venv anywhere, not only the checkout's .venv; read at import, never fails)
SITE = Path(sysconfig.get_paths()["purelib"])
BOOT = ("import sys; sys.path[:0] = [sys.argv.pop(1), sys.argv.pop(1)]; sys.argv[0] = 'gpuhpc'; "
        "from gpuhpc.cli.main import main; sys.exit(main())")


@pytest.fixture()
def client():
    return SlurmClient()


@pytest.fixture()
def unix_user():
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", USER], check=True)
    return USER


def as_user(user: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in (env or {}).items()}
    envs = [f"{k}={v}" for k, v in keep.items()]
    return subprocess.run(["runuser", "-u", user, "--", "env", f"HOME={pwd.getpwnam(user).pw_dir}", *envs, *argv],
                          capture_output=True, text=True, cwd="/tmp", timeout=120)


def gpuhpc_as(user: str, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return as_user(user, ["/usr/bin/python3.11", "-c", BOOT, str(REPO), str(SITE), *args], env)




def _done(client, ids: list[str]) -> bool:
    """Every job finished (squeue keeps finished jobs for MinJobAge, in a final state)."""
    return all(r.state.state.is_finished for r in client.queue(job_ids=ids)) if ids else True


def _assoc(client, account: str) -> dict[str, str]:
    rows = [r for r in client.sacctmgr_list("association", f"cluster={client.cluster_name()}",
                                            fields=["Account", "User", "GrpTRESMins"])
            if r["Account"] == account and not r["User"]]
    return rows[0] if rows else {}


def _cleanup(client, account: str, users: list[str], jobs: list[str]) -> None:
    for j in jobs:
        client.run(cmd.scancel(j), check=False)
    wait_for(lambda: _done(client, jobs), 60, "test jobs to finish")
    for u in users:
        client.sacctmgr_delete("user", [("name", u), ("account", account)], check=False)
    client.sacctmgr_delete("account", [("name", account)], check=False)
    budget.snapshot_path().unlink(missing_ok=True)


def _used_minutes(client, account: str, tres: str) -> int:
    for a in client.assoc_budgets([account]):
        if a.account == account and not a.user:
            return a.used.get(tres, 0)
    return 0


def test_plain_sbatch_never_overspends_and_users_cannot_rewrite_the_ledger(tmp_path, client, unix_user):
    acct = "quota-t1"
    data = Path(tempfile.mkdtemp(prefix="gpuhpc-quota-"))
    os.chmod(data, 0o755)                       # like /var/lib/gpuhpc: the file inside is the admin's only
    url = f"sqlite:///{data / 'ledger.db'}"
    db.upgrade(url)
    assert (data / "ledger.db").stat().st_mode & 0o777 == 0o600
    admin.add_account(acct, description="issue 14 test", url=url)
    admin.set_price("h100", rate=Decimal("2.50"), url=url)
    admin.set_quota(acct, gpu_hours=Decimal("0.1"), period="day", url=url)     # 6 GPU-minutes
    jobs: list[str] = []
    try:
        plans = slurm_sync.plan(url=url, accounts=[acct])
        slurm_sync.sync(client, plans)
        slurm_sync.record_periods(plans, url=url)
        slurm_sync.publish(url=url, billing_file=tmp_path / "billing.json")
        assert _assoc(client, acct)["GrpTRESMins"] == "gres/gpu=4"   # 2 minutes of headroom
        # the user joins the account in Slurm only; the ledger never heard of them
        client.sacctmgr("add", "user", unix_user, f"Account={acct}", check=False)   # (kept by an aborted run)
        assert any(r["User"] == unix_user and r["Account"] == acct for r in client.sacctmgr_list(
            "association", f"cluster={client.cluster_name()}", fields=["Account", "User"]))
        user_env = {"GPUHPC_DB_URL": url, "GPUHPC_DATA_DIR": f"/var/tmp/{unix_user}-gpuhpc",
                    "GPUHPC_BUDGET_SNAPSHOT": str(budget.snapshot_path())}

        # --- gpuhpc submit works for the user and shows the budget (the published snapshot)
        r = gpuhpc_as(unix_user, ["submit", "-A", acct, "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t", "1m",
                                  "--grace", "10s", "--log-dir", f"/var/tmp/{unix_user}-logs", "--", "true"], user_env)
        assert r.returncode == 0, r.stderr
        assert "budget: account quota-t1: budget 0.10 GPU-hours for" in r.stderr, r.stderr
        jobs.append(r.stdout.strip().splitlines()[-1].strip())
        wait_for(lambda: _done(client, jobs[-1:]), 90, "the user's gpuhpc job to finish")

        def refusals() -> None:
            """Run beside the 10 jobs below (they take a minute or more; none of this depends on them:
            gpuhpc checks the published snapshot, job_submit.lua the published budget)."""
            # --- who may change the ledger: not this user; one line each, nothing changed
            before = (admin.list_prices(url=url), [q.as_dict() for q in admin.quota_status(url=url)])
            for args in (["ledger", "price", "set", "--gpu-type", "h100", "--rate", "0.01"],
                         ["quota", "set", acct, "--gpu-hours", "1000"],
                         ["ledger", "ingest"]):
                r = gpuhpc_as(unix_user, args, user_env)
                assert r.returncode == 1, (args, r.stdout, r.stderr)
                assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: permission denied"), r.stderr
            assert (admin.list_prices(url=url), [q.as_dict() for q in admin.quota_status(url=url)]) == before
            # --- gpuhpc submit refuses, before sbatch, a job that alone cannot fit
            r = gpuhpc_as(unix_user, ["submit", "-A", acct, "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t",
                                      "10m", "--grace", "10s", "--", "true"], user_env)
            assert r.returncode == 3 and "this job may use 0.17 GPU-hours" in r.stderr, r.stderr
            # --- a plain sbatch that can never fit is refused at submit by job_submit.lua, with the budget
            r = as_user(unix_user, cmd.sbatch(extra=["-A", acct, "-p", "gpu", "--gres=gpu:h100:1", "-t", "10",
                                                     "-o", "/dev/null", "--wrap", "sleep 1"]))
            assert r.returncode != 0 and "account quota-t1: budget 0.10 GPU-hours" in r.stderr, r.stderr

        refused: list[BaseException] = []

        def run_refusals() -> None:
            try:
                refusals()
            except BaseException as e:          # raised in the test's thread below
                refused.append(e)

        # --- 10 concurrent plain sbatch, 1 GPU for 40 s each (6.7 GPU-minutes): together never above 6
        ids: list[str] = []
        lock = threading.Lock()

        def submit() -> None:
            out = as_user(unix_user, cmd.sbatch(extra=["-A", acct, "-p", "gpu", "--gres=gpu:h100:1", "-t", "1",
                                                       "-o", "/dev/null", "--wrap", "sleep 40"]))
            if out.returncode == 0:
                with lock:
                    ids.append(out.stdout.strip().split(";")[0])

        threads = [threading.Thread(target=submit) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        jobs.extend(ids)
        assert len(ids) == 10
        beside = threading.Thread(target=run_refusals, daemon=True)
        beside.start()
        seen_reason: set[str] = set()
        translated = ""

        def decided() -> bool:
            """One look at the jobs, the limit checked on each: True once they have all ended, or
            the budget holds the rest for good."""
            nonlocal translated
            rows = [r for r in client.queue(job_ids=ids) if not r.state.state.is_finished]
            running = [r for r in rows if r.state.state.value == "RUNNING"]
            for r in rows:
                if r.state.state.value == "PENDING":
                    seen_reason.add(r.reason)
            # at most 5 at once: GrpTRESMins=gres/gpu=4, and Slurm floors the running jobs' reserve to minutes
            assert len(running) <= 5, rows
            if not translated and "AssocGrpGRESMinutes" in seen_reason:
                out = gpuhpc_as(unix_user, ["jobs"], user_env)
                m = re.search(r"AssocGrpGRESMinutes: account quota-t1: budget 0\.10 GPU-hours for \S+, [\d.]+ "
                              r"GPU-hours left; this job may use 0\.02 GPU-hours", out.stdout)
                translated = m.group(0) if m else out.stdout + out.stderr
            if not rows:
                return True
            # decided: nothing runs any more and the usage Slurm has counted (whole minutes, as its
            # limit check counts them; it never decays here) leaves less than one job's minute under
            # GrpTRESMins=4, so no pending job can ever start; a finished job's usage is counted at
            # the next PriorityCalcPeriod, so until then this stays false
            return bool(translated) and all(r.state.state.value == "PENDING" for r in rows) \
                and _used_minutes(client, acct, "gres/gpu") + 1 > 4

        wait_for(decided, 240, lambda: f"the 10 jobs to end or be held for good by the budget (pending reasons "
                 f"{sorted(seen_reason)}, translated: {translated!r})", interval=2)
        beside.join()
        if refused:
            raise refused[0]
        for j in ids:
            client.run(cmd.scancel(j), check=False)
        wait_for(lambda: _done(client, ids), 60, "the jobs to finish")
        assert "AssocGrpGRESMinutes" in seen_reason, seen_reason
        assert translated.startswith("AssocGrpGRESMinutes: account quota-t1"), translated
        runs = wait_for(lambda: (rs := client.accounting(job_ids=ids, all_users=True))
                     and len(rs) == len(ids) and all(r.state.state.is_finished for r in rs) and rs, 30,
                     "sacct to show the jobs finished")
        gpu_seconds = sum(r.elapsed_s for r in runs)            # 1 GPU each
        assert gpu_seconds <= 6 * 60, (gpu_seconds, len(runs))
        print(f"{len([r for r in runs if r.elapsed_s])} of 10 ran, {gpu_seconds} GPU-s of 360; pending reasons "
              f"{sorted(seen_reason)}", file=sys.stderr)
        started = [r for r in runs if r.elapsed_s > 0]
        assert 0 < len(started) < 10, [(r.job_id, r.elapsed_s) for r in runs]
    finally:
        _cleanup(client, acct, [unix_user], jobs)
        shutil.rmtree(data, ignore_errors=True)
    assert not _assoc(client, acct)


def test_a_postgresql_reader_submits_and_is_refused_from_the_budget_snapshot(tmp_path, client, unix_user, pg_url):
    """Issue 34.3: on a PostgreSQL ledger an ordinary user holds the reader role (what the login role
    installs). `gpuhpc submit` used to end `unexpected InsufficientPrivilege` (exit 1) for every job
    of such a user, and `cannot connect` (exit 1) while the database was down. Now both decide from
    the published budget snapshot, as job_submit.lua decides for plain sbatch, and say which: a job
    that fits is submitted, one that alone cannot fit is refused (exit 3) by gpuhpc and by plain
    sbatch alike, and the reader wrote nothing to the ledger."""
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    acct = "quota-t3"
    db.upgrade(pg_url)
    admin.add_account(acct, description="issue 34 test", url=pg_url)
    admin.set_price("h100", rate=Decimal("2.50"), url=pg_url)
    admin.set_quota(acct, gpu_hours=Decimal("0.1"), period="day", url=pg_url)     # 6 GPU-minutes
    tag = uuid.uuid4().hex[:8]
    role = f"gpuhpc_r_{tag}"
    sup = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_reader"))
    reader_url = make_url(pg_url).set(username=role, password=tag).render_as_string(hide_password=False)
    jobs: list[str] = []
    try:
        admin.add_user(role, acct, url=pg_url)
        plans = slurm_sync.plan(url=pg_url, accounts=[acct])
        slurm_sync.sync(client, plans)
        slurm_sync.record_periods(plans, url=pg_url)
        slurm_sync.publish(url=pg_url, billing_file=tmp_path / "billing.json")
        client.sacctmgr("add", "user", unix_user, f"Account={acct}", check=False)
        user_env = {"GPUHPC_DB_URL": reader_url, "GPUHPC_DATA_DIR": f"/var/tmp/{unix_user}-gpuhpc",
                    "GPUHPC_BUDGET_SNAPSHOT": str(budget.snapshot_path())}
        down_env = {**user_env, "GPUHPC_DB_URL": "postgresql+psycopg://nobody@127.0.0.1:1/gpuhpc"}
        fits = ["submit", "-A", acct, "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t", "1m", "--grace", "10s",
                "--hold", "--log-dir", f"/var/tmp/{unix_user}-logs", "--", "true"]
        too_big = [*fits[:fits.index("-t")], "-t", "10m", *fits[fits.index("-t") + 2:]]
        for env, why in ((user_env, f"budget: the ledger is read-only for database role {role}: "
                                    "deciding from the budget snapshot"),
                         (down_env, "budget: cannot connect to the ledger database postgresql+psycopg://nobody@"
                                    "127.0.0.1:1/gpuhpc: ")):
            r = gpuhpc_as(unix_user, fits, env)
            assert r.returncode == 0, r.stderr
            jobs.append(r.stdout.strip().splitlines()[-1].strip())
            assert why in r.stderr and "deciding from the budget snapshot" in r.stderr, r.stderr
            assert "budget: account quota-t3: budget 0.10 GPU-hours for" in r.stderr, r.stderr
            assert client.queue(job_ids=jobs[-1:]), jobs           # it reached Slurm
            r = gpuhpc_as(unix_user, too_big, env)
            assert r.returncode == 3 and "this job may use 0.17 GPU-hours" in r.stderr, r.stderr
            assert r.stdout == "", r.stdout
        # plain sbatch decides the same from the same snapshot (job_submit.lua)
        r = as_user(unix_user, cmd.sbatch(extra=["-A", acct, "-p", "gpu", "--gres=gpu:h100:1", "-t", "10",
                                                 "-o", "/dev/null", "--wrap", "sleep 1"]))
        assert r.returncode != 0 and "account quota-t3: budget 0.10 GPU-hours" in r.stderr, r.stderr
        # the reader held nothing and wrote nothing: the ledger has no reservation
        with create_engine(pg_url).connect() as c:
            assert c.execute(text("SELECT count(*) FROM reservations")).scalar() == 0
        mine = [row for row in client.queue(user=unix_user) if row.job_id in jobs]
        assert len(mine) == 2, mine
    finally:
        _cleanup(client, acct, [unix_user], jobs)
        with sup.connect() as c:
            c.execute(text(f"DROP OWNED BY {role}"))
            c.execute(text(f"DROP ROLE {role}"))
        sup.dispose()
    assert not _assoc(client, acct)


# the files a converge of the local cluster deploys (cluster.sh's `deployed`), and its daemons' pid files
DEPLOYED = ("/etc/slurm/*.conf", "/etc/slurm/job_submit.lua", "/etc/gpuhpc/*")
PID_FILES = ("/run/slurm/slurmctld.pid", "/run/slurm/slurmd-*.pid")
# what a changed billing weight alone changes in a converge: the rendered files (slurm.conf), the
# reconfigure their change asks for, and the copy of what the daemons now run with
BILLING_TASKS = {"gpuhpc.cluster.gpuhpc_slurm_common : Render Slurm config files from the slurm-conf templates",
                 "gpuhpc.cluster.gpuhpc_slurm_controller : Reconfigure Slurm (scontrol reconfigure)",
                 "gpuhpc.cluster.gpuhpc_slurm_common : Record the config files the daemons applied"}


def _files(patterns: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pattern in patterns:
        for f in sorted(Path("/").glob(pattern.lstrip("/"))):
            if f.is_file():
                out[str(f)] = f.read_text(errors="replace")
    return out


def changed_tasks(stdout: str) -> list[str]:
    """The tasks and handlers of an ansible-playbook run (default output) that reported changed."""
    out: list[str] = []
    name = ""
    for line in stdout.splitlines():
        m = re.match(r"(?:TASK|RUNNING HANDLER) \[(.*)\] \*+$", line)
        if m:
            name = m.group(1)
        elif line.startswith("changed:") and (not out or out[-1] != name):
            out.append(name)
    return out


def _billing(row) -> int:
    return int(row.alloc_tres.get("billing", 0))


def test_money_budget_two_gpu_types_price_change_by_reconfigure_and_rollover(tmp_path, client):
    acct = "quota-t2"
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db.upgrade(url)
    # a real change every run (so the collection has something to reconfigure): h100 0.60 or 0.90 /GPU-h
    weights = client.config().get("TRESBillingWeights", "")
    billing_file = budget.billing_path()
    old = json.loads(billing_file.read_text()).get("rates", {}).get("h100") if billing_file.exists() else None
    rate = Decimal("0.90") if old == "600000" else Decimal("0.60")
    t0 = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(minutes=5)
    admin.set_price("h100", rate=rate, effective_from=t0, url=url)
    admin.set_price("1g.10gb", base="h100", fraction="1/5", effective_from=t0, url=url)
    admin.add_account(acct, description="issue 14 money test", url=url)
    me = pwd.getpwuid(os.getuid()).pw_name
    admin.add_user(me, acct, url=url)
    admin.set_quota(acct, money=Decimal("1.00"), period="day", url=url)
    jobs: list[str] = []
    try:
        plans = slurm_sync.plan(url=url, accounts=[acct])
        slurm_sync.sync(client, plans)
        slurm_sync.record_periods(plans, url=url)
        slurm_sync.publish(url=url)
        assert _assoc(client, acct)["GrpTRESMins"] == "billing=59999998"
        # a job running through the price change
        long = client.submit_script("#!/bin/bash\nsleep 300\n", extra=["-A", acct, "-p", "cpu", "-t", "10",
                                                                       "-o", "/dev/null", "-J", "quota-t2-long"])
        jobs.append(long)
        wait_for(lambda: (q := client.queue(job_ids=[long])) and q[0].state.state.value == "RUNNING", 60, "the long job")
        pids, files = _files(PID_FILES), _files(DEPLOYED)
        assert "/run/slurm/slurmctld.pid" in pids and len(pids) >= 5, pids    # slurmctld and the 4 slurmd
        up = subprocess.run(["bash", str(REPO / "scripts" / "cluster.sh"), "up"], capture_output=True, text=True,
                            timeout=600)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
        # reconfigured, not restarted: slurmctld and every slurmd keep their pids
        assert _files(PID_FILES) == pids, (pids, up.stdout[up.stdout.rindex("PLAY RECAP"):])
        # a second converge (idempotence): among the deployed files only slurm.conf's billing line differs ...
        after = _files(DEPLOYED)
        assert after.keys() == files.keys(), sorted(after.keys() ^ files.keys())
        diff = {p: sorted(set(files[p].splitlines()) ^ set(after[p].splitlines()))
                for p in files if files[p] != after[p]}
        assert list(diff) == ["/etc/slurm/slurm.conf"], diff
        # the weights, and the comment above the partitions that names their unit: on a machine whose
        # first converge had no billing document yet, both are new in this converge
        field = re.compile(r" ?TRESBillingWeights=\S*|^# TRESBillingWeights: .*\n", re.M)
        assert field.sub("", files["/etc/slurm/slurm.conf"]) == field.sub("", after["/etc/slurm/slurm.conf"]), diff
        # ... and only the tasks that write it and reconfigure report changed (any other would be a task
        # that is not idempotent, or a restart)
        changed = changed_tasks(up.stdout)
        assert set(changed) == BILLING_TASKS, changed
        print(f"cluster.sh up with a new billing weight: changed {changed}", file=sys.stderr)
        assert re.search(r"failed=0 ", up.stdout[up.stdout.rindex("PLAY RECAP"):]), up.stdout[-3000:]
        (q,) = client.queue(job_ids=[long])
        assert q.state.state.value == "RUNNING", q                                     # untouched
        del weights
        w = int(rate * 1_000_000)
        # two GPU types, 5 s each (the billing weights are per allocated TRES, whatever the length)
        a = client.submit_script("#!/bin/bash\nsleep 5\n", extra=["-A", acct, "-p", "gpu", "--gres=gpu:h100:1",
                                                                   "-t", "1", "-o", "/dev/null"])
        b = client.submit_script("#!/bin/bash\nsleep 5\n", extra=["-A", acct, "-p", "mig", "--gres=gpu:1g.10gb:1",
                                                                   "-t", "1", "-o", "/dev/null"])
        jobs += [a, b]
        wait_for(lambda: _done(client, [a, b]), 150, "the two GPU jobs to finish")
        runs = wait_for(lambda: (rs := {r.job_id: r for r in client.accounting(job_ids=[a, b], all_users=True)})
                     and all(j in rs and rs[j].state.state.is_finished for j in (a, b)) and rs, 30, "sacct")
        assert _billing(runs[a]) == w and _billing(runs[b]) == w // 5      # in proportion to the prices
        # settle from sacct: the ledger's charge and Slurm's billing agree per job (the ledger's 6 decimals)
        since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
        rows = wait_for(lambda: (rs := client.job_runs(since, job_ids=[a, b]))
                     and {a, b} <= {r.array_job_id for r in rs} and rs, 30, "sacct window")
        # (this test's jobs only: an earlier run's jobs of the same account are in the window too)
        ingest.ingest_rows([r for r in rows if r.array_job_id in (a, b)], since=since, active=set(), url=url)
        (st,) = admin.quota_status(acct, url=url)
        slurm_money = sum(budget.billing_minutes_to_money(Decimal(_billing(runs[j])) * runs[j].elapsed_s / 60)
                          for j in (a, b))
        assert abs(st.used_money - slurm_money) <= Decimal("0.000001") * 2, (st.used_money, slurm_money)
        # Slurm's own usage of the budget (added up every PriorityCalcPeriod = 1 min here)
        wait_for(lambda: _used_minutes(client, acct, "billing") > 0, 130, "Slurm to add up the usage", interval=5)
        used = budget.billing_minutes_to_money(_used_minutes(client, acct, "billing"))
        assert abs(used - st.used_money) <= Decimal("0.0001"), (used, st.used_money)
        print(f"billing h100 {_billing(runs[a])} 1g.10gb {_billing(runs[b])}; ledger {st.used_money} vs sacct "
              f"{slurm_money} vs Slurm's usage {used}", file=sys.stderr)
        # period rollover (the period start moved): both the ledger's and Slurm's usage start again
        tomorrow = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
        (p2,) = slurm_sync.plan(url=url, accounts=[acct], now=tomorrow)
        assert p2.reset
        res = slurm_sync.sync(client, [p2])
        assert ["sacctmgr", "-i", "modify", "account", "where", f"name={acct}", f"cluster={client.cluster_name()}",
                "set", "RawUsage=0"] in res.commands
        wait_for(lambda: _used_minutes(client, acct, "billing") == 0, 30, "Slurm's usage reset")
        (st2,) = admin.quota_status(acct, url=url, now=tomorrow)
        assert st2.used_money == 0 and st2.remaining_money == Decimal("1.00")
    finally:
        _cleanup(client, acct, [me], jobs)
    assert not _assoc(client, acct)
    print(f"h100 {rate}/GPU-h -> billing weight {int(rate * 1_000_000)}", file=sys.stderr)

"""Reliability on SQLite AND PostgreSQL, for real: concurrent reservations never overspend,
and a kill -9 in the middle of an ingest followed by a rerun gives exact totals."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import func, select

from gpuhpc.ledger import admin, db
from gpuhpc.ledger.orm import Charge, Reservation, UsageRecord

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

HERE = Path(__file__).parent
WORKER = HERE / "ledger_workers.py"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
REPO = HERE.parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env.pop("GPUHPC_DB_URL", None)
    return env


def _prepare(url: str, *, budget: str) -> None:
    db.upgrade(url)
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0, url=url)
    admin.set_quota("research", money=Decimal(budget), period="total", url=url)


def test_eight_processes_never_overspend(any_url):
    # each reservation: 3 GPUs × 1 h × 2.50 = 7.50; budget 250.00 -> exactly 33 fit (247.50)
    _prepare(any_url, budget="250")
    start_at = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, str(WORKER), "reserve", any_url, str(start_at), "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    ok = sum(r["ok"] for r in results)
    assert ok == 33, results
    assert sum(r["refused"] for r in results) == 64 - 33
    (st,) = admin.quota_status("research", url=any_url)
    assert st.held_money == Decimal("247.500000") and st.used_money == 0
    with db.session_scope(any_url) as s:
        assert s.scalar(select(func.count()).select_from(Reservation)) == 33
        assert Decimal(s.scalar(select(func.sum(Reservation.amount)))) == Decimal("247.5")


def test_kill_9_mid_ingest_then_rerun_is_exact(any_url):
    sys.path.insert(0, str(HERE))
    import ledger_workers

    _prepare(any_url, budget="1000000")
    n_jobs, batch = 3000, 100
    p = subprocess.Popen([sys.executable, str(WORKER), "ingest", any_url, str(n_jobs), str(batch)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    seen = 0
    for line in p.stdout:
        if line.startswith("batch"):
            seen += 1
            if seen == 5:
                time.sleep(0.02)              # somewhere inside batch 6's transaction
                p.send_signal(signal.SIGKILL)
                break
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL, "ingest finished before it could be killed"
    with db.session_scope(any_url) as s:
        partial = s.scalar(select(func.count()).select_from(UsageRecord))
    assert 0 < partial < n_jobs
    rerun = subprocess.run([sys.executable, str(WORKER), "ingest", any_url, str(n_jobs), str(batch)],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    # and once more: nothing changes
    again = subprocess.run([sys.executable, str(WORKER), "ingest", any_url, str(n_jobs), str(batch)],
                           capture_output=True, text=True, env=_env(), timeout=300)
    assert again.returncode == 0, again.stderr
    want = ledger_workers.expected_total(n_jobs)
    runs = n_jobs + n_jobs // 5
    with db.session_scope(any_url) as s:
        assert s.scalar(select(func.count()).select_from(UsageRecord)) == runs
        assert s.scalar(select(func.count()).select_from(Charge)) == runs       # one charge per run, ever
        total = Decimal(s.scalar(select(func.sum(Charge.amount)))).quantize(Decimal("0.000001"))
        usage_total = Decimal(s.scalar(select(func.sum(UsageRecord.amount)))).quantize(Decimal("0.000001"))
    assert total == want and usage_total == want
    (st,) = admin.quota_status("research", url=any_url)
    assert st.used_money == want


def test_postgres_schema_matches_models(pg_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from gpuhpc.ledger.orm import Base

    db.upgrade(pg_url)
    assert db.current_revision(db.get_engine(pg_url)) == db.SCHEMA_HEAD
    with db.get_engine(pg_url).connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []
    db.downgrade(pg_url, "base")
    assert db.current_revision(db.get_engine(pg_url)) is None


def test_ingest_and_reservations_concurrently(any_url):
    """An ingest (locks every quota per batch) racing 4 reservers (lock their quota rows):
    no deadlock, no lost update, exact totals."""
    sys.path.insert(0, str(HERE))
    import ledger_workers

    _prepare(any_url, budget="1000000")
    start_at = time.time() + 1.5
    reservers = [subprocess.Popen([sys.executable, str(WORKER), "reserve", any_url, str(start_at), "100"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
                 for _ in range(4)]
    ing = subprocess.Popen([sys.executable, str(WORKER), "ingest", any_url, "1500", "50"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    ok = 0
    for p in reservers:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
        ok += json.loads(out.strip().splitlines()[-1])["ok"]
    _, err = ing.communicate(timeout=180)
    assert ing.returncode == 0, err
    assert ok == 400
    (st,) = admin.quota_status("research", url=any_url)
    assert st.held_money == Decimal("7.5") * 400
    assert st.used_money == ledger_workers.expected_total(1500)

"""Issue 26 point 5: a ledger reader sees its own rows only, in every per-user table.

The hostile user logs in to the real PostgreSQL ledger with its own role (gpuhpc_reader, named
like the Unix user, as the docs say) and asks psql for another user's sweep spec (with the API
key in its env), trials, chunks, metrics, utilisation, memberships, quotas, charges and
reservations, and for a table created after the migrations: it gets none of them, and nothing
in the ledger changed."""
from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gpuhpc.ledger import admin, db
from gpuhpc.ledger.orm import (Charge, JobMetric, Reservation, RunUtilisation, Sweep, SweepChunk, SweepTrial,
                               UsageRecord)

pytestmark = pytest.mark.integration

SECRET = "sk-victim-" + uuid.uuid4().hex
PER_USER = ("charges", "usage_records", "reservations", "reservation_holds", "memberships", "quotas", "quota_usage",
            "sweeps", "sweep_chunks", "sweep_trials", "job_metrics", "run_utilisation")


def _seed(url: str, victim: str, attacker: str) -> None:
    """The victim's rows in every per-user table (account vic-acct), the attacker's own usage in
    its own account (own-acct)."""
    now = dt.datetime.now(dt.timezone.utc)
    admin.add_account("vic-acct", url=url)
    admin.add_account("own-acct", url=url)
    admin.add_user(victim, "vic-acct", url=url)
    admin.add_user(attacker, "own-acct", url=url)
    admin.set_quota("vic-acct", money=Decimal("100"), url=url)
    with db.session_scope(url) as s:
        for i, (user, acct) in enumerate(((victim, "vic-acct"), (attacker, "own-acct"))):
            u = UsageRecord(cluster="local", job_id=str(100 + i), array_task_id=-1, run_start=now, run_end=now,
                            state="COMPLETED", elapsed_s=3600, user_name=user, account_name=acct, partition="gpu",
                            qos="normal", gpu_type="h100", gpus=8, job_name="train", gpu_hours=Decimal(8),
                            amount=Decimal(20), priced=True)
            s.add(u)
            s.flush()
            s.add(Charge(usage_id=u.id, account_name=acct, user_name=user, gpu_hours=Decimal(8), rate=Decimal("2.5"),
                         amount=Decimal(20), bucket_at=now, created_at=now, kind="usage"))
            s.add(JobMetric(cluster="local", job_id=str(100 + i), array_task_id=-1, name="samples_per_s", value=1.0,
                            samples=1))
            s.add(RunUtilisation(usage_id=u.id, slurm_job_id=str(100 + i), threshold=5.0, step_s=30, samples=1,
                                 idle_gpu_hours=Decimal(0), held_gpu_hours=Decimal(8), devices="[]"))
            s.add(Reservation(cluster="local", user_name=user, account_name=acct, partition="gpu", gpu_type="h100",
                              gpus=8, time_limit_s=3600, array_size=1, job_name="train", gpu_hours=Decimal(8),
                              amount=Decimal(20), status="settled", created_at=now))
        sw = Sweep(name="secret-sweep", user_name=victim, cluster="local", directory="/nowhere", n_trials=1,
                   spec=json.dumps({"env": {"OPENAI_API_KEY": SECRET}}))
        s.add(sw)
        s.flush()
        ch = SweepChunk(sweep_id=sw.id, number=0, job_id="100", n_tasks=1, trials="[0]")
        s.add(ch)
        s.flush()
        s.add(SweepTrial(sweep_id=sw.id, number=0, params=json.dumps({"key": SECRET}), chunk_id=ch.id))


def _counts(url: str) -> dict[str, int]:
    with db.get_engine(url).connect() as c:
        return {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in PER_USER}


def test_reader_sees_only_its_own_rows_in_every_per_user_table(hostile, pg_url):
    db.upgrade(pg_url)
    victim = f"victim_{uuid.uuid4().hex[:6]}"
    _seed(pg_url, victim, hostile.name)
    before = _counts(pg_url)
    password = uuid.uuid4().hex
    sup = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f'CREATE ROLE "{hostile.name}" LOGIN PASSWORD \'{password}\' IN ROLE gpuhpc_reader'))
    u = make_url(pg_url)
    dsn = f"host={u.host} port={u.port} dbname={u.database} user={hostile.name} password={password}"

    def psql(sql: str):
        return hostile.run(["psql", dsn, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])

    try:
        # every per-user table: only the attacker's own rows (one usage, charge, metric, ...; no sweep)
        mine = {"charges": 1, "usage_records": 1, "reservations": 1, "reservation_holds": 0, "memberships": 1,
                "quotas": 0, "quota_usage": 0, "sweeps": 0, "sweep_chunks": 0, "sweep_trials": 0, "job_metrics": 1,
                "run_utilisation": 1}
        for table, n in mine.items():
            r = psql(f"SELECT count(*) FROM {table}")
            assert r.returncode == 0 and r.stdout.strip() == str(n), (table, r.stdout, r.stderr)
        r = psql("SELECT spec FROM sweeps UNION ALL SELECT params FROM sweep_trials")
        assert r.returncode == 0 and SECRET not in r.stdout
        r = psql(f"SELECT count(*) FROM usage_records WHERE user_name = '{victim}'")
        assert r.stdout.strip() == "0"
        # a table created after the migrations is not readable by default
        with sup.connect() as c:
            c.execute(text("CREATE TABLE later_table (secret text)"))
            c.execute(text(f"INSERT INTO later_table VALUES ('{SECRET}')"))
        r = psql("SELECT secret FROM later_table")
        assert r.returncode != 0 and "permission denied" in r.stderr and SECRET not in r.stdout
        # and the reader cannot change anything either
        r = psql("DELETE FROM sweeps")
        assert r.returncode != 0 and "permission denied" in r.stderr
        assert _counts(pg_url) == before
    finally:
        with sup.connect() as c:
            c.execute(text(f'DROP OWNED BY "{hostile.name}"'))
            c.execute(text(f'DROP ROLE IF EXISTS "{hostile.name}"'))
        sup.dispose()

"""Who may change a PostgreSQL ledger: migration 0004's roles, checked with psql as a user's role
(issue 14). gpuhpc_reader reads; it cannot UPDATE or DELETE charges, and gpuhpc's admin commands
refuse it with one line, and it sees only its own accounts' rows; gpuhpc_admin may change the ledger."""
from __future__ import annotations

import os
import subprocess
import uuid
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from gpuhpc.errors import LedgerError
from gpuhpc.ledger import admin, db

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


def _psql(url: str, sql: str) -> subprocess.CompletedProcess:
    u = make_url(url)
    return subprocess.run(["psql", "-h", u.host, "-p", str(u.port), "-U", u.username, "-d", u.database,
                           "-v", "ON_ERROR_STOP=1", "-qtAc", sql], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PGPASSWORD": u.password or ""})


def test_reader_role_cannot_change_charges_and_admin_can(pg_url, monkeypatch, capsys):
    db.upgrade(pg_url)
    admin.add_account("quota-pg", url=pg_url)
    admin.set_quota("quota-pg", money=Decimal("10"), url=pg_url)
    with db.get_engine(pg_url).begin() as c:
        c.execute(text("INSERT INTO usage_records (cluster, job_id, array_task_id, run_start, state, elapsed_s, "
                       "user_name, account_name, partition, qos, gpu_type, gpus, job_name, gpu_hours, amount, priced) "
                       "VALUES ('local', '1', -1, now(), 'COMPLETED', 3600, 'alice', 'quota-pg', 'gpu', '', 'h100', 1, "
                       "'x', 1, 1, true)"))
        c.execute(text("INSERT INTO charges (usage_id, account_name, user_name, gpu_hours, rate, amount, bucket_at, "
                       "created_at, kind) SELECT id, 'quota-pg', 'alice', 1, 1, 1, now(), now(), 'usage' "
                       "FROM usage_records"))
    tag = uuid.uuid4().hex[:8]
    reader, writer = f"gpuhpc_u_{tag}", f"gpuhpc_a_{tag}"
    sup = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with sup.connect() as c:
        c.execute(text(f"CREATE ROLE {reader} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_reader"))
        c.execute(text(f"CREATE ROLE {writer} LOGIN PASSWORD '{tag}' IN ROLE gpuhpc_admin"))
    reader_url = make_url(pg_url).set(username=reader, password=tag).render_as_string(hide_password=False)
    writer_url = make_url(pg_url).set(username=writer, password=tag).render_as_string(hide_password=False)
    try:
        # row-level security: the reader sees its own accounts' rows only
        r = _psql(reader_url, "SELECT count(*) FROM charges")
        assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr
        admin.add_user(reader, "quota-pg", url=pg_url)
        r = _psql(reader_url, "SELECT count(*) FROM charges")
        assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
        r = _psql(writer_url, "SELECT count(*) FROM charges")
        assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
        for sql in ("UPDATE charges SET amount = 0", "DELETE FROM charges", "UPDATE quotas SET money = 1000000",
                    "INSERT INTO gpu_prices (gpu_type, rate, currency, effective_from) VALUES ('h100', 0, 'USD', now())"):
            r = _psql(reader_url, sql)
            assert r.returncode != 0 and "permission denied" in r.stderr, (sql, r.stderr)
        with pytest.raises(LedgerError, match=r"^permission denied: quota set changes the ledger"):
            admin.require_admin("quota set", url=reader_url)
        # the CLI: one line, exit 1, nothing changed
        from gpuhpc.cli.main import main

        monkeypatch.setenv("GPUHPC_DB_URL", reader_url)
        assert main(["quota", "set", "quota-pg", "--money", "1000000"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: permission denied"), err
        (st,) = admin.quota_status("quota-pg", url=pg_url)
        assert st.money_budget == Decimal("10")
        # the admin role may
        admin.require_admin("quota set", url=writer_url)
        r = _psql(writer_url, "UPDATE quotas SET money = 20")
        assert r.returncode == 0, r.stderr
        admin.set_quota("quota-pg", money=Decimal("30"), url=writer_url)       # through gpuhpc, as that role
        from gpuhpc.ledger import hooks, quota

        res = quota.reserve(hooks.ChargeRequest(cluster="local", user="alice", account="quota-pg", partition="gpu",
                                                qos=None, gpu_type=None, gpus=0, time_limit_s=60), url=writer_url)
        quota.release(res.id, url=writer_url)
    finally:
        for u in (reader_url, writer_url):
            try:
                db.get_engine(u).dispose()
            except Exception:
                pass
        with sup.connect() as c:
            for role in (reader, writer):
                c.execute(text(f"DROP OWNED BY {role}"))
                c.execute(text(f"DROP ROLE IF EXISTS {role}"))
        sup.dispose()

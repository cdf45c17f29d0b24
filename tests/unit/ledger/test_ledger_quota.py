"""Reservations against quotas on a real (temporary) SQLite ledger."""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from decimal import Decimal

import pytest
from sqlalchemy import text

from gpuhpc.errors import LedgerError, QuotaExceeded
from gpuhpc.ledger import admin, db, hooks, quota

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _setup(url, money="100", gpu_hours=None, user_money=None):
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.add_user("bob", "research", url=url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=url)
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0, url=url)
    admin.set_quota("research", money=Decimal(money) if money else None,
                    gpu_hours=Decimal(gpu_hours) if gpu_hours else None, url=url)
    if user_money:
        admin.set_quota("research", user="bob", money=Decimal(user_money), url=url)


def req(user="alice", account=None, gpus=8, hours=1, array=1, partition=None, gpu_type="h100"):
    return hooks.ChargeRequest(cluster="local", user=user, account=account, partition=partition, qos=None,
                               gpu_type=gpu_type, gpus=gpus, time_limit_s=int(hours * 3600), array_size=array)


def test_reserve_until_budget_then_refuse_with_numbers(ledger_url):
    _setup(ledger_url)
    got = [hooks.reserve(req()) for _ in range(5)]            # 5 × 20.00 = 100.00 exactly
    assert all(r is not None and r.amount == Decimal("20.000000") for r in got)
    with pytest.raises(QuotaExceeded) as exc:
        hooks.reserve(req())
    msg = exc.value.one_line()
    assert "budget 100.00" in msg and "committed 100.00" in msg and "remaining 0.00" in msg
    assert "\n" not in msg and exc.value.exit_code == 3
    got[0].release()
    got[0].release()                                          # idempotent
    assert hooks.reserve(req()) is not None
    (st,) = admin.quota_status("research", url=ledger_url)
    assert st.held_money == Decimal("100.000000") and st.remaining_money == 0


def test_array_size_and_partition_multiplier_in_worst_case(ledger_url):
    _setup(ledger_url)
    r = hooks.reserve(req(gpus=4, hours=0.5, array=10, partition="gpu"))
    assert r.gpu_hours == Decimal("20.000000")
    assert r.amount == Decimal("30.000000")                   # 20 × 2.50 × 0.6
    with pytest.raises(QuotaExceeded):
        hooks.reserve(req(gpus=1, hours=1, array=66, gpu_type="3g.40gb"))   # 66 × 15/14 = 70.71 > 70 left
    # 65 slice-hours × 15/14 = 69.64 fits
    assert hooks.reserve(req(gpus=1, hours=1, array=65, gpu_type="3g.40gb")).amount == Decimal("69.642857")


def test_gpu_hour_and_user_quotas(ledger_url):
    _setup(ledger_url, money=None, gpu_hours="16", user_money="10")
    hooks.reserve(req(gpus=8, hours=1))                       # 8 of 16 GPU-h
    with pytest.raises(QuotaExceeded, match="user bob in account research"):
        hooks.reserve(req(user="bob", account="research", gpus=8, hours=1))   # 20.00 > bob's 10
    with pytest.raises(QuotaExceeded, match="GPU-h"):
        hooks.reserve(req(gpus=9, hours=1))
    hooks.reserve(req(user="bob", account="research", gpus=2, hours=1))      # 5.00, 2 GPU-h
    (acct, bob) = admin.quota_status("research", url=ledger_url)
    assert acct.held_gpu_hours == Decimal("10") and bob.held_money == Decimal("5")


def test_attach_job_and_no_quota_accounts(ledger_url):
    _setup(ledger_url)
    r = hooks.reserve(req())
    r.attach_job("1234")
    with db.session_scope(ledger_url) as s:
        assert s.execute(text("select job_id, status from reservations where id=:i"), {"i": r.id}).one() == ("1234", "submitted")
    # unknown account: recorded, nothing enforced
    r2 = hooks.reserve(req(user="carol", account="elsewhere", gpus=1000))
    assert r2 is not None and r2.account == "elsewhere"


def test_unpriced_gpu_type_with_money_quota_is_an_error(ledger_url):
    _setup(ledger_url)
    with pytest.raises(LedgerError, match="price set"):
        hooks.reserve(req(gpu_type="b200"))


def test_ledger_off_and_missing_database(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUHPC_DB_URL", raising=False)
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "nothing"))
    assert hooks.reserve(req()) is None
    monkeypatch.setenv("GPUHPC_DB_URL", f"sqlite:///{tmp_path}/x.db")
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    assert hooks.reserve(req()) is None


def test_schema_behind_head_refuses(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    db.get_engine(url)
    with pytest.raises(LedgerError, match="gpuhpc db upgrade"):
        hooks.reserve(req())
    db.upgrade(url)
    _setup(url)
    # this gpuhpc ships a newer migration than the database has
    head = quota.SCHEMA_HEAD
    monkeypatch.setattr(quota, "SCHEMA_HEAD", "9998")
    monkeypatch.setattr(quota, "KNOWN_REVISIONS", (head, "9998"))
    db._checked.discard(url)
    with pytest.raises(LedgerError, match=f"is at schema revision {head}.*run `gpuhpc db upgrade`"):
        admin.quota_status(url=url)
    with pytest.raises(LedgerError, match=f"is at schema revision {head}, but this gpuhpc needs 9998: run `gpuhpc db upgrade`"):
        hooks.reserve(req())
    monkeypatch.undo()
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    with db.get_engine(url).begin() as c:
        c.execute(text("update alembic_version set version_num='9999'"))
    with pytest.raises(LedgerError, match="newer gpuhpc"):
        hooks.reserve(req())
    with pytest.raises(LedgerError, match="does not exist: run `gpuhpc db upgrade`"):
        quota.reserve(req(), url=f"sqlite:///{tmp_path / 'missing.db'}")
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(LedgerError, match=r"cannot connect to the ledger database postgresql\+psycopg://u:\*\*\*@"):
        quota.reserve(req(), url="postgresql+psycopg://u:secret@127.0.0.1:1/ledger")


def test_first_decision_of_a_period_builds_its_counter_from_the_charges(ledger_url):
    _setup(ledger_url)
    now = dt.datetime(2026, 3, 18, 12, 30, tzinfo=dt.timezone.utc)
    # usage booked as ingest books it (this March and the February before), then a decision in March
    with db.get_engine(ledger_url).begin() as c:
        c.execute(text("insert into usage_records (id, cluster, job_id, array_task_id, run_start, state, elapsed_s, "
                       "user_name, account_name, partition, qos, gpu_type, gpus, job_name, gpu_hours, amount) values "
                       "(1, 'local', '1', -1, '2026-03-02 00:00:00.000000', 'COMPLETED', 1, 'alice', 'research', "
                       "'gpu', '', 'h100', 8, 'x', 8, 33.333333)"))
        for at in ("2026-03-02 00:00:00.000000", "2026-02-27 00:00:00.000000"):
            c.execute(text("insert into charges (usage_id, account_name, user_name, gpu_hours, rate, amount, "
                           "bucket_at, created_at) values (1, 'research', 'alice', 8, 2.5, 33.333333, :at, :at)"),
                      {"at": at})
    got = quota.reserve(req(), url=ledger_url, now=now)
    assert got.amount == Decimal("20.000000")
    with pytest.raises(QuotaExceeded, match=r"used 33\.33 \+ held 20\.00"):
        quota.reserve(req(gpus=24), url=ledger_url, now=now)
    (st,) = admin.quota_status("research", url=ledger_url, now=now)
    assert st.used_money == Decimal("33.333333") and st.held_money == Decimal("20.000000")


def test_submit_path_never_imports_sqlalchemy(ledger_url):
    _setup(ledger_url)
    code = ("import sys; from gpuhpc.ledger.hooks import ChargeRequest, reserve\n"
            "r = reserve(ChargeRequest(cluster='local', user='alice', account='research', partition='gpu',"
            " qos=None, gpu_type='h100', gpus=2, time_limit_s=600))\n"
            "r.attach_job('77'); r2 = reserve(ChargeRequest('local', 'alice', None, None, None, 'h100', 1, 60))\n"
            "r2.release()\n"
            "print([m for m in ('sqlalchemy', 'alembic', 'psycopg', 'gpuhpc.ledger.orm', 'gpuhpc.ledger.admin',"
            " 'gpuhpc.ledger.db') if m in sys.modules])")
    env = {**os.environ, "GPUHPC_DB_URL": ledger_url, "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    with db.session_scope(ledger_url) as s:
        assert [tuple(r) for r in s.execute(text("select status, job_id from reservations order by id"))] == [
            ("submitted", "77"), ("released", None)]
    (st,) = admin.quota_status("research", url=ledger_url)
    assert st.held_money == Decimal("0.500000")           # 2 GPUs × 10 min × 2.50 × 0.6; the other released


def test_schema_head_constant_matches_migrations():
    from alembic.script import ScriptDirectory

    assert db.head_revision() == db.SCHEMA_HEAD
    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    assert tuple(reversed([r.revision for r in script.walk_revisions()])) == db.KNOWN_REVISIONS


def test_schema_from_a_newer_gpuhpc_is_refused(ledger_url):
    with db.get_engine(ledger_url).begin() as c:
        c.execute(text("update alembic_version set version_num='9999'"))
    db._checked.discard(ledger_url)
    with pytest.raises(LedgerError, match="newer gpuhpc"):
        admin.quota_status(url=ledger_url)


def test_migration_downgrade_and_upgrade(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    db.upgrade(url)
    db.downgrade(url, "base")
    assert db.current_revision(db.get_engine(url)) is None
    assert db.upgrade(url) == (None, db.SCHEMA_HEAD)


def test_sqlite_uses_wal_and_begin_immediate(ledger_url):
    with db.get_engine(ledger_url).connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == db.SQLITE_BUSY_TIMEOUT_MS
        c.rollback()
    # BEGIN IMMEDIATE: a second writer cannot even start its transaction while one is open
    import sqlite3

    path = ledger_url.removeprefix("sqlite:///")
    with db.session_scope(ledger_url) as s:
        s.execute(text("select 1"))
        other = sqlite3.connect(path, timeout=0.05, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()


def test_hooks_import_is_cheap():
    code = ("import sys, gpuhpc.ledger.hooks, gpuhpc.ledger.metrics; "
            "bad = [m for m in ('sqlalchemy', 'alembic', 'rich', 'pydantic') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert res.returncode == 0, res.stdout + res.stderr


def test_models_and_migrations_agree(tmp_path):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from gpuhpc.ledger.orm import Base

    url = f"sqlite:///{tmp_path / 'drift.db'}"
    db.upgrade(url)
    with db.get_engine(url).connect() as c:
        assert compare_metadata(MigrationContext.configure(c), Base.metadata) == []

"""The stdlib SQLite fast path of the quota decision (gpuhpc.ledger.fastpath) against the
SQLAlchemy implementation (gpuhpc.ledger.quota): same outcomes, messages and stored rows."""
from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

from gpuhpc.errors import GpuhpcError
from gpuhpc.ledger import db, fastpath, hooks, quota

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NOW = dt.datetime(2026, 3, 18, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)
REPO = Path(__file__).parents[3]
TABLES = ("reservations", "reservation_holds", "quota_usage", "quotas", "charges")


def req(user="alice", account=None, gpus=8, hours=1.0, array=1, partition=None, gpu_type="h100", qos=None):
    return hooks.ChargeRequest(cluster="local", user=user, account=account, partition=partition, qos=qos,
                               gpu_type=gpu_type, gpus=gpus, time_limit_s=int(hours * 3600), array_size=array,
                               job_name="train")


def _setup(url, *, money="100", gpu_hours=None, user_money=None, user_period="day", buckets=True):
    db.upgrade(url)
    quota.add_account("research", url=url)
    quota.add_account("other", url=url)                       # an account without a quota
    quota.add_user("alice", "research", default=True, url=url)
    quota.add_user("bob", "research", url=url)
    quota.add_user("dave", "other", url=url)                  # only membership: the default
    quota.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    quota.set_price("h100", rate=Decimal("2.75"), effective_from=NOW + dt.timedelta(days=1), url=url)
    quota.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=url)
    quota.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0, url=url)
    quota.set_multiplier("qos", "low", Decimal("0.333333"), effective_from=T0, url=url)
    quota.set_quota("research", money=Decimal(money) if money else None,
                    gpu_hours=Decimal(gpu_hours) if gpu_hours else None, url=url)
    if user_money:
        quota.set_quota("research", user="bob", money=Decimal(user_money), period=user_period, url=url)
    if buckets:
        quota.quota_status(url=url, now=NOW)                  # the period's counter rows exist
        with sqlite3.connect(url.removeprefix("sqlite:///")) as c:     # as ingest would have booked
            c.execute("update quota_usage set used_money = ?, used_gpu_hours = ?", (3.333333, 1.5))


def _copy(url, dst: Path) -> str:
    src = sqlite3.connect(url.removeprefix("sqlite:///"))
    out = sqlite3.connect(dst)
    src.backup(out)
    src.close()
    out.close()
    return f"sqlite:///{dst}"


def _dump(url) -> dict:
    c = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return {t: [tuple((type(v).__name__, v) for v in row) for row in c.execute(f"select * from {t} order by 1")]
                for t in TABLES}
    finally:
        c.close()


def _outcome(fn):
    try:
        r = fn()
    except GpuhpcError as e:
        return (type(e).__name__, e.one_line())
    return None if r is None else (r.id, r.gpu_hours, r.amount, r.account)


SCENARIOS = {
    "account quota only": (dict(), [req(), req(gpus=16), req(gpus=16), req(gpus=1)]),
    "account + user quota": (dict(money=None, gpu_hours="16", user_money="10"),
                             [req(gpus=8), req(user="bob", account="research", gpus=8),
                              req(user="bob", account="research", gpus=2), req(gpus=9)]),
    "mig fraction": (dict(), [req(gpus=1, array=65, gpu_type="3g.40gb"), req(gpus=1, gpu_type="3g.40gb")]),
    "partition and qos multipliers": (dict(), [req(gpus=4, hours=0.5, array=10, partition="gpu"),
                                               req(gpus=3, hours=1.7, partition="gpu", qos="low")]),
    "array": (dict(), [req(gpus=2, hours=0.25, array=7), req(gpus=0, hours=3, array=3, gpu_type=None)]),
    "over quota": (dict(), [req(gpus=48), req(gpus=36), req(gpus=1, hours=0.4)]),
    "no quota for the account": (dict(), [req(user="dave", gpus=1000), req(account="other", gpus=99),
                                          req(user="carol", account="elsewhere", gpus=1000),
                                          req(user="carol", gpus=4), req(user="carol", gpu_type="b200")]),
    "unpriced gpu type with a money quota": (dict(), [req(gpu_type="b200"), req(gpus=2)]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_fast_path_equals_sqlalchemy_path(tmp_path, name):
    options, requests = SCENARIOS[name]
    base = f"sqlite:///{tmp_path / 'base.db'}"
    _setup(base, **options)
    fast, slow = _copy(base, tmp_path / "fast.db"), _copy(base, tmp_path / "slow.db")
    for r in requests:
        got = _outcome(lambda: fastpath.reserve(r, fast, now=NOW))
        assert got is not None, "the fast path fell back"
        assert got == _outcome(lambda: quota.reserve(r, url=slow, now=NOW)), r
    assert _dump(fast) == _dump(slow)
    # attach the first reservation and release the last, both ways
    ids = [row[0][1] for row in _dump(fast)["reservations"]]
    if ids:
        assert fastpath.attach_job(ids[0], "4242;local", fast)
        quota.attach_job(ids[0], "4242;local", url=slow)
        assert fastpath.release(ids[-1], fast) and fastpath.release(ids[-1], fast)   # idempotent
        quota.release(ids[-1], url=slow)
        a, b = _dump(fast), _dump(slow)
        for d in (a, b):   # closed_at is "now" at release time: compare that it is set
            d["reservations"] = [row[:-1] + (row[-1][1] is not None,) for row in d["reservations"]]
        assert a == b


def test_fast_path_falls_back_when_unsure(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _setup(url, buckets=False)
    # no counter row for this period yet: built from charges by the SQLAlchemy path
    assert fastpath.reserve(req(), url, now=NOW) is None and _dump(url)["reservations"] == []
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    assert hooks.reserve(req()).gpu_hours == Decimal("8.000000")
    assert len(_dump(url)["quota_usage"]) == 1
    assert fastpath.reserve(req(), url) is not None          # now the row exists
    assert fastpath.reserve(req(gpus=-1), url) is None       # invalid: quota.reserve raises UserInputError
    assert fastpath.attach_job(999, "1", url) is None        # quota.attach_job raises LedgerError
    assert fastpath.reserve(req(), "postgresql+psycopg://u@nowhere/db") is None
    assert fastpath.reserve(req(), f"sqlite:///{tmp_path / 'missing.db'}") is None
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        c.execute("update gpu_prices set fraction_num = NULL where base_gpu_type is not null")
    assert fastpath.reserve(req(), url) is None              # an unusual price row


def test_schema_not_at_head_gives_the_same_errors(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _setup(url)
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    # this gpuhpc ships a newer migration than the database has
    monkeypatch.setattr(fastpath, "SCHEMA_HEAD", "0002")
    monkeypatch.setattr(db, "SCHEMA_HEAD", "0002")
    monkeypatch.setattr(db, "KNOWN_REVISIONS", ("0001", "0002"))
    db._checked.discard(url)                                  # this process checked it before
    assert fastpath.reserve(req(), url) is None
    with pytest.raises(GpuhpcError, match="0001, but this gpuhpc needs 0002: run `gpuhpc db upgrade`"):
        hooks.reserve(req())
    monkeypatch.undo()
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        c.execute("update alembic_version set version_num = '9999'")
    assert fastpath.reserve(req(), url) is None
    with pytest.raises(GpuhpcError, match="newer gpuhpc"):
        hooks.reserve(req())
    assert _dump(url)["reservations"] == []


def test_ledger_off_leaves_the_database_alone(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _setup(url)
    before = _dump(url)
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    assert hooks.reserve(req()) is None
    assert _dump(url) == before


def test_constants_are_the_ones_db_uses():
    assert db.SCHEMA_HEAD is fastpath.SCHEMA_HEAD and db.head_revision() == fastpath.SCHEMA_HEAD
    assert db.KNOWN_REVISIONS is fastpath.KNOWN_REVISIONS
    assert db.SQLITE_BUSY_TIMEOUT_MS == fastpath.SQLITE_BUSY_TIMEOUT_MS


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ, GPUHPC_DB_URL=url, PYTHONPATH=str(REPO))
    env.pop("GPUHPC_LEDGER", None)
    return env


def test_submit_path_never_imports_sqlalchemy(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    _setup(url)
    quota.quota_status(url=url)                               # this period's counter rows
    code = ("import sys; from gpuhpc.ledger.hooks import ChargeRequest, reserve\n"
            "r = reserve(ChargeRequest(cluster='local', user='alice', account='research', partition='gpu',"
            " qos=None, gpu_type='h100', gpus=2, time_limit_s=600))\n"
            "r.attach_job('77'); r2 = reserve(ChargeRequest('local', 'alice', None, None, None, 'h100', 1, 60))\n"
            "r2.release()\n"
            "print([m for m in ('sqlalchemy', 'alembic', 'gpuhpc.ledger.orm', 'gpuhpc.ledger.quota',"
            " 'gpuhpc.ledger.db') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(url), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    rows = _dump(url)["reservations"]
    assert [(r[13][1], r[14][1]) for r in rows] == [("submitted", "77"), ("released", None)]


WORKER = """
import json, sys, time
from gpuhpc.errors import QuotaExceeded
from gpuhpc.ledger.hooks import ChargeRequest, reserve
req = ChargeRequest(cluster="local", user="alice", account="research", partition=None, qos=None,
                    gpu_type="h100", gpus=3, time_limit_s=3600)
start_at = float(sys.argv[1])
while time.time() < start_at:
    time.sleep(0.001)
ok = refused = 0
for _ in range(8):
    try:
        reserve(req)
        ok += 1
    except QuotaExceeded:
        refused += 1
print(json.dumps({"ok": ok, "refused": refused, "fast": "sqlalchemy" not in sys.modules}))
"""


def test_eight_processes_never_overspend_on_the_fast_path(tmp_path):
    # each reservation: 3 GPUs × 1 h × 2.50 = 7.50; budget 250.00 -> exactly 33 fit (247.50)
    url = f"sqlite:///{tmp_path / 'l.db'}"
    db.upgrade(url)
    quota.add_account("research", url=url)
    quota.add_user("alice", "research", default=True, url=url)
    quota.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    quota.set_quota("research", money=Decimal("250"), period="total", url=url)
    quota.quota_status(url=url)
    start_at = str(time.time() + 3.0)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, start_at], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(url)) for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["fast"] for r in results)
    assert sum(r["ok"] for r in results) == 33 and sum(r["refused"] for r in results) == 64 - 33
    (st,) = quota.quota_status("research", url=url)
    assert st.held_money == Decimal("247.500000") and st.used_money == 0
    assert len(_dump(url)["reservations"]) == 33 and len(_dump(url)["reservation_holds"]) == 33

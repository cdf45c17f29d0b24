"""Prices at sacct's resolution, and ``--reprice`` of runs settled without a price, on SQLite
AND PostgreSQL; ``gpuhpc db upgrade`` from a database at the previous revision."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from sqlalchemy import func, select, text

from gpuhpc.ledger import admin, db, ingest
from gpuhpc.ledger.orm import Charge, UsageRecord
from gpuhpc.slurm.commands import SACCT_RUN_FIELDS, SEP
from gpuhpc.slurm.parsers import parse_sacct

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
START = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)


def _local(t: dt.datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def rows(*runs: tuple[str, str, int]):
    """sacct rows: (job id, GPU type, elapsed s), 8 GPUs each, all starting at START."""
    lines = []
    for job, gpu_type, elapsed in runs:
        tres = f"cpu=1,gres/gpu:{gpu_type}=8,gres/gpu=8,node=1"
        d = {"JobID": job, "JobIDRaw": job, "JobName": "train", "State": "COMPLETED", "Elapsed": "",
             "ElapsedRaw": str(elapsed), "Submit": _local(START), "Start": _local(START),
             "End": _local(START + dt.timedelta(seconds=elapsed)), "AllocTRES": tres, "ReqTRES": tres,
             "Partition": "gpu", "Account": "research", "User": "alice", "QOS": "normal", "Cluster": "local",
             "Timelimit": "01:00:00"}
        lines.append(SEP.join(d[f] for f in SACCT_RUN_FIELDS))
    return parse_sacct("\n".join(lines), fields=SACCT_RUN_FIELDS)


def _charges(url, job: str) -> list[tuple[str, Decimal]]:
    with db.session_scope(url) as s:
        return [(k, Decimal(a).quantize(Decimal("0.000001"))) for k, a in s.execute(
            select(Charge.kind, Charge.amount).join(UsageRecord, Charge.usage_id == UsageRecord.id)
            .where(UsageRecord.job_id == job).order_by(Charge.id))]


def _setup(url) -> None:
    db.upgrade(url)
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_quota("research", money=Decimal("1000"), url=url)


def test_price_set_in_the_second_a_run_started_applies(any_url):
    _setup(any_url)
    # the quickstart's case: the run started at hh:mm:ss, the price was set 125 ms later
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=START + dt.timedelta(milliseconds=125), url=any_url)
    res = ingest.ingest_rows(rows(("100", "h100", 100)), url=any_url)
    assert res.unpriced_runs == 0
    assert _charges(any_url, "100") == [("usage", Decimal("0.800000"))]      # 8 × 100 s × 3.60 / h
    # one second later is after the run's start: not priced
    admin.set_price("a100", rate=Decimal("3.60"), effective_from=START + dt.timedelta(seconds=1), url=any_url)
    assert ingest.ingest_rows(rows(("101", "a100", 100)), url=any_url).unpriced_runs == 1


def test_reprice_charges_unpriced_runs_once_with_an_audit_trail(any_url):
    _setup(any_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=any_url)
    data = rows(("200", "b200", 360), ("201", "h100", 360))
    res = ingest.ingest_rows(data, url=any_url)
    assert res.unpriced_runs == 1
    assert _charges(any_url, "200") == [("usage", Decimal("0.000000"))]
    # nothing to reprice while there is no price; a re-ingest changes nothing either
    assert ingest.reprice(url=any_url).repriced_runs == 0
    admin.set_price("b200", rate=Decimal("5.00"), effective_from=T0, url=any_url)
    again = ingest.ingest_rows(data, url=any_url)
    assert (again.runs_updated, again.charges) == (0, 0)             # history is not rewritten silently
    res = ingest.reprice(url=any_url)
    assert (res.repriced_runs, res.repriced_amount) == (1, Decimal("4.000000"))   # 8 × 0.1 h × 5.00
    assert _charges(any_url, "200") == [("usage", Decimal("0.000000")), ("reprice", Decimal("4.000000"))]
    assert _charges(any_url, "201") == [("usage", Decimal("2.000000"))]
    (st,) = admin.quota_status("research", url=any_url)
    assert st.used_money == Decimal("6.000000")
    # idempotent
    assert ingest.reprice(url=any_url).repriced_runs == 0
    assert ingest.ingest_rows(data, url=any_url).charges == 0
    with db.session_scope(any_url) as s:
        rec = s.scalar(select(UsageRecord).where(UsageRecord.job_id == "200"))
        assert rec.priced and rec.amount == Decimal("4")
    (st,) = admin.quota_status("research", url=any_url)
    assert st.used_money == Decimal("6.000000")


def test_upgrade_from_0001_marks_runs_charged_zero_for_reprice(any_url):
    db.upgrade(any_url, "0001")
    with db.get_engine(any_url).begin() as c:
        c.execute(text("INSERT INTO usage_records (cluster, job_id, array_task_id, run_start, state, elapsed_s, "
                       "user_name, account_name, partition, qos, gpu_type, gpus, job_name, gpu_hours, amount) "
                       "VALUES ('local', :j, -1, :t, 'COMPLETED', 360, 'alice', 'research', 'gpu', '', :g, :n, "
                       "'x', 0.8, :a)"),
                  [{"j": "300", "t": START, "g": "b200", "n": 8, "a": 0},
                   {"j": "301", "t": START, "g": "h100", "n": 8, "a": 2},
                   {"j": "302", "t": START, "g": "", "n": 0, "a": 0}])
        c.execute(text("INSERT INTO charges (usage_id, account_name, user_name, gpu_hours, rate, amount, bucket_at, "
                       "created_at) SELECT id, 'research', 'alice', 0.8, 0, amount, run_start, run_start "
                       "FROM usage_records"))
    assert db.upgrade(any_url) == ("0001", db.SCHEMA_HEAD)
    with db.session_scope(any_url) as s:
        assert dict(s.execute(select(UsageRecord.job_id, UsageRecord.priced)).all()) == {
            "300": False, "301": True, "302": True}
        assert set(s.scalars(select(Charge.kind))) == {"usage"}
    admin.set_price("b200", rate=Decimal("5.00"), effective_from=T0, url=any_url)
    assert ingest.reprice(url=any_url).repriced_amount == Decimal("4.000000")
    with db.session_scope(any_url) as s:
        assert s.scalar(select(func.count()).select_from(Charge).where(Charge.kind == "reprice")) == 1

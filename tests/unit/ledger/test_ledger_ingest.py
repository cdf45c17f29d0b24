"""Ingest of sacct rows: per-run charges, requeues, idempotency, holds."""
from __future__ import annotations

import datetime as dt
import json
import os
import pwd
from decimal import Decimal

import pytest
from sqlalchemy import func, select

from gpuhpc.ledger import admin, db, hooks, ingest, reports
from gpuhpc.ledger.orm import Charge, Reservation, UsageRecord

from ledger_sacct_text import row, rows

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NOW = dt.datetime.now(dt.timezone.utc)


def ts(minutes: float) -> str:
    """A local sacct timestamp `minutes` after the start of this hour."""
    base = NOW.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    return (base + dt.timedelta(minutes=minutes)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture()
def ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=ledger_url)
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("1000"), url=ledger_url)
    return ledger_url


def totals(url):
    with db.session_scope(url) as s:
        return (s.scalar(select(func.count()).select_from(UsageRecord)),
                Decimal(s.scalar(select(func.coalesce(func.sum(Charge.amount), 0)))).quantize(Decimal("0.000001")))


def test_requeued_job_charged_per_run_once(ledger):
    data = rows(
        row("100", "PREEMPTED", ts(0), ts(0.5), 34),                       # first run, preempted
        row("100", "COMPLETED", ts(0.7), ts(0.75), 3, submit=ts(0.5)),     # rerun
        row("101", "COMPLETED", ts(0.1), ts(0.2), 4, partition="gpu-hi"),
    )
    r1 = ingest.ingest_rows(data, url=ledger)
    assert (r1.runs_new, r1.charges) == (3, 3)
    # 8 GPUs × (34 + 3) s × 2.50 × 0.6 / 3600, per run rounded; gpu-hi has no multiplier
    want = Decimal("0.113333") + Decimal("0.010000") + Decimal("0.022222")
    assert totals(ledger) == (3, want)
    r2 = ingest.ingest_rows(data, url=ledger)                              # re-ingest: nothing new
    assert (r2.runs_new, r2.runs_updated, r2.charges) == (0, 0, 0)
    assert totals(ledger) == (3, want)
    (st,) = admin.quota_status("research", url=ledger)
    assert st.used_money == want


def test_running_job_is_topped_up_not_double_charged(ledger):
    ingest.ingest_rows(rows(row("200", "RUNNING", ts(0), "Unknown", 60)), url=ledger)
    ingest.ingest_rows(rows(row("200", "RUNNING", ts(0), "Unknown", 120)), url=ledger)
    ingest.ingest_rows(rows(row("200", "COMPLETED", ts(0), ts(3), 180)), url=ledger)
    n, total = totals(ledger)
    assert n == 1 and total == Decimal("0.600000")          # 8 × 180 s × 1.50 / 3600
    with db.session_scope(ledger) as s:
        assert s.scalar(select(func.count()).select_from(Charge)) == 3   # first charge + 2 top-ups


def test_pending_and_unstarted_rows_are_skipped(ledger):
    res = ingest.ingest_rows(rows(row("300", "PENDING", "Unknown", "Unknown", 0),
                                  row("301_[2-9]", "PENDING", "Unknown", "Unknown", 0)), url=ledger)
    assert res.runs_seen == 0 and totals(ledger)[0] == 0


def test_reservation_hold_consumed_then_released(ledger):
    req = hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="gpu", qos=None,
                              gpu_type="h100", gpus=8, time_limit_s=3600, array_size=2)
    r = hooks.reserve(req)
    assert r.amount == Decimal("24.000000")
    r.attach_job("400")
    ingest.ingest_rows(rows(row("400_0", "COMPLETED", ts(0), ts(1), 60),
                            row("400_1", "RUNNING", ts(0), "Unknown", 30)), url=ledger)
    (st,) = admin.quota_status("research", url=ledger)
    assert st.used_money == Decimal("0.300000")              # 8 × 90 s × 1.5 / 3600
    assert st.held_money == Decimal("23.700000")             # hold consumed by the charges
    ingest.ingest_rows(rows(row("400_0", "COMPLETED", ts(0), ts(1), 60),
                            row("400_1", "COMPLETED", ts(0), ts(2), 120)), url=ledger)
    (st,) = admin.quota_status("research", url=ledger)
    assert st.used_money == Decimal("0.600000") and st.held_money == 0
    with db.session_scope(ledger) as s:
        assert s.get(Reservation, r.id).status.value == "settled"


def test_preempted_job_left_queue_settles_with_active_set(ledger):
    req = hooks.ChargeRequest("local", "alice", "research", "gpu", None, "h100", 8, 3600)
    r = hooks.reserve(req)
    r.attach_job("500")
    data = rows(row("500", "PREEMPTED", ts(0), ts(1), 60))
    ingest.ingest_rows(data, url=ledger, active={"500"})
    with db.session_scope(ledger) as s:
        assert s.get(Reservation, r.id).status.value == "submitted"
    ingest.ingest_rows(data, url=ledger, active=set())
    with db.session_scope(ledger) as s:
        assert s.get(Reservation, r.id).status.value == "settled"
    (st,) = admin.quota_status("research", url=ledger)
    assert st.held_money == 0


def test_mig_and_cpu_runs(ledger):
    ingest.ingest_rows(rows(row("600", "COMPLETED", ts(0), ts(60), 3600, gpus=1, gpu_type="3g.40gb", partition="mig"),
                            row("601", "COMPLETED", ts(0), ts(60), 3600, gpus=0, partition="cpu")), url=ledger)
    assert totals(ledger) == (2, Decimal("1.071429"))


def test_quota_created_after_usage_counts_the_period(ledger):
    ingest.ingest_rows(rows(row("700", "COMPLETED", ts(0), ts(60), 3600, account="research")), url=ledger)
    admin.remove_quota("research", url=ledger)
    admin.set_quota("research", gpu_hours=Decimal("10"), url=ledger)
    (st,) = admin.quota_status("research", url=ledger)
    assert st.used_gpu_hours == Decimal("8") and st.remaining_gpu_hours == Decimal("2")


def test_metrics_and_cost_report(ledger, tmp_path, monkeypatch):
    from gpuhpc.ledger import metrics

    monkeypatch.setenv("GPUHPC_METRICS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("SLURM_CLUSTER_NAME", "local")
    monkeypatch.setenv("SLURM_JOB_ID", "800")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    metrics.report(samples_per_s=1000.0)
    metrics.report(samples_per_s=3000.0)
    monkeypatch.setenv("RANK", "1")
    metrics.report(samples_per_s=1e9)                      # other ranks do not write
    lines = (tmp_path / "m" / "local" / "800.jsonl").read_text().splitlines()
    assert [json.loads(x)["metrics"] for x in lines] == [{"samples_per_s": 1000.0}, {"samples_per_s": 3000.0}]
    me = pwd.getpwuid(os.getuid()).pw_name                  # metrics count only from the job user's own files
    ingest.ingest_rows(rows(row("800", "COMPLETED", ts(0), ts(60), 3600, partition="gpu-hi", user=me)), url=ledger)
    assert ingest.ingest_metrics(tmp_path / "m", url=ledger) == 1
    assert ingest.ingest_metrics(tmp_path / "m", url=ledger) == 1    # idempotent upsert
    rep = reports.cost_report(by="gpu-type", period="day", url=ledger)
    assert rep.metrics == ["samples_per_s"]
    (r,) = rep.rows
    assert r.cost == Decimal("20.000000")
    # 2000 samples/s × 3600 s = 7.2M samples for 20.00 -> 2.7778 per 1M
    assert r.per_million("samples_per_s") == Decimal("2.7778")
    page = reports.render_html(rep)
    assert "<svg" in page and "h100" in page and "2.7778" in page
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org/", "")
    assert "https://" not in page
    with pytest.warns(RuntimeWarning, match="recorded as failed"):   # a failed value, never a raise
        metrics.report(samples_per_s=float("nan"))                  # (test_report_nonfinite.py)
    import gpuhpc

    assert gpuhpc.report is metrics.report
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("RANK")
    with pytest.warns(UserWarning, match="not inside a Slurm job"):
        metrics.report(samples_per_s=1.0)          # outside Slurm: a warning, not a crash


def test_report_groups_and_periods(ledger):
    ingest.ingest_rows(rows(row("900", "COMPLETED", ts(0), ts(60), 3600, user="alice"),
                            row("901", "COMPLETED", ts(0), ts(60), 1800, user="bob", partition="gpu-hi")), url=ledger)
    rep = reports.cost_report(by="user", period="month", url=ledger)
    assert {r.key: r.cost for r in rep.rows} == {"alice": Decimal("12.000000"), "bob": Decimal("10.000000")}
    assert rep.total == Decimal("22.000000")
    assert reports.render_html(rep).count("<tr>") == 3
    with pytest.raises(Exception):
        reports.cost_report(by="nope", url=ledger)


def test_het_job_components_and_duplicate_rows(ledger):
    data = rows(row("950+0", "COMPLETED", ts(0), ts(60), 3600, gpus=8),
                row("950+1", "COMPLETED", ts(0), ts(60), 3600, gpus=1, gpu_type="3g.40gb", partition="mig"),
                row("951", "COMPLETED", ts(0), ts(60), 3600),
                row("951", "COMPLETED", ts(0), ts(60), 3600))
    res = ingest.ingest_rows(data, url=ledger)
    assert res.runs_new == 3
    assert totals(ledger) == (3, Decimal("12.000000") + Decimal("1.071429") + Decimal("12.000000"))


def test_metrics_only_from_the_job_users_own_regular_files(ledger, tmp_path, caplog):
    """A shared metrics directory: a FIFO, a symlink to /dev/zero, an oversized file, a file of
    a job accounting does not know and a line naming another job are skipped (logged), never
    block or exhaust memory; the job's own file counts."""
    me = pwd.getpwuid(os.getuid()).pw_name
    ingest.ingest_rows(rows(row("900", "COMPLETED", ts(0), ts(60), 3600, user=me),
                            row("901", "COMPLETED", ts(0), ts(60), 3600, user=me),
                            row("902", "COMPLETED", ts(0), ts(60), 3600, user=me),
                            row("903", "COMPLETED", ts(0), ts(60), 3600, user=me)), url=ledger)
    d = tmp_path / "m" / "local"
    d.mkdir(parents=True)
    line = lambda job, v: json.dumps({"cluster": "local", "job_id": job, "array_task_id": None,  # noqa: E731
                                      "metrics": {"samples_per_s": v}}) + "\n"
    (d / "900.jsonl").write_text(line("900", 10.0) + line("555", 1e12))   # 555: another job's line, ignored
    os.mkfifo(d / "901.jsonl")
    os.symlink("/dev/zero", d / "902.jsonl")
    with open(d / "903.jsonl", "wb") as f:
        f.truncate(ingest.METRICS_FILE_MAX_BYTES + 1)
    (d / "904.jsonl").write_text(line("904", 5.0))                        # no such job in accounting
    assert ingest.ingest_metrics(tmp_path / "m", url=ledger) == 1
    from gpuhpc.ledger.orm import JobMetric
    from sqlalchemy import select
    from gpuhpc.ledger import db
    with db.session_scope(ledger) as s:
        assert [(m.job_id, m.value) for m in s.scalars(select(JobMetric))] == [("900", 10.0)]
    text = caplog.text
    assert "901.jsonl: not a regular file" in text and "903.jsonl" in text and "904.jsonl" in text
    assert "902.jsonl" in text

"""Per-run GPU utilisation summaries (migration 0005, gpuhpc.monitoring.summaries) on SQLite and
PostgreSQL: a settled run without a summary is pending; its summary (built by the pure
summariser from Prometheus-shaped samples) is stored once, read back for the one-job report and
the account ranking at the charge's rate. The Prometheus and Slurm side is
tests/integration/monitoring/test_efficiency.py."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Charge, UsageRecord
from gpuhpc.monitoring import summaries
from gpuhpc.monitoring.efficiency import advise
from gpuhpc.monitoring.usage import JobEfficiency, summarize

pytestmark = [pytest.mark.integration, pytest.mark.isolated]
T0 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.timezone.utc)


def _matrix(values: dict[str, list[float]], step: int = 15) -> list[dict]:
    return [{"metric": {"node": "gpu-node1", "gpu": g}, "values": [[T0.timestamp() + k * step, str(v)]
                                                                     for k, v in enumerate(vs)]}
            for g, vs in values.items()]


def test_summary_stored_once_and_read_back(any_url):
    db.upgrade(any_url)
    with db.session_scope(any_url) as s:
        run = UsageRecord(cluster="local", job_id="4242", array_task_id=-1, run_start=T0,
                          run_end=T0 + dt.timedelta(hours=1), state="COMPLETED", elapsed_s=3600, user_name="alice",
                          account_name="research", partition="gpu", qos="normal", gpu_type="h100", gpus=4,
                          job_name="half", gpu_hours=Decimal(4), amount=Decimal(10))
        s.add(run)
        s.flush()
        uid = run.id
        s.add(Charge(usage_id=uid, account_name="research", user_name="alice", gpu_hours=Decimal(4),
                     rate=Decimal("2.5"), amount=Decimal(10), bucket_at=T0, created_at=T0))
    now = T0 + dt.timedelta(days=1)
    (p,) = summaries.pending(url=any_url, now=now)
    assert (p.usage_id, p.job_id, p.array_task_id) == (uid, "4242", -1)

    rep = JobEfficiency(job_id="4242", threshold=5.0, step_s=15)
    busy, idle = [90.0, 70.0] * 120, [0.0] * 240                     # 240 samples of 15 s = 1 hour
    rep.devices = summarize(_matrix({"0": busy, "1": busy, "2": idle, "3": idle}),
                            _matrix({"0": [30e9] * 240, "1": [20e9] * 240, "2": [0.0] * 240, "3": [0.0] * 240}),
                            threshold=5.0, step_s=15)
    rep.cpu_used, rep.rss = [10.0, 700.0], [1e9, 3e9]
    row = summaries.summary_row(rep, p, "4242")
    assert summaries.write([row], url=any_url, now=now) == 1
    assert summaries.write([row], url=any_url, now=now) == 0        # a second ingest stores nothing
    assert summaries.pending(url=any_url, now=now) == []

    stored = summaries.load_run("4242", url=any_url)
    assert stored.samples == 960 and stored.idle_gpu_hours == Decimal(2) and stored.rate == Decimal("2.5")
    assert stored.cpu_used_seconds == 700.0 and stored.peak_rss_bytes == 3e9
    out = JobEfficiency(job_id="4242", gpus=4, gpu_type="h100", state="COMPLETED", elapsed_s=3600)
    summaries.apply(out, stored)
    out.advice = advise(out)
    assert out.source == "ledger" and [d.idle for d in out.devices] == [False, False, True, True]
    assert out.devices[0].peak_util == 90.0 and out.devices[0].peak_mem_bytes == 30e9
    assert "GPUs 2, 3 were idle: ask for 2" in out.advice and out.idle_cost == Decimal("5.00")

    (ranked,) = summaries.idle_by_job("research", T0 - dt.timedelta(days=7), now, url=any_url)
    assert (ranked.job_id, ranked.user, ranked.idle_gpu_hours, ranked.idle_cost) == ("4242", "alice", 2.0,
                                                                                    Decimal("5.00"))
    assert summaries.idle_by_job("other", T0 - dt.timedelta(days=7), now, url=any_url) == []


def test_node_baselines(any_url):
    """The deep checks' per-node all-reduce baseline (run_deep records one only when there is
    none): an admin's value wins, and a later measurement does not overwrite it."""
    from gpuhpc.health.deep import Baselines

    db.upgrade(any_url)
    b = Baselines(any_url)
    assert b.get("gpu-node1") is None
    b.record("gpu-node1", 434.7)
    b.record("gpu-node1", 430.0)
    assert b.get("gpu-node1") == 430.0 and b.get("gpu-node2") is None
    b.record("gpu-node1", 417.0, "admin")
    b.record("gpu-node1", 300.0)
    assert b.get("gpu-node1") == 417.0

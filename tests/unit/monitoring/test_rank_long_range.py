"""The account ranking over a long range at a large site stays under Prometheus' default
query.max-samples (50M): at 500 nodes x 8 GPUs a month of per-GPU series at 15 s is ~690M samples,
so the ranking reads the recording rule gpuhpc:job_idle_gpu_samples:sum5m (rules-long-range.yml)
instead;
a small cluster (or a short range) keeps the exact per-GPU query."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace

import yaml

from gpuhpc.monitoring import RECORDED, efficiency
from gpuhpc.monitoring.promql import metric_names

NOW = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


class Prom:
    def __init__(self, devices: int):
        self.devices, self.exprs = devices, []

    def query(self, expr, at=None):
        self.exprs.append(expr)
        if expr == "count(gpuhpc_gpu_info)":
            return [{"metric": {}, "value": [0, str(self.devices)]}]
        return [{"metric": {"job_id": "77"}, "value": [0, "120"]}]

    def config(self):
        return "global: {scrape_interval: 30s, evaluation_interval: 30s}\n"


class Client:
    def job_runs(self, since, until, job_ids=()):
        return [SimpleNamespace(job_id="77", job_id_raw="77", user="alice", account="acc", gpus={"h100": 1},
                                partition="gpu", qos="normal", start="2026-11-20T00:00:00")]


def _rank(monkeypatch, devices, period):
    monkeypatch.setattr("gpuhpc.monitoring.summaries.idle_by_job", lambda *a, **k: [])
    monkeypatch.setattr(efficiency, "gpu_rate", lambda *a: Decimal("2"))
    prom, notes = Prom(devices), []
    rows = efficiency.rank("acc", period, client=Client(), prom=prom, book=object(), now=NOW, notes=notes)
    return rows, prom.exprs, notes


def test_a_month_at_500_nodes_reads_the_recording_rule(monkeypatch):
    assert efficiency.long_range_samples(4000, 30 * 86400, 15) > efficiency.MAX_SAMPLES
    rows, exprs, notes = _rank(monkeypatch, 4000, "month")
    assert exprs[-1] == "sum by (job_id) (sum_over_time(gpuhpc:job_idle_gpu_samples:sum5m[2592000s]))"
    assert rows[0].job_id == "77" and rows[0].idle_gpu_hours == 1.0      # 120 samples x 30 s (evaluation)
    assert "recording rule" in notes[0]
    # the rule exists, over names the catalogue knows, every 5 minutes
    rules = yaml.safe_load((Path(efficiency.__file__).parent / "prometheus" / "rules-long-range.yml").read_text())
    group = next(g for g in rules["groups"] if any(r.get("record") == efficiency.RECORDED_IDLE for r in g["rules"]))
    assert group["interval"] == "5m" and efficiency.RECORDED_IDLE in RECORDED
    expr = next(r["expr"] for r in group["rules"] if r.get("record") == efficiency.RECORDED_IDLE)
    assert metric_names(expr) == {"gpuhpc:gpu_idle_held:bool"}
    # what the rule's month costs at that size: one sample per job per 5 minutes, at most one job per GPU
    assert 4000 * 30 * 86400 / 300 < efficiency.MAX_SAMPLES


def test_a_small_cluster_or_a_day_keeps_the_exact_query(monkeypatch):
    for devices, period in ((25, "month"), (800, "day")):
        rows, exprs, notes = _rank(monkeypatch, devices, period)
        assert "count_over_time(((gpuhpc_gpu_utilization_percent < 5)" in exprs[-1] and not notes, (devices, period)
        assert rows[0].idle_gpu_hours == 120 * 15 / 3600                    # the subquery's 15 s steps

"""Efficiency summaries and advice from Prometheus-shaped data (no Prometheus, no Slurm)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

from gpuhpc.monitoring.efficiency import _ranges, advise, render_html
from gpuhpc.monitoring.usage import JobEfficiency, summarize


def _matrix(values: dict[tuple[str, str, str], list[float]], t0: float = 1000.0, step: int = 15) -> list[dict]:
    out = []
    for (node, gpu, mig), vs in values.items():
        m = {"node": node, "gpu": gpu, **({"mig": mig} if mig else {})}
        out.append({"metric": m, "values": [[t0 + k * step, str(v)] for k, v in enumerate(vs)]})
    return out


def _job(util, mem, **kw) -> JobEfficiency:
    rep = JobEfficiency(job_id="7", gpus=len(util), gpu_type="h100", elapsed_s=3600, time_limit_s=4 * 3600,
                        state="COMPLETED", rate=Decimal("2.5"), **kw)
    rep.devices = summarize(_matrix(util), _matrix(mem), threshold=rep.threshold, step_s=15)
    rep.advice = advise(rep)
    return rep


def test_idle_gpus_named_and_priced():
    util = {("n1", str(i), ""): [90.0] * 240 if i < 4 else [1.0] * 240 for i in range(8)}
    mem = {k: [40e9] * 240 for k in util}
    rep = _job(util, mem)
    assert [d.gpu for d in rep.devices] == [str(i) for i in range(8)]       # numeric order
    assert [d.idle for d in rep.devices] == [False] * 4 + [True] * 4
    assert rep.idle_gpu_hours == 4 * 240 * 15 / 3600 == 4.0
    assert rep.idle_cost == Decimal("10.00")
    assert rep.advice[0] == "GPUs 4–7 were idle: ask for 4"
    assert rep.advice[1] == "used 25% of its 04:00:00 time limit: --time=01:30:00 would schedule sooner"


def test_partly_idle_samples_count_and_small_memory_suggests_mig():
    util = {("n1", "0", ""): [80.0] * 100 + [0.0] * 20}
    rep = _job(util, {("n1", "0", ""): [9e9] * 120})
    assert rep.devices[0].idle is False and abs(rep.idle_gpu_hours - 20 * 15 / 3600) < 1e-9
    assert "peak GPU memory 9 GB: a 1g.10gb MIG slice would do" in rep.advice


def test_mig_instances_and_no_data():
    util = {("m1", "7", "3g.40gb"): [0.0] * 10, ("m1", "8", "3g.40gb"): [50.0] * 10}
    rep = _job(util, {})
    assert rep.advice[0] == "MIG instances 7 were idle: ask for 1"
    empty = JobEfficiency(job_id="8")
    assert "no GPU metrics" in advise(empty)[0]
    busy = _job({("n1", "0", ""): [99.0] * 10}, {("n1", "0", ""): [70e9] * 10}, )
    assert busy.advice == ["used 25% of its 04:00:00 time limit: --time=01:30:00 would schedule sooner"]


def test_ranges():
    assert _ranges([4, 5, 6, 7, 9]) == "4–7, 9" and _ranges([2, 3]) == "2, 3" and _ranges([1]) == "1"


def test_html_is_self_contained_with_two_charts():
    util = {("n1", str(i), ""): [90.0 if i < 2 else 0.0] * 20 for i in range(4)}
    rep = _job(util, {k: [1e9] * 20 for k in util}, user="<alice>")
    page = render_html(rep, generated=dt.datetime(2026, 11, 30, tzinfo=dt.timezone.utc))
    assert page.count("<svg") == 2 and "<script" not in page and "&lt;alice&gt;" in page
    assert "GPUs 2, 3 were idle: ask for 2" in page and "http://" not in page.replace("http://www.w3.org", "")


def test_cpu_efficiency_advice_and_chart():
    util = {("n1", "0", ""): [90.0] * 20}
    rep = _job(util, {("n1", "0", ""): [70e9] * 20}, cpus=16)
    rep.cpu_times = [1000.0 + 60 * k for k in range(61)]
    rep.cpu_used = [60.0 * k for k in range(61)]        # one core busy out of 16
    rep.rss = [2e9] * 61
    rep.advice = advise(rep)
    assert rep.cpu_used_seconds == 3600 and abs(rep.cpu_efficiency - 1 / 16) < 1e-9
    assert "CPUs: 6% of 16 cores busy on average: ask for fewer (--cpus-per-gpu)" in rep.advice
    page = render_html(rep)
    assert page.count("<svg") == 3 and "3,600 core-seconds used of 16 cores" in page and "2.00 GB" in page

"""Cost reports: grouped totals over periods, plus a self-contained HTML page (inline SVG).

Usage is attributed to the period in which each run started. Jobs that reported throughput
with ``gpuhpc.report(samples_per_s=...)`` get a cost-per-work column: ``$ per 1M samples``
(cost of those runs / (rate × elapsed) summed over them).
"""
from __future__ import annotations

import datetime as dt
import html
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import select

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import db, pricing
from gpuhpc.ledger.orm import Charge, JobMetric, UsageRecord

GROUPS = {"user": "user_name", "account": "account_name", "partition": "partition", "gpu-type": "gpu_type"}
PERIODS = ("day", "week", "month")
ZERO = Decimal(0)


@dataclass
class CostRow:
    period_start: dt.datetime
    key: str
    gpu_hours: Decimal = ZERO
    cost: Decimal = ZERO
    jobs: set[str] = field(default_factory=set)
    work: dict[str, float] = field(default_factory=lambda: defaultdict(float))         # metric -> units done
    work_cost: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))  # cost of runs with it

    def per_million(self, metric: str) -> Decimal | None:
        units = self.work.get(metric, 0.0)
        if not units:
            return None
        return (self.work_cost[metric] * Decimal(1_000_000) / Decimal(repr(units))).quantize(Decimal("0.0001"))

    def as_dict(self, metrics: list[str]) -> dict:
        d = {"period_start": self.period_start.date().isoformat(), "key": self.key,
             "gpu_hours": str(self.gpu_hours), "cost": str(self.cost), "jobs": len(self.jobs)}
        for m in metrics:
            v = self.per_million(m)
            d[f"cost_per_1m_{unit(m)}"] = None if v is None else str(v)
        return d


def unit(metric: str) -> str:
    return metric[:-6] if metric.endswith("_per_s") else metric


@dataclass
class CostReport:
    by: str
    period: str
    rows: list[CostRow]
    metrics: list[str]            # throughput metrics seen (e.g. samples_per_s)
    by_gpu_type: dict[str, Decimal]
    total: Decimal

    def as_dicts(self) -> list[dict]:
        return [r.as_dict(self.metrics) for r in self.rows]


def cost_report(*, by: str = "account", period: str = "month", since: dt.datetime | None = None,
                until: dt.datetime | None = None, url: str | None = None) -> CostReport:
    if by not in GROUPS:
        raise UserInputError(f"--by {by!r} is not one of {', '.join(GROUPS)}")
    if period not in PERIODS:
        raise UserInputError(f"--period {period!r} is not one of {', '.join(PERIODS)}")
    col = getattr(UsageRecord, GROUPS[by])
    stmt = (select(UsageRecord.cluster, UsageRecord.job_id, UsageRecord.array_task_id, UsageRecord.run_start,
                   UsageRecord.elapsed_s, UsageRecord.gpu_type, col.label("key"),
                   Charge.gpu_hours, Charge.amount)
            .join(Charge, Charge.usage_id == UsageRecord.id))
    if since is not None:
        stmt = stmt.where(UsageRecord.run_start >= since)
    if until is not None:
        stmt = stmt.where(UsageRecord.run_start < until)
    rows: dict[tuple[dt.datetime, str], CostRow] = {}
    by_gpu: dict[str, Decimal] = defaultdict(Decimal)
    run_cost: dict[tuple, list] = {}
    total = ZERO
    with db.session_scope(url) as s:
        metrics: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
        for m in s.execute(select(JobMetric.cluster, JobMetric.job_id, JobMetric.array_task_id, JobMetric.name,
                                  JobMetric.value)):
            if m.name.endswith("_per_s"):
                metrics[(m.cluster, m.job_id, m.array_task_id)][m.name] = m.value
        for r in s.execute(stmt):
            key = r.key if r.key else ("cpu" if by == "gpu-type" else "-")
            ps = pricing.period_start(period, r.run_start)
            row = rows.get((ps, key))
            if row is None:
                row = rows[(ps, key)] = CostRow(ps, key)
            row.gpu_hours += r.gpu_hours
            row.cost += r.amount
            row.jobs.add(f"{r.cluster}:{r.job_id}")
            by_gpu[r.gpu_type or "cpu"] += r.amount
            total += r.amount
            jm = metrics.get((r.cluster, r.job_id, r.array_task_id))
            if jm:
                rc = run_cost.setdefault((r.cluster, r.job_id, r.array_task_id, r.run_start), [row, r.elapsed_s, ZERO, jm])
                rc[1] = r.elapsed_s
                rc[2] += r.amount
    names: set[str] = set()
    for row, elapsed, cost, jm in run_cost.values():
        for name, value in jm.items():
            names.add(name)
            row.work[name] += value * elapsed
            row.work_cost[name] += cost
    ordered = sorted(rows.values(), key=lambda x: (x.period_start, -x.cost, x.key))
    return CostReport(by, period, ordered, sorted(names), dict(sorted(by_gpu.items(), key=lambda kv: -kv[1])), total)


# ------------------------------------------------------------------ HTML
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _svg_stacked(report: CostReport, width: int = 760, height: int = 300) -> str:
    periods = sorted({r.period_start for r in report.rows})
    keys = [k for k, _ in sorted(((k, sum(r.cost for r in report.rows if r.key == k))
                                  for k in {r.key for r in report.rows}), key=lambda kv: -kv[1])]
    if not periods:
        return '<p class="empty">No usage in this range.</p>'
    top = keys[:len(PALETTE) - 1]
    color = {k: PALETTE[i] for i, k in enumerate(top)}
    other = "other" if len(keys) > len(top) else None
    stacks: dict[dt.datetime, dict[str, Decimal]] = {p: defaultdict(Decimal) for p in periods}
    for r in report.rows:
        stacks[r.period_start][r.key if r.key in color else "other"] += r.cost
    vmax = max((sum(v.values()) for v in stacks.values()), default=ZERO) or Decimal(1)
    left, bottom, top_m = 70, 40, 20
    plot_w, plot_h = width - left - 160, height - bottom - top_m
    bw = plot_w / len(periods)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="cost over time">']
    for i in range(5):
        v = vmax * i / 4
        y = top_m + plot_h - float(v / vmax) * plot_h
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{float(v):,.2f}</text>')
    for i, p in enumerate(periods):
        y = top_m + plot_h
        x = left + i * bw + bw * 0.1
        for k in [*top, *([other] if other else [])]:
            v = stacks[p].get(k, ZERO)
            if not v:
                continue
            h = float(v / vmax) * plot_h
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bw * 0.8:.1f}" height="{h:.1f}" '
                         f'fill="{color.get(k, "#999")}"><title>{_e(k)} {_e(p.date())}: {float(v):,.2f}</title></rect>')
        if len(periods) <= 16 or i % max(1, len(periods) // 16) == 0:
            parts.append(f'<text x="{x + bw * 0.4:.1f}" y="{top_m + plot_h + 15}" text-anchor="middle" '
                         f'font-size="10">{_e(p.strftime("%Y-%m-%d"))}</text>')
    for i, k in enumerate([*top, *([other] if other else [])]):
        y = top_m + i * 18
        parts.append(f'<rect x="{left + plot_w + 15}" y="{y}" width="12" height="12" fill="{color.get(k, "#999")}"/>'
                     f'<text x="{left + plot_w + 32}" y="{y + 10}" font-size="11">{_e(k)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _svg_bars(values: dict[str, Decimal], width: int = 760) -> str:
    if not values:
        return '<p class="empty">No usage in this range.</p>'
    row_h, left = 24, 110
    height = row_h * len(values) + 10
    vmax = max(values.values()) or Decimal(1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="cost by GPU type">']
    for i, (k, v) in enumerate(values.items()):
        w = float(v / vmax) * (width - left - 120)
        y = 5 + i * row_h
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end" font-size="12">{_e(k)}</text>'
                     f'<rect x="{left}" y="{y}" width="{max(w, 1):.1f}" height="{row_h - 6}" '
                     f'fill="{PALETTE[i % len(PALETTE)]}"/>'
                     f'<text x="{left + w + 6:.1f}" y="{y + 15}" font-size="12">{float(v):,.2f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: CostReport, *, title: str = "gpuhpc cost report", generated: dt.datetime | None = None) -> str:
    generated = generated or dt.datetime.now(dt.timezone.utc)
    cols = ["period", report.by, "GPU-hours", "cost", "jobs", *[f"$ / 1M {unit(m)}" for m in report.metrics]]
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = []
    for r in report.rows:
        cells = [r.period_start.date().isoformat(), r.key, f"{r.gpu_hours:,.2f}", f"{r.cost:,.2f}", str(len(r.jobs))]
        cells += [("" if r.per_million(m) is None else f"{r.per_million(m):,.4f}") for m in report.metrics]
        body.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;margin-top:1em}}th,td{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
th{{background:#f4f4f4}}td:nth-child(2),td:first-child{{text-align:left}}h2{{margin-top:1.6em}}
.meta{{color:#666;font-size:90%}}
</style></head><body>
<h1>{_e(title)}</h1>
<p class="meta">By {_e(report.by)} per {_e(report.period)}; total {float(report.total):,.2f};
generated {_e(generated.strftime("%Y-%m-%d %H:%M UTC"))}.</p>
<h2>Cost over time</h2>
{_svg_stacked(report)}
<h2>Cost by GPU type</h2>
{_svg_bars(report.by_gpu_type)}
<h2>Details</h2>
<table><thead><tr>{head}</tr></thead><tbody>
{"".join(body)}
</tbody></table>
</body></html>
"""

"""Cost reports: grouped totals over periods, plus a self-contained HTML page (inline SVG charts
from :mod:`gpuhpc.reports.charts`, drawn by matplotlib).

A run counts in each period (and ``since``/``until`` window) for the part of it that ran
inside, with period boundaries in the ledger's zone (``ledger.timezone``,
:mod:`gpuhpc.ledger.periods`): the same cut as ingest's charges and the quotas' counters, and
as sreport's (docs/ledger.md, "Month end, for finance"). Jobs that reported throughput
with ``gpuhpc.report(samples_per_s=...)`` get a cost-per-work column: ``$ per 1M samples``
(cost of those runs / (rate × elapsed) summed over them).
"""
from __future__ import annotations

import datetime as dt
import html
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from sqlalchemy import or_, select

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import admin, db, periods, pricing
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
    adjustments: Decimal = ZERO   # of cost: credits, debits, refunds, corrections dated in this period
    work: dict[str, float] = field(default_factory=lambda: defaultdict(float))         # metric -> units done
    work_cost: dict[str, Decimal] = field(default_factory=lambda: defaultdict(Decimal))  # cost of runs with it

    def per_million(self, metric: str) -> Decimal | None:
        units = self.work.get(metric, 0.0)
        if not units:
            return None
        return (self.work_cost[metric] * Decimal(1_000_000) / Decimal(repr(units))).quantize(Decimal("0.0001"))

    def as_dict(self, metrics: list[str]) -> dict:
        d = {"period_start": self.period_start.date().isoformat(), "key": self.key,
             "gpu_hours": str(self.gpu_hours), "cost": str(self.cost), "jobs": len(self.jobs),
             "adjustments": str(self.adjustments)}
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


def _cumulative(book: pricing.PriceCache, r) -> periods.Cumulative:
    """A usage record's cumulative (GPU-hours, money) after ``s`` seconds: priced as ingest
    prices it (so a report's parts equal the charges ingest booked per day); a run of several
    GPU types (stored as one record) pro rata by seconds."""
    if "+" in r.gpu_type and r.elapsed_s > 0:
        hours, amount, e = Decimal(r.gpu_hours), Decimal(r.amount), r.elapsed_s
        return lambda sec: (pricing.to_decimal(Fraction(hours) * sec / e), pricing.to_decimal(Fraction(amount) * sec / e))

    def cum(sec: int) -> tuple[Decimal, Decimal]:
        p = book.price(r.gpu_type or None, r.gpus, sec, r.partition, r.qos, r.run_start)
        return p.gpu_hours, p.amount if r.priced else ZERO

    return cum


def cost_report(*, by: str = "account", period: str = "month", since: dt.datetime | None = None,
                until: dt.datetime | None = None, url: str | None = None, tz: dt.tzinfo | None = None) -> CostReport:
    """GPU-hours and cost per period (days, weeks, months of the ledger's zone ``tz``, default
    the ``ledger.timezone`` setting) and key, over ``[since, until)`` (any instants). Each run
    counts in each period and window for the part of it that ran inside (cut as ingest cuts
    its charges); the parts of a run add up exactly to its charges."""
    if by not in GROUPS:
        raise UserInputError(f"--by {by!r} is not one of {', '.join(GROUPS)}")
    if period not in PERIODS:
        raise UserInputError(f"--period {period!r} is not one of {', '.join(PERIODS)}")
    tz = periods.ledger_zone() if tz is None else tz
    col = getattr(UsageRecord, GROUPS[by])
    stmt = select(UsageRecord.cluster, UsageRecord.job_id, UsageRecord.array_task_id, UsageRecord.run_start,
                  UsageRecord.run_end, UsageRecord.elapsed_s, UsageRecord.gpu_type, UsageRecord.gpus,
                  UsageRecord.partition, UsageRecord.qos, UsageRecord.priced, UsageRecord.gpu_hours,
                  UsageRecord.amount, col.label("key"))
    if since is not None:     # a run still open (no end yet) or ending after since
        stmt = stmt.where(or_(UsageRecord.run_end.is_(None), UsageRecord.run_end >= since,
                              UsageRecord.run_start >= since))
    if until is not None:
        stmt = stmt.where(UsageRecord.run_start < until)
    window = [t for t in (since, until) if t is not None]
    rows: dict[tuple[dt.datetime, str], CostRow] = {}
    by_gpu: dict[str, Decimal] = defaultdict(Decimal)
    total = ZERO
    names: set[str] = set()
    with db.session_scope(url) as s:
        book = pricing.PriceCache(admin.load_price_book(s))
        metrics: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
        for m in s.execute(select(JobMetric.cluster, JobMetric.job_id, JobMetric.array_task_id, JobMetric.name,
                                  JobMetric.value)):
            if m.name.endswith("_per_s"):
                metrics[(m.cluster, m.job_id, m.array_task_id)][m.name] = m.value
        for r in s.execute(stmt):
            key = r.key if r.key else ("cpu" if by == "gpu-type" else "-")
            start = r.run_start
            end = start + dt.timedelta(seconds=max(r.elapsed_s, 0))
            cuts = [*periods.boundaries(period, start, end, tz), *window]
            jm = metrics.get((r.cluster, r.job_id, r.array_task_id))
            for frm, to, hours, cost in periods.run_shares(start, r.elapsed_s, (r.gpu_hours, r.amount),
                                                           _cumulative(book, r), cuts):
                if (since is not None and frm < since) or (until is not None and frm >= until):
                    continue
                ps = periods.period_start(period, frm, tz).astimezone(tz)
                row = rows.get((ps, key))
                if row is None:
                    row = rows[(ps, key)] = CostRow(ps, key)
                row.gpu_hours += hours
                row.cost += cost
                row.jobs.add(f"{r.cluster}:{r.job_id}")
                by_gpu[r.gpu_type or "cpu"] += cost
                total += cost
                for name, value in (jm or {}).items():
                    names.add(name)
                    row.work[name] += value * (to - frm).total_seconds()
                    row.work_cost[name] += cost
        # adjustments (gpuhpc.ledger.adjust): their charges, in the period of their date
        adj = (select(Charge.bucket_at, Charge.gpu_hours, Charge.amount, Charge.account_name, Charge.user_name,
                      UsageRecord.partition, UsageRecord.gpu_type, Charge.usage_id)
               .outerjoin(UsageRecord, UsageRecord.id == Charge.usage_id)
               .where(Charge.adjustment_id.is_not(None)))
        if since is not None:
            adj = adj.where(Charge.bucket_at >= since)
        if until is not None:
            adj = adj.where(Charge.bucket_at < until)
        for at, hours, amount, account, user, partition, gpu_type, usage_id in s.execute(adj):
            key = {"account": account, "user": user or "-", "partition": partition or "-",
                   "gpu-type": (gpu_type or "cpu") if usage_id is not None else "-"}[by]
            ps = periods.period_start(period, at, tz).astimezone(tz)
            row = rows.get((ps, key))
            if row is None:
                row = rows[(ps, key)] = CostRow(ps, key)
            hours, amount = Decimal(hours), Decimal(amount)
            row.gpu_hours += hours
            row.cost += amount
            row.adjustments += amount
            by_gpu[(gpu_type or "cpu") if usage_id is not None else "adjustments"] += amount
            total += amount
    ordered = sorted(rows.values(), key=lambda x: (x.period_start, -x.cost, x.key))
    return CostReport(by, period, ordered, sorted(names), dict(sorted(by_gpu.items(), key=lambda kv: -kv[1])), total)


# ------------------------------------------------------------------ HTML
TOP_KEYS = 9            # keys drawn with a colour of their own; the rest stack as "other"
EMPTY = '<p class="empty">No usage in this range.</p>'


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _svg_stacked(report: CostReport) -> str:
    """Cost per period, stacked by the report's key (the largest keys first; the rest as other)."""
    from gpuhpc.reports import charts

    periods = sorted({r.period_start for r in report.rows})
    if not periods:
        return EMPTY
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for r in report.rows:
        totals[r.key] += r.cost
    keys = sorted(totals, key=lambda k: (-totals[k], k))
    top = keys[:TOP_KEYS]
    series: dict[str, list[float]] = {k: [0.0] * len(periods) for k in [*top, *(["other"] if keys[TOP_KEYS:] else [])]}
    index = {p: i for i, p in enumerate(periods)}
    for r in report.rows:
        series[r.key if r.key in top else "other"][index[r.period_start]] += float(r.cost)
    return charts.stacked_bars([p.strftime("%Y-%m-%d") for p in periods], series, ylabel="cost")


def _svg_bars(values: dict[str, Decimal]) -> str:
    from gpuhpc.reports import charts

    if not values:
        return EMPTY
    return charts.hbars({k: float(v) for k, v in values.items()}, xlabel="cost")


def render_html(report: CostReport, *, title: str = "gpuhpc cost report", generated: dt.datetime | None = None,
                instances=None) -> str:
    """The page; ``instances`` (a :class:`gpuhpc.ledger.instances.InstanceReport` of the same
    range) adds elastic capacity's instance-hours section."""
    generated = generated or dt.datetime.now(dt.timezone.utc)
    section = ""
    if instances is not None:
        from gpuhpc.ledger.instances import render_html as instances_html

        section = instances_html(instances)
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
<table id="cost-details"><thead><tr>{head}</tr></thead><tbody>
{"".join(body)}
</tbody></table>
{section}</body></html>
"""

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
from gpuhpc.ledger.orm import Account, Charge, JobMetric, UsageRecord

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


# ------------------------------------------------------------------ burn forecast
@dataclass(frozen=True)
class Burn:
    """One budget's burn: spend per day over the last ``days`` days, and the date at that rate
    its remaining budget (less open holds) runs out; ``runs_out`` None: it lasts until the
    period resets (``period_end``) or nothing was spent."""

    account: str
    user: str | None
    period: str
    measure: str                  # money | gpu_hours
    budget: Decimal
    used: Decimal
    held: Decimal
    per_day: Decimal
    days: int
    period_end: dt.datetime | None
    runs_out: dt.datetime | None

    @property
    def remaining(self) -> Decimal:
        return self.budget - self.used - self.held

    def as_dict(self) -> dict:
        return {"account": self.account, "user": self.user, "period": self.period, "measure": self.measure,
                "budget": str(self.budget), "used": str(self.used), "held": str(self.held),
                "remaining": str(self.remaining), "per_day": str(self.per_day), "days": self.days,
                "period_end": None if self.period_end is None else self.period_end.isoformat(),
                "runs_out": None if self.runs_out is None else self.runs_out.isoformat()}


def burn_forecast(*, days: int = 14, account: str | None = None, now: dt.datetime | None = None,
                  url: str | None = None) -> list[Burn]:
    """Each quota's spend rate over ``[now - days, now)`` (its charges, adjustments included: all
    its account's, or one user's for a user quota) and the date its remaining budget runs out at
    that rate, when that comes before the period resets. An exhausted budget runs out ``now``."""
    from sqlalchemy import func

    if not isinstance(days, int) or days < 1 or days > 3660:
        raise UserInputError(f"{days!r} is not a number of days from 1 to 3660", field="--days", hint="--days 14")
    now = now or dt.datetime.now(dt.timezone.utc)
    tz = periods.ledger_zone()
    statuses = admin.quota_status(account, url=url, now=now)
    out: list[Burn] = []
    with db.session_scope(url) as s:
        for st in statuses:
            stmt = select(func.coalesce(func.sum(Charge.gpu_hours), 0), func.coalesce(func.sum(Charge.amount), 0)).where(
                Charge.account_name == st.account, Charge.bucket_at >= now - dt.timedelta(days=days),
                Charge.bucket_at < now)
            if st.user is not None:
                stmt = stmt.where(Charge.user_name == st.user)
            spent_h, spent_m = (pricing.to_decimal(Decimal(str(v))) for v in s.execute(stmt).one())
            end = periods.period_end(st.period, st.period_start, tz)
            for measure, budget_, used, held, spent in (
                    ("money", st.money_budget, st.used_money, st.held_money, spent_m),
                    ("gpu_hours", st.gpu_hours_budget, st.used_gpu_hours, st.held_gpu_hours, spent_h)):
                if budget_ is None:
                    continue
                per_day = pricing.to_decimal(Fraction(spent) / days)
                left = budget_ - used - held
                runs_out = None
                if left <= 0:
                    runs_out = now
                elif per_day > 0:
                    when = now + dt.timedelta(seconds=float(Fraction(left) / Fraction(per_day) * 86400))
                    runs_out = when if end is None or when < end else None
                out.append(Burn(st.account, st.user, st.period, measure, Decimal(budget_), Decimal(used), Decimal(held),
                                per_day, days, end, runs_out))
    return out


# ------------------------------------------------------------------ per-job line items
LINE_FIELDS = ("kind", "cluster", "job_id", "array_task_id", "account", "grant", "cost_centre", "user", "partition", "qos", "gpu_type", "gpus",
               "run_start", "run_end", "state", "gpu_hours", "cost", "adjustments", "total", "reason")


def job_lines(*, since: dt.datetime | None = None, until: dt.datetime | None = None, account: str | None = None,
              url: str | None = None, tz: dt.tzinfo | None = None) -> list[dict]:
    """Line items for finance: one per run (its part inside ``[since, until)``, cut as the cost
    report cuts it, with what adjustments dated in the window did to it: refunds, corrections),
    and one per adjustment of an account rather than a run (a credit or debit). Totals add up to
    :func:`cost_report`'s over the same window. Values are strings (exact decimals)."""
    from gpuhpc.ledger.orm import Adjustment

    tz = periods.ledger_zone() if tz is None else tz
    window = [t for t in (since, until) if t is not None]
    stmt = select(UsageRecord).order_by(UsageRecord.run_start, UsageRecord.cluster, UsageRecord.job_id,
                                        UsageRecord.array_task_id)
    if since is not None:
        stmt = stmt.where(or_(UsageRecord.run_end.is_(None), UsageRecord.run_end >= since,
                              UsageRecord.run_start >= since))
    if until is not None:
        stmt = stmt.where(UsageRecord.run_start < until)
    if account:
        stmt = stmt.where(UsageRecord.account_name == account)
    adj = select(Charge.usage_id, Charge.gpu_hours, Charge.amount, Charge.adjustment_id, Charge.account_name,
                 Charge.user_name, Charge.bucket_at).where(Charge.adjustment_id.is_not(None))
    if since is not None:
        adj = adj.where(Charge.bucket_at >= since)
    if until is not None:
        adj = adj.where(Charge.bucket_at < until)
    if account:
        adj = adj.where(Charge.account_name == account)
    out: list[dict] = []
    with db.session_scope(url) as s:
        book = pricing.PriceCache(admin.load_price_book(s))
        per_run: dict[int, list[Decimal]] = defaultdict(lambda: [ZERO, ZERO])
        loose: list = []
        for c in s.execute(adj):
            if c.usage_id is None:
                loose.append(c)
            else:
                per_run[c.usage_id][0] += Decimal(c.gpu_hours)
                per_run[c.usage_id][1] += Decimal(c.amount)
        for r in s.scalars(stmt):
            hours = cost = ZERO
            for frm, _to, h, m in periods.run_shares(r.run_start, r.elapsed_s, (r.gpu_hours, r.amount),
                                                     _cumulative(book, r), window):
                if (since is not None and frm < since) or (until is not None and frm >= until):
                    continue
                hours += h
                cost += m
            a_h, a_m = per_run.pop(r.id, (ZERO, ZERO))
            out.append({"kind": "run", "cluster": r.cluster, "job_id": r.job_id,
                        "array_task_id": "" if r.array_task_id < 0 else str(r.array_task_id),
                        "account": r.account_name, "user": r.user_name, "partition": r.partition, "qos": r.qos,
                        "gpu_type": r.gpu_type, "gpus": str(r.gpus), "run_start": r.run_start.isoformat(),
                        "run_end": "" if r.run_end is None else r.run_end.isoformat(), "state": r.state,
                        "gpu_hours": str(hours + a_h), "cost": str(cost), "adjustments": str(a_m),
                        "total": str(cost + a_m), "reason": ""})
        # adjustments of runs outside the window's runs (a refund dated in it of an older run), and of accounts
        adjs = {a.id: a for a in s.scalars(select(Adjustment).where(
            Adjustment.id.in_({c.adjustment_id for c in loose})))} if loose else {}
        for uid, (a_h, a_m) in sorted(per_run.items()):
            u = s.get(UsageRecord, uid)
            out.append({"kind": "adjustment", "cluster": u.cluster, "job_id": u.job_id,
                        "array_task_id": "" if u.array_task_id < 0 else str(u.array_task_id),
                        "account": u.account_name, "user": u.user_name, "partition": u.partition, "qos": u.qos,
                        "gpu_type": u.gpu_type, "gpus": str(u.gpus), "run_start": u.run_start.isoformat(),
                        "run_end": "" if u.run_end is None else u.run_end.isoformat(), "state": u.state,
                        "gpu_hours": str(a_h), "cost": "0", "adjustments": str(a_m), "total": str(a_m), "reason": ""})
        for c in loose:
            a = adjs[c.adjustment_id]
            job, _, task = (a.job_id or "").partition("_")
            out.append({"kind": "adjustment", "cluster": a.cluster or "", "job_id": job, "array_task_id": task,
                        "account": c.account_name, "user": c.user_name, "partition": "", "qos": "", "gpu_type": "",
                        "gpus": "", "run_start": "", "run_end": "", "state": a.kind,
                        "gpu_hours": str(Decimal(c.gpu_hours)), "cost": "0", "adjustments": str(Decimal(c.amount)),
                        "total": str(Decimal(c.amount)), "reason": a.reason})
        codes = {a.name: (a.grant_code or "", a.cost_centre or "")
                 for a in s.scalars(select(Account).where(Account.name.in_({x["account"] for x in out})))} \
            if out else {}
    for x in out:
        x["grant"], x["cost_centre"] = codes.get(x["account"], ("", ""))
    return out


def lines_csv(lines: list[dict]) -> str:
    """RFC 4180 CSV with a header row; a cell a spreadsheet would run as a formula (=, +, -, @ first)
    gets a leading apostrophe, unless it is a number."""
    return rows_csv(LINE_FIELDS, lines)


def _cell(v: str) -> str:
    if v[:1] in ("=", "+", "-", "@", "\t", "\r"):
        try:
            Decimal(v)
            return v
        except Exception:
            return "'" + v
    return v


def rows_csv(fields: tuple[str, ...], rows: list[dict]) -> str:
    """:func:`lines_csv` for any report's rows (the line items, the instance cost by account):
    ``fields`` as the header, each row's values in that order, formulas defused."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(fields)
    for r in rows:
        w.writerow([_cell(str(r[f])) for f in fields])
    return buf.getvalue()

"""Instance-hours of elastic capacity (issue 24): the elastic journal's events folded into
``instance_usage`` (one row per instance, re-ingesting is idempotent), and the report next to
the jobs' GPU-hours.

Each instance's life splits into parts that add up to its instance-hours:

- **boot**: launch until its slurmd registered (the whole life when it never did);
- **busy**: registration until its last job ended (LastBusyTime; for a reclaimed or lost instance,
  until its end);
- **idle**: last job until Slurm powered it down (SuspendTime);
- **suspend**: power-down until the instance ended;
- **orphan**: an instance no node owned, from launch until the reconciler ended it.

Prices are per hour, as at launch; spot savings are (on-demand price - price) x hours."""
from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import select

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import InstanceUsage, UsageRecord

ZERO = Decimal(0)
HOUR = Decimal(3600)
PARTS = ("boot", "busy", "idle", "suspend", "orphan")


def _t(x: float | None) -> dt.datetime | None:
    return None if x is None else dt.datetime.fromtimestamp(float(x), dt.timezone.utc)


def fold(events: list[dict]) -> dict[tuple[str, str], dict]:
    """(cluster, instance id) -> the row's fields, from launch and end events in any order."""
    rows: dict[tuple[str, str], dict] = {}
    for e in events:
        key = (e.get("cluster", ""), e.get("id", ""))
        if not all(key):
            continue
        r = rows.setdefault(key, {})
        if e.get("event") == "launch" or (e.get("event") == "end" and e.get("orphan")):
            r.update(node=e.get("node") or "", pool=e.get("pool") or "", instance_type=e.get("type") or "-",
                     market=e.get("market") or "on_demand", launched_at=e.get("launched_at", e.get("at")),
                     price=e.get("price") or "0", on_demand_price=e.get("on_demand_price") or e.get("price") or "0")
        if e.get("event") == "end" and r.get("ended_at") is None:
            r.update(ended_at=e.get("at"), end_reason=e.get("reason", ""), orphan=bool(e.get("orphan")),
                     registered_at=e.get("registered_at"), last_busy=e.get("last_busy"), suspend_at=e.get("suspend_at"))
    return {k: v for k, v in rows.items() if v.get("launched_at") is not None}


def ingest(events: list[dict], url: str | None = None) -> int:
    """Upsert the instances of ``events``; returns how many rows were written or changed."""
    rows = fold(events)
    n = 0
    with db.session_scope(url) as s:
        have = {(r.cluster, r.instance_id): r for r in s.scalars(select(InstanceUsage).where(
            InstanceUsage.instance_id.in_([k[1] for k in rows])))} if rows else {}
        for (cluster, iid), f in rows.items():
            row = have.get((cluster, iid))
            if row is None:
                row = InstanceUsage(cluster=cluster, instance_id=iid)
                s.add(row)
            elif row.ended_at is not None:
                continue                                   # settled
            launched = _t(f["launched_at"])
            registered = _t(f.get("registered_at"))
            if registered is not None and registered < launched - dt.timedelta(seconds=1):
                registered = None                          # an earlier boot's slurmd
            elif registered is not None:
                registered = max(registered, launched)     # Slurm's times have whole seconds
            row.node, row.pool, row.instance_type, row.market = f["node"], f["pool"], f["instance_type"], f["market"]
            row.launched_at, row.registered_at = launched, registered
            row.last_busy_at, row.suspend_at, row.ended_at = _t(f.get("last_busy")), _t(f.get("suspend_at")), _t(f.get("ended_at"))
            row.end_reason, row.orphan = f.get("end_reason", ""), f.get("orphan", False)
            row.price_per_hour, row.on_demand_price_per_hour = Decimal(str(f["price"])), Decimal(str(f["on_demand_price"]))
            n += 1
    return n


def spans(row: InstanceUsage, now: dt.datetime) -> dict[str, tuple[dt.datetime, dt.datetime]]:
    """``[start, end)`` of each part of one instance's life (:data:`PARTS`; an empty part starts
    where it ends): they tile ``[launched_at, ended_at or now)`` in order. The instance-cost report
    (:mod:`gpuhpc.ledger.instance_cost`) cuts them at a period's edges and lays jobs on the busy one."""
    launched = row.launched_at
    end = max(row.ended_at or now, launched)
    out = {p: (launched, launched) for p in PARTS}
    if row.orphan:
        out["orphan"] = (launched, end)
    elif row.registered_at is None:
        out["boot"] = (launched, end)
    else:
        def clamp(t: dt.datetime | None, lo: dt.datetime) -> dt.datetime:
            return min(max(t or end, lo), end)
        registered = clamp(row.registered_at, launched)
        suspend = clamp(row.suspend_at, registered)
        last_busy = clamp(row.last_busy_at if row.suspend_at else None, registered) if row.last_busy_at else suspend
        last_busy = min(last_busy, suspend)
        out.update(boot=(launched, registered), busy=(registered, last_busy), idle=(last_busy, suspend),
                   suspend=(suspend, end))
    return out


def parts(row: InstanceUsage, now: dt.datetime) -> dict[str, Decimal]:
    """Seconds of each part of one instance's life (they sum to its whole life)."""
    return {k: Decimal(repr((b - a).total_seconds())) for k, (a, b) in spans(row, now).items()}


@dataclass
class InstanceRow:
    instance_type: str
    market: str
    instances: int = 0
    seconds: dict[str, Decimal] = field(default_factory=lambda: dict.fromkeys(PARTS, ZERO))
    cost: Decimal = ZERO
    on_demand_cost: Decimal = ZERO

    @property
    def hours(self) -> Decimal:
        return sum(self.seconds.values(), ZERO) / HOUR

    @property
    def spot_savings(self) -> Decimal:
        return self.on_demand_cost - self.cost

    def as_dict(self) -> dict:
        q = Decimal("0.000001")
        d = {"instance_type": self.instance_type, "market": self.market, "instances": self.instances,
             "instance_hours": str(self.hours.quantize(q))}
        d.update({f"{p}_hours": str((self.seconds[p] / HOUR).quantize(q)) for p in PARTS})
        d.update(cost=str(self.cost.quantize(q)), spot_savings=str(self.spot_savings.quantize(q)))
        return d


@dataclass
class InstanceReport:
    rows: list[InstanceRow]
    job_gpu_hours: Decimal            # the jobs' GPU-hours over the same range
    job_hours: Decimal                # the jobs' run hours (node-hours of the runs) over the same range

    def as_dict(self) -> dict:
        return {"instances": [r.as_dict() for r in self.rows], "job_gpu_hours": str(self.job_gpu_hours),
                "job_hours": str(self.job_hours)}


def instance_report(*, since: dt.datetime | None = None, until: dt.datetime | None = None, url: str | None = None,
                    cluster: str | None = None, now: dt.datetime | None = None) -> InstanceReport:
    """Instance-hours, their parts, cost and spot savings per (instance type, market) of the
    instances launched in the range, and the jobs' GPU-hours of the runs started in it."""
    now = now or dt.datetime.now(dt.timezone.utc)
    by: dict[tuple[str, str], InstanceRow] = {}
    stmt = select(InstanceUsage)
    runs = select(UsageRecord.gpu_hours, UsageRecord.elapsed_s)
    if since is not None:
        stmt, runs = stmt.where(InstanceUsage.launched_at >= since), runs.where(UsageRecord.run_start >= since)
    if until is not None:
        stmt, runs = stmt.where(InstanceUsage.launched_at < until), runs.where(UsageRecord.run_start < until)
    if cluster is not None:
        stmt, runs = stmt.where(InstanceUsage.cluster == cluster), runs.where(UsageRecord.cluster == cluster)
    gpu_hours = job_s = ZERO
    with db.session_scope(url) as s:
        for row in s.scalars(stmt):
            r = by.setdefault((row.instance_type, row.market), InstanceRow(row.instance_type, row.market))
            r.instances += 1
            secs = parts(row, now)
            for k, v in secs.items():
                r.seconds[k] += v
            hours = sum(secs.values(), ZERO) / HOUR
            r.cost += hours * row.price_per_hour
            r.on_demand_cost += hours * row.on_demand_price_per_hour
        for g, e in s.execute(runs):
            gpu_hours += g or ZERO
            job_s += Decimal(e or 0)
    rows = sorted(by.values(), key=lambda r: (r.market, r.instance_type))
    return InstanceReport(rows, gpu_hours, job_s / HOUR)


def totals(rows: list[InstanceRow]) -> dict[str, Decimal]:
    """Hours of each part and in all, cost and spot savings over ``rows``."""
    out: dict[str, Decimal] = defaultdict(Decimal)
    for r in rows:
        for k, v in r.seconds.items():
            out[f"{k}_hours"] += v / HOUR
        out["instance_hours"] += r.hours
        out["cost"] += r.cost
        out["spot_savings"] += r.spot_savings
    return dict(out)


def render_html(rep: InstanceReport) -> str:
    """The cost page's section on elastic capacity (:func:`gpuhpc.ledger.reports.render_html`):
    the instance-hours as the text report splits them (boot, busy, idle, suspend, orphan; they add
    up to the total), cost and spot savings per instance type and market, a bar per type stacked
    by part, and the jobs' GPU-hours and run hours of the same range beside them. Empty when the
    range holds no instance."""
    import html

    from gpuhpc.reports import charts

    if not rep.rows:
        return ""
    e = lambda x: html.escape(str(x), quote=True)  # noqa: E731
    h = lambda x: f"{float(x):,.3f}"                 # noqa: E731 - hours, as the text report prints them
    tot = totals(rep.rows)
    cols = ["type", "market", "instances", "instance-h", *[f"{p}-h" for p in PARTS], "cost", "spot savings"]

    def cells(label: list[str], hours: Decimal, parts_h: list[Decimal], cost: Decimal, savings: Decimal) -> str:
        vals = [*label, h(hours), *[h(x) for x in parts_h], f"{float(cost):,.2f}", f"{float(savings):,.2f}"]
        return "".join(f"<td>{e(v)}</td>" for v in vals)

    body = "".join(f"<tr>{cells([r.instance_type, r.market, str(r.instances)], r.hours, [r.seconds[p] / HOUR for p in PARTS], r.cost, r.spot_savings)}</tr>"
                   for r in rep.rows)
    foot = cells(["total", "", str(sum(r.instances for r in rep.rows))], tot["instance_hours"],
                 [tot[f"{p}_hours"] for p in PARTS], tot["cost"], tot["spot_savings"])
    chart = charts.stacked_bars([f"{r.instance_type} ({r.market})" for r in rep.rows],
                                {p: [float(r.seconds[p] / HOUR) for r in rep.rows] for p in PARTS},
                                ylabel="instance-hours")
    split = " + ".join(f"{p} {h(tot[f'{p}_hours'])}" for p in PARTS)
    return f"""<h2>Elastic instances</h2>
<p id="instance-summary"><b>{e(h(tot["instance_hours"]))}</b> instance-hours = {e(split)}; cost
{e(f"{float(tot['cost']):,.2f}")}, spot savings {e(f"{float(tot['spot_savings']):,.2f}")} (on-demand price
less the price paid, per hour). Jobs in the same range: {e(f"{float(rep.job_gpu_hours):,.2f}")} GPU-hours,
{e(f"{float(rep.job_hours):,.3f}")} run hours.</p>
{chart}
<table id="instances"><thead><tr>{"".join(f"<th>{e(c)}</th>" for c in cols)}</tr></thead><tbody>
{body}
</tbody><tfoot><tr>{foot}</tr></tfoot></table>
"""

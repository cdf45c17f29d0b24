"""Elastic instance cost charged to the accounts whose jobs ran on the instances, reconciled with
instance-hours (issue 34 point 10): ``gpuhpc ledger report --instances --by-account``.

Over one window (a period of the ledger's zone, or ``--since``/``--until``), each instance's life
(:func:`gpuhpc.ledger.instances.spans`: boot, busy, idle, suspend, orphan) is cut to the window
and priced at its price per hour as at launch. Its **busy** part is laid against the runs of the
ledger's usage records that ran on its node (the node lists come from sacct, by the run's key:
cluster, job, array task, start; the ledger keeps no node list):

- a run's time on the node is its ``[start, end)`` inside the busy part; a multi-node run has
  such a share on each of its nodes;
- at each instant the node's cost goes to the runs on it then: one run alone bears all of it
  (the instance was there for it); overlapping runs split it by their GPUs on that node (a run's
  GPUs over its node count), or equally when one of them holds no GPU;
- what no run covers (boot, idle, suspend, orphan, and busy time with no run on the node) is
  **overhead** of the instance's pool, by part (``unused`` for the uncovered busy time).

With the ``spread`` policy a pool's overhead goes to the accounts that used that pool, in
proportion to what they were charged in it (a pool no account used keeps its overhead).

Money is exact (``Fraction``) until the figures are printed: then each line is rounded to the
ledger's 6 decimals by largest remainder, so the printed lines add up exactly to the printed
instance cost, as they do exactly before rounding: sum over accounts + overhead = instance cost
= sum over instances of instance-hours x price. :attr:`InstanceCost.reconciled` checks it.

A report only: it books nothing (docs/ledger.md, "Elastic instance cost by account", says why).
"""
from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal
from fractions import Fraction
from typing import Iterable, Mapping

from gpuhpc.errors import UserInputError

OVERHEAD = "overhead"
SPREAD = "spread"
POLICIES = (OVERHEAD, SPREAD)
UNUSED = "unused"              # busy time that no run covers
OVERHEAD_PARTS = ("boot", UNUSED, "idle", "suspend", "orphan")
QUANTUM = Decimal("0.000001")  # the ledger's money and hours (orm.MONEY, orm.HOURS)
RunKey = tuple[str, str, int, dt.datetime]   # cluster, job id, array task id (-1: none), run start


@dataclass(frozen=True)
class Life:
    """One instance: where it ran and the parts of its life (``instances.spans``)."""

    cluster: str
    instance_id: str
    node: str
    pool: str
    instance_type: str
    market: str
    price_per_hour: Fraction
    spans: Mapping[str, tuple[dt.datetime, dt.datetime]]


@dataclass(frozen=True)
class JobRun:
    """One run of a job as the ledger has it, with the nodes sacct says it ran on."""

    cluster: str
    job: str                  # 123, 123_4
    account: str
    nodes: tuple[str, ...]
    start: dt.datetime
    end: dt.datetime
    gpus: int                 # in all, over its nodes


@dataclass
class AccountLine:
    account: str
    seconds: Fraction = Fraction(0)          # instance-seconds attributed (shared seconds by their share)
    cost: Fraction = Fraction(0)
    overhead_share: Fraction = Fraction(0)   # the spread policy's part of its pools' overhead
    jobs: set[str] = field(default_factory=set)
    by_pool: dict[str, Fraction] = field(default_factory=lambda: defaultdict(Fraction))

    @property
    def total(self) -> Fraction:
        return self.cost + self.overhead_share


@dataclass
class InstanceLine:
    life: Life
    seconds: Fraction = Fraction(0)      # inside the window
    cost: Fraction = Fraction(0)
    attributed: Fraction = Fraction(0)   # of cost, to accounts' runs


@dataclass
class InstanceCost:
    since: dt.datetime | None
    until: dt.datetime | None
    policy: str
    instances: list[InstanceLine]
    accounts: dict[str, AccountLine]
    overhead: dict[tuple[str, str], list[Fraction]]     # (pool, part) -> [seconds, cost]
    unmatched: list[str] = field(default_factory=list)   # runs on instances' clusters sacct gave no node list for

    @property
    def instance_seconds(self) -> Fraction:
        return sum((i.seconds for i in self.instances), Fraction(0))

    @property
    def instance_cost(self) -> Fraction:
        """Sum over instances of instance-hours in the window x price per hour."""
        return sum((i.seconds * i.life.price_per_hour / 3600 for i in self.instances), Fraction(0))

    @property
    def accounts_cost(self) -> Fraction:
        return sum((a.total for a in self.accounts.values()), Fraction(0))

    @property
    def overhead_cost(self) -> Fraction:
        return sum((c for _, c in self.overhead.values()), Fraction(0))

    @property
    def reconciled(self) -> bool:
        """Accounts + overhead = instance cost, exactly, in money and in instance-seconds."""
        attributed_s = sum((a.seconds for a in self.accounts.values()), Fraction(0))
        overhead_s = sum((s for s, _ in self.overhead.values()), Fraction(0))
        return (self.accounts_cost + self.overhead_cost == self.instance_cost
                and attributed_s + overhead_s == self.instance_seconds)

    # ---------------------------------------------------------------- printed figures
    def rounded(self) -> tuple[dict[str, Decimal], dict[tuple[str, str], Decimal], Decimal]:
        """Each account's total and each overhead line's cost at 6 decimals, apportioned so that
        they add up to the instance cost at 6 decimals (largest remainder)."""
        keys = [("account", a) for a in sorted(self.accounts)] + [("overhead", k) for k in sorted(self.overhead)]
        exact = [self.accounts[k].total if kind == "account" else self.overhead[k][1] for kind, k in keys]
        total = q6(self.accounts_cost + self.overhead_cost)
        shares = apportion(exact, total)
        acc = {k: v for (kind, k), v in zip(keys, shares) if kind == "account"}
        over = {k: v for (kind, k), v in zip(keys, shares) if kind == "overhead"}
        return acc, over, total

    def as_dict(self) -> dict:
        acc, over, total = self.rounded()
        hours = lambda s: str(q6(s / 3600))  # noqa: E731
        return {
            "since": None if self.since is None else self.since.isoformat(),
            "until": None if self.until is None else self.until.isoformat(),
            "policy": self.policy,
            "accounts": [{"account": a.account, "instance_hours": hours(a.seconds), "cost": str(q6(a.cost)),
                          "overhead_share": str(q6(a.overhead_share)), "total": str(acc[a.account]),
                          "jobs": len(a.jobs)} for a in sorted(self.accounts.values(), key=lambda x: x.account)],
            "overhead": [{"pool": pool, "part": part, "instance_hours": hours(s), "cost": str(over[(pool, part)])}
                         for (pool, part), (s, _c) in sorted(self.overhead.items())],
            "instances": [{"cluster": i.life.cluster, "instance_id": i.life.instance_id, "node": i.life.node,
                           "pool": i.life.pool, "instance_type": i.life.instance_type, "market": i.life.market,
                           "price_per_hour": str(q6(i.life.price_per_hour)), "instance_hours": hours(i.seconds),
                           "cost": str(q6(i.cost)), "attributed": str(q6(i.attributed))} for i in self.instances],
            "totals": {"instance_hours": hours(self.instance_seconds), "instance_cost": str(q6(self.instance_cost)),
                       "accounts": str(sum(acc.values(), Decimal(0))), "overhead": str(sum(over.values(), Decimal(0))),
                       "printed_total": str(total), "reconciled": self.reconciled},
            "runs_without_node_list": self.unmatched,
        }

    def csv_rows(self) -> list[dict]:
        """One line per account, per overhead (pool, part), and the total: ``line, key, part,
        instance_hours, cost, overhead_share, total`` (the totals' ``total`` is the instance cost)."""
        d = self.as_dict()
        out = [{"line": "account", "key": a["account"], "part": "", "instance_hours": a["instance_hours"],
                "cost": a["cost"], "overhead_share": a["overhead_share"], "total": a["total"]} for a in d["accounts"]]
        out += [{"line": "overhead", "key": o["pool"], "part": o["part"], "instance_hours": o["instance_hours"],
                 "cost": o["cost"], "overhead_share": "", "total": o["cost"]} for o in d["overhead"]]
        t = d["totals"]
        out.append({"line": "instances", "key": "total", "part": "", "instance_hours": t["instance_hours"],
                    "cost": t["instance_cost"], "overhead_share": "", "total": t["printed_total"]})
        return out

    def reconciliation(self) -> str:
        """The line finance checks."""
        acc, over, total = self.rounded()
        a, o = sum(acc.values(), Decimal(0)), sum(over.values(), Decimal(0))
        word = "reconciled" if self.reconciled and a + o == total else "DOES NOT RECONCILE"
        return (f"{len(self.instances)} instances, {q6(self.instance_seconds / 3600)} instance-hours x price = "
                f"{total} = accounts {a} + overhead {o}: {word}")


CSV_FIELDS = ("line", "key", "part", "instance_hours", "cost", "overhead_share", "total")


def q6(x: Fraction | Decimal | int) -> Decimal:
    from gpuhpc.ledger.pricing import to_decimal

    return to_decimal(Fraction(x))


def apportion(exact: list[Fraction], total: Decimal) -> list[Decimal]:
    """``exact`` (non-negative) at 6 decimals adding up to ``total`` (their sum rounded): each
    rounded down, the quanta left over to the largest remainders (the first on a tie)."""
    floors = [(Decimal(x.numerator) / Decimal(x.denominator)).quantize(QUANTUM, rounding=ROUND_FLOOR)
              if x else Decimal(0) for x in exact]
    left = int((total - sum(floors, Decimal(0))) / QUANTUM)
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - Fraction(floors[i])), i))
    for i in order[:max(left, 0)]:
        floors[i] += QUANTUM
    return floors


def _secs(a: dt.datetime, b: dt.datetime) -> Fraction:
    return Fraction((b - a) // dt.timedelta(microseconds=1), 1_000_000) if b > a else Fraction(0)


def _clip(a: dt.datetime, b: dt.datetime, lo: dt.datetime | None, hi: dt.datetime | None) -> tuple[dt.datetime, dt.datetime]:
    a2 = a if lo is None else max(a, lo)
    b2 = b if hi is None else min(b, hi)
    return a2, max(a2, b2)


def attribute(lives: Iterable[Life], runs: Iterable[JobRun], *, since: dt.datetime | None = None,
              until: dt.datetime | None = None, policy: str = OVERHEAD) -> InstanceCost:
    """The pure computation (module docstring): each instance's cost inside ``[since, until)`` to
    the accounts of the runs on its node during its busy part, the rest to its pool's overhead."""
    if policy not in POLICIES:
        raise UserInputError(f"unknown overhead policy {policy!r}", field="--overhead",
                             hint="overhead (report it per pool) or spread (to the pool's accounts by their cost)")
    on_node: dict[tuple[str, str], list[JobRun]] = defaultdict(list)
    for r in runs:
        for n in r.nodes:
            on_node[(r.cluster, n)].append(r)
    accounts: dict[str, AccountLine] = {}
    overhead: dict[tuple[str, str], list[Fraction]] = defaultdict(lambda: [Fraction(0), Fraction(0)])
    lines: list[InstanceLine] = []
    for life in lives:
        line = InstanceLine(life)
        per_s = life.price_per_hour / 3600
        for part, (a, b) in life.spans.items():
            a, b = _clip(a, b, since, until)
            s = _secs(a, b)
            line.seconds += s
            line.cost += s * per_s
            if part != "busy":
                if s:
                    o = overhead[(life.pool, part)]
                    o[0] += s
                    o[1] += s * per_s
                continue
            here = [(max(r.start, a), min(r.end, b), r) for r in on_node.get((life.cluster, life.node), ())
                    if r.start < b and r.end > a]
            cuts = sorted({a, b, *(t for x, y, _ in here for t in (x, y))})
            for x, y in zip(cuts, cuts[1:]):
                seg = _secs(x, y)
                active = [r for rx, ry, r in here if rx <= x and ry >= y]
                if not active:
                    o = overhead[(life.pool, UNUSED)]
                    o[0] += seg
                    o[1] += seg * per_s
                    continue
                if all(r.gpus > 0 for r in active):
                    weights = [Fraction(r.gpus, len(r.nodes)) for r in active]
                else:
                    weights = [Fraction(1)] * len(active)
                whole = sum(weights, Fraction(0))
                for r, w in zip(active, weights):
                    acc = accounts.get(r.account)
                    if acc is None:
                        acc = accounts[r.account] = AccountLine(r.account)
                    share = seg * w / whole
                    acc.seconds += share
                    acc.cost += share * per_s
                    acc.by_pool[life.pool] += share * per_s
                    acc.jobs.add(r.job)
                    line.attributed += share * per_s
        lines.append(line)
    if policy == SPREAD:
        for (pool, part), o in list(overhead.items()):
            users = {a: acc.by_pool[pool] for a, acc in accounts.items() if acc.by_pool.get(pool)}
            whole = sum(users.values(), Fraction(0))
            if not whole or not o[1]:
                continue
            for a, c in users.items():
                accounts[a].overhead_share += o[1] * c / whole
                accounts[a].seconds += o[0] * c / whole
            overhead[(pool, part)] = [Fraction(0), Fraction(0)]
        overhead = {k: v for k, v in overhead.items() if v[0] or v[1]}
    return InstanceCost(since, until, policy, lines, accounts, dict(overhead))


# ------------------------------------------------------------------ from the ledger (and sacct's node lists)
def run_key(cluster: str, job_id: str, array_task_id: int, start: dt.datetime) -> RunKey:
    return (cluster, job_id, int(array_task_id), start.astimezone(dt.timezone.utc))


def sacct_node_lists(client, since: dt.datetime | None, until: dt.datetime | None) -> dict[RunKey, str]:
    """Each run's node list as sacct has it (every user's allocations, each run of a requeued job),
    for the runs that overlap ``[since, until)``, keyed as the ledger keys its usage records."""
    from gpuhpc.ledger import ingest

    def local(t: dt.datetime) -> str:        # sacct reads times in the host's local zone
        return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

    start = since or dt.datetime(1970, 1, 2, tzinfo=dt.timezone.utc)
    rows = client.accounting(all_users=True, since=local(start), until=local(until) if until else None,
                             duplicates=True, allocations=True)
    out: dict[RunKey, str] = {}
    for view in ingest.group_jobs(rows, client.cluster_name()):
        for r in view.runs:
            if r.nodelist and r.nodelist not in ("None assigned", "(null)"):
                out[run_key(r.cluster, r.job_id, r.array_task_id, r.run_start)] = r.nodelist
    return out


def window(period: str | None, at: dt.datetime | None, since: dt.datetime | None,
           until: dt.datetime | None) -> tuple[dt.datetime | None, dt.datetime | None]:
    """``[since, until)``, or the ledger zone's ``period`` (day, week, month) holding ``at``."""
    from gpuhpc.ledger import periods

    if period is None:
        return since, until
    if since is not None or until is not None:
        raise UserInputError("give a period or a window, not both", field="--period",
                             hint="--period month --at 2026-11-15, or --since/--until")
    if period not in ("day", "week", "month"):
        raise UserInputError(f"unknown period {period!r}", field="--period", hint="day, week or month")
    tz = periods.ledger_zone()
    start = periods.period_start(period, at or dt.datetime.now(dt.timezone.utc), tz)
    return start, periods.period_end(period, start, tz)


def instance_cost(*, since: dt.datetime | None = None, until: dt.datetime | None = None,
                  node_lists: Mapping[RunKey, str], policy: str = OVERHEAD, url: str | None = None,
                  now: dt.datetime | None = None) -> InstanceCost:
    """The report over the instances whose life overlaps ``[since, until)`` and the ledger's runs
    that overlap it, with ``node_lists`` (:func:`sacct_node_lists`) saying where each run ran."""
    from sqlalchemy import or_, select

    from gpuhpc import hostlist
    from gpuhpc.ledger import db
    from gpuhpc.ledger.instances import spans
    from gpuhpc.ledger.orm import InstanceUsage, UsageRecord

    if policy not in POLICIES:
        raise UserInputError(f"unknown overhead policy {policy!r}", field="--overhead",
                             hint="overhead (report it per pool) or spread (to the pool's accounts by their cost)")
    now = now or dt.datetime.now(dt.timezone.utc)
    stmt = select(InstanceUsage).order_by(InstanceUsage.launched_at, InstanceUsage.cluster, InstanceUsage.instance_id)
    if until is not None:
        stmt = stmt.where(InstanceUsage.launched_at < until)
    if since is not None:
        stmt = stmt.where(or_(InstanceUsage.ended_at.is_(None), InstanceUsage.ended_at > since))
    lives: list[Life] = []
    runs: list[JobRun] = []
    unmatched: list[str] = []
    with db.session_scope(url) as s:
        for row in s.scalars(stmt):
            lives.append(Life(row.cluster, row.instance_id, row.node, row.pool, row.instance_type, row.market,
                              Fraction(row.price_per_hour), spans(row, now)))
        if lives:
            first = min(lf.spans["boot"][0] for lf in lives)
            last = max(max(b for _, b in lf.spans.values()) for lf in lives)
            lo, hi = max(first, since) if since else first, min(last, until) if until else last
            clusters = sorted({lf.cluster for lf in lives})
            rec = select(UsageRecord).where(UsageRecord.cluster.in_(clusters), UsageRecord.run_start < hi,
                                            or_(UsageRecord.run_end.is_(None), UsageRecord.run_end > lo))
            for r in s.scalars(rec):
                job = r.job_id if r.array_task_id < 0 else f"{r.job_id}_{r.array_task_id}"
                end = r.run_end or (r.run_start + dt.timedelta(seconds=r.elapsed_s))
                nodes = node_lists.get(run_key(r.cluster, r.job_id, r.array_task_id, r.run_start))
                if not nodes:
                    unmatched.append(job)
                    continue
                runs.append(JobRun(r.cluster, job, r.account_name, tuple(hostlist.expand(nodes)), r.run_start,
                                   end, r.gpus))
    rep = attribute(lives, runs, since=since, until=until, policy=policy)
    rep.unmatched = sorted(unmatched)
    return rep

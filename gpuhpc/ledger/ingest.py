"""Settle actual usage from sacct: ``gpuhpc ledger ingest``.

* One :class:`UsageRecord` per *run* of a job / array task, keyed by (cluster, job id,
  array task id, run start). ``sacct --duplicates`` lists every run of a requeued job, so a
  preempted run is charged for the time it actually ran, and the rerun separately, once.
* A re-ingest compares each run with what is stored and books only the difference as a new
  :class:`Charge` (zero for a finished run): ingest is idempotent, and a run that was still
  running last time is topped up rather than charged twice.
* Each batch (whole jobs only) is one transaction holding the quota locks: usage records,
  charges, quota counters and reservation holds change together, so a ``kill -9`` mid-ingest
  loses nothing and double-counts nothing; the rerun finishes the job.
* A reservation's hold is consumed by its job's charges and the rest released once every
  array task reached a final state (:meth:`JobState.is_finished`).
* A charge is booked in parts, one per local day (the ledger's zone,
  :mod:`gpuhpc.ledger.periods`) its new seconds ran in, each dated when its part began: a run
  across a period boundary counts in each period for the part inside it (docs/ledger.md,
  "Month end, for finance").
* Charges are only ever added (a trigger refuses UPDATE and DELETE, migration 0009): a run seen
  again is topped up by a new charge; the usage record keeps the run's totals so far. With the
  ``node_fail_refund`` policy on, a run that ended NODE_FAIL gets its charges back as a refund
  adjustment (:mod:`gpuhpc.ledger.adjust`).
* The ``gpuhpc.report()`` metrics files are the other half of the ingest:
  :mod:`gpuhpc.ledger.metrics_ingest`.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuhpc.ledger import adjust, audit, db, periods, pricing
from gpuhpc.ledger import admin as q
from gpuhpc.ledger.metrics_ingest import METRICS_FILE_MAX_BYTES, ingest_metrics  # noqa: F401 (ingest's callers)
from gpuhpc.ledger.quota import quota_applies
from gpuhpc.ledger.orm import (Account, Adjustment, IngestState, Quota, QuotaUsage, Reservation, ReservationHold,
                               ReservationStatus, User, utcnow)
from gpuhpc.slurm.parsers import AcctRow
from gpuhpc.slurm.state import JobState

log = logging.getLogger(__name__)

ZERO = Decimal(0)
SOURCE = "sacct"
OPEN = (ReservationStatus.held, ReservationStatus.submitted)
STALE_HOLD = dt.timedelta(hours=6)   # a hold with no job id after this long is released


def _fixed_local_tz() -> dt.tzinfo | None:
    """The local zone as a fixed offset when it has no DST (fast path), else None."""
    import time

    return dt.timezone(dt.timedelta(seconds=-time.timezone)) if not time.daylight else None


_LOCAL = _fixed_local_tz()


def parse_time(text: str) -> dt.datetime | None:
    """sacct's local ``2026-11-30T02:50:08`` -> aware UTC (None for Unknown/None)."""
    t = (text or "").strip()
    if not t or t in ("Unknown", "None", "N/A"):
        return None
    try:
        value = dt.datetime.fromisoformat(t)
    except ValueError:
        return None
    if value.tzinfo is None:
        # sacct prints the local time of the host
        value = value.replace(tzinfo=_LOCAL) if _LOCAL is not None else value.astimezone()
    return value.astimezone(dt.timezone.utc)


@dataclass(slots=True)
class Run:
    cluster: str
    job_id: str
    array_task_id: int
    run_start: dt.datetime
    run_end: dt.datetime | None
    state: str
    elapsed_s: int
    user: str
    account: str
    partition: str
    qos: str
    gpus: dict[str, int]
    job_name: str
    cpus: int = 0                 # what it held, for the max_share pricing policy (pricing.PriceCache.price_run)
    mem_mb: Fraction | int = 0
    nodelist: str = ""

    @property
    def key(self) -> tuple[str, str, int, dt.datetime]:
        return (self.cluster, self.job_id, self.array_task_id, self.run_start)


@dataclass
class JobView:
    """Everything sacct said about one job (all its tasks and runs)."""

    cluster: str
    job_id: str
    runs: list[Run] = field(default_factory=list)
    # per array task: (submit, state) of its latest record; pending ranges make the job open
    latest: dict[int, tuple[str, JobState]] = field(default_factory=dict)
    pending_tasks: bool = False

    @property
    def finished(self) -> bool:
        return not self.pending_tasks and bool(self.latest) and all(s.is_finished for _, s in self.latest.values())


def group_jobs(rows: Iterable[AcctRow], default_cluster: str = "") -> Iterator[JobView]:
    """Group sacct allocation rows by (cluster, job id), in input order."""
    views: dict[tuple[str, str], JobView] = {}
    gpu_cache: dict[tuple, tuple[dict[str, int], int, Fraction]] = {}     # AllocTRES -> GPUs, CPUs, memory
    for r in rows:
        if "." in r.job_id:            # a step, not an allocation
            continue
        cluster = r.cluster or default_cluster
        head, _, tail = r.job_id.partition("_")
        het = None
        if "+" in head:                       # heterogeneous job component "123+1"
            head, _, comp = head.partition("+")
            het = int(comp) if comp.isdigit() else 0
        key = (cluster, head)
        v = views.get(key)
        if v is None:
            v = views[key] = JobView(cluster, head)
        if tail and not tail.isdigit():       # "123_[4-9]": tasks not started yet
            v.pending_tasks = True
            continue
        task = int(tail) if tail else (-1 if het is None else -100 - het)   # het components: -100, -101, ...
        prev = v.latest.get(task)
        if prev is None or (r.submit, r.start) >= (prev[0], ""):
            v.latest[task] = (r.submit, r.state.state)
        start = parse_time(r.start)
        if start is None:
            continue
        tres_key = tuple(r.alloc_tres.items())
        held = gpu_cache.get(tres_key)
        if held is None:
            held = gpu_cache[tres_key] = ({k: n for k, n in r.gpus.items() if n > 0}, *pricing.alloc_cpus_mem(r.alloc_tres))
        gpus, cpus, mem = held
        v.runs.append(Run(cluster, head, task, start, parse_time(r.end), r.state.raw.split()[0] if r.state.raw else "",
                          max(r.elapsed_s, 0), r.user, r.account, r.partition, r.qos, gpus, r.name[:255],
                          cpus, mem, r.nodelist))
    for v in views.values():
        if len(v.runs) > 1:                   # the same run listed twice: keep the last word on it
            v.runs = list({r.key: r for r in v.runs}.values())
        yield v


def _batches(jobs: Iterable[JobView], size: int) -> Iterator[list[JobView]]:
    batch: list[JobView] = []
    n = 0
    for j in jobs:
        batch.append(j)
        n += max(len(j.runs), 1)
        if n >= size:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


@dataclass
class IngestResult:
    runs_seen: int = 0
    runs_new: int = 0
    runs_updated: int = 0
    charges: int = 0
    amount: Decimal = ZERO
    gpu_hours: Decimal = ZERO
    reservations_settled: int = 0
    reservations_expired: int = 0
    unpriced_runs: int = 0
    repriced_runs: int = 0
    repriced_amount: Decimal = ZERO
    metrics: int = 0
    batches: int = 0
    utilisation: int = 0          # run utilisation summaries stored (gpuhpc.monitoring.summaries)
    refunds: int = 0              # NODE_FAIL runs refunded (the node_fail_refund policy)
    refunded_amount: Decimal = ZERO

    def as_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in self.__dict__.items()}


def _price(book: pricing.PriceCache, run: Run, seconds: int | None = None) -> tuple[str, int, pricing.Price]:
    """The run's GPU type(s), GPU count and price for its elapsed time (or its first ``seconds``)."""
    gpus = run.gpus
    secs = run.elapsed_s if seconds is None else seconds
    if book.max_share:               # the pricing policy max_share: the largest share of the run's nodes
        return "+".join(sorted(gpus)), sum(gpus.values()), book.price_run(
            gpus, run.cpus, run.mem_mb, run.nodelist, secs, run.partition, run.qos, run.run_start)
    if not gpus:
        return "", 0, book.price(None, 0, secs, run.partition, run.qos, run.run_start)
    if len(gpus) == 1:
        ((gt, n),) = gpus.items()
        return gt, n, book.price(gt, n, secs, run.partition, run.qos, run.run_start)
    hours, amount, priced = ZERO, ZERO, True
    for gt, n in sorted(gpus.items()):
        p = book.price(gt, n, secs, run.partition, run.qos, run.run_start)
        hours += p.gpu_hours
        amount += p.amount
        priced = priced and p.priced
    rate = (amount / hours).quantize(pricing.QUANTUM) if hours else ZERO
    return "+".join(sorted(gpus)), sum(gpus.values()), pricing.Price(hours, rate, amount, priced)


class _Books:
    """Per-transaction cache of accounts, users, quotas and their period counters."""

    def __init__(self, s: Session, tz: dt.tzinfo = periods.UTC) -> None:
        self.s = s
        self.tz = tz
        self.accounts = {a.name: a for a in s.scalars(select(Account))}
        self.users = {name: uid for uid, name in s.execute(select(User.id, User.name))}
        self.quotas: dict[int, list[Quota]] = defaultdict(list)
        for quota in q.lock_all_quotas(s):
            self.quotas[quota.account_id].append(quota)
        self._buckets: dict[tuple[int, dt.datetime], QuotaUsage] = {}
        self._qcache: dict[tuple[str, str, str], list[Quota]] = {}
        self._pstart: dict[tuple, dt.datetime] = {}
        self._pending: dict[tuple[int, dt.datetime], list[Decimal]] = {}

    def quotas_for(self, account: str, user: str, cluster: str) -> list[Quota]:
        """The quotas a run of ``user`` in ``account`` on ``cluster`` counts in: the account's and
        the user's, each for every cluster or for this one."""
        key = (account, user, cluster)
        hit = self._qcache.get(key)
        if hit is None:
            acct = self.accounts.get(account)
            uid = self.users.get(user)
            hit = self._qcache[key] = [] if acct is None else \
                [x for x in self.quotas.get(acct.id, ()) if (x.user_id is None or x.user_id == uid)
                 and quota_applies(x.cluster, cluster)]
        return hit

    def add_used(self, quota: Quota, at: dt.datetime, hours: Decimal, money: Decimal) -> None:
        """Count usage in the quota's period containing ``at`` (applied in :meth:`apply`)."""
        pkey = (quota.period, at.astimezone(self.tz).date())
        start = self._pstart.get(pkey)
        if start is None:
            start = self._pstart[pkey] = periods.period_start(quota.period.value, at, self.tz)
        key = (quota.id, start)
        acc = self._pending.get(key)
        if acc is None:
            # get/create the counter row now, before this batch's charges exist in the table
            self.bucket(quota, at)
            acc = self._pending[key] = [ZERO, ZERO]
        acc[0] += hours
        acc[1] += money

    def apply(self) -> None:
        for key, (hours, money) in self._pending.items():
            b = self._buckets[key]
            b.used_gpu_hours = b.used_gpu_hours + hours
            b.used_money = b.used_money + money
        self._pending.clear()

    def bucket(self, quota: Quota, at: dt.datetime) -> QuotaUsage:
        key = (quota.id, periods.period_start(quota.period.value, at, self.tz))
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = q.bucket(self.s, quota, at)
        return b


class StoredRun(NamedTuple):
    """What the ledger holds for one run already."""

    id: int
    gpu_hours: Decimal
    amount: Decimal
    elapsed_s: int
    state: str


class ChargeRow(NamedTuple):
    usage_id: int
    reservation_id: int | None
    account: str
    user: str
    gpu_hours: Decimal
    rate: Decimal
    amount: Decimal
    bucket_at: dt.datetime
    created_at: dt.datetime
    kind: str = "usage"          # or "reprice": a run charged 0 for want of a price, charged now; "refund"
    adjustment_id: int | None = None     # a refund's adjustment (gpuhpc.ledger.adjust)


class PricedRun(NamedTuple):
    run: Run
    key: tuple                   # (cluster, job id, array task id, start as stored)
    gpu_type: str
    gpus: int
    price: pricing.Price
    reservation: Reservation | None


_USAGE_INSERT = ("INSERT INTO usage_records (cluster, job_id, array_task_id, run_start, run_end, state, elapsed_s, "
                 "user_name, account_name, partition, qos, gpu_type, gpus, job_name, gpu_hours, amount, priced) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_CHARGE_INSERT = ("INSERT INTO charges (usage_id, reservation_id, account_name, user_name, gpu_hours, rate, amount, "
                  "bucket_at, created_at, kind, adjustment_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _chunks(ids: set[str], n: int = 500) -> Iterator[list[str]]:
    ordered = sorted(ids)
    for i in range(0, len(ordered), n):
        yield ordered[i:i + n]


class _Batch:
    """One ingest batch (whole jobs) in one transaction: look up what is stored, price each
    run, insert new runs and top up changed ones, count the charges against the quotas and
    the reservations' holds, and settle the reservations of jobs that are over."""

    def __init__(self, s: Session, book: pricing.PriceCache, jobs: list[JobView], res: IngestResult,
                 active: set[str] | None, tz: dt.tzinfo | None = None) -> None:
        self.s, self.book, self.jobs, self.res, self.active = s, book, jobs, res, active
        self.active_cluster: str | None = None       # the cluster whose squeue ``active`` is (None: every one)
        self.tz = periods.ledger_zone() if tz is None else tz
        self.books = _Books(s, self.tz)
        self.tx = q.session_tx(s)
        self.now = utcnow()
        self.by_cluster: dict[str, set[str]] = defaultdict(set)
        for j in jobs:
            self.by_cluster[j.cluster].add(j.job_id)
        self.charges: list[ChargeRow] = []
        self._ts: dict[dt.datetime, object] = {}

    def ts(self, v: dt.datetime | None) -> object:
        if v is None:
            return None
        hit = self._ts.get(v)
        if hit is None:
            hit = self._ts[v] = self.tx.ts(v)
        return hit

    # ---------------------------------------------------------------- what is stored
    def key(self, run: Run) -> tuple:
        """A run's key as the database stores it (its start time in the stored form)."""
        return (run.cluster, run.job_id, run.array_task_id, self.ts(run.run_start))

    def _stored(self, columns: str, by_cluster: dict[str, set[str]]) -> Iterator[tuple]:
        """``(key, *columns)`` of the stored runs of these jobs (keys as :meth:`key` makes them)."""
        tx = self.tx
        for cluster, ids in by_cluster.items():
            for chunk in _chunks(ids):
                for job_id, task, start, *rest in tx.execute(
                        f"SELECT job_id, array_task_id, run_start, {columns} FROM usage_records "
                        f"WHERE cluster = ? AND job_id IN ({', '.join('?' * len(chunk))})", (cluster, *chunk)):
                    if not tx.pg and len(start) != 26:          # not the form written here: normalise
                        start = tx.ts(tx.parse_ts(start))
                    yield ((cluster, job_id, task, start), *rest)

    def stored_runs(self) -> dict[tuple, StoredRun]:
        tx = self.tx
        return {key: StoredRun(uid, tx.dec(hours), tx.dec(amount), elapsed, state)
                for key, uid, hours, amount, elapsed, state
                in self._stored("id, gpu_hours, amount, elapsed_s, state", self.by_cluster)}

    def reservations(self) -> tuple[dict[tuple[str, str], Reservation], dict[int, list[ReservationHold]]]:
        """The latest reservation of each job, and the holds of those still open."""
        resv: dict[tuple[str, str], Reservation] = {}
        for cluster, ids in self.by_cluster.items():
            for chunk in _chunks(ids):
                for r in self.s.scalars(select(Reservation).where(Reservation.cluster == cluster,
                                                                  Reservation.job_id.in_(chunk))):
                    prev = resv.get((cluster, r.job_id))
                    if prev is None or prev.id < r.id:
                        resv[(cluster, r.job_id)] = r
        holds: dict[int, list[ReservationHold]] = defaultdict(list)
        open_ids = [r.id for r in resv.values() if r.status in OPEN]
        if open_ids:
            for h in self.s.scalars(select(ReservationHold).where(ReservationHold.reservation_id.in_(open_ids))):
                holds[h.reservation_id].append(h)
        return resv, holds

    # ---------------------------------------------------------------- booking
    def pieces(self, run: Run, old_s: int, old: tuple[Decimal, Decimal], new: tuple[Decimal, Decimal],
               reprice: bool = False) -> list[tuple[dt.datetime, Decimal, Decimal]]:
        """``(bucket_at, GPU-hours, money)`` of each part of the change from ``old`` (the run
        as stored, ``old_s`` seconds long) to ``new`` (the run now), cut at the local midnights
        (ledger zone) inside the seconds that are new: each part counts in the day, week and
        month it ran in, and the parts add up exactly to ``new - old``. A part's share is the
        run priced up to its end minus up to its start (the cumulative price), so a day that
        is over never changes when the run grows. ``reprice``: the run's money was 0 (no
        price) and is now priced: the money is spread over the whole run, the GPU-hours stay."""
        start = run.run_start
        a = start + dt.timedelta(seconds=0 if reprice else max(min(old_s, run.elapsed_s), 0))
        d_total = (new[0] - old[0], new[1] - old[1])
        cuts = periods.boundaries("day", a, start + dt.timedelta(seconds=run.elapsed_s), self.tz)
        if not cuts:
            return [(a, *d_total)]
        out: list[tuple[dt.datetime, Decimal, Decimal]] = []
        prev, frm = (ZERO, ZERO), a
        for cut in cuts:
            price = _price(self.book, run, int((cut - start).total_seconds()))[2]
            upto = (ZERO, price.amount - old[1]) if reprice else (price.gpu_hours - old[0], price.amount - old[1])
            out.append((frm, upto[0] - prev[0], upto[1] - prev[1]))
            prev, frm = upto, cut
        out.append((frm, d_total[0] - prev[0], d_total[1] - prev[1]))
        return out

    def book_delta(self, run: Run, r: Reservation | None, usage_id: int, d_hours: Decimal, d_amount: Decimal,
                   rate: Decimal, kind: str = "usage", *, old_s: int = 0,
                   old: tuple[Decimal, Decimal] = (ZERO, ZERO), reprice: bool = False) -> None:
        """Count a charge against the quotas and take it out of the reservation's holds. The
        charge is booked in parts (:meth:`pieces`), one charge row per local day the new seconds
        ran in, each dated (``bucket_at``) when its part began: a run across a period boundary
        counts in each period for the part inside it (Slurm's usage, reset at the boundary,
        counts the tail in the new period too). Holds are consumed in the reservation's own
        period counters, whatever the period the usage lands in."""
        parts = self.pieces(run, old_s, old, (old[0] + d_hours, old[1] + d_amount), reprice)
        quotas = self.books.quotas_for(run.account, run.user, run.cluster)
        for at, h, m in parts:
            for quota in quotas:
                self.books.add_used(quota, at, h, m)
        for h in self.holds.get(r.id, ()) if r is not None else ():
            take_h = min(max(d_hours, ZERO), h.gpu_hours)
            take_m = min(max(d_amount, ZERO), h.money)
            if take_h or take_m:
                hb = self.s.get(QuotaUsage, h.quota_usage_id)
                hb.held_gpu_hours = hb.held_gpu_hours - take_h
                hb.held_money = hb.held_money - take_m
                h.gpu_hours = h.gpu_hours - take_h
                h.money = h.money - take_m
        self.res.amount += d_amount
        self.res.gpu_hours += d_hours
        booked = [p for p in parts if p[1] or p[2]] or parts[:1]
        self.res.charges += len(booked)
        for at, h, m in booked:
            self.charges.append(ChargeRow(usage_id, r.id if r else None, run.account, run.user, h, rate, m, at,
                                          self.now, kind))

    def update_run(self, p: PricedRun, old: StoredRun) -> None:
        """A run seen before: top it up when it ran longer (or changed state). A run that did
        not change is left alone even if the price book did: that is ``--reprice``'s job."""
        run, price = p.run, p.price
        state = run.state[:32]
        if old.elapsed_s == run.elapsed_s and old.state == state:
            return
        d_hours, d_amount = price.gpu_hours - old.gpu_hours, price.amount - old.amount
        self.tx.execute("UPDATE usage_records SET run_end = ?, state = ?, elapsed_s = ?, gpu_hours = ?, amount = ?, "
                  "priced = ? WHERE id = ?", (self.ts(run.run_end), state, run.elapsed_s, self.tx.num(price.gpu_hours),
                                              self.tx.num(price.amount), price.priced, old.id))
        self.res.runs_updated += 1
        if d_hours or d_amount:
            self.book_delta(run, p.reservation, old.id, d_hours, d_amount, price.rate, old_s=old.elapsed_s,
                            old=(old.gpu_hours, old.amount))

    def insert_runs(self, new: list[PricedRun]) -> None:
        """Insert new runs (ids from the database), then book their first charges."""
        if not new:
            return
        tx, num = self.tx, self.tx.num
        tx.execute_many(_USAGE_INSERT, [
            (*p.key, None if r.run_end is None else tx.ts(r.run_end), r.state[:32], r.elapsed_s, r.user,
             r.account, r.partition, r.qos, p.gpu_type, p.gpus, r.job_name, num(p.price.gpu_hours),
             num(p.price.amount), p.price.priced)
            for p in new for r in (p.run,)])
        by_cluster: dict[str, set[str]] = defaultdict(set)
        for p in new:
            by_cluster[p.run.cluster].add(p.run.job_id)
        ids = dict(self._stored("id", by_cluster))
        for p in new:
            self.book_delta(p.run, p.reservation, ids[p.key], p.price.gpu_hours, p.price.amount, p.price.rate)

    def insert_charges(self) -> None:
        tx, ts, num = self.tx, self.ts, self.tx.num
        if self.charges:
            tx.execute_many(_CHARGE_INSERT, [
                (c.usage_id, c.reservation_id, c.account, c.user, num(c.gpu_hours), num(c.rate),
                 num(c.amount), ts(c.bucket_at), ts(c.created_at), c.kind, c.adjustment_id) for c in self.charges])
        self.charges = []

    def refund_node_fail(self, runs: list[Run]) -> None:
        """The ``node_fail_refund`` policy: a run that ended NODE_FAIL gets back what its charges
        net to, per day they were booked in (a ``refund`` charge each, with one adjustment per
        run saying why), so each quota period gets back what it counted. Idempotent: a run
        refunded before nets to zero and books nothing; a later top-up is refunded too."""
        failed = [r for r in runs if r.state.startswith("NODE_FAIL")]
        if not failed:
            return
        by_cluster: dict[str, set[str]] = defaultdict(set)
        for r in failed:
            by_cluster[r.cluster].add(r.job_id)
        ids = dict(self._stored("id", by_cluster))
        uid_of = {ids[self.key(r)]: r for r in failed if self.key(r) in ids}
        tx = self.tx
        nets: dict[int, list[tuple[dt.datetime, Decimal, Decimal]]] = defaultdict(list)
        chunk_ids = sorted(uid_of)
        for i in range(0, len(chunk_ids), 500):
            chunk = chunk_ids[i:i + 500]
            for uid, at, h, m in tx.execute(
                    f"SELECT usage_id, bucket_at, sum(gpu_hours), sum(amount) FROM charges WHERE usage_id IN "
                    f"({', '.join('?' * len(chunk))}) GROUP BY usage_id, bucket_at", chunk).fetchall():
                h, m = pricing.to_decimal(tx.dec(h)), pricing.to_decimal(tx.dec(m))
                if h or m:
                    nets[uid].append((tx.parse_ts(at), h, m))
        who = f"policy node_fail_refund ({audit.actor(self.s)})"[:128]
        for uid, parts in sorted(nets.items()):
            run = uid_of[uid]
            hours, money = sum((p[1] for p in parts), ZERO), sum((p[2] for p in parts), ZERO)
            job = run.job_id if run.array_task_id < 0 else f"{run.job_id}_{run.array_task_id}"
            a = Adjustment(kind="refund", account_name=run.account, user_name=run.user, cluster=run.cluster,
                           job_id=job[:32], gpu_hours=-hours, amount=-money,
                           reason=f"NODE_FAIL: run started {run.run_start.isoformat()} refunded by the "
                                  f"node_fail_refund policy", detail="", bucket_at=min(p[0] for p in parts),
                           created_by=who, created_at=self.now)
            self.s.add(a)
            self.s.flush()
            for at, h, m in parts:
                for quota in self.books.quotas_for(run.account, run.user, run.cluster):
                    self.books.add_used(quota, at, -h, -m)
                self.charges.append(ChargeRow(uid, None, run.account, run.user, -h, ZERO, -m, at, self.now,
                                              "refund", a.id))
            audit.record(self.s, "adjust.refund", f"account {run.account} user {run.user} job {job}", None,
                         {"adjustment": a.id, "gpu_hours": str(-hours), "amount": str(-money)})
            self.res.refunds += 1
            self.res.refunded_amount += money
        self.books.apply()
        self.s.flush()
        self.insert_charges()

    def settle(self) -> None:
        """Release what is left of the holds of reservations whose jobs are over."""
        for j in self.jobs:
            r = self.resv.get((j.cluster, j.job_id))
            if r is None or r.status not in OPEN:
                continue
            # a job no longer in the queue is over even if its last record says PREEMPTED/NODE_FAIL
            asked = self.active is not None and (self.active_cluster is None or j.cluster == self.active_cluster)
            done = j.finished or (asked and j.job_id not in self.active and not j.pending_tasks)
            if done and (r.array_size <= 1 or len(j.latest) >= r.array_size):
                q.release_holds(self.s, r, ReservationStatus.settled, self.now)
                self.res.reservations_settled += 1

    # ----------------------------------------------------------------
    def run(self) -> None:
        runs = [r for j in self.jobs for r in j.runs]
        self.res.runs_seen += len(runs)
        existing = self.stored_runs()
        self.resv, self.holds = self.reservations()
        new: list[PricedRun] = []
        for run in runs:
            gpu_type, ngpus, price = _price(self.book, run)
            if not price.priced:
                self.res.unpriced_runs += 1
            p = PricedRun(run, self.key(run), gpu_type, ngpus, price, self.resv.get((run.cluster, run.job_id)))
            old = existing.get(p.key)
            if old is None:
                new.append(p)
            else:
                self.update_run(p, old)
        self.res.runs_new += len(new)
        self.insert_runs(new)
        self.books.apply()
        self.s.flush()              # counters and holds, before the charges and the settlement below them
        self.insert_charges()
        if adjust.policy(self.s, "node_fail_refund") == "on":
            self.refund_node_fail(runs)
        self.settle()
        self.s.flush()
        self.res.batches += 1


def reprice(*, url: str | None = None, res: IngestResult | None = None) -> IngestResult:
    """Charge the runs that were settled without a price (charged 0) now that the price book
    has a rate for their GPU type at their start. History is kept: the 0 charge stays and the
    correction is a charge of its own, of kind ``reprice``, split over the days the run ran in
    as its usage charges are (each part counted in the quota period it ran in). Idempotent: a repriced run is marked priced; a run whose
    type still has no price is left for a later reprice."""
    res = res or IngestResult()
    with db.session_scope(url) as s:
        _lock_state(s)
        book = pricing.PriceCache(q.load_price_book(s))
        batch = _Batch(s, book, [], res, None)
        tx = batch.tx
        rows = tx.execute("SELECT id, cluster, job_id, array_task_id, run_start, run_end, state, elapsed_s, user_name, "
                    "account_name, partition, qos, gpu_type, gpus, job_name, gpu_hours, amount FROM usage_records "
                    "WHERE priced = ? ORDER BY id", (False,)).fetchall()
        todo: list[tuple[int, Run, Decimal, Decimal, pricing.Price]] = []
        for uid, cluster, job_id, task, start, end, state, elapsed, user, account, part, qos, gpu_type, gpus, name, \
                hours, amount in rows:
            if "+" in gpu_type:          # several GPU types in one run: the split per type is not stored
                continue
            run = Run(cluster, job_id, task, tx.parse_ts(start), tx.parse_ts(end) if end else None, state, elapsed,
                      user, account, part, qos, {gpu_type: gpus} if gpu_type else {}, name)
            price = _price(book, run)[2]
            if price.priced:
                todo.append((uid, run, tx.dec(hours), tx.dec(amount), price))
                batch.by_cluster[cluster].add(job_id)
        batch.resv, batch.holds = batch.reservations()
        for uid, run, hours, amount, price in todo:
            tx.execute("UPDATE usage_records SET gpu_hours = ?, amount = ?, priced = ? WHERE id = ?",
                 (tx.num(price.gpu_hours), tx.num(price.amount), True, uid))
            batch.book_delta(run, batch.resv.get((run.cluster, run.job_id)), uid, price.gpu_hours - hours,
                             price.amount - amount, price.rate, "reprice", old_s=run.elapsed_s, old=(hours, amount),
                             reprice=True)
            res.repriced_runs += 1
            res.repriced_amount += price.amount - amount
        batch.books.apply()
        s.flush()
        batch.insert_charges()
    return res


def expire_stale_holds(s: Session, now: dt.datetime, res: IngestResult) -> None:
    """Holds whose sbatch never reported back (no job id after STALE_HOLD) are released."""
    for r in list(s.scalars(select(Reservation).where(Reservation.status == ReservationStatus.held,
                                                      Reservation.job_id.is_(None),
                                                      Reservation.created_at < now - STALE_HOLD))):
        q.release_holds(s, r, ReservationStatus.released, now)
        res.reservations_expired += 1


def _lock_state(s: Session, name: str = SOURCE) -> IngestState:
    st = s.scalar(select(IngestState).where(IngestState.name == name).with_for_update())
    if st is None:
        st = IngestState(name=name, last_detail="")
        s.add(st)
        s.flush()
    return st


def watermark_name(cluster: str) -> str:
    """The ingest-state row of one cluster's watermark (migration 0011): ``sacct:CLUSTER``."""
    return f"{SOURCE}:{cluster}"


def ingest_rows(rows: Iterable[AcctRow], *, url: str | None = None, batch_size: int = 5000,
                default_cluster: str = "", since: dt.datetime | None = None,
                on_batch: Callable[[IngestResult], None] | None = None,
                active: set[str] | None = None, nodes: pricing.Fleet | None = None,
                clusters: Iterable[str] | None = None, active_cluster: str | None = None) -> IngestResult:
    """Ingest parsed sacct rows (``--allocations --duplicates``). Safe to rerun any time.

    ``clusters``: the clusters these rows are all of (sacct's ``-M``), each of whose watermark
    (``since``, the run's time) is moved on, whether it had jobs or not; None: ``default_cluster``
    and the clusters the rows name. A run is keyed by its cluster, so job 42 of two clusters is
    two runs.

    ``active``: job ids (array job ids) still in the queue, from squeue; when given, a job
    that left the queue settles its reservation even if sacct's last word was PREEMPTED.
    ``active_cluster``: the cluster whose queue ``active`` is (None: the rows' only cluster); a
    job of another cluster settles on sacct's word alone.
    ``nodes``: the cluster's nodes (:func:`gpuhpc.ledger.pricing.fleet`), which the ``max_share``
    pricing policy needs; None: asked of Slurm (``scontrol show node``) when that policy is on. A
    run whose node shape they do not decide is priced per GPU."""
    import gc

    # bulk object creation: the cyclic GC would rescan every live row again and again
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _ingest_rows(rows, url=url, batch_size=batch_size, default_cluster=default_cluster, since=since,
                            on_batch=on_batch, active=active, nodes=nodes, clusters=clusters,
                            active_cluster=active_cluster)
    finally:
        if gc_was_enabled:
            gc.enable()


def _ingest_rows(rows, *, url, batch_size, default_cluster, since, on_batch, active, nodes=None,
                 clusters=None, active_cluster=None) -> IngestResult:
    res = IngestResult()
    seen: set[str] = set() if clusters is None else {c for c in clusters if c}
    if clusters is None and default_cluster:
        seen.add(default_cluster)
    tz = periods.ledger_zone()
    with db.session_scope(url) as s:
        _lock_state(s)
        prices, mode = q.load_price_book(s), adjust.policy(s, pricing.POLICY)
    if mode == pricing.MAX_SHARE and nodes is None:
        from gpuhpc.slurm.client import SlurmClient        # after the session: no Slurm call inside a transaction

        nodes = pricing.fleet(SlurmClient().nodes())
    book = pricing.PriceCache(prices, mode=mode, nodes=nodes)
    jobs = group_jobs(rows, default_cluster)
    if clusters is None:
        jobs = _noting_clusters(jobs, seen)
    for batch in _batches(jobs, batch_size):
        with db.session_scope(url) as s:
            _lock_state(s)
            b = _Batch(s, book, batch, res, active, tz)
            b.active_cluster = active_cluster
            b.run()
        if on_batch:
            on_batch(res)
    with db.session_scope(url) as s:
        st = _lock_state(s)
        q.lock_all_quotas(s)
        now = utcnow()
        expire_stale_holds(s, now, res)
        st.last_run_at = now
        if since is not None:
            st.last_since = since
        st.last_detail = json.dumps(res.as_dict())
        for cluster in sorted(seen):            # each cluster's own watermark
            cst = _lock_state(s, watermark_name(cluster))
            cst.last_run_at = now
            if since is not None:
                cst.last_since = since
            cst.last_detail = st.last_detail
    return res


def _noting_clusters(jobs: Iterable[JobView], seen: set[str]) -> Iterator[JobView]:
    for j in jobs:
        seen.add(j.cluster)
        yield j


def default_since(*, url: str | None = None, now: dt.datetime | None = None,
                  clusters: Iterable[str] | None = None) -> dt.datetime:
    """A day before the last ingest of ``clusters`` (the earliest of their watermarks), or the
    oldest open reservation on them, whichever is earlier; 30 days back for a cluster never
    ingested. A ledger from before migration 0011 has no cluster's watermark yet: its one
    ``sacct`` row's last run stands for every cluster then. ``clusters`` None: the ledger as a
    whole (every cluster's watermark, or that row's)."""
    now = now or utcnow()
    first = now - dt.timedelta(days=30)
    with db.session_scope(url) as s:
        marks = {st.name[len(SOURCE) + 1:]: st.last_run_at
                 for st in s.scalars(select(IngestState).where(IngestState.name.like(f"{SOURCE}:%")))}
        legacy = s.get(IngestState, SOURCE)
        if not marks and legacy is not None and legacy.last_run_at is not None:
            runs = [legacy.last_run_at]        # the first ingest after the upgrade to 0011
        elif clusters is None:
            runs = list(marks.values()) or [None]
        else:
            runs = [marks.get(c) for c in clusters] or [None]
        cands = [first if t is None else t - dt.timedelta(days=1) for t in runs]
        stmt = select(Reservation.created_at).where(
            Reservation.status.in_([ReservationStatus.held, ReservationStatus.submitted]))
        if clusters is not None:
            stmt = stmt.where(Reservation.cluster.in_(list(clusters)))
        oldest = s.scalar(stmt.order_by(Reservation.created_at).limit(1))
        if oldest is not None:
            cands.append(oldest - dt.timedelta(minutes=5))
    return min(cands)


def open_reservation_jobs(*, url: str | None = None, clusters: Iterable[str] | None = None) -> list[str]:
    """Job ids of the open reservations (on ``clusters``; None: every cluster)."""
    want = None if clusters is None else set(clusters)
    with db.session_scope(url) as s:
        return sorted({r.job_id for r in q.open_reservations(s) if r.job_id and (want is None or r.cluster in want)})


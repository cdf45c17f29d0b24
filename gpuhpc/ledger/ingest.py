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
"""
from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.orm import Session

from gpuhpc.ledger import db, pricing
from gpuhpc.ledger import admin as q
from gpuhpc.ledger.orm import (Account, Charge, IngestState, JobMetric, Quota, QuotaUsage, Reservation,
                               ReservationHold, ReservationStatus, UsageRecord, User, utcnow)
from gpuhpc.slurm.parsers import AcctRow
from gpuhpc.slurm.state import JobState

ZERO = Decimal(0)
SOURCE = "sacct"
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
    gpu_cache: dict[tuple, dict[str, int]] = {}
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
        gpus = gpu_cache.get(tres_key)
        if gpus is None:
            gpus = gpu_cache[tres_key] = {k: n for k, n in r.gpus.items() if n > 0}
        v.runs.append(Run(cluster, head, task, start, parse_time(r.end), r.state.raw.split()[0] if r.state.raw else "",
                          max(r.elapsed_s, 0), r.user, r.account, r.partition, r.qos, gpus, r.name[:255]))
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
    metrics: int = 0
    batches: int = 0

    def as_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Decimal) else v) for k, v in self.__dict__.items()}


def _price(book: pricing.PriceCache, run: Run) -> tuple[str, int, pricing.Price]:
    gpus = run.gpus
    if not gpus:
        return "", 0, book.price(None, 0, run.elapsed_s, run.partition, run.qos, run.run_start)
    if len(gpus) == 1:
        ((gt, n),) = gpus.items()
        return gt, n, book.price(gt, n, run.elapsed_s, run.partition, run.qos, run.run_start)
    hours, amount, priced = ZERO, ZERO, True
    for gt, n in sorted(gpus.items()):
        p = book.price(gt, n, run.elapsed_s, run.partition, run.qos, run.run_start)
        hours += p.gpu_hours
        amount += p.amount
        priced = priced and p.priced
    rate = (amount / hours).quantize(pricing.QUANTUM) if hours else ZERO
    return "+".join(sorted(gpus)), sum(gpus.values()), pricing.Price(hours, rate, amount, priced)


class _Books:
    """Per-transaction cache of accounts, users, quotas and their period counters."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.accounts = {a.name: a for a in s.scalars(select(Account))}
        self.users = {name: uid for uid, name in s.execute(select(User.id, User.name))}
        self.quotas: dict[int, list[Quota]] = defaultdict(list)
        for quota in q.lock_all_quotas(s):
            self.quotas[quota.account_id].append(quota)
        self._buckets: dict[tuple[int, dt.datetime], QuotaUsage] = {}
        self._qcache: dict[tuple[str, str], list[Quota]] = {}
        self._pstart: dict[tuple, dt.datetime] = {}
        self._pending: dict[tuple[int, dt.datetime], list[Decimal]] = {}

    def quotas_for(self, account: str, user: str) -> list[Quota]:
        key = (account, user)
        hit = self._qcache.get(key)
        if hit is None:
            acct = self.accounts.get(account)
            uid = self.users.get(user)
            hit = self._qcache[key] = [] if acct is None else \
                [x for x in self.quotas.get(acct.id, ()) if x.user_id is None or x.user_id == uid]
        return hit

    def add_used(self, quota: Quota, at: dt.datetime, hours: Decimal, money: Decimal) -> None:
        """Count usage in the quota's period containing ``at`` (applied in :meth:`apply`)."""
        pkey = (quota.period, at.date())
        start = self._pstart.get(pkey)
        if start is None:
            start = self._pstart[pkey] = pricing.period_start(quota.period.value, at)
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
        key = (quota.id, pricing.period_start(quota.period.value, at))
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = q.bucket(self.s, quota, at)
        return b


def _ingest_batch(s: Session, book: pricing.PriceCache, jobs: list[JobView], res: IngestResult,
                  active: set[str] | None) -> None:
    books = _Books(s)
    runs = [r for j in jobs for r in j.runs]
    res.runs_seen += len(runs)
    # what is stored already, for these jobs
    existing: dict[tuple, tuple[int, Decimal, Decimal, int, str]] = {}
    by_cluster: dict[str, set[str]] = defaultdict(set)
    for j in jobs:
        by_cluster[j.cluster].add(j.job_id)
    for cluster, ids in by_cluster.items():
        ids_l = sorted(ids)
        for i in range(0, len(ids_l), 500):
            for row in s.execute(select(UsageRecord.id, UsageRecord.job_id, UsageRecord.array_task_id,
                                        UsageRecord.run_start, UsageRecord.gpu_hours, UsageRecord.amount,
                                        UsageRecord.elapsed_s, UsageRecord.state)
                                 .where(UsageRecord.cluster == cluster, UsageRecord.job_id.in_(ids_l[i:i + 500]))):
                existing[(cluster, row.job_id, row.array_task_id, row.run_start)] = (
                    row.id, row.gpu_hours, row.amount, row.elapsed_s, row.state)
    # open reservations of these jobs
    resv: dict[tuple[str, str], Reservation] = {}
    for cluster, ids in by_cluster.items():
        ids_l = sorted(ids)
        for i in range(0, len(ids_l), 500):
            for r in s.scalars(select(Reservation).where(Reservation.cluster == cluster,
                                                         Reservation.job_id.in_(ids_l[i:i + 500]))):
                prev = resv.get((cluster, r.job_id))
                if prev is None or prev.id < r.id:
                    resv[(cluster, r.job_id)] = r
    holds: dict[int, list[ReservationHold]] = defaultdict(list)
    open_ids = [r.id for r in resv.values() if r.status in (ReservationStatus.held, ReservationStatus.submitted)]
    if open_ids:
        for h in s.scalars(select(ReservationHold).where(ReservationHold.reservation_id.in_(open_ids))):
            holds[h.reservation_id].append(h)

    new_rows: list[tuple] = []
    new_meta: list[tuple[Run, pricing.Price, Reservation | None]] = []
    charges: list[tuple] = []
    now = utcnow()

    def book_delta(run: Run, r: Reservation | None, d_hours: Decimal, d_amount: Decimal) -> dt.datetime:
        bucket_at = r.created_at if r is not None else run.run_start
        for quota in books.quotas_for(run.account, run.user):
            books.add_used(quota, bucket_at, d_hours, d_amount)
        if r is not None and r.id in holds:
            for h in holds[r.id]:
                take_h = min(max(d_hours, ZERO), h.gpu_hours)
                take_m = min(max(d_amount, ZERO), h.money)
                if take_h or take_m:
                    hb = s.get(QuotaUsage, h.quota_usage_id)
                    hb.held_gpu_hours = hb.held_gpu_hours - take_h
                    hb.held_money = hb.held_money - take_m
                    h.gpu_hours = h.gpu_hours - take_h
                    h.money = h.money - take_m
        res.charges += 1
        res.amount += d_amount
        res.gpu_hours += d_hours
        return bucket_at

    for run in runs:
        gpu_type, ngpus, price = _price(book, run)
        if not price.priced:
            res.unpriced_runs += 1
        r = resv.get((run.cluster, run.job_id))
        old = existing.get(run.key)
        if old is None:
            new_rows.append((run.cluster, run.job_id, run.array_task_id, run.run_start, run.run_end, run.state[:32],
                             run.elapsed_s, run.user, run.account, run.partition, run.qos, gpu_type, ngpus,
                             run.job_name, price.gpu_hours, price.amount))
            new_meta.append((run, price, r))
            res.runs_new += 1
            continue
        uid, old_hours, old_amount, old_elapsed, old_state = old
        d_hours, d_amount = price.gpu_hours - old_hours, price.amount - old_amount
        if not d_hours and not d_amount and old_elapsed == run.elapsed_s and old_state == run.state[:32]:
            continue
        s.execute(update(UsageRecord).where(UsageRecord.id == uid).values(
            run_end=run.run_end, state=run.state[:32], elapsed_s=run.elapsed_s,
            gpu_hours=price.gpu_hours, amount=price.amount))
        res.runs_updated += 1
        if d_hours or d_amount:
            bucket_at = book_delta(run, r, d_hours, d_amount)
            charges.append((uid, r.id if r else None, run.account, run.user, d_hours, price.rate, d_amount,
                            bucket_at, now))
    if new_rows:
        ids = _insert_usage(s, new_rows)
        for uid, (run, price, r) in zip(ids, new_meta):
            bucket_at = book_delta(run, r, price.gpu_hours, price.amount)
            charges.append((uid, r.id if r else None, run.account, run.user, price.gpu_hours, price.rate,
                            price.amount, bucket_at, now))
    books.apply()
    if charges:
        _insert_charges(s, charges)
    # settle reservations whose jobs are over
    for j in jobs:
        r = resv.get((j.cluster, j.job_id))
        if r is None or r.status not in (ReservationStatus.held, ReservationStatus.submitted):
            continue
        # a job no longer in the queue is over even if its last record says PREEMPTED/NODE_FAIL
        done = j.finished or (active is not None and j.job_id not in active and not j.pending_tasks)
        if done and (r.array_size <= 1 or len(j.latest) >= r.array_size):
            q.release_holds(s, r, ReservationStatus.settled)
            res.reservations_settled += 1
    s.flush()
    res.batches += 1


_USAGE_COLS = ("cluster", "job_id", "array_task_id", "run_start", "run_end", "state", "elapsed_s", "user_name",
               "account_name", "partition", "qos", "gpu_type", "gpus", "job_name", "gpu_hours", "amount")
_CHARGE_COLS = ("usage_id", "reservation_id", "account_name", "user_name", "gpu_hours", "rate", "amount",
                "bucket_at", "created_at")


def _ts(v: dt.datetime | None) -> str | None:
    """How SQLAlchemy stores our UTCDateTime on SQLite (naive UTC, microseconds)."""
    if v is None:
        return None
    if v.tzinfo is not dt.timezone.utc:
        v = v.astimezone(dt.timezone.utc)
    return v.isoformat(" ", "microseconds")[:26]     # drop "+00:00"


_TS_MEMO: dict[dt.datetime, str] = {}


def _ts_memo(v: dt.datetime) -> str:
    """_ts for values seen twice in a batch (a run's start is also its charge's bucket time)."""
    hit = _TS_MEMO.get(v)
    if hit is None:
        hit = _TS_MEMO[v] = _ts(v)
    return hit


def _insert_usage(s: Session, rows: list[tuple]) -> list[int]:
    """Insert usage records (tuples in _USAGE_COLS order), returning their ids in order. On
    SQLite (where this transaction holds the write lock) ids are assigned here and rows go
    straight to the driver; elsewhere through SQLAlchemy with RETURNING."""
    conn = s.connection()
    if conn.dialect.name != "sqlite":
        return list(s.scalars(insert(UsageRecord).returning(UsageRecord.id, sort_by_parameter_order=True),
                              [dict(zip(_USAGE_COLS, r)) for r in rows]))
    first = (conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM usage_records").scalar() or 0) + 1
    ids = list(range(first, first + len(rows)))
    params = [(i, c, j, task, _ts_memo(st), _ts(en), state, el, u, a, p, qos, gt, g, name, str(h), str(amt))
              for i, (c, j, task, st, en, state, el, u, a, p, qos, gt, g, name, h, amt) in zip(ids, rows)]
    cur = conn.connection.dbapi_connection.cursor()
    cur.executemany(f"INSERT INTO usage_records (id, {', '.join(_USAGE_COLS)}) "
                    f"VALUES ({', '.join('?' * (len(_USAGE_COLS) + 1))})", params)
    cur.close()
    return ids


def _insert_charges(s: Session, rows: list[tuple]) -> None:
    conn = s.connection()
    if conn.dialect.name != "sqlite":
        s.execute(insert(Charge), [dict(zip(_CHARGE_COLS, r)) for r in rows])
        return
    params = [(uid, rid, a, u, str(h), str(rate), str(amt), _ts_memo(bucket_at), _ts_memo(created))
              for uid, rid, a, u, h, rate, amt, bucket_at, created in rows]
    _TS_MEMO.clear()
    cur = conn.connection.dbapi_connection.cursor()
    cur.executemany(f"INSERT INTO charges ({', '.join(_CHARGE_COLS)}) VALUES ({', '.join('?' * len(_CHARGE_COLS))})",
                    params)
    cur.close()


def expire_stale_holds(s: Session, now: dt.datetime, res: IngestResult) -> None:
    """Holds whose sbatch never reported back (no job id after STALE_HOLD) are released."""
    for r in list(s.scalars(select(Reservation).where(Reservation.status == ReservationStatus.held,
                                                      Reservation.job_id.is_(None),
                                                      Reservation.created_at < now - STALE_HOLD))):
        q.release_holds(s, r, ReservationStatus.released, now)
        res.reservations_expired += 1


def _lock_state(s: Session) -> IngestState:
    st = s.scalar(select(IngestState).where(IngestState.name == SOURCE).with_for_update())
    if st is None:
        st = IngestState(name=SOURCE, last_detail="")
        s.add(st)
        s.flush()
    return st


def ingest_rows(rows: Iterable[AcctRow], *, url: str | None = None, batch_size: int = 5000,
                default_cluster: str = "", since: dt.datetime | None = None,
                on_batch: Callable[[IngestResult], None] | None = None,
                active: set[str] | None = None) -> IngestResult:
    """Ingest parsed sacct rows (``--allocations --duplicates``). Safe to rerun any time.

    ``active``: job ids (array job ids) still in the queue, from squeue; when given, a job
    that left the queue settles its reservation even if sacct's last word was PREEMPTED."""
    import gc

    # bulk object creation: the cyclic GC would rescan every live row again and again
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _ingest_rows(rows, url=url, batch_size=batch_size, default_cluster=default_cluster, since=since,
                            on_batch=on_batch, active=active)
    finally:
        if gc_was_enabled:
            gc.enable()


def _ingest_rows(rows, *, url, batch_size, default_cluster, since, on_batch, active) -> IngestResult:
    res = IngestResult()
    with db.session_scope(url) as s:
        _lock_state(s)
        book = pricing.PriceCache(q.load_price_book(s))
    for batch in _batches(group_jobs(rows, default_cluster), batch_size):
        with db.session_scope(url) as s:
            _lock_state(s)
            _ingest_batch(s, book, batch, res, active)
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
    return res


def default_since(*, url: str | None = None, now: dt.datetime | None = None) -> dt.datetime:
    """A day before the last ingest, or the oldest open reservation, whichever is earlier;
    30 days back on the first run."""
    now = now or utcnow()
    with db.session_scope(url) as s:
        st = s.get(IngestState, SOURCE)
        cands = [now - dt.timedelta(days=30)] if st is None or st.last_run_at is None else \
            [st.last_run_at - dt.timedelta(days=1)]
        oldest = s.scalar(select(Reservation.created_at).where(
            Reservation.status.in_([ReservationStatus.held, ReservationStatus.submitted]))
            .order_by(Reservation.created_at).limit(1))
        if oldest is not None:
            cands.append(oldest - dt.timedelta(minutes=5))
    return min(cands)


def open_reservation_jobs(*, url: str | None = None) -> list[str]:
    with db.session_scope(url) as s:
        return sorted({r.job_id for r in q.open_reservations(s) if r.job_id})


# ------------------------------------------------------------------ throughput metrics
def ingest_metrics(folder: Path, *, url: str | None = None) -> int:
    """Read ``gpuhpc.report()`` files (``<cluster>/<job>[_<task>].jsonl``) into job_metrics."""
    if not folder.is_dir():
        return 0
    agg: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    for f in sorted(folder.glob("*/*.jsonl")):
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                rec = json.loads(line)
                task = rec.get("array_task_id")
                for name, value in rec["metrics"].items():
                    agg[(str(rec["cluster"]), str(rec["job_id"]), int(task) if task is not None else -1,
                         str(name)[:64])].append(float(value))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue          # a torn last line of a job still writing
    if not agg:
        return 0
    with db.session_scope(url) as s:
        keys = list(agg)
        for i in range(0, len(keys), 200):
            chunk = keys[i:i + 200]
            s.execute(delete(JobMetric).where(tuple_(JobMetric.cluster, JobMetric.job_id, JobMetric.array_task_id,
                                                     JobMetric.name).in_(chunk)))
        s.execute(insert(JobMetric), [dict(cluster=k[0], job_id=k[1], array_task_id=k[2], name=k[3],
                                           value=sum(v) / len(v), samples=len(v)) for k, v in agg.items()])
    return len(agg)

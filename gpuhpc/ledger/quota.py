"""The quota decision: reserve, attach, release. One implementation, for SQLite and PostgreSQL.

Plain DB-API SQL (``sqlite3`` or ``psycopg``), no SQLAlchemy: on the embedded SQLite ledger
``gpuhpc submit`` pays for the standard library only. The ORM (:mod:`gpuhpc.ledger.admin`,
:mod:`~gpuhpc.ledger.ingest`, :mod:`~gpuhpc.ledger.reports`) runs the same functions inside its
own transactions through :func:`gpuhpc.ledger.admin.session_tx`, so the period counters and
the release of holds are also written in one place.

Every quota has one ``quota_usage`` counter row per period holding settled usage and open
holds, so a decision reads a handful of rows however many usage records exist. Writers
serialise on the quota rows: ``SELECT ... FOR UPDATE`` in quota-id order on PostgreSQL (READ
COMMITTED; the same order everywhere, so no deadlocks), ``BEGIN IMMEDIATE`` on SQLite (WAL,
60 s busy timeout).

Stored values are the ones SQLAlchemy's dialects write and read, so both layers share the
tables: on SQLite ``Numeric`` is bound as ``float(Decimal)`` and read back as
``Decimal("%.6f" % value)``, datetimes are naive UTC ``YYYY-MM-DD HH:MM:SS.ffffff``; on
PostgreSQL they are ``numeric`` and ``timestamptz``. Enums are stored as their values.
"""
from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from gpuhpc import dbapi
from gpuhpc.dbapi import SQLITE_BUSY_TIMEOUT_MS, Tx, redact, sqlite_file  # noqa: F401 (the ledger's names too)
from gpuhpc.errors import LedgerError, QuotaExceeded, UserInputError
from gpuhpc.ledger import paths, periods, pricing
from gpuhpc.ledger.types import ChargeRequest

# The schema revision this gpuhpc needs: the one place it is written (db.py imports it; a
# unit test checks it against migrations/versions, so a new migration must update it).
SCHEMA_HEAD = "0011"
KNOWN_REVISIONS = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011")   # every revision in migrations/versions, oldest first
ZERO = Decimal(0)
UTC = dt.timezone.utc
OPEN = ("held", "submitted")


# ------------------------------------------------------------------ connection
class LedgerUnwritable(LedgerError):
    """This process may not write the ledger (a reader's database role), or cannot reach it. The
    submit path then decides from the budget snapshot (:func:`gpuhpc.ledger.hooks.submit_budget`),
    as job_submit.lua does for plain sbatch; the message says which of the two it was."""


# The rights a reservation (and every admin change) needs on PostgreSQL: the migrations grant
# them to gpuhpc_admin and not to gpuhpc_reader (0004, 0006).
WRITE_RIGHTS_SQL = ("SELECT has_table_privilege(current_user, 'quotas', 'UPDATE') AND "
                    "has_table_privilege(current_user, 'reservations', 'INSERT') AND "
                    "has_table_privilege(current_user, 'charges', 'INSERT')")


def pg_role_may_write(cursor: Any) -> bool:
    """Does the connected PostgreSQL role hold :data:`WRITE_RIGHTS_SQL`'s rights?"""
    cursor.execute(WRITE_RIGHTS_SQL)
    return bool(cursor.fetchone()[0])


def schema_problem(rev: str | None, where: str) -> str | None:
    """Why a database at revision ``rev`` cannot be used (None when it can)."""
    if rev is not None and rev not in KNOWN_REVISIONS:
        return (f"the ledger database {where} is at schema revision {rev}, written by a newer gpuhpc than "
                f"this one (which knows up to {SCHEMA_HEAD}): upgrade gpuhpc")
    if rev != SCHEMA_HEAD:
        state = "has no ledger schema" if rev is None else f"is at schema revision {rev}"
        return f"the ledger database {where} {state}, but this gpuhpc needs {SCHEMA_HEAD}: run `gpuhpc db upgrade`"
    return None


def _check_schema(tx: Tx, url: str) -> None:
    try:
        row = tx.one("SELECT version_num FROM alembic_version")
    except Exception:           # no such table: an empty database
        row = None
    problem = schema_problem(row[0] if row else None, redact(url))
    if problem:
        raise LedgerError(problem)


class Connection(dbapi.Connection):
    """A :class:`gpuhpc.dbapi.Connection` to the ledger: its schema is checked in the first
    transaction, and a PostgreSQL server it cannot reach is :class:`LedgerUnwritable`."""

    def __init__(self, url: str) -> None:
        super().__init__(url, check=_check_schema, unreachable=LedgerUnwritable)


@contextlib.contextmanager
def transaction(url: str) -> Iterator[Tx]:
    """One committed transaction on a connection of its own (schema checked)."""
    conn = Connection(url)
    try:
        with conn.transaction() as tx:
            yield tx
    finally:
        conn.close()


# ------------------------------------------------------------------ price book and counters
def load_price_book(tx: Tx) -> pricing.PriceBook:
    book = pricing.PriceBook()
    for gpu_type, rate, base, num, den, eff in tx.execute(
            "SELECT gpu_type, rate, base_gpu_type, fraction_num, fraction_den, effective_from FROM gpu_prices").fetchall():
        if rate is not None:
            book.add_price(gpu_type, tx.parse_ts(eff), rate=tx.dec(rate))
        elif base is not None and num and den:
            book.add_price(gpu_type, tx.parse_ts(eff), base=base, fraction=f"{num}/{den}")
        else:
            raise LedgerError(f"the price of {gpu_type} from {eff} has neither a rate nor a base type and fraction")
    for kind, name, mult, eff in tx.execute("SELECT kind, name, multiplier, effective_from FROM price_multipliers").fetchall():
        book.add_multiplier(kind, name, tx.parse_ts(eff), tx.dec(mult))
    return book


def counter(tx: Tx, quota_id: int, period: str, account: str, user: str | None,
            at: dt.datetime, tz: dt.tzinfo | None = None,
            cluster: str | None = None) -> tuple[int, Decimal, Decimal, Decimal, Decimal]:
    """``(id, used GPU-h, used money, held GPU-h, held money)`` of the quota's counter row for
    the period containing ``at`` (its boundaries in ``tz``, default the ledger's zone,
    :func:`gpuhpc.ledger.periods.ledger_zone`), created on first use from the charges already
    booked in that period (ingest splits a run's charges at local midnights, so a charge lies
    in one period). ``cluster``: the quota's cluster (:data:`CLUSTER_CHARGES`: runs on other
    clusters do not count); None: every cluster's. Call with the quota row locked."""
    tz = periods.ledger_zone() if tz is None else tz
    start = periods.period_start(period, at, tz)
    row = tx.one("SELECT id, used_gpu_hours, used_money, held_gpu_hours, held_money FROM quota_usage "
                 "WHERE quota_id = ? AND period_start = ?", (quota_id, tx.ts(start)))
    if row is not None:
        return (row[0], *(tx.dec(v) for v in row[1:]))
    sql = ("SELECT coalesce(sum(gpu_hours), 0), coalesce(sum(amount), 0) FROM charges "
           "WHERE account_name = ? AND bucket_at >= ?")
    params: list = [account, tx.ts(start)]
    end = periods.period_end(period, start, tz)
    if end is not None:
        sql += " AND bucket_at < ?"
        params.append(tx.ts(end))
    if user is not None:
        sql += " AND user_name = ?"
        params.append(user)
    if cluster is not None:
        sql += CLUSTER_CHARGES
        params.append(cluster)
    hours, money = (tx.dec(v) for v in tx.one(sql, params))
    bid = tx.insert("INSERT INTO quota_usage (quota_id, period_start, used_gpu_hours, used_money, held_gpu_hours, "
                    "held_money) VALUES (?, ?, ?, ?, ?, ?)",
                    (quota_id, tx.ts(start), tx.num(hours), tx.num(money), tx.num(ZERO), tx.num(ZERO)))
    return bid, hours, money, ZERO, ZERO


# A cluster's quota counts the charges of runs on that cluster, and the account's adjustments that
# belong to no run (credits, debits): a charge of a run on another cluster does not count.
CLUSTER_CHARGES = " AND (usage_id IS NULL OR usage_id IN (SELECT id FROM usage_records WHERE cluster = ?))"


def quota_applies(quota_cluster: str | None, cluster: str | None) -> bool:
    """Does a quota of ``quota_cluster`` (None: every cluster) count usage on ``cluster``?"""
    return quota_cluster is None or quota_cluster == (cluster or "").lower()


def usage_elsewhere(tx: Tx, account: str, user: str | None, cluster: str, start: dt.datetime,
                    end: dt.datetime | None) -> tuple[Decimal, Decimal]:
    """``(GPU-hours, money)`` that runs of ``account`` (``user`` in it) on clusters other than
    ``cluster`` were charged in ``[start, end)``: what sync-slurm takes off a quota for every
    cluster before it becomes the Slurm limit on ``cluster`` (Slurm counts only its own jobs)."""
    sql = ("SELECT coalesce(sum(c.gpu_hours), 0), coalesce(sum(c.amount), 0) FROM charges c JOIN usage_records u "
           "ON u.id = c.usage_id WHERE c.account_name = ? AND u.cluster <> ? AND c.bucket_at >= ?")
    params: list = [account, cluster, tx.ts(start)]
    if end is not None:
        sql += " AND c.bucket_at < ?"
        params.append(tx.ts(end))
    if user is not None:
        sql += " AND c.user_name = ?"
        params.append(user)
    hours, money = tx.one(sql, params)
    return tx.dec(hours), tx.dec(money)


def mig_extra_gpu_hours(tx: Tx, account: str, user: str | None, start: dt.datetime,
                        end: dt.datetime | None, cluster: str | None = None) -> Decimal:
    """GPU-hours Slurm counts beyond the ledger in ``[start, end)`` for ``account`` (``user`` in it):
    the ledger counts a MIG slice by its fraction of a GPU (:func:`gpuhpc.ledger.pricing.gpu_weight`),
    Slurm's ``gres/gpu`` as a whole GPU, so a run's ``h`` GPU-hours on a ``1g.10gb`` are ``7h`` in
    Slurm (``6h`` more). sync-slurm raises ``GrpTRESMins=gres/gpu`` by it and ``ledger check``
    adds it to the ledger's usage it compares. Usage charges only (adjustments are not Slurm usage);
    a run of two GPU types at once counts as whole GPUs (its split per type is not stored)."""
    sql = ("SELECT u.gpu_type, coalesce(sum(c.gpu_hours), 0) FROM charges c JOIN usage_records u ON u.id = "
           "c.usage_id WHERE c.adjustment_id IS NULL AND c.account_name = ? AND c.bucket_at >= ?")
    params: list = [account, tx.ts(start)]
    if end is not None:
        sql += " AND c.bucket_at < ?"
        params.append(tx.ts(end))
    if user is not None:
        sql += " AND c.user_name = ?"
        params.append(user)
    if cluster is not None:                 # Slurm on that cluster counts that cluster's runs only
        sql += " AND u.cluster = ?"
        params.append(cluster)
    extra = Fraction(0)
    for gpu_type, hours in tx.execute(sql + " GROUP BY u.gpu_type", params).fetchall():
        w = pricing.gpu_weight(gpu_type)
        if w != 1 and w:
            extra += Fraction(tx.dec(hours)) * (1 / w - 1)
    return pricing.to_decimal(extra)


def counter_of(tx: Tx, quota_id: int, at: dt.datetime,
               tz: dt.tzinfo | None = None) -> tuple[int, Decimal, Decimal, Decimal, Decimal]:
    """:func:`counter` for a quota known by id only."""
    period, account, user, cluster = tx.one(
        "SELECT q.period, a.name, u.name, q.cluster FROM quotas q JOIN accounts a ON a.id = q.account_id "
        "LEFT JOIN users u ON u.id = q.user_id WHERE q.id = ?", (quota_id,))
    return counter(tx, quota_id, period, account, user, at, tz, cluster)


# ------------------------------------------------------------------ the decision
@dataclass
class Reservation:
    """A committed pre-submit hold (what :func:`reserve` returns). ``gpu_hours``/``amount``
    are the worst case held."""

    id: int
    gpu_hours: Decimal = Decimal(0)
    amount: Decimal = Decimal(0)
    account: str | None = None
    url: str | None = None
    # the reservation's open connection (reserve(keep_open=True)), used and closed by the next call
    _conn: object = field(default=None, repr=False, compare=False)

    def _take_conn(self):
        conn, self._conn = self._conn, None
        return conn

    def attach_job(self, job_id: str) -> None:
        """Record the Slurm job id (new transaction, after sbatch succeeded)."""
        attach_job(self.id, str(job_id), url=self.url, conn=self._take_conn())

    def release(self) -> None:
        """sbatch failed: give the whole hold back (idempotent)."""
        release(self.id, url=self.url, conn=self._take_conn())


def check_quota(who: str, period: str, money: Decimal | None, gpu_hours: Decimal | None,
                used_h: Decimal, used_m: Decimal, held_h: Decimal, held_m: Decimal, wc: pricing.Price) -> None:
    """Raise QuotaExceeded when ``wc`` does not fit one quota's period."""
    for budget, used, held, need, fmt in ((money, used_m, held_m, wc.amount, "{:,.2f}"),
                                          (gpu_hours, used_h, held_h, wc.gpu_hours, "{:,.2f} GPU-h")):
        if budget is None:
            continue
        committed = used + held
        if committed + need > budget:
            raise QuotaExceeded(
                f"quota exceeded for {who} ({period}): budget {fmt.format(budget)}, "
                f"committed {fmt.format(committed)} (used {fmt.format(used)} + held "
                f"{fmt.format(held)}), remaining {fmt.format(max(budget - committed, ZERO))}; "
                f"this job needs up to {fmt.format(need)}")


def unpriced(gpu_type: str | None, account: str) -> LedgerError:
    return LedgerError(f"the price book has no rate for GPU type {gpu_type!r}, so the money quota "
                       f"of account {account} cannot be checked: an admin sets one with "
                       f"`gpuhpc ledger price set --gpu-type {gpu_type} --rate RATE`")


def _account_of(tx: Tx, req: ChargeRequest) -> tuple[int | None, tuple[int, str] | None]:
    """(user id, (account id, name)): the named account, else the user's default (or only) one."""
    row = tx.one("SELECT id FROM users WHERE name = ?", (req.user,))
    user_id = row[0] if row else None
    if req.account:
        return user_id, tx.one("SELECT id, name FROM accounts WHERE name = ?", (req.account,))
    if user_id is None:
        return None, None
    ms = tx.execute("SELECT a.id, a.name, m.is_default FROM accounts a JOIN memberships m ON m.account_id = a.id "
              "WHERE m.user_id = ?", (user_id,)).fetchall()
    pick = [m for m in ms if m[2]] or (ms if len(ms) == 1 else [])
    return user_id, (tuple(pick[0][:2]) if pick else None)


def reserve_in(tx: Tx, req: ChargeRequest, now: dt.datetime, url: str | None = None) -> Reservation:
    """The decision inside an open transaction ``tx``: hold the worst case of ``req`` against
    every quota that applies (the account's, and the user's in it; each for every cluster or for
    ``req.cluster``), or raise QuotaExceeded."""
    if req.gpus < 0 or req.time_limit_s < 0 or req.array_size < 1:
        raise UserInputError("gpus and time limit must be >= 0 and array size >= 1")
    user_id, acct = _account_of(tx, req)
    quotas = []
    if acct is not None:
        quotas = [(qid, uid, period, None if h is None else tx.dec(h), None if m is None else tx.dec(m), qc)
                  for qid, uid, period, h, m, qc in tx.execute(
                      "SELECT id, user_id, period, gpu_hours, money, cluster FROM quotas WHERE account_id = ? "
                      "ORDER BY id" + tx.for_update, (acct[0],)).fetchall()
                  if (uid is None or uid == user_id) and quota_applies(qc, req.cluster)]
    mode = pricing.PER_GPU      # the pricing policy matters only when the request came with its nodes' shapes
    if req.shapes:
        row = tx.one("SELECT value FROM ledger_policies WHERE name = ?", (pricing.POLICY,))
        mode = row[0] if row else pricing.PER_GPU
    wc = pricing.request_price(load_price_book(tx), gpu_type=req.gpu_type, gpus=req.gpus,
                               time_limit_s=req.time_limit_s, array_size=req.array_size,
                               partition=req.partition, qos=req.qos, at=now, mode=mode, cpus=req.cpus,
                               mem_mb=req.mem_mb, shapes=req.shapes)
    if not wc.priced and any(q[4] is not None for q in quotas):
        raise unpriced(req.gpu_type, acct[1])
    counters = []
    tz = periods.ledger_zone() if quotas else periods.UTC
    for qid, uid, period, hours, money, qc in quotas:
        bid, used_h, used_m, held_h, held_m = counter(tx, qid, period, acct[1], None if uid is None else req.user, now,
                                                      tz, qc)
        who = (f"account {acct[1]}" if uid is None else f"user {req.user} in account {acct[1]}") + \
            (f" on cluster {qc}" if qc is not None else "")
        check_quota(who, period, money, hours, used_h, used_m, held_h, held_m, wc)
        counters.append((bid, held_h, held_m))
    account_name = acct[1] if acct is not None else req.account
    rid = tx.insert("INSERT INTO reservations (cluster, user_name, account_name, partition, qos, gpu_type, gpus, "
                    "time_limit_s, array_size, job_name, gpu_hours, amount, status, job_id, created_at, closed_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'held', NULL, ?, NULL)",
                    (req.cluster, req.user, account_name, req.partition, req.qos, req.gpu_type, req.gpus,
                     req.time_limit_s, req.array_size, req.job_name[:255], tx.num(wc.gpu_hours), tx.num(wc.amount),
                     tx.ts(now)))
    for bid, held_h, held_m in counters:
        tx.execute("UPDATE quota_usage SET held_gpu_hours = ?, held_money = ? WHERE id = ?",
             (tx.num(held_h + wc.gpu_hours), tx.num(held_m + wc.amount), bid))
        tx.execute("INSERT INTO reservation_holds (reservation_id, quota_usage_id, gpu_hours, money) VALUES (?, ?, ?, ?)",
             (rid, bid, tx.num(wc.gpu_hours), tx.num(wc.amount)))
    return Reservation(id=rid, gpu_hours=wc.gpu_hours, amount=wc.amount, account=account_name, url=url)


def reserve(req: ChargeRequest, *, url: str | None = None, now: dt.datetime | None = None,
            keep_open: bool = False) -> Reservation:
    """Hold the worst case of ``req`` in one committed transaction (before sbatch). Raises
    QuotaExceeded (nothing held) when a quota would be overspent; LedgerError when the schema
    is not at head (naming ``gpuhpc db upgrade``). With ``keep_open`` the connection stays with
    the reservation for its :meth:`Reservation.attach_job` or ``release``, which close it."""
    if req.gpus < 0 or req.time_limit_s < 0 or req.array_size < 1:
        raise UserInputError("gpus and time limit must be >= 0 and array size >= 1")
    url = url or paths.db_url()
    conn = Connection(url)
    try:
        if conn.dialect == "postgresql":
            may = pg_role_may_write(conn.conn.cursor())
            conn.conn.rollback()
            if not may:
                raise LedgerUnwritable(f"the ledger is read-only for database role {conn.conn.info.user}")
        with conn.transaction() as tx:
            res = reserve_in(tx, req, now or dt.datetime.now(UTC), url)
    except BaseException:
        conn.close()
        raise
    if keep_open:
        res._conn = conn
    else:
        conn.close()
    return res


@contextlib.contextmanager
def _transaction_on(url: str | None, conn: Connection | None) -> Iterator[Tx]:
    """A transaction on ``conn`` (closed afterwards), else on a connection of its own."""
    if conn is None:
        with transaction(url or paths.db_url()) as tx:
            yield tx
        return
    try:
        with conn.transaction() as tx:
            yield tx
    finally:
        conn.close()


def attach_job(reservation_id: int, job_id: str, *, url: str | None = None, conn: Connection | None = None) -> None:
    """Record the Slurm job id (its own transaction, after sbatch succeeded)."""
    with _transaction_on(url, conn) as tx:
        attach_job_in(tx, reservation_id, job_id)


def attach_job_in(tx: Tx, reservation_id: int, job_id: str) -> None:
    """:func:`attach_job` inside an open transaction (a submitter recording several at once)."""
    tx.execute("UPDATE reservations SET job_id = ?, status = CASE status WHEN 'held' THEN 'submitted' ELSE status END "
         "WHERE id = ?", (str(job_id).split(";", 1)[0].strip(), reservation_id))
    if tx.cur.rowcount != 1:
        raise LedgerError(f"no reservation {reservation_id}")


def release_holds(tx: Tx, reservation_id: int, status: str, now: dt.datetime) -> None:
    """Give back what a reservation still holds and close it as ``status`` (released or
    settled). The caller holds the quota locks (PostgreSQL) or runs on SQLite."""
    for hid, bid, h, m in tx.execute("SELECT id, quota_usage_id, gpu_hours, money FROM reservation_holds "
                               "WHERE reservation_id = ? ORDER BY id", (reservation_id,)).fetchall():
        h, m = tx.dec(h), tx.dec(m)
        if not (h or m):
            continue
        held_h, held_m = (tx.dec(v) for v in tx.one("SELECT held_gpu_hours, held_money FROM quota_usage WHERE id = ?",
                                                    (bid,)))
        tx.execute("UPDATE quota_usage SET held_gpu_hours = ?, held_money = ? WHERE id = ?",
             (tx.num(held_h - h), tx.num(held_m - m), bid))
        tx.execute("UPDATE reservation_holds SET gpu_hours = ?, money = ? WHERE id = ?", (tx.num(ZERO), tx.num(ZERO), hid))
    tx.execute("UPDATE reservations SET status = ?, closed_at = ? WHERE id = ?", (status, tx.ts(now), reservation_id))


def lock_quotas_of(tx: Tx, reservation_id: int) -> None:
    """Lock the quota rows a reservation holds against, in id order (the order every writer
    uses: quota rows first, then reservation rows)."""
    if tx.pg:
        tx.execute("SELECT id FROM quotas WHERE id IN (SELECT u.quota_id FROM reservation_holds h JOIN quota_usage u ON "
             "u.id = h.quota_usage_id WHERE h.reservation_id = ?) ORDER BY id FOR UPDATE", (reservation_id,))


def release(reservation_id: int, *, url: str | None = None, conn: Connection | None = None) -> None:
    """sbatch failed: give the whole hold back (idempotent)."""
    with _transaction_on(url, conn) as tx:
        lock_quotas_of(tx, reservation_id)
        row = tx.one("SELECT status FROM reservations WHERE id = ?" + tx.for_update, (reservation_id,))
        if row is None or row[0] not in OPEN:
            return
        release_holds(tx, reservation_id, "released", dt.datetime.now(UTC))

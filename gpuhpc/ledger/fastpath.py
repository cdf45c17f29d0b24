"""The quota decision on an embedded SQLite ledger, with the stdlib ``sqlite3`` only.

Why: ``gpuhpc submit`` reserves before every sbatch. Importing SQLAlchemy, the ORM models and
:mod:`gpuhpc.ledger.quota` costs ~0.6 s on a small machine; the decision itself ~1 ms. This
module makes the same decision, writing the same rows with the same values, without them.

It is a *fast path*, not a second implementation: :func:`reserve`, :func:`attach_job` and
:func:`release` return ``None`` ("not handled", after rolling back) whenever they meet
anything they do not handle with certainty, and the caller (:mod:`gpuhpc.ledger.hooks`) then
runs the SQLAlchemy code in :mod:`gpuhpc.ledger.quota`. They fall back when the URL is not a
plain ``sqlite:///FILE`` (PostgreSQL always), the file is missing, the schema is not at
:data:`SCHEMA_HEAD` (the SQLAlchemy path raises its usual LedgerError), the request is
invalid, a quota's counter row for this period does not exist yet (it is built from the
charges), a stored value has an unexpected type or format, or on any other exception.

What it mirrors from :mod:`gpuhpc.ledger.db` and SQLAlchemy's SQLite dialect: WAL, busy
timeout, ``BEGIN IMMEDIATE``; ``Numeric`` bound as ``float(Decimal)`` and read back as
``Decimal("%.6f" % value)``; datetimes stored as naive UTC ``YYYY-MM-DD HH:MM:SS.ffffff``;
enums as their values. Pricing is :mod:`gpuhpc.ledger.pricing` (pure, shared).
"""
from __future__ import annotations

import datetime as dt
import os
import sqlite3
from decimal import Decimal

from gpuhpc.errors import LedgerError, QuotaExceeded
from gpuhpc.ledger import hooks, pricing

# The schema revision this gpuhpc needs: the one place it is written (db.py imports it; a
# unit test checks it against migrations/versions, so a new migration must update it).
SCHEMA_HEAD = "0001"
KNOWN_REVISIONS = ("0001",)   # every revision in migrations/versions, oldest first
SQLITE_BUSY_TIMEOUT_MS = 60_000
ZERO = Decimal(0)


class _Fallback(Exception):
    """Not handled with certainty here: let the SQLAlchemy implementation decide."""


def sqlite_path(url: str) -> str | None:
    """The file of a plain ``sqlite:///FILE`` URL that exists, else None."""
    if not url.startswith("sqlite:///") or "?" in url or "%" in url:
        return None
    path = url[len("sqlite:///"):]
    return path if path and path != ":memory:" and os.path.isfile(path) else None


def _dec(v: object) -> Decimal | None:
    if v is None:
        return None
    if type(v) not in (int, float):
        raise _Fallback(f"unexpected numeric value {v!r}")
    return Decimal("%.6f" % v)


def _ts(d: dt.datetime) -> str:
    return d.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")


def _parse_ts(v: object) -> dt.datetime:
    if not isinstance(v, str) or len(v) != 26:
        raise _Fallback(f"unexpected timestamp {v!r}")
    return dt.datetime.fromisoformat(v).replace(tzinfo=dt.timezone.utc)


def _begin(conn: sqlite3.Connection) -> None:
    """db.get_engine's connection set-up, then BEGIN IMMEDIATE and the schema check."""
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    if conn.execute("SELECT version_num FROM alembic_version").fetchall() != [(SCHEMA_HEAD,)]:
        raise _Fallback("schema not at head")    # quota.reserve raises the LedgerError


def _run(url: str, fn, *args):
    """``fn(conn, *args)`` in one BEGIN IMMEDIATE transaction; None when not handled."""
    path = sqlite_path(url)
    if path is None:
        return None
    conn = None
    try:
        conn = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        _begin(conn)
        out = fn(conn, *args)
        conn.execute("COMMIT")
        return out
    except (QuotaExceeded, LedgerError):
        raise
    except Exception:          # _Fallback, or anything unforeseen: the SQLAlchemy path decides
        return None
    finally:
        if conn is not None:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.close()


def _price_book(conn: sqlite3.Connection) -> pricing.PriceBook:
    book = pricing.PriceBook()
    for gpu_type, rate, base, num, den, eff in conn.execute(
            "SELECT gpu_type, rate, base_gpu_type, fraction_num, fraction_den, effective_from FROM gpu_prices"):
        if rate is not None:
            book.add_price(gpu_type, _parse_ts(eff), rate=_dec(rate))
        elif base is not None and type(num) is int and type(den) is int and num > 0 and den > 0:
            book.add_price(gpu_type, _parse_ts(eff), base=base, fraction=f"{num}/{den}")
        else:
            raise _Fallback("unusual price row")
    for kind, name, mult, eff in conn.execute(
            "SELECT kind, name, multiplier, effective_from FROM price_multipliers"):
        if kind not in ("partition", "qos") or mult is None:
            raise _Fallback("unusual multiplier row")
        book.add_multiplier(kind, name, _parse_ts(eff), _dec(mult))
    return book


def check_quota(who: str, period: str, money: Decimal | None, gpu_hours: Decimal | None,
                used_h: Decimal, used_m: Decimal, held_h: Decimal, held_m: Decimal, wc: pricing.Price) -> None:
    """Raise QuotaExceeded when ``wc`` does not fit one quota's period (shared with quota.py)."""
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


def _reserve(conn: sqlite3.Connection, req: hooks.ChargeRequest, url: str, now: dt.datetime) -> hooks.Reservation:
    if req.gpus < 0 or req.time_limit_s < 0 or req.array_size < 1:
        raise _Fallback("invalid request")          # quota.reserve raises the UserInputError
    q = conn.execute
    row = q("SELECT id FROM users WHERE name = ?", (req.user,)).fetchone()
    user_id = row[0] if row else None
    if req.account:
        acct = q("SELECT id, name FROM accounts WHERE name = ?", (req.account,)).fetchone()
    elif user_id is not None:
        ms = q("SELECT a.id, a.name, m.is_default FROM accounts a JOIN memberships m ON m.account_id = a.id "
               "WHERE m.user_id = ?", (user_id,)).fetchall()
        pick = [m for m in ms if m[2]] or (ms if len(ms) == 1 else [])
        acct = pick[0][:2] if pick else None
    else:
        acct = None
    quotas = []
    if acct is not None:
        quotas = [(qid, uid, period, _dec(h), _dec(m)) for qid, uid, period, h, m in
                  q("SELECT id, user_id, period, gpu_hours, money FROM quotas WHERE account_id = ? ORDER BY id",
                    (acct[0],)) if uid is None or uid == user_id]
    wc = pricing.worst_case(_price_book(conn), gpu_type=req.gpu_type, gpus=req.gpus,
                            time_limit_s=req.time_limit_s, array_size=req.array_size,
                            partition=req.partition, qos=req.qos, at=now)
    if not wc.priced and any(money is not None for *_, money in quotas):
        raise unpriced(req.gpu_type, acct[1])
    buckets = []
    for qid, uid, period, hours, money in quotas:
        if period not in ("day", "week", "month", "total"):
            raise _Fallback("unknown period")
        b = q("SELECT id, used_gpu_hours, used_money, held_gpu_hours, held_money FROM quota_usage "
              "WHERE quota_id = ? AND period_start = ?", (qid, _ts(pricing.period_start(period, now)))).fetchone()
        if b is None:
            raise _Fallback("no counter row for this period yet")
        bid, *vals = b
        used_h, used_m, held_h, held_m = (_dec(v) for v in vals)
        if None in (used_h, used_m, held_h, held_m):
            raise _Fallback("NULL counter")
        who = f"account {acct[1]}" if uid is None else f"user {req.user} in account {acct[1]}"
        buckets.append((bid, held_h, held_m, (who, period, money, hours, used_h, used_m, held_h, held_m)))
    for *_, check in buckets:
        check_quota(*check, wc)
    account_name = acct[1] if acct is not None else req.account
    rid = q("INSERT INTO reservations (cluster, user_name, account_name, partition, qos, gpu_type, gpus, "
            "time_limit_s, array_size, job_name, gpu_hours, amount, status, job_id, created_at, closed_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'held', NULL, ?, NULL)",
            (req.cluster, req.user, account_name, req.partition, req.qos, req.gpu_type, req.gpus,
             req.time_limit_s, req.array_size, req.job_name[:255], float(wc.gpu_hours), float(wc.amount),
             _ts(now))).lastrowid
    for bid, held_h, held_m, _ in buckets:
        q("UPDATE quota_usage SET held_gpu_hours = ?, held_money = ? WHERE id = ?",
          (float(held_h + wc.gpu_hours), float(held_m + wc.amount), bid))
        q("INSERT INTO reservation_holds (reservation_id, quota_usage_id, gpu_hours, money) VALUES (?, ?, ?, ?)",
          (rid, bid, float(wc.gpu_hours), float(wc.amount)))
    return hooks.Reservation(id=rid, gpu_hours=wc.gpu_hours, amount=wc.amount, account=account_name, _url=url)


def reserve(req: hooks.ChargeRequest, url: str, now: dt.datetime | None = None) -> hooks.Reservation | None:
    """:func:`gpuhpc.ledger.quota.reserve` on SQLite; None when not handled (nothing written)."""
    return _run(url, _reserve, req, url, now or dt.datetime.now(dt.timezone.utc))


def _attach(conn: sqlite3.Connection, reservation_id: int, job_id: str) -> bool:
    cur = conn.execute("UPDATE reservations SET job_id = ?, status = CASE status WHEN 'held' THEN 'submitted' "
                       "ELSE status END WHERE id = ?", (str(job_id).split(";", 1)[0].strip(), reservation_id))
    if cur.rowcount != 1:
        raise _Fallback("no such reservation")      # quota.attach_job raises the LedgerError
    return True


def attach_job(reservation_id: int, job_id: str, url: str) -> bool | None:
    return _run(url, _attach, reservation_id, job_id)


def _release(conn: sqlite3.Connection, reservation_id: int, now: dt.datetime) -> bool:
    row = conn.execute("SELECT status FROM reservations WHERE id = ?", (reservation_id,)).fetchone()
    if row is None or row[0] in ("released", "settled"):
        return True
    if row[0] not in ("held", "submitted"):
        raise _Fallback("unknown status")
    holds = conn.execute("SELECT id, quota_usage_id, gpu_hours, money FROM reservation_holds "
                         "WHERE reservation_id = ?", (reservation_id,)).fetchall()
    for hid, bid, h, m in holds:
        h, m = _dec(h), _dec(m)
        if h is None or m is None:
            raise _Fallback("NULL hold")
        if not (h or m):
            continue
        b = conn.execute("SELECT held_gpu_hours, held_money FROM quota_usage WHERE id = ?", (bid,)).fetchone()
        held_h, held_m = _dec(b[0]), _dec(b[1])
        if held_h is None or held_m is None:
            raise _Fallback("NULL counter")
        conn.execute("UPDATE quota_usage SET held_gpu_hours = ?, held_money = ? WHERE id = ?",
                     (float(held_h - h), float(held_m - m), bid))
        conn.execute("UPDATE reservation_holds SET gpu_hours = ?, money = ? WHERE id = ?", (0.0, 0.0, hid))
    conn.execute("UPDATE reservations SET status = 'released', closed_at = ? WHERE id = ?",
                 (_ts(now), reservation_id))
    return True


def release(reservation_id: int, url: str) -> bool | None:
    return _run(url, _release, reservation_id, dt.datetime.now(dt.timezone.utc))

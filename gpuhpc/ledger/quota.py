"""Quota decisions: atomic reservations (pre-submit holds), release, attach, and the admin
operations on accounts, users, prices and quotas.

Every quota has one :class:`~gpuhpc.ledger.orm.QuotaUsage` counter row per period holding
settled usage and open holds, so a decision reads a handful of rows no matter how many
usage records exist. Writers serialise on the quota rows: ``SELECT ... FOR UPDATE`` in
PostgreSQL (always in quota-id order, so no deadlocks), ``BEGIN IMMEDIATE`` in SQLite.
"""
from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from gpuhpc.errors import LedgerError, UserInputError
from gpuhpc.ledger import db, fastpath, hooks, pricing
from gpuhpc.ledger.orm import (Account, Charge, GpuPrice, Membership, MultiplierKind, Period, PriceMultiplier,
                               Quota, QuotaUsage, Reservation, ReservationHold, ReservationStatus, User, utcnow)

ZERO = Decimal(0)


# ------------------------------------------------------------------ price book
def load_price_book(session: Session) -> pricing.PriceBook:
    conn = session.connection()
    book = pricing.PriceBook()
    st = _reserve_statements()
    for p in conn.execute(st["prices"]):
        if p.rate is not None:
            book.add_price(p.gpu_type, p.effective_from, rate=p.rate)
        else:
            book.add_price(p.gpu_type, p.effective_from, base=p.base_gpu_type,
                           fraction=f"{p.fraction_num}/{p.fraction_den}")
    for m in conn.execute(st["multipliers"]):
        book.add_multiplier(m.kind.value, m.name, m.effective_from, m.multiplier)
    return book


# ------------------------------------------------------------------ lookups
def _account(session: Session, name: str) -> Account | None:
    return session.scalar(select(Account).where(Account.name == name))


def _user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def resolve_account(session: Session, user: User | None, account: str | None) -> Account | None:
    """The named account, else the user's default (or only) membership."""
    if account:
        return _account(session, account)
    if user is None:
        return None
    ms = session.scalars(select(Membership).where(Membership.user_id == user.id)).all()
    default = [m for m in ms if m.is_default] or (ms if len(ms) == 1 else [])
    return session.get(Account, default[0].account_id) if default else None


def quotas_for(session: Session, account_id: int, user_id: int | None, *, lock: bool) -> list[Quota]:
    """The account's quota and the user's quota in that account, locked in id order."""
    cond = Quota.account_id == account_id
    users = [None] if user_id is None else [None, user_id]
    stmt = select(Quota).where(cond).order_by(Quota.id)
    if lock:
        stmt = stmt.with_for_update()
    return [q for q in session.scalars(stmt) if q.user_id in users]


def lock_all_quotas(session: Session) -> list[Quota]:
    return list(session.scalars(select(Quota).order_by(Quota.id).with_for_update()))


def bucket(session: Session, quota: Quota, at: dt.datetime) -> QuotaUsage:
    """The counter row of ``quota`` for the period containing ``at``, created on first use
    from the charges already booked in that period. Call with the quota row locked."""
    start = pricing.period_start(quota.period.value, at)
    row = session.scalar(select(QuotaUsage).where(QuotaUsage.quota_id == quota.id,
                                                  QuotaUsage.period_start == start))
    if row is not None:
        return row
    account = session.get(Account, quota.account_id)
    stmt = select(func.coalesce(func.sum(Charge.gpu_hours), 0), func.coalesce(func.sum(Charge.amount), 0)).where(
        Charge.account_name == account.name, Charge.bucket_at >= start)
    end = pricing.period_end(quota.period.value, start)
    if end is not None:
        stmt = stmt.where(Charge.bucket_at < end)
    if quota.user_id is not None:
        stmt = stmt.where(Charge.user_name == session.get(User, quota.user_id).name)
    hours, money = session.execute(stmt).one()
    row = QuotaUsage(quota_id=quota.id, period_start=start, used_gpu_hours=Decimal(hours),
                     used_money=Decimal(money), held_gpu_hours=ZERO, held_money=ZERO)
    session.add(row)
    session.flush()
    return row


# ------------------------------------------------------------------ reserve / release
@functools.cache
def _reserve_statements() -> dict:
    """Statements of the quota decision, built once (their SQL and cache keys are reused)."""
    return {
        "user": select(User.id).where(User.name == bindparam("name")),
        "account": select(Account.id, Account.name).where(Account.name == bindparam("name")),
        "memberships": select(Account.id, Account.name, Membership.is_default)
        .join(Membership, Membership.account_id == Account.id).where(Membership.user_id == bindparam("uid")),
        "quotas": select(Quota.id, Quota.user_id, Quota.period, Quota.gpu_hours, Quota.money)
        .where(Quota.account_id == bindparam("aid")).order_by(Quota.id).with_for_update(),
        "bucket": select(QuotaUsage.id, QuotaUsage.used_gpu_hours, QuotaUsage.used_money, QuotaUsage.held_gpu_hours,
                         QuotaUsage.held_money)
        .where(QuotaUsage.quota_id == bindparam("qid"), QuotaUsage.period_start == bindparam("start")),
        "insert": insert(Reservation).returning(Reservation.id),
        "hold_bucket": update(QuotaUsage).where(QuotaUsage.id == bindparam("bid"))
        .values(held_gpu_hours=bindparam("h"), held_money=bindparam("m")),
        "hold": insert(ReservationHold),
        "prices": select(GpuPrice.gpu_type, GpuPrice.rate, GpuPrice.base_gpu_type, GpuPrice.fraction_num,
                         GpuPrice.fraction_den, GpuPrice.effective_from),
        "multipliers": select(PriceMultiplier.kind, PriceMultiplier.name, PriceMultiplier.multiplier,
                              PriceMultiplier.effective_from),
    }


def reserve(req: hooks.ChargeRequest, *, url: str | None = None, now: dt.datetime | None = None) -> hooks.Reservation:
    """Hold the worst case of ``req`` against every quota that applies, in one committed
    transaction. Raises QuotaExceeded (nothing is held) when any quota would be overspent.

    Written with Core statements: this is the latency-critical quota decision."""
    if req.gpus < 0 or req.time_limit_s < 0 or req.array_size < 1:
        raise UserInputError("gpus and time limit must be >= 0 and array size >= 1")
    now = now or utcnow()
    st = _reserve_statements()
    with db.session_scope(url) as s:
        conn = s.connection()
        user_id = conn.execute(st["user"], {"name": req.user}).scalar()
        if req.account:
            acct = conn.execute(st["account"], {"name": req.account}).first()
        elif user_id is not None:
            ms = conn.execute(st["memberships"], {"uid": user_id}).all()
            pick = [m for m in ms if m.is_default] or (ms if len(ms) == 1 else [])
            acct = pick[0] if pick else None
        else:
            acct = None
        quotas = []
        if acct is not None:
            quotas = [qr for qr in conn.execute(st["quotas"], {"aid": acct.id})
                      if qr.user_id is None or qr.user_id == user_id]
        book = load_price_book(s)
        wc = pricing.worst_case(book, gpu_type=req.gpu_type, gpus=req.gpus, time_limit_s=req.time_limit_s,
                                array_size=req.array_size, partition=req.partition, qos=req.qos, at=now)
        if not wc.priced and any(qr.money is not None for qr in quotas):
            raise fastpath.unpriced(req.gpu_type, acct.name)
        buckets = []
        for qr in quotas:
            start = pricing.period_start(qr.period.value, now)
            b = conn.execute(st["bucket"], {"qid": qr.id, "start": start}).first()
            if b is None:
                row = bucket(s, s.get(Quota, qr.id), now)
                b = (row.id, row.used_gpu_hours, row.used_money, row.held_gpu_hours, row.held_money)
            buckets.append((qr, tuple(b)))
        for qr, (_bid, used_h, used_m, held_h, held_m) in buckets:
            who = (f"account {acct.name}" if qr.user_id is None else f"user {req.user} in account {acct.name}")
            fastpath.check_quota(who, qr.period.value, qr.money, qr.gpu_hours, used_h, used_m, held_h, held_m, wc)
        account_name = acct.name if acct is not None else req.account
        rid = conn.execute(st["insert"], dict(
            cluster=req.cluster, user_name=req.user, account_name=account_name, partition=req.partition,
            qos=req.qos, gpu_type=req.gpu_type, gpus=req.gpus, time_limit_s=req.time_limit_s,
            array_size=req.array_size, job_name=req.job_name[:255], gpu_hours=wc.gpu_hours, amount=wc.amount,
            status=ReservationStatus.held, created_at=now)).scalar_one()
        for _qr, (bid, _uh, _um, held_h, held_m) in buckets:
            conn.execute(st["hold_bucket"], {"bid": bid, "h": held_h + wc.gpu_hours, "m": held_m + wc.amount})
            conn.execute(st["hold"], dict(reservation_id=rid, quota_usage_id=bid, gpu_hours=wc.gpu_hours,
                                          money=wc.amount))
        return hooks.Reservation(id=rid, gpu_hours=wc.gpu_hours, amount=wc.amount, account=account_name, _url=url)


def _lock_quotas_of_holds(s: Session, holds: Sequence[ReservationHold]) -> None:
    ids = sorted({s.get(QuotaUsage, h.quota_usage_id).quota_id for h in holds})
    if ids:
        list(s.scalars(select(Quota.id).where(Quota.id.in_(ids)).order_by(Quota.id).with_for_update()))


def release_holds(s: Session, r: Reservation) -> None:
    """Give back what ``r`` still holds (caller holds the quota locks or runs on SQLite)."""
    for h in s.scalars(select(ReservationHold).where(ReservationHold.reservation_id == r.id)):
        if h.gpu_hours or h.money:
            b = s.get(QuotaUsage, h.quota_usage_id)
            b.held_gpu_hours = b.held_gpu_hours - h.gpu_hours
            b.held_money = b.held_money - h.money
            h.gpu_hours = ZERO
            h.money = ZERO
    r.closed_at = utcnow()


def release(reservation_id: int, *, url: str | None = None) -> None:
    with db.session_scope(url) as s:
        # lock order everywhere: quota rows (by id) first, then reservation rows; ingest does the same
        holds = list(s.scalars(select(ReservationHold).where(ReservationHold.reservation_id == reservation_id)))
        _lock_quotas_of_holds(s, holds)
        r = s.scalar(select(Reservation).where(Reservation.id == reservation_id).with_for_update())
        if r is None or r.status in (ReservationStatus.released, ReservationStatus.settled):
            return
        release_holds(s, r)
        r.status = ReservationStatus.released


def attach_job(reservation_id: int, job_id: str, *, url: str | None = None) -> None:
    with db.session_scope(url) as s:
        r = s.get(Reservation, reservation_id)
        if r is None:
            raise LedgerError(f"no reservation {reservation_id}")
        r.job_id = str(job_id).split(";", 1)[0].strip()
        if r.status == ReservationStatus.held:
            r.status = ReservationStatus.submitted


# ------------------------------------------------------------------ admin
def add_account(name: str, *, description: str = "", url: str | None = None) -> bool:
    _check_name(name, "account")
    with db.session_scope(url) as s:
        if _account(s, name):
            return False
        s.add(Account(name=name, description=description))
        return True


def add_user(name: str, account: str, *, default: bool = False, url: str | None = None) -> bool:
    _check_name(name, "user")
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            raise UserInputError(f"no account {account!r}", hint=f"gpuhpc ledger account add {account}")
        user = _user(s, name)
        if user is None:
            user = User(name=name)
            s.add(user)
            s.flush()
        m = s.scalar(select(Membership).where(Membership.user_id == user.id, Membership.account_id == acct.id))
        if default:
            for other in s.scalars(select(Membership).where(Membership.user_id == user.id)):
                other.is_default = False
        if m is None:
            s.add(Membership(user_id=user.id, account_id=acct.id, is_default=default))
            return True
        m.is_default = default or m.is_default
        return False


def _check_name(name: str, what: str) -> None:
    if not name or len(name) > 64 or any(not (c.isalnum() or c in "-_.") for c in name):
        raise UserInputError(f"invalid {what} name {name!r}", hint="letters, digits, '-', '_', '.'; up to 64")


def set_price(gpu_type: str, *, rate: Decimal | None = None, base: str | None = None, fraction: str | None = None,
              effective_from: dt.datetime | None = None, currency: str = "USD", url: str | None = None) -> None:
    if not gpu_type:
        raise UserInputError("--gpu-type is required")
    if (rate is None) == (base is None):
        raise UserInputError("give either --rate or --of BASE_GPU_TYPE --fraction N/D")
    eff = effective_from or utcnow()
    frac = pricing.parse_fraction(fraction or "1") if base else None
    with db.session_scope(url) as s:
        row = s.scalar(select(GpuPrice).where(GpuPrice.gpu_type == gpu_type, GpuPrice.effective_from == eff))
        if row is None:
            row = GpuPrice(gpu_type=gpu_type, effective_from=eff)
            s.add(row)
        row.rate = rate
        row.base_gpu_type = base
        row.fraction_num = frac.numerator if frac else None
        row.fraction_den = frac.denominator if frac else None
        row.currency = currency


def set_multiplier(kind: str, name: str, multiplier: Decimal, *, effective_from: dt.datetime | None = None,
                   url: str | None = None) -> None:
    k = MultiplierKind(kind)
    eff = effective_from or utcnow()
    with db.session_scope(url) as s:
        row = s.scalar(select(PriceMultiplier).where(PriceMultiplier.kind == k, PriceMultiplier.name == name,
                                                     PriceMultiplier.effective_from == eff))
        if row is None:
            row = PriceMultiplier(kind=k, name=name, effective_from=eff, multiplier=multiplier)
            s.add(row)
        row.multiplier = multiplier


def set_quota(account: str, *, user: str | None = None, gpu_hours: Decimal | None = None,
              money: Decimal | None = None, period: str = "month", url: str | None = None) -> None:
    if gpu_hours is None and money is None:
        raise UserInputError("give --gpu-hours and/or --money")
    p = Period(period) if period in Period.__members__ else None
    if p is None:
        raise UserInputError(f"unknown period {period!r}", hint="day, week, month or total")
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            raise UserInputError(f"no account {account!r}", hint=f"gpuhpc ledger account add {account}")
        uid = None
        if user:
            u = _user(s, user)
            if u is None:
                raise UserInputError(f"no user {user!r}", hint=f"gpuhpc ledger user add {user} --account {account}")
            uid = u.id
        q = s.scalar(select(Quota).where(Quota.account_id == acct.id, Quota.user_key == (uid or 0)).with_for_update())
        if q is None:
            q = Quota(account_id=acct.id, user_id=uid, user_key=uid or 0, period=p)
            s.add(q)
        elif q.period != p:
            # counters are per period: start afresh (they are rebuilt from charges)
            for b in s.scalars(select(QuotaUsage).where(QuotaUsage.quota_id == q.id)):
                s.delete(b)
        q.period = p
        q.gpu_hours = gpu_hours
        q.money = money
        q.updated_at = utcnow()


def remove_quota(account: str, *, user: str | None = None, url: str | None = None) -> bool:
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            return False
        uid = _user(s, user).id if user and _user(s, user) else None
        if user and uid is None:
            return False
        q = s.scalar(select(Quota).where(Quota.account_id == acct.id, Quota.user_key == (uid or 0)))
        if q is None:
            return False
        s.delete(q)
        return True


@dataclass(frozen=True)
class QuotaStatus:
    account: str
    user: str | None
    period: str
    period_start: dt.datetime
    gpu_hours_budget: Decimal | None
    money_budget: Decimal | None
    used_gpu_hours: Decimal
    held_gpu_hours: Decimal
    used_money: Decimal
    held_money: Decimal

    @property
    def remaining_money(self) -> Decimal | None:
        return None if self.money_budget is None else self.money_budget - self.used_money - self.held_money

    @property
    def remaining_gpu_hours(self) -> Decimal | None:
        return None if self.gpu_hours_budget is None else self.gpu_hours_budget - self.used_gpu_hours - self.held_gpu_hours

    def as_dict(self) -> dict:
        return {"account": self.account, "user": self.user, "period": self.period,
                "period_start": self.period_start.isoformat(),
                "gpu_hours_budget": self.gpu_hours_budget, "used_gpu_hours": self.used_gpu_hours,
                "held_gpu_hours": self.held_gpu_hours, "remaining_gpu_hours": self.remaining_gpu_hours,
                "money_budget": self.money_budget, "used_money": self.used_money, "held_money": self.held_money,
                "remaining_money": self.remaining_money}


def quota_status(account: str | None = None, *, url: str | None = None, now: dt.datetime | None = None) -> list[QuotaStatus]:
    now = now or utcnow()
    out = []
    with db.session_scope(url) as s:
        stmt = select(Quota).join(Account).order_by(Account.name, Quota.user_key)
        if account:
            stmt = stmt.where(Account.name == account)
            if _account(s, account) is None:
                raise UserInputError(f"no account {account!r}")
        for q in list(s.scalars(stmt.with_for_update())):
            b = bucket(s, q, now)
            out.append(QuotaStatus(q.account.name, q.user.name if q.user else None, q.period.value, b.period_start,
                                   q.gpu_hours, q.money, b.used_gpu_hours, b.held_gpu_hours, b.used_money,
                                   b.held_money))
    return out


def list_accounts(*, url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        rows = []
        for a in s.scalars(select(Account).order_by(Account.name)):
            users = sorted((m.user.name + ("*" if m.is_default else "")) for m in a.memberships)
            rows.append({"account": a.name, "description": a.description, "users": users})
        return rows


def list_prices(*, url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        out = []
        for p in s.scalars(select(GpuPrice).order_by(GpuPrice.gpu_type, GpuPrice.effective_from)):
            out.append({"kind": "gpu", "name": p.gpu_type, "rate": p.rate,
                        "of": p.base_gpu_type, "fraction": f"{p.fraction_num}/{p.fraction_den}" if p.base_gpu_type else None,
                        "currency": p.currency, "effective_from": p.effective_from.isoformat()})
        for m in s.scalars(select(PriceMultiplier).order_by(PriceMultiplier.kind, PriceMultiplier.name,
                                                             PriceMultiplier.effective_from)):
            out.append({"kind": m.kind.value, "name": m.name, "multiplier": m.multiplier,
                        "effective_from": m.effective_from.isoformat()})
        return out


def open_reservations(s: Session, cluster: str | None = None) -> Iterable[Reservation]:
    stmt = select(Reservation).where(Reservation.status.in_([ReservationStatus.held, ReservationStatus.submitted]))
    if cluster:
        stmt = stmt.where(Reservation.cluster == cluster)
    return s.scalars(stmt)

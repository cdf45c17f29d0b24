"""Ledger administration on the ORM: accounts, users, the price book (GPU rates, partition
and QOS multipliers), quotas and their status. The quota decision itself (reserve, attach,
release, period counters) is :mod:`gpuhpc.ledger.quota`; this module reaches it inside its own
sessions through :func:`session_tx`.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.ledger import audit, db, periods, pricing, quota
from gpuhpc.ledger.orm import (Account, GpuPrice, Membership, MultiplierKind, Period, PriceMultiplier, Quota,
                               QuotaUsage, Reservation, ReservationStatus, User, utcnow)

ZERO = Decimal(0)


def session_tx(s: Session) -> quota.Tx:
    """The session's own transaction as a :class:`gpuhpc.ledger.quota.Tx` (pending ORM changes
    flushed first), for the quota functions that write counters and holds."""
    s.flush()
    return quota.Tx(s.connection().connection.dbapi_connection, s.get_bind().dialect.name)


def require_admin(what: str, url: str | None = None) -> None:
    """Raise LedgerError (one line, nothing changed) unless this process may change the ledger:
    SQLite, the file and its directory are writable (the admin owns them, mode 0600/0640);
    PostgreSQL, the role may write the tables (the migrations' ``gpuhpc_admin`` grants)."""
    import getpass

    from gpuhpc.errors import LedgerError
    from gpuhpc.ledger import hooks, paths

    url = url or paths.db_url()
    me = getpass.getuser()
    if url.startswith("sqlite:"):
        if not hooks.writable(url):
            raise LedgerError(f"permission denied: {what} changes the ledger, which only its admin may do "
                              f"(user {me} cannot write {quota.sqlite_file(url)})")
        return
    from sqlalchemy import text

    with db.get_engine(url).connect() as conn:
        ok = conn.execute(text(quota.WRITE_RIGHTS_SQL)).scalar()
        conn.rollback()
    if not ok:
        raise LedgerError(f"permission denied: {what} changes the ledger, which only its admin may do "
                          f"(database role of user {me} has read access only)")


def load_price_book(s: Session) -> pricing.PriceBook:
    return quota.load_price_book(session_tx(s))


def lock_all_quotas(s: Session) -> list[Quota]:
    return list(s.scalars(select(Quota).order_by(Quota.id).with_for_update()))


def bucket(s: Session, q: Quota, at: dt.datetime) -> QuotaUsage:
    """The counter row of quota ``q`` for the period containing ``at`` (created on first use,
    by :func:`gpuhpc.ledger.quota.counter`). Call with the quota row locked."""
    bid = quota.counter_of(session_tx(s), q.id, at)[0]
    return s.get(QuotaUsage, bid)


def release_holds(s: Session, r: Reservation, status: ReservationStatus, now: dt.datetime | None = None) -> None:
    """:func:`gpuhpc.ledger.quota.release_holds` for an ORM reservation (refreshed afterwards)."""
    quota.release_holds(session_tx(s), r.id, status.value, now or utcnow())
    s.expire_all()          # the counters and holds were written below the ORM


def _account(session: Session, name: str) -> Account | None:
    return session.scalar(select(Account).where(Account.name == name))


def _user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def add_account(name: str, *, description: str = "", grant: str | None = None, cost_centre: str | None = None,
                url: str | None = None) -> bool:
    _check_name(name, "account")
    grant, cost_centre = _check_code(grant, "--grant"), _check_code(cost_centre, "--cost-centre")
    with db.session_scope(url) as s:
        if _account(s, name):
            return False
        s.add(Account(name=name, description=description, grant_code=grant, cost_centre=cost_centre))
        if grant or cost_centre:
            audit.record(s, "account.set", f"account {name}", None, {"grant": grant, "cost_centre": cost_centre})
        return True


def _check_code(value: str | None, what: str) -> str | None:
    """A grant or cost-centre code: printable, no control characters, up to 64 ("" clears it)."""
    if value is None:
        return None
    v = value.strip()
    if len(v) > 64 or any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise UserInputError(f"{value!r} is not a code of up to 64 printable characters", field=what,
                             hint="e.g. ERC-2026-0042 (an empty one clears it)")
    return v


def set_account(name: str, *, grant: str | None = None, cost_centre: str | None = None,
                url: str | None = None) -> bool:
    """Set an account's grant and/or cost-centre code (``""`` clears one); audited. True when it changed."""
    grant, cost_centre = _check_code(grant, "--grant"), _check_code(cost_centre, "--cost-centre")
    if grant is None and cost_centre is None:
        raise UserInputError("nothing to set", field="--grant", hint="--grant CODE and/or --cost-centre CODE")
    with db.session_scope(url) as s:
        a = _account(s, name)
        if a is None:
            raise GpuhpcError(f"no account {name!r}", hint=f"gpuhpc ledger account add {name}")
        before = {"grant": a.grant_code, "cost_centre": a.cost_centre}
        if grant is not None:
            a.grant_code = grant or None
        if cost_centre is not None:
            a.cost_centre = cost_centre or None
        after = {"grant": a.grant_code, "cost_centre": a.cost_centre}
        audit.record(s, "account.set", f"account {name}", before, after)
        return before != after


def add_user(name: str, account: str, *, default: bool = False, url: str | None = None) -> bool:
    _check_name(name, "user")
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            raise GpuhpcError(f"no account {account!r}", hint=f"gpuhpc ledger account add {account}")
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
    eff = effective_from or pricing.at_sacct_resolution(utcnow())
    frac = pricing.parse_fraction(fraction or "1") if base else None
    with db.session_scope(url) as s:
        row = s.scalar(select(GpuPrice).where(GpuPrice.gpu_type == gpu_type, GpuPrice.effective_from == eff))
        before = None if row is None else _price_dict(row)
        if row is None:
            row = GpuPrice(gpu_type=gpu_type, effective_from=eff)
            s.add(row)
        row.rate = rate
        row.base_gpu_type = base
        row.fraction_num = frac.numerator if frac else None
        row.fraction_den = frac.denominator if frac else None
        row.currency = currency
        audit.record(s, "price.set", f"gpu {gpu_type} from {eff.isoformat()}", before, _price_dict(row))


def _price_dict(row: GpuPrice) -> dict:
    return {"rate": None if row.rate is None else str(pricing.to_decimal(Decimal(row.rate))),
            "of": row.base_gpu_type,
            "fraction": f"{row.fraction_num}/{row.fraction_den}" if row.base_gpu_type else None,
            "currency": row.currency}


def set_multiplier(kind: str, name: str, multiplier: Decimal, *, effective_from: dt.datetime | None = None,
                   url: str | None = None) -> None:
    k = MultiplierKind(kind)
    eff = effective_from or pricing.at_sacct_resolution(utcnow())
    with db.session_scope(url) as s:
        if k is MultiplierKind.qos and multiplier != 1:
            _refuse_qos_with_money(s, name)
        row = s.scalar(select(PriceMultiplier).where(PriceMultiplier.kind == k, PriceMultiplier.name == name,
                                                     PriceMultiplier.effective_from == eff))
        before = None if row is None else {"multiplier": str(pricing.to_decimal(Decimal(row.multiplier)))}
        if row is None:
            row = PriceMultiplier(kind=k, name=name, effective_from=eff, multiplier=multiplier)
            s.add(row)
        row.multiplier = multiplier
        audit.record(s, "multiplier.set", f"{k.value} {name} from {eff.isoformat()}", before,
                     {"multiplier": str(pricing.to_decimal(Decimal(multiplier)))})


# Slurm bills a job by its partition's TRESBillingWeights only: a QOS multiplier lives in the ledger
# alone, so a money budget that Slurm enforces (GrpTRESMins=billing, sync-slurm) would drift from it.
QOS_DRIFT = ("Slurm bills by partition weights only (TRESBillingWeights), so a QOS multiplier applies in the "
             "ledger alone and a money budget in Slurm would drift from the ledger")


def _refuse_qos_with_money(s: Session, qos: str) -> None:
    money = sorted({(q.account.name + (f"/{q.user.name}" if q.user else ""))
                    for q in s.scalars(select(Quota).where(Quota.money.is_not(None)))})
    if money:
        raise UserInputError(f"QOS multiplier for {qos!r} refused: money quotas exist ({', '.join(money)}); {QOS_DRIFT}",
                             field="--qos", hint="price the capacity as a partition (--partition P --multiplier M), "
                                                 "or make those quotas GPU-hour quotas (--gpu-hours) first")


def _refuse_money_with_qos(s: Session) -> None:
    names = pricing.unmirrored_qos(load_price_book(s), utcnow())
    if names:
        raise UserInputError(f"money quota refused: QOS multipliers other than 1 exist ({', '.join(names)}); "
                             f"{QOS_DRIFT}",
                             field="--money", hint="set them to 1 (gpuhpc ledger price set --qos Q --multiplier 1) "
                                                   "and price by partition instead, or give a --gpu-hours quota")


def set_quota(account: str, *, user: str | None = None, gpu_hours: Decimal | None = None,
              money: Decimal | None = None, period: str = "month", url: str | None = None,
              cluster: str | None = None) -> None:
    """``cluster``: the quota counts that cluster's usage only (None: every cluster's; one quota of
    each kind per account, user and cluster, migration 0011)."""
    if gpu_hours is None and money is None:
        raise UserInputError("give --gpu-hours and/or --money")
    # a calendar period, or an allocation window's text (periods.window_arg: 2026-07-01/P12M)
    p = Period(period) if period in Period.__members__ else periods.WindowName(periods.check_period(period))
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            raise GpuhpcError(f"no account {account!r}", hint=f"gpuhpc ledger account add {account}")
        uid = None
        if user:
            u = _user(s, user)
            if u is None:
                raise UserInputError(f"no user {user!r}", hint=f"gpuhpc ledger user add {user} --account {account}")
            uid = u.id
        if money is not None:
            _refuse_money_with_qos(s)
        q = s.scalar(select(Quota).where(Quota.account_id == acct.id, Quota.user_key == (uid or 0),
                                         Quota.cluster_key == (cluster or "")).with_for_update())
        before = None if q is None else _quota_dict(q)
        if q is None:
            q = Quota(account_id=acct.id, user_id=uid, user_key=uid or 0, period=p, cluster=cluster or None,
                      cluster_key=cluster or "")
            s.add(q)
        elif q.period != p:
            # counters are per period: start afresh (they are rebuilt from charges)
            for b in s.scalars(select(QuotaUsage).where(QuotaUsage.quota_id == q.id)):
                s.delete(b)
        q.period = p
        q.gpu_hours = gpu_hours
        q.money = money
        q.updated_at = utcnow()
        audit.record(s, "quota.set", _quota_target(account, user, cluster), before, _quota_dict(q))


def _quota_target(account: str, user: str | None, cluster: str | None = None) -> str:
    return f"account {account}" + (f" user {user}" if user else "") + (f" cluster {cluster}" if cluster else "")


def _quota_dict(q: Quota) -> dict:
    def d(v: Decimal | None) -> str | None:
        return None if v is None else str(pricing.to_decimal(Decimal(v)))

    return {"period": getattr(q.period, "value", q.period), "gpu_hours": d(q.gpu_hours), "money": d(q.money)}


def remove_quota(account: str, *, user: str | None = None, url: str | None = None,
                 cluster: str | None = None) -> bool:
    with db.session_scope(url) as s:
        acct = _account(s, account)
        if acct is None:
            return False
        uid = _user(s, user).id if user and _user(s, user) else None
        if user and uid is None:
            return False
        q = s.scalar(select(Quota).where(Quota.account_id == acct.id, Quota.user_key == (uid or 0),
                                         Quota.cluster_key == (cluster or "")))
        if q is None:
            return False
        audit.record(s, "quota.remove", _quota_target(account, user if uid else None, cluster), _quota_dict(q), None)
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
    cluster: str | None = None      # the one cluster whose usage counts; None: every cluster (migration 0011)

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
                "remaining_money": self.remaining_money, "cluster": self.cluster}


def quota_status(account: str | None = None, *, url: str | None = None, now: dt.datetime | None = None) -> list[QuotaStatus]:
    now = now or utcnow()
    out = []
    with db.session_scope(url) as s:
        stmt = select(Quota).join(Account).order_by(Account.name, Quota.user_key, Quota.cluster_key)
        if account:
            stmt = stmt.where(Account.name == account)
            if _account(s, account) is None:
                raise GpuhpcError(f"no account {account!r}")
        for q in list(s.scalars(stmt.with_for_update())):
            b = bucket(s, q, now)
            out.append(QuotaStatus(q.account.name, q.user.name if q.user else None, q.period.value, b.period_start,
                                   q.gpu_hours, q.money, b.used_gpu_hours, b.held_gpu_hours, b.used_money,
                                   b.held_money, q.cluster))
    return out


def list_accounts(*, url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        rows = []
        for a in s.scalars(select(Account).order_by(Account.name)):
            users = sorted((m.user.name + ("*" if m.is_default else "")) for m in a.memberships)
            rows.append({"account": a.name, "description": a.description, "grant": a.grant_code,
                         "cost_centre": a.cost_centre, "users": users})
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

"""Credits, debits and corrections: ``gpuhpc ledger adjust``, ``gpuhpc ledger reprice``, the
ledger's policies (``gpuhpc ledger policy``).

Charges are append-only (migration 0009's trigger refuses UPDATE and DELETE on both backends):
a correction is never an edit but an :class:`~gpuhpc.ledger.orm.Adjustment` (the why: kind,
reason, job, who, when) and the charges that carry its money (``Charge.adjustment_id``),
counted in the quota period of their ``bucket_at`` like any charge, so budgets, the budget
snapshot and the reports include them. Every adjustment also writes an audit row
(:mod:`gpuhpc.ledger.audit`).

* **adjust**: a credit (negative) or debit (positive) of money and/or GPU-hours for an account,
  optionally one user in it and one job of it, with a reason.
* **reprice**: a corrected rate for one GPU type over ``[since, until)``: each run's charges of
  that type dated inside the window are priced again at the corrected rate (its partition and
  QOS multipliers from the price book, as ingest priced it); the difference, per run and day,
  is booked as a ``correction`` charge. Rerunning it with the same rate books nothing.
* **NODE_FAIL refunds** (policy ``node_fail_refund``): the ingest refunds what a run that ended
  ``NODE_FAIL`` was charged (:func:`refund_rows`, called by :mod:`gpuhpc.ledger.ingest`).
"""
from __future__ import annotations

import datetime as dt
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpuhpc.errors import GpuhpcError, LedgerError, UserInputError
from gpuhpc.ledger import admin, audit, db, pricing, quota
from gpuhpc.ledger.orm import (Account, Adjustment, Charge, LedgerPolicy, Membership, Quota, QuotaUsage, UsageRecord,
                               User, utcnow)

ZERO = Decimal(0)
KINDS = ("credit", "debit")
REASON_MAX = 1000
JOB_RE = re.compile(r"^\d{1,20}(_\d{1,10})?$")
# name -> (default, allowed values, what it does)
POLICIES = {
    "node_fail_refund": ("off", ("on", "off"),
                         "refund what a run that ended NODE_FAIL was charged, at ingest (an adjustment of kind refund)"),
    pricing.POLICY: (pricing.PER_GPU, pricing.MODES,
                     "how ingest prices a run: per_gpu (its GPUs) or max_share (the largest of its shares of its "
                     "nodes' GPUs, CPUs and memory × the nodes' price; docs/ledger.md)"),
    # read by gpuhpc.ledger.slurm_sync (sync-slurm, rollover, check): docs/ledger.md "budget enforcement modes"
    "slurm_enforcement": ("association", ("association", "qos"),
                          "where sync-slurm puts budgets: association (GrpTRESMins on the account's association; needs "
                          "PriorityDecayHalfLife=0) or qos (a NoDecay QOS per budgeted account; fair-share keeps decaying)"),
}


# ------------------------------------------------------------------ checks (exit 2, one line naming the field)
def check_reason(reason: str | None) -> str:
    r = (reason or "").strip()
    if not r:
        raise UserInputError("a reason is required", field="--reason",
                             hint='say why, e.g. --reason "NODE_FAIL of job 1234 on gpu-node2"')
    if any(ord(c) < 32 or ord(c) == 127 for c in r):
        raise UserInputError("control characters are not allowed", field="--reason", hint="one line of plain text")
    if len(r) > REASON_MAX:
        raise UserInputError(f"{len(r)} characters, more than {REASON_MAX}", field="--reason",
                             hint="shorten it (details belong in a ticket it names)")
    return r


def _positive(value: str | Decimal | None, what: str) -> Decimal | None:
    if value is None:
        return None
    try:
        d = Decimal(str(value).strip())
    except Exception:
        raise UserInputError(f"not a number: {value!r}", field=what, hint=f"a positive number such as {what} 12.50") from None
    if not d.is_finite() or d <= 0:
        raise UserInputError(f"must be a positive number, not {value!r}", field=what,
                             hint="give the size; --credit or --debit says which way")
    if d != d.quantize(pricing.QUANTUM):
        raise UserInputError(f"{value!r} has more than 6 decimals", field=what, hint="the ledger keeps 6 decimals")
    if d >= Decimal(10) ** 13:
        raise UserInputError(f"{value!r} is too large", field=what, hint="at most 13 digits before the point")
    return d


# ------------------------------------------------------------------ booking
@dataclass
class Booked:
    """What one adjust or reprice booked."""

    adjustments: list[dict] = field(default_factory=list)
    charges: int = 0
    gpu_hours: Decimal = ZERO
    amount: Decimal = ZERO
    skipped: int = 0          # reprice under max_share: runs sacct no longer has (left alone)

    def as_dict(self) -> dict:
        return {"adjustments": self.adjustments, "charges": self.charges, "gpu_hours": str(self.gpu_hours),
                "amount": str(self.amount), "skipped": self.skipped}


class Counters:
    """The quota counters that charges of an account (and user) count in: each fetched (created
    from the charges already booked) *before* the new charges are inserted, then added to."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self.quotas = admin.lock_all_quotas(s)
        self.users = {uid: name for uid, name in s.execute(select(User.id, User.name))}
        self.accounts = {aid: name for aid, name in s.execute(select(Account.id, Account.name))}
        self._pending: dict[int, list] = {}

    def add(self, account: str, user: str, at: dt.datetime, hours: Decimal, money: Decimal,
            cluster: str | None = None) -> None:
        """``cluster``: the cluster of the charge's run (a quota of another cluster does not count
        it, :data:`gpuhpc.ledger.quota.CLUSTER_CHARGES`); None: a charge of no run, which all count."""
        for q in self.quotas:
            if self.accounts.get(q.account_id) != account:
                continue
            if cluster is not None and not quota.quota_applies(q.cluster, cluster):
                continue
            if q.user_id is not None and self.users.get(q.user_id) != user:
                continue
            b = admin.bucket(self.s, q, at)
            acc = self._pending.setdefault(b.id, [b, ZERO, ZERO])
            acc[1] += hours
            acc[2] += money

    def apply(self) -> None:
        for b, hours, money in self._pending.values():
            b = self.s.get(QuotaUsage, b.id)
            b.used_gpu_hours = b.used_gpu_hours + hours
            b.used_money = b.used_money + money
        self._pending.clear()


def _adjustment_dict(a: Adjustment) -> dict:
    return {"id": a.id, "kind": a.kind, "account": a.account_name, "user": a.user_name or None,
            "cluster": a.cluster, "job_id": a.job_id, "gpu_hours": str(a.gpu_hours), "amount": str(a.amount),
            "reason": a.reason, "at": a.bucket_at.isoformat(), "by": a.created_by}


def adjust(account: str, *, kind: str, reason: str, amount: str | Decimal | None = None,
           gpu_hours: str | Decimal | None = None, user: str | None = None, job: str | None = None,
           cluster: str | None = None, at: dt.datetime | None = None, url: str | None = None) -> Booked:
    """Book a credit (``kind="credit"``: the account gets it back) or a debit, of ``amount``
    and/or ``gpu_hours`` (both positive; the kind gives the sign), counted in the quota period
    containing ``at`` (default now). ``user``: one user's share (that user's quota counts it
    too); ``job``: the job it is about (must be the account's in the ledger; its user by
    default). One adjustment row, one charge, one audit row, in one transaction."""
    if kind not in KINDS:
        raise UserInputError(f"{kind!r} is not credit or debit", field="kind", hint="--credit or --debit")
    r = check_reason(reason)
    money = _positive(amount, "--amount")
    hours = _positive(gpu_hours, "--gpu-hours")
    if money is None and hours is None:
        raise UserInputError("nothing to adjust", field="--amount", hint="give --amount X and/or --gpu-hours H")
    if job is not None and not JOB_RE.match(job):
        raise UserInputError(f"{job!r} is not a Slurm job id", field="--job", hint="digits, or ARRAYJOB_TASK")
    sign = -1 if kind == "credit" else 1
    money, hours = sign * (money or ZERO), sign * (hours or ZERO)
    at = at or utcnow()
    out = Booked()
    with db.session_scope(url) as s:
        if s.scalar(select(Account.id).where(Account.name == account)) is None:
            raise GpuhpcError(f"no account {account!r} in the ledger", hint="gpuhpc ledger account list")
        job_id = task = None
        if job is not None:
            job_id, _, t = job.partition("_")
            task = int(t) if t else None
            stmt = select(UsageRecord.cluster, UsageRecord.account_name, UsageRecord.user_name).where(
                UsageRecord.job_id == job_id)
            if task is not None:
                stmt = stmt.where(UsageRecord.array_task_id == task)
            if cluster:
                stmt = stmt.where(UsageRecord.cluster == cluster)
            found = {tuple(x) for x in s.execute(stmt)}
            if not found:
                raise GpuhpcError(f"no job {job} in the ledger" + (f" on cluster {cluster}" if cluster else ""),
                                  hint="gpuhpc ledger ingest first, or leave --job out")
            if not any(a == account for _, a, _ in found):
                raise UserInputError(f"job {job} was charged to {', '.join(sorted({a for _, a, _ in found}))}, "
                                     f"not {account}", field="--job", hint="name the job's account")
            clusters = {c for c, a, _ in found if a == account}
            if len(clusters) > 1:
                raise UserInputError(f"job {job} is on several clusters ({', '.join(sorted(clusters))})",
                                     field="--cluster", hint="say which with --cluster")
            cluster = clusters.pop()
            if user is None:
                users = {u for _, a, u in found if a == account}
                user = users.pop() if len(users) == 1 else None
        if user is not None:
            member = s.scalar(select(Membership.id).join(User).join(Account).where(User.name == user,
                                                                                  Account.name == account))
            if member is None:
                raise UserInputError(f"user {user!r} is not in account {account!r}", field="--user",
                                     hint=f"gpuhpc ledger user add {user} --account {account}, or leave --user out")
        counters = Counters(s)
        counters.add(account, user or "", at, hours, money)      # counters fetched before the charge exists
        a = Adjustment(kind=kind, account_name=account, user_name=user or "", cluster=cluster, job_id=job,
                       gpu_hours=hours, amount=money, reason=r, detail="", bucket_at=at,
                       created_by=audit.actor(s), created_at=utcnow())
        s.add(a)
        s.flush()
        s.add(Charge(usage_id=None, adjustment_id=a.id, account_name=account, user_name=user or "",
                     gpu_hours=hours, rate=ZERO, amount=money, bucket_at=at, created_at=a.created_at, kind="adjust"))
        counters.apply()
        d = _adjustment_dict(a)
        audit.record(s, f"adjust.{kind}", f"account {account}" + (f" user {user}" if user else ""), None, d)
        out.adjustments.append(d)
        out.charges, out.gpu_hours, out.amount = 1, hours, money
    return out


def reprice(gpu_type: str, rate: str | Decimal, *, since: dt.datetime, until: dt.datetime, reason: str,
            account: str | None = None, dry_run: bool = False, url: str | None = None,
            runs: Iterable | None = None, nodes: pricing.Fleet | None = None) -> Booked:
    """A corrected rate per GPU-hour for ``gpu_type`` over ``[since, until)``: the charges of
    that type's runs dated in the window are priced again (per run and day: what they net to in
    GPU-hours × the corrected rate × the run's partition and QOS multipliers at its start), and
    the difference is booked as ``correction`` charges, one adjustment per account. The charges
    themselves never change; a second run with the same rate books nothing.

    Under the ``max_share`` pricing policy a run is priced again as ingest prices it
    (:meth:`gpuhpc.ledger.pricing.PriceCache.price_run` over a :class:`~gpuhpc.ledger.pricing.CorrectedBook`):
    every run whose price involves the type (its GPUs, or its nodes' price: a CPU-only run on an
    ``h100`` node too), each part (run and day) the cumulative price at its end less at its start.
    That needs what each run held: ``runs``, sacct's runs of the window as ingest reads them
    (:func:`gpuhpc.ledger.ingest.group_jobs`: ``key``, ``gpus``, ``cpus``, ``mem_mb``, ``nodelist``)
    and ``nodes`` (:func:`gpuhpc.ledger.pricing.fleet`); a run sacct no longer has is left alone
    and counted in :attr:`Booked.skipped`."""
    if not gpu_type or any(ord(c) < 33 for c in gpu_type) or len(gpu_type) > 64:
        raise UserInputError(f"{gpu_type!r} is not a GPU type", field="--gpu-type", hint="as sacct names it: h100")
    r = check_reason(reason)
    new_rate = pricing.parse_money(rate, what="--rate")
    if new_rate != new_rate.quantize(pricing.QUANTUM):
        raise UserInputError(f"{rate!r} has more than 6 decimals", field="--rate", hint="the ledger keeps 6 decimals")
    if until <= since:
        raise UserInputError(f"the window is empty ({since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M})",
                             field="--until", hint="--until after --since")
    out = Booked()
    with db.session_scope(url) as s:
        book = admin.load_price_book(s)
        share = policy(s, pricing.POLICY) == pricing.MAX_SHARE
        if share and runs is None:
            raise LedgerError(f"the pricing policy is {pricing.MAX_SHARE}: repricing needs what each run held "
                              f"(sacct's AllocTRES and nodes); gpuhpc ledger reprice reads them, the API takes runs=")
        stmt = (select(Charge.usage_id, Charge.bucket_at, func.sum(Charge.gpu_hours), func.sum(Charge.amount))
                .where(Charge.usage_id.is_not(None), Charge.bucket_at >= since, Charge.bucket_at < until)
                .group_by(Charge.usage_id, Charge.bucket_at))
        nets = {(uid, at): (Decimal(h), Decimal(m)) for uid, at, h, m in s.execute(stmt)}
        uids = sorted({uid for uid, _ in nets})
        records: dict[int, UsageRecord] = {}
        for i in range(0, len(uids), 500):
            q = select(UsageRecord).where(UsageRecord.id.in_(uids[i:i + 500]))
            if not share:            # max_share: a run of another type may pay for this type's node
                q = q.where(UsageRecord.gpu_type == gpu_type)
            if account:
                q = q.where(UsageRecord.account_name == account)
            records.update({u.id: u for u in s.scalars(q)})
        wants = _max_share_wants(s, pricing.CorrectedBook(book, gpu_type, new_rate), gpu_type, nets, records,
                                 runs or (), nodes, out) if share else {}
        todo = []
        per_account: dict[str, list] = defaultdict(lambda: [ZERO, 0])
        for (uid, at), (hours, money) in sorted(nets.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            run = records.get(uid)
            if run is None:
                continue
            if share:
                if (uid, at) not in wants:
                    continue
                want, eff = wants[(uid, at)]
            else:
                mult = book.multiplier("partition", run.partition, run.run_start) * \
                    book.multiplier("qos", run.qos, run.run_start)
                eff = Fraction(new_rate) * mult
                # GPU-hours weigh a MIG slice by its fraction (pricing.gpu_weight); the rate is per slice-hour
                want = pricing.to_decimal(Fraction(pricing.to_decimal(hours)) / pricing.gpu_weight(gpu_type) * eff)
            delta = want - pricing.to_decimal(money)
            if delta:
                todo.append((run, at, delta, pricing.to_decimal(eff)))
                per_account[run.account_name][0] += delta
                per_account[run.account_name][1] += 1
        detail = json.dumps({"gpu_type": gpu_type, "rate": str(new_rate), "since": since.isoformat(),
                             "until": until.isoformat()}, sort_keys=True)
        if dry_run:
            for acct, (amount, n) in sorted(per_account.items()):
                out.adjustments.append({"kind": "correction", "account": acct, "amount": str(amount), "charges": n,
                                        "reason": r, "dry_run": True})
                out.amount += amount
                out.charges += n
            s.rollback()
            return out
        counters = Counters(s)
        for run, at, delta, _ in todo:
            counters.add(run.account_name, run.user_name, at, ZERO, delta, run.cluster)
        adj: dict[str, Adjustment] = {}
        now = utcnow()
        who = audit.actor(s)
        for acct, (amount, _) in sorted(per_account.items()):
            a = adj[acct] = Adjustment(kind="correction", account_name=acct, user_name="", cluster=None, job_id=None,
                                       gpu_hours=ZERO, amount=amount, reason=r, detail=detail, bucket_at=since,
                                       created_by=who, created_at=now)
            s.add(a)
        s.flush()
        for run, at, delta, eff in todo:
            s.add(Charge(usage_id=run.id, adjustment_id=adj[run.account_name].id, account_name=run.account_name,
                         user_name=run.user_name, gpu_hours=ZERO, rate=eff, amount=delta, bucket_at=at,
                         created_at=now, kind="correction"))
        counters.apply()
        for acct, a in sorted(adj.items()):
            d = {**_adjustment_dict(a), "charges": per_account[acct][1], **json.loads(detail)}
            audit.record(s, "reprice", f"account {acct} gpu {gpu_type}", None, d)
            out.adjustments.append(d)
        out.charges = len(todo)
        out.amount = sum((d for _, _, d, _ in todo), ZERO)
    return out


def _max_share_wants(s: Session, book: pricing.CorrectedBook, gpu_type: str, nets: dict, records: dict,
                     runs: Iterable, nodes: pricing.Fleet | None, out: Booked) -> dict:
    """Under ``max_share``: ``(usage id, bucket_at) -> (amount, rate)`` each part of a run should
    have been charged at the corrected rate, priced by ingest's own function (the cumulative
    :meth:`~gpuhpc.ledger.pricing.PriceCache.price_run` at the part's end less at its start; a
    part ends where the run's next charge date begins, the last at the run's end). Only runs whose
    price involves ``gpu_type``; a part that nets to nothing (a refund) gets nothing; a run sacct
    no longer has is counted in ``out.skipped``."""
    cache = pricing.PriceCache(book, mode=pricing.MAX_SHARE, nodes=nodes)
    held = {r.key: r for r in runs}
    uids = sorted({uid for uid, _ in nets if uid in records})
    dates: dict[int, list[dt.datetime]] = defaultdict(list)
    for i in range(0, len(uids), 500):
        for uid, at in s.execute(select(Charge.usage_id, Charge.bucket_at).distinct()
                                 .where(Charge.usage_id.in_(uids[i:i + 500]))):
            dates[uid].append(at)
    wants: dict = {}
    missing: set[int] = set()
    for (uid, at), (hours, money) in nets.items():
        rec = records.get(uid)
        if rec is None or (not hours and not money):
            continue
        run = held.get((rec.cluster, rec.job_id, rec.array_task_id, rec.run_start))
        if run is None:
            missing.add(uid)
            continue
        shapes = cache.shapes_of(run.nodelist, rec.partition, run.gpus) or []
        if gpu_type not in run.gpus and not any(t == gpu_type for sh in shapes for t, _ in sh.gpus):
            continue
        start = max(int((at - rec.run_start).total_seconds()), 0)
        later = sorted(d for d in dates[uid] if d > at)
        end = max(int((later[0] - rec.run_start).total_seconds()) if later else rec.elapsed_s, start)
        whole = _price_upto(cache, run, rec, rec.elapsed_s)
        before = _price_upto(cache, run, rec, start).amount if start else ZERO
        part = _price_upto(cache, run, rec, end).amount - before
        wants[(uid, at)] = (part, Fraction(whole.rate))
    out.skipped = len(missing)
    return wants


def _price_upto(cache: pricing.PriceCache, run, rec: UsageRecord, seconds: int) -> pricing.Price:
    """The run's price for its first ``seconds`` (what it held from sacct, the rest as the ledger has it)."""
    return cache.price_run(run.gpus, run.cpus, run.mem_mb, run.nodelist, seconds, rec.partition, rec.qos, rec.run_start)


def period_adjustments(s: Session, account: str, user: str | None, start: dt.datetime,
                       end: dt.datetime | None) -> tuple[Decimal, Decimal]:
    """(GPU-hours, money) the adjustments of ``account`` (of ``user`` only, for a user quota) net
    to in ``[start, end)``: what a quota counter holds that Slurm's usage does not, so that
    sync-slurm moves the Slurm limit by it (a credit raises it) and ``ledger check`` leaves it
    out of the usage it compares."""
    stmt = select(func.coalesce(func.sum(Charge.gpu_hours), 0), func.coalesce(func.sum(Charge.amount), 0)).where(
        Charge.adjustment_id.is_not(None), Charge.account_name == account, Charge.bucket_at >= start)
    if end is not None:
        stmt = stmt.where(Charge.bucket_at < end)
    if user is not None:
        stmt = stmt.where(Charge.user_name == user)
    h, m = s.execute(stmt).one()
    return pricing.to_decimal(Decimal(str(h))), pricing.to_decimal(Decimal(str(m)))


def list_adjustments(*, account: str | None = None, since: dt.datetime | None = None,
                     url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        stmt = select(Adjustment).order_by(Adjustment.id)
        if account:
            stmt = stmt.where(Adjustment.account_name == account)
        if since is not None:
            stmt = stmt.where(Adjustment.created_at >= since)
        return [_adjustment_dict(a) for a in s.scalars(stmt)]


# ------------------------------------------------------------------ policies
def check_policy(name: str, value: str | None = None) -> None:
    if name not in POLICIES:
        raise UserInputError(f"unknown policy {name!r}", field="NAME", hint=f"one of: {', '.join(sorted(POLICIES))}")
    if value is not None and value not in POLICIES[name][1]:
        raise UserInputError(f"{value!r} is not a value of {name}", field="VALUE",
                             hint=f"one of: {', '.join(POLICIES[name][1])}")


def policy(s: Session, name: str) -> str:
    """A policy's value in this session's transaction (its default when never set)."""
    check_policy(name)
    row = s.get(LedgerPolicy, name)
    return POLICIES[name][0] if row is None else row.value


def pricing_mode(*, url: str | None = None) -> str:
    """The ledger's pricing policy (:data:`gpuhpc.ledger.pricing.MODES`), read in a transaction of its own."""
    with db.session_scope(url) as s:
        return policy(s, pricing.POLICY)


def set_policy(name: str, value: str, *, url: str | None = None) -> bool:
    """Set a policy; True when it changed (audited)."""
    check_policy(name, value)
    with db.session_scope(url) as s:
        row = s.get(LedgerPolicy, name)
        before = POLICIES[name][0] if row is None else row.value
        if row is None:
            row = LedgerPolicy(name=name, value=value, updated_by=audit.actor(s), updated_at=utcnow())
            s.add(row)
        row.value, row.updated_by, row.updated_at = value, audit.actor(s), utcnow()
        audit.record(s, "policy.set", name, {"value": before}, {"value": value})
        return before != value


def list_policies(*, url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        rows = {p.name: p for p in s.scalars(select(LedgerPolicy))}
        return [{"name": n, "value": rows[n].value if n in rows else d, "default": d, "values": list(v), "help": h,
                 "updated_by": rows[n].updated_by if n in rows else None,
                 "updated_at": rows[n].updated_at.isoformat() if n in rows else None}
                for n, (d, v, h) in sorted(POLICIES.items())]


def audit_entries(*, since: dt.datetime | None = None, action: str | None = None, url: str | None = None) -> list[dict]:
    with db.session_scope(url) as s:
        return audit.entries(s, since=since, action=action)

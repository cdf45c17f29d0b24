"""``gpuhpc ledger sync-slurm``: mirror ledger accounts, users and GPU-hour quotas into slurmdbd
so that a user who calls ``sbatch`` directly is still held to the quota.

For every ledger account: the Slurm account exists, every member has an association, and a
QOS (``gpuhpc-<account>``; an account already named ``gpuhpc-*`` uses its own name) is the
account's (and its users') only and default QOS, with

* ``Flags=NoDecay`` and ``GrpTRESMins=gres/gpu=<GPU-hours × 60>``: the cumulative limit.
  Slurm counts that usage only with ``PriorityType=priority/multifactor``, and without
  ``AccountingStorageEnforce=safe`` it stops *new* jobs only once usage reached the limit;
* ``MaxTRESMinsPerJob=gres/gpu=<remaining GPU-minutes>`` (budget − settled usage, refreshed
  on every sync, e.g. after each ``ledger ingest``): a directly submitted job larger than
  what is left pends with ``QOSMaxGRESMinutesPerJob``; this works with any priority plugin.

At a new quota period the QOS's raw usage is reset (the period is remembered in the QOS
description). Slurm enforces any of it only with
``AccountingStorageEnforce=associations,limits,qos`` in slurm.conf.

The ledger database is read first and closed; sacctmgr runs afterwards (no network call
inside a DB transaction), through :class:`~gpuhpc.slurm.client.SlurmClient`, which builds the
command lines.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlalchemy import select

from gpuhpc.ledger import admin, db, pricing
from gpuhpc.ledger.orm import Account, Quota, utcnow

DESC_PREFIX = "gpuhpc period="


def qos_name(account: str) -> str:
    return account if account.startswith("gpuhpc-") else f"gpuhpc-{account}"


@dataclass(frozen=True)
class AccountPlan:
    account: str
    description: str
    users: tuple[str, ...]
    qos: str
    grp_gpu_minutes: int | None      # None: no GPU-hour quota (limit cleared)
    max_job_gpu_minutes: int | None  # remaining GPU-minutes of the period (budget - used)
    period_start: dt.datetime | None


@dataclass
class SyncResult:
    commands: list[list[str]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"commands": [" ".join(c) for c in self.commands]}


def plan(*, url: str | None = None, accounts: list[str] | None = None,
         now: dt.datetime | None = None) -> list[AccountPlan]:
    now = now or utcnow()
    out = []
    with db.session_scope(url) as s:
        stmt = select(Account).order_by(Account.name)
        if accounts:
            stmt = stmt.where(Account.name.in_(accounts))
        for a in s.scalars(stmt):
            qrow = s.scalar(select(Quota).where(Quota.account_id == a.id, Quota.user_key == 0))
            minutes = remaining = None
            start = None
            if qrow is not None and qrow.gpu_hours is not None:
                minutes = int(qrow.gpu_hours * 60)
                start = pricing.period_start(qrow.period.value, now)
                b = admin.bucket(s, qrow, now)
                remaining = max(int((qrow.gpu_hours - b.used_gpu_hours) * 60), 0)
            users = tuple(sorted(m.user.name for m in a.memberships))
            out.append(AccountPlan(a.name, a.description or a.name, users, qos_name(a.name), minutes, remaining,
                                   start))
    return out


def sync(client, plans: list[AccountPlan], *, dry_run: bool = False) -> SyncResult:
    """Apply ``plans`` through the :class:`~gpuhpc.slurm.client.SlurmClient`'s sacctmgr methods
    (idempotent: only what differs changes). ``dry_run`` lists the command lines, runs nothing."""
    res = SyncResult()

    def add(entity: str, name: str, *settings: tuple[str, str]) -> None:
        res.commands.append(client.sacctmgr_add(entity, name, settings, dry_run=dry_run))

    def modify(entity: str, where: list[tuple[str, str]], *settings: tuple[str, str]) -> None:
        res.commands.append(client.sacctmgr_modify(entity, where, settings, dry_run=dry_run))

    qos = {r["Name"]: r for r in client.sacctmgr_list("qos", fields=["Name", "Flags", "GrpTRESMins", "MaxTRESMins",
                                                                      "Description"])}
    accts = {r["Account"] for r in client.sacctmgr_list("account", fields=["Account"])}
    assocs = client.sacctmgr_list("association", fields=["Account", "User", "QOS", "DefaultQOS"])
    users_of: dict[str, dict[str, dict]] = {}
    for r in assocs:
        users_of.setdefault(r["Account"], {})[r["User"]] = r
    for p in plans:
        want_limit = f"gres/gpu={p.grp_gpu_minutes}" if p.grp_gpu_minutes is not None else "gres/gpu=-1"
        want_max = f"gres/gpu={p.max_job_gpu_minutes}" if p.max_job_gpu_minutes is not None else "gres/gpu=-1"
        desc = f"{DESC_PREFIX}{p.period_start.date().isoformat()}" if p.period_start else "gpuhpc"
        limits = (("Flags", "NoDecay"), ("GrpTRESMins", want_limit), ("MaxTRESMinsPerJob", want_max))
        qos_assoc = (("QOS", p.qos), ("DefaultQOS", p.qos))
        cur = qos.get(p.qos)
        if cur is None:
            add("qos", p.qos, *limits, ("Description", desc))
        else:
            def same(have: str, want: str, unset: bool) -> bool:
                return have == want or (unset and "gres/gpu" not in have)

            if ("NoDecay" not in cur.get("Flags", "")
                    or not same(cur.get("GrpTRESMins", ""), want_limit, p.grp_gpu_minutes is None)
                    or not same(cur.get("MaxTRESMins", ""), want_max, p.max_job_gpu_minutes is None)):
                modify("qos", [("name", p.qos)], *limits)
            if cur.get("Description", "") != desc:
                # a new quota period: Slurm's usage starts again from zero, like the ledger's
                modify("qos", [("name", p.qos)], ("Description", desc), ("RawUsage", "0"))
        if p.account not in accts:
            add("account", p.account, ("Description", p.description), ("Organization", "gpuhpc"), *qos_assoc)
        else:
            a = users_of.get(p.account, {}).get("", {})
            if a.get("QOS") != p.qos or a.get("DefaultQOS") != p.qos:
                modify("account", [("name", p.account)], *qos_assoc)
        have_users = users_of.get(p.account, {})
        for u in p.users:
            ua = have_users.get(u)
            if ua is None:
                add("user", u, ("Account", p.account), *qos_assoc)
            elif ua.get("QOS") != p.qos or ua.get("DefaultQOS") != p.qos:
                modify("user", [("name", u), ("account", p.account)], *qos_assoc)
    return res

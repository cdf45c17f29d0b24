"""``gpuhpc ledger sync-slurm``: make Slurm itself enforce the ledger's budgets, for every job
charged to an account, whoever submits it and however (``gpuhpc submit`` or a plain ``sbatch``).

A budget is a limit on the **account's association**: ``GrpTRESMins=gres/gpu=<GPU-hours × 60>``
for a GPU-hour quota, ``GrpTRESMins=billing=<money × 60,000,000>`` for a money quota (billing
units: :mod:`gpuhpc.ledger.budget`; the weights come from the price book). Slurm sums a
``Grp*`` limit over the association and all its children, so every user association under the
account is bound, including users that an admin added with ``sacctmgr`` only, and whatever QOS a
job asks for. A per-user quota is the same limit on that user's association in the account.

Why the association and not a budget QOS: a QOS binds only the jobs that run under it, and a
user association keeps its own QOS list (``sacctmgr add user`` or the Ansible role never give it
the budget QOS), so a QOS budget leaks. The cost: association usage decays with
``PriorityDecayHalfLife``; budgets need ``PriorityDecayHalfLife=0`` and
``PriorityUsageResetPeriod=NONE`` (the cluster spec's ``priority``), so fair-share sees undecayed
usage; the ledger resets an association's usage (``RawUsage=0``) when its quota's period rolls over:
the account's on the account quota's period, each user's on that user quota's own period.

Requirements in slurm.conf: ``PriorityType=priority/multifactor`` (usage accumulates only
there) and ``AccountingStorageEnforce=associations,limits,qos,safe`` (``safe``: a job starts
only if its whole time limit fits in what is left).

**The qos mode** (``gpuhpc ledger policy set slurm_enforcement qos``; docs/ledger.md, "budget
enforcement modes") keeps fair-share decaying: each account with an account quota gets a budget
QOS of its own (:func:`budget_qos`, ``Flags=NoDecay``: its usage never decays, whatever
``PriorityDecayHalfLife`` says) carrying the ``GrpTRESMins``, granted to the account's and its
users' associations as their ``DefaultQOS``; the associations themselves carry no budget. The
budget snapshot names each account's QOS (``qos`` lines) and job_submit.lua puts every job of the
account in it, refusing a job that asks for another QOS (a job has one QOS, so any other would
escape the budget). A new period resets the QOS's usage (``sacctmgr modify qos ... set
RawUsage=0``). A per-user quota cannot be held that way (a QOS sums over every user in it, and a job
has one QOS): :func:`plan` refuses it in this mode. A QOS is one for every cluster of a slurmdbd
(its usage is counted by each slurmctld on its own, as an association's is).

The ledger database is read first and closed; sacctmgr runs afterwards (no network call inside
a DB transaction), through :class:`~gpuhpc.slurm.client.SlurmClient`.
"""
from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass, field

from sqlalchemy import select

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import adjust, admin, budget, db, quota
from gpuhpc.ledger.orm import Account, IngestState, Quota, utcnow
from gpuhpc.ledger.periods import ledger_zone, period_end, period_start

UNSET = -1
ENFORCEMENT = "slurm_enforcement"              # the ledger policy (gpuhpc.ledger.adjust.POLICIES)
ASSOCIATION, QOS = "association", "qos"        # its values
QOS_PREFIX = "budget_"
# Slurm decides in whole TRES-minutes: ``safe`` starts a job when  floor(settled usage) +
# floor(running jobs' reserve) + the job's own limit <= GrpTRESMins, so each floor can hide
# just under one minute. The limit is set this many TRES-minutes below the budget, so that jobs
# can never together run past the budget itself (for money: 2/60,000,000 of the currency).
HEADROOM_MINUTES = 2


def _limit(gpu_hours, money, adjusted=(0, 0)) -> dict[str, int]:
    """GrpTRESMins for a budget; ``adjusted``: what the period's adjustments net to (GPU-hours,
    money), taken off the budget (a credit raises the limit): Slurm never sees them as usage."""
    if gpu_hours is not None:
        gpu_hours = gpu_hours - adjusted[0]
    if money is not None:
        money = money - adjusted[1]
    return {"gres/gpu": UNSET if gpu_hours is None else max(int(gpu_hours * 60) - HEADROOM_MINUTES, 0),
            "billing": UNSET if money is None else max(budget.money_to_billing_minutes(money) - HEADROOM_MINUTES, 0)}


@dataclass(frozen=True)
class AccountPlan:
    account: str
    description: str
    users: tuple[str, ...]
    limits: dict[str, int]                       # GrpTRESMins of the account association (-1: none)
    user_limits: dict[str, dict[str, int]]       # per-user quotas: user -> GrpTRESMins
    period_start: dt.datetime | None             # of the account quota
    reset: bool = False                          # a new period: Slurm's usage starts again
    # per-user quotas keep periods of their own: each user's association restarts on its own period
    user_periods: dict[str, dt.datetime] = field(default_factory=dict)
    user_resets: tuple[str, ...] = ()
    qos: str | None = None                       # the qos mode: the account's budget QOS (holds ``limits``)


def budget_qos(account: str) -> str:
    """The name of an account's budget QOS in the qos mode."""
    return QOS_PREFIX + account


def association_limits(p: AccountPlan) -> dict[str, int]:
    """GrpTRESMins of the account's own association: the budget, or none when its QOS holds it."""
    return p.limits if p.qos is None else _limit(None, None)


@dataclass
class SyncResult:
    commands: list[list[str]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"commands": [" ".join(c) for c in self.commands]}


def _state_key(account: str, user: str | None = None, cluster: str | None = None) -> str:
    """The ingest-state row that remembers the period a quota's Slurm usage was last reset for (on
    ``cluster``: each cluster's associations are reset by the sync-slurm run there)."""
    what = account if user is None else f"{account}\0{user}"
    what = what if not cluster else f"{cluster}\0{what}"
    return "budget:" + hashlib.sha1(what.encode()).hexdigest()[:24]


def _new_period(s, key: str, start: dt.datetime, before: str | None = None) -> bool:
    """``before``: the key a ledger before migration 0011 (one cluster) kept, read when ``key`` is new."""
    st = s.get(IngestState, key) or (s.get(IngestState, before) if before else None)
    return st is None or st.last_since != start


def _tighter(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Per TRES the lower of two limits (UNSET: none)."""
    return {k: b.get(k, UNSET) if v == UNSET else v if b.get(k, UNSET) == UNSET else min(v, b[k]) for k, v in a.items()}


def plan(*, url: str | None = None, accounts: list[str] | None = None,
         now: dt.datetime | None = None, cluster: str | None = None) -> list[AccountPlan]:
    """Each account's limits and resets. ``cluster``: for sync-slurm on that cluster (several
    clusters on one ledger, docs/ledger.md): another cluster's quota is left out, a quota for
    every cluster is its budget less what runs on the other clusters were charged this period (Slurm
    here counts its own jobs only), and the tighter limit holds where both kinds apply; None: every
    quota, as on a ledger of one cluster."""
    now = now or utcnow()
    tz = ledger_zone()           # quota periods begin at local midnight there (ledger.timezone)
    out = []
    with db.session_scope(url) as s:
        mode = adjust.policy(s, ENFORCEMENT)
        stmt = select(Account).order_by(Account.name)
        if accounts:
            stmt = stmt.where(Account.name.in_(accounts))
        for a in s.scalars(stmt):
            limits, start, user_limits, user_periods = _limit(None, None), None, {}, {}
            for q in s.scalars(select(Quota).where(Quota.account_id == a.id).order_by(Quota.id)):
                if cluster is not None and not quota.quota_applies(q.cluster, cluster):
                    continue
                qstart = period_start(q.period.value, now, tz)
                adj = adjust.period_adjustments(s, a.name, q.user.name if q.user_id is not None else None, qstart,
                                                period_end(q.period.value, qstart, tz))
                # Slurm counts a MIG slice as a whole GPU, the ledger by its fraction: the limit rises by the difference
                mig = quota.mig_extra_gpu_hours(admin.session_tx(s), a.name, q.user.name if q.user_id is not None
                                                else None, qstart, period_end(q.period.value, qstart, tz), cluster)
                adj = (adj[0] - mig, adj[1])
                if cluster is not None and q.cluster is None:       # the other clusters' usage is spent
                    h, m = quota.usage_elsewhere(admin.session_tx(s), a.name, q.user.name if q.user_id is not None
                                                 else None, cluster, qstart, period_end(q.period.value, qstart, tz))
                    adj = (adj[0] + h, adj[1] + m)
                if q.user_id is None:
                    limits = _tighter(limits, _limit(q.gpu_hours, q.money, adj))
                    start = qstart
                else:
                    user_limits[q.user.name] = _tighter(user_limits.get(q.user.name, _limit(None, None)),
                                                        _limit(q.gpu_hours, q.money, adj))
                    user_periods[q.user.name] = qstart
            reset = start is not None and _new_period(s, _state_key(a.name, None, cluster), start,
                                                      _state_key(a.name) if cluster else None)
            user_resets = tuple(sorted(u for u, us in user_periods.items() if _new_period(
                s, _state_key(a.name, u, cluster), us, _state_key(a.name, u) if cluster else None)))
            users = tuple(sorted(m.user.name for m in a.memberships))
            if mode == QOS and user_limits:
                raise UserInputError(f"account {a.name}: a per-user quota ({', '.join(sorted(user_limits))}) cannot be "
                                     f"enforced with {ENFORCEMENT}=qos (one budget QOS binds the whole account)",
                                     field="quota", hint=f"remove the user quota, or gpuhpc ledger policy set "
                                                         f"{ENFORCEMENT} {ASSOCIATION}")
            out.append(AccountPlan(a.name, a.description or a.name, users, limits, user_limits, start, reset,
                                   user_periods, user_resets,
                                   budget_qos(a.name) if mode == QOS and start is not None else None))
    return out


def record_periods(plans: list[AccountPlan], *, url: str | None = None, cluster: str | None = None) -> None:
    """After a sync (on ``cluster``, as :func:`plan` was made): remember each quota's period (the
    account's and each user's), so that the next period resets that association's Slurm usage once."""
    with db.session_scope(url) as s:
        for p in plans:
            periods = [(_state_key(p.account, None, cluster), p.account, p.period_start)] \
                if p.period_start is not None else []
            periods += [(_state_key(p.account, u, cluster), f"{p.account}/{u}", us)
                        for u, us in sorted(p.user_periods.items())]
            for key, detail, start in periods:
                st = s.get(IngestState, key) or IngestState(name=key, last_detail=detail)
                st.last_since = start
                st.last_run_at = utcnow()
                s.add(st)


def parse_tres(text: str) -> dict[str, int]:
    """``billing=5,gres/gpu=3`` -> dict (unparsable parts left out)."""
    out = {}
    for part in (text or "").split(","):
        k, _, v = part.partition("=")
        if k and v.lstrip("-").isdigit():
            out[k] = int(v)
    return out


def _differs(have: str, want: dict[str, int]) -> bool:
    cur = parse_tres(have)
    return any(cur.get(k, UNSET) != v for k, v in want.items())


def _set_only(want: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in want.items() if v != UNSET}


def _tres(want: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(want.items()))


def sync(client, plans: list[AccountPlan], *, dry_run: bool = False) -> SyncResult:
    """Apply ``plans`` through the :class:`~gpuhpc.slurm.client.SlurmClient`'s sacctmgr methods
    (idempotent: only what differs changes). ``dry_run`` lists the command lines, runs nothing.

    Every list, add and modify names the client's cluster: one slurmdbd often serves several
    clusters, and a bare ``sacctmgr add account`` would put the budget on every one of them (and a
    bare list would read another cluster's association as this one's)."""
    res = SyncResult()
    cluster = client.cluster_name()
    setting = [("Cluster", cluster)] if cluster else []      # add ... Cluster=
    where_on = [("cluster", cluster)] if cluster else []     # list/modify ... where cluster=

    def add(entity: str, name: str, *settings: tuple[str, str]) -> None:
        res.commands.append(client.sacctmgr_add(entity, name, [*setting, *settings], dry_run=dry_run))

    def modify(entity: str, where: list[tuple[str, str]], *settings: tuple[str, str]) -> None:
        res.commands.append(client.sacctmgr_modify(entity, [*where, *where_on], settings, dry_run=dry_run))

    qos_plans = [p for p in plans if p.qos]
    if qos_plans:
        # the budget QOS first (a QOS is one for the whole slurmdbd: no cluster), then the grants
        have_qos = {r["Name"].lower(): r for r in client.sacctmgr_list("qos", fields=["Name", "Flags", "GrpTRESMins"])}
        for p in qos_plans:
            res.commands += qos_commands(client, p, have_qos.get(p.qos.lower()), dry_run=dry_run)
        for p in plans:
            # an account whose quota is gone keeps its QOS (and its jobs the default): the QOS's budget goes
            left = have_qos.get(budget_qos(p.account).lower()) if not p.qos else None
            if left is not None and _set_only(parse_tres(left.get("GrpTRESMins", ""))):
                unset = {k: UNSET for k in parse_tres(left.get("GrpTRESMins", ""))}
                res.commands.append(client.sacctmgr_modify("qos", [("name", budget_qos(p.account))],
                                                           [("GrpTRESMins", _tres(unset))], dry_run=dry_run))
    assocs = client.sacctmgr_list("association", *(f"{k}={v}" for k, v in where_on),
                                  fields=["Account", "User", "GrpTRESMins", "QOS", "DefaultQOS"])
    users_of: dict[str, dict[str, dict]] = {}
    for r in assocs:
        users_of.setdefault(r["Account"], {})[r["User"]] = r
    # an account is on this cluster when its own (user-less) association is
    accts = {a for a, users in users_of.items() if "" in users}
    for p in plans:
        limits = association_limits(p)
        if p.account not in accts:
            add("account", p.account, ("Description", p.description), ("Organization", "gpuhpc"),
                *((("GrpTRESMins", _tres(_set_only(limits))),) if _set_only(limits) else ()))
        else:
            have = users_of.get(p.account, {}).get("", {})
            if _differs(have.get("GrpTRESMins", ""), limits):
                modify("account", [("name", p.account)], ("GrpTRESMins", _tres(limits)))
        if p.qos:
            if not _granted(users_of.get(p.account, {}).get(""), p.qos):
                modify("account", [("name", p.account)], *grant(p.qos))
        elif p.reset:
            # a new quota period (or a first sync): Slurm's usage of the budget starts from zero, like
            # the ledger's (an account re-added in slurmdbd keeps the usage it had)
            modify("account", [("name", p.account)], ("RawUsage", "0"))
        have_users = users_of.get(p.account, {})
        for u in sorted(set(p.users) | set(p.user_limits)):
            want = p.user_limits.get(u, _limit(None, None))
            ua = have_users.get(u)
            if ua is None:
                add("user", u, ("Account", p.account),
                    *((("GrpTRESMins", _tres(_set_only(want))),) if _set_only(want) else ()))
            elif _differs(ua.get("GrpTRESMins", ""), want) and (u in p.user_limits or ua.get("GrpTRESMins")):
                modify("user", [("name", u), ("account", p.account)], ("GrpTRESMins", _tres(want)))
            if p.qos and not _granted(ua, p.qos):
                modify("user", [("name", u), ("account", p.account)], *grant(p.qos))
            if u in p.user_resets:
                # the user's quota entered a new period of its own: that association's usage starts again
                modify("user", [("name", u), ("account", p.account)], ("RawUsage", "0"))
    return res


def grant(qos: str) -> tuple[tuple[str, str], ...]:
    """The settings that let an association's jobs run in ``qos`` and put them there by default."""
    return (("QOS+", qos), ("DefaultQOS", qos))


def _granted(assoc: dict | None, qos: str) -> bool:
    """Does this ``sacctmgr list association`` row (None: none yet) hold ``qos`` as its default?"""
    if assoc is None:
        return False
    names = {q.strip().lower() for q in assoc.get("QOS", "").split(",")}
    return qos.lower() in names and assoc.get("DefaultQOS", "").strip().lower() == qos.lower()


def qos_commands(client, p: AccountPlan, have: dict | None, *, dry_run: bool = False) -> list[list[str]]:
    """Make ``p``'s budget QOS what the plan says (``have``: its ``sacctmgr list qos`` row, None when
    it does not exist): ``Flags=NoDecay`` and the budget's ``GrpTRESMins``; on a new period its usage
    starts again (``RawUsage=0``). Only what differs changes; returns the command lines."""
    out = []
    if have is None:
        out.append(client.sacctmgr_add("qos", p.qos, [("Flags", "NoDecay"),
                                                      *((("GrpTRESMins", _tres(_set_only(p.limits))),)
                                                        if _set_only(p.limits) else ())], dry_run=dry_run))
    else:
        if "nodecay" not in {f.strip().lower() for f in have.get("Flags", "").split(",")}:
            out.append(client.sacctmgr_modify("qos", [("name", p.qos)], [("Flags+", "NoDecay")], dry_run=dry_run))
        if _differs(have.get("GrpTRESMins", ""), p.limits):
            out.append(client.sacctmgr_modify("qos", [("name", p.qos)], [("GrpTRESMins", _tres(p.limits))],
                                              dry_run=dry_run))
    if p.reset:
        out.append(client.sacctmgr_modify("qos", [("name", p.qos)], [("RawUsage", "0")], dry_run=dry_run))
    return out


def snapshot_qos_lines(plans: list[AccountPlan]) -> str:
    """The budget snapshot's ``qos`` lines (``qos <account> <QOS>``): job_submit.lua puts every job of
    such an account in its budget QOS."""
    return "".join(f"qos\t{p.account}\t{p.qos}\n" for p in plans if p.qos)


def publish(*, url: str | None = None, now: dt.datetime | None = None, billing_file=None,
            snapshot_file=None, gpu_types=None, cluster: str | None = None) -> tuple[str, str]:
    """Write the billing document (prices -> TRESBillingWeights) and the budget snapshot; returns their paths.
    ``gpu_types``: the cluster's GPU types for the snapshot's weights (None: asked of Slurm, before the database)."""
    now = now or utcnow()
    if gpu_types is None:
        from gpuhpc.errors import GpuhpcError
        from gpuhpc.slurm.client import SlurmClient

        try:
            gpu_types = sorted({t for n in SlurmClient().nodes() for t in (n.gpus_total or {})})
        except GpuhpcError:
            gpu_types = []
    with db.session_scope(url) as s:
        book = admin.load_price_book(s)
    # the snapshot of a cluster (next to its slurm.conf): its own quotas and those for every cluster
    statuses = [st for st in admin.quota_status(url=url, now=now) if not cluster or quota.quota_applies(st.cluster, cluster)]
    qos_lines = snapshot_qos_lines(plan(url=url, now=now))
    doc = budget.billing_document(book, now)
    b = budget.write_billing(doc, billing_file)
    text = budget.render_snapshot(statuses, book, now, gpu_types=gpu_types)
    snap = budget.write_snapshot(text + qos_lines, snapshot_file)         # the text ends with a newline
    return str(b), str(snap)

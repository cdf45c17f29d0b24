"""``gpuhpc ledger rollover``: each quota's Slurm usage starts again at its period boundary
without the ledger database (issue 34 point 4).

A budget is ``GrpTRESMins`` on an association (in the qos mode on the account's budget QOS, whose
usage the rollover resets instead: an entry's ``qos``), and only ``gpuhpc ledger sync-slurm`` resets the
association's usage (``RawUsage=0``) when the quota's period rolls over. It reads the database to
know that: with the database down at a month's end, every budgeted account stays at last month's
usage, held on ``Assoc Grp*Minutes``, until the database is back. So ``sync-slurm`` also writes the
**reset plan** (``gpuhpc-resets.json`` in the data directory, :func:`publish`): for each quota with a
period, the association (cluster, account, user), the period start it last reset, and the next
:data:`AHEAD` period starts, each with the ``GrpTRESMins`` to set then (that period's budget less
its adjustments, as ``sync-slurm`` would set it: computed by :func:`gpuhpc.ledger.slurm_sync.plan`
at that instant).

``gpuhpc ledger rollover`` (cron, every few minutes) reads only that file and the state
(``gpuhpc-resets.state.json``: the period start last reset per association), and for each
association whose next period has begun and was not reset yet sets the new limit and
``RawUsage=0`` through :class:`~gpuhpc.slurm.client.SlurmClient` (:func:`apply`). It imports no
database module. When the database is back, ``sync-slurm`` leaves alone the resets that the
rollover already made (:func:`without_done`) and records its own (:func:`mark_done`), so a
period's usage is reset once. Both hold one lock (:func:`locked`) around deciding and making the
resets, and only there: ``sync-slurm`` reads and writes the database outside it, so a database that
hangs never keeps the rollover waiting.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PLAN_NAME = "gpuhpc-resets.json"
STATE_NAME = "gpuhpc-resets.state.json"
LOCK_NAME = ".gpuhpc-resets.lock"
AHEAD = 3                  # period starts precomputed per quota: an outage may span several days' resets


def directory() -> Path:
    """Where the plan, the state and the lock live: the data directory (``$GPUHPC_DATA_DIR``; the
    ledger role's ``/var/lib/gpuhpc``), beside the ingest's and sync-slurm's locks."""
    from gpuhpc.fsutil import data_dir

    return data_dir()


def plan_path(base: Path | None = None) -> Path:
    return (base or directory()) / PLAN_NAME


def state_path(base: Path | None = None) -> Path:
    return (base or directory()) / STATE_NAME


@contextlib.contextmanager
def locked(base: Path | None = None) -> Iterator[None]:
    """One of ``sync-slurm`` and ``rollover`` at a time (an exclusive ``flock``, waited for)."""
    path = (base or directory()) / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Reset:
    at: int                              # the period start, epoch seconds
    limits: dict[str, int]               # GrpTRESMins for that period (-1: none)


@dataclass(frozen=True)
class Entry:
    account: str
    user: str                            # "" for the account's own association
    period: str                          # day, week, month
    current: int                         # the period start whose reset sync-slurm made, epoch seconds
    resets: tuple[Reset, ...]
    qos: str = ""                        # the qos mode: the account's budget QOS (reset instead of the association)

    @property
    def key(self) -> str:
        return f"{self.account}/{self.user}"

    def who(self) -> str:
        return f"account {self.account}" if not self.user else f"user {self.user} in account {self.account}"


@dataclass
class Plan:
    cluster: str
    generated: int
    entries: list[Entry] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"version": 1, "cluster": self.cluster, "generated": self.generated,
                "quotas": [{"account": e.account, "user": e.user, "period": e.period, "current": e.current,
                            **({"qos": e.qos} if e.qos else {}),
                            "resets": [{"at": r.at, "GrpTRESMins": dict(sorted(r.limits.items()))}
                                       for r in e.resets]} for e in self.entries]}


def key(account: str, user: str | None = None) -> str:
    return f"{account}/{user or ''}"


def compute(cluster: str, *, url: str | None = None, now: dt.datetime | None = None,
            tz: dt.tzinfo | None = None) -> Plan:
    """The reset plan from the ledger: every quota with a period (not ``total``), its current
    period start and the next :data:`AHEAD`, each with the limits :func:`slurm_sync.plan` gives
    at that instant. ``tz``: the accounting zone (default ``ledger.timezone``)."""
    from sqlalchemy import select

    from gpuhpc.ledger import db, periods, quota, slurm_sync
    from gpuhpc.ledger.orm import Quota, utcnow

    now = now or utcnow()
    tz = tz or periods.ledger_zone()
    with db.session_scope(url) as s:
        quotas = sorted({(q.account.name, q.user.name if q.user_id is not None else "", q.period.value)
                         for q in s.scalars(select(Quota)) if not cluster or quota.quota_applies(q.cluster, cluster)})
    current = {p.account: p for p in slurm_sync.plan(url=url, now=now, cluster=cluster or None)}
    at_cache: dict[dt.datetime, dict] = {}

    def plans_at(at: dt.datetime) -> dict:
        if at not in at_cache:
            at_cache[at] = {p.account: p for p in slurm_sync.plan(url=url, now=at, cluster=cluster or None)}
        return at_cache[at]

    def start_and_limits(p, user: str):
        if not user:
            return p.period_start, p.limits
        return p.user_periods.get(user), p.user_limits.get(user)

    out = Plan(cluster, int(now.timestamp()))
    for account, user, period in quotas:
        if period == "total" or account not in current:
            continue
        start, _ = start_and_limits(current[account], user)
        if start is None:
            continue
        resets, nxt = [], start
        for _ in range(AHEAD):
            nxt = periods.period_end(period, nxt, tz)
            if nxt is None:
                break
            p = plans_at(nxt).get(account)
            got = start_and_limits(p, user) if p is not None else (None, None)
            if got[0] != nxt or got[1] is None:
                break                     # the ledger's own period there disagrees: plan no further
            resets.append(Reset(int(nxt.timestamp()), dict(got[1])))
        out.entries.append(Entry(account, user, period, int(start.timestamp()), tuple(resets),
                                 "" if user else current[account].qos or ""))
    return out


def render(plan: Plan) -> str:
    return json.dumps(plan.as_dict(), indent=1) + "\n"


def publish(cluster: str, *, url: str | None = None, now: dt.datetime | None = None, tz: dt.tzinfo | None = None,
            path: Path | None = None) -> Path:
    """Compute the plan and write it (atomically, 0644); returns its path."""
    from gpuhpc.fsutil import write_atomic

    path = path or plan_path()
    write_atomic(path, render(compute(cluster, url=url, now=now, tz=tz)), mode=0o644)
    return path


def check_trusted(path: Path) -> None:
    """The plan says whose usage to reset, the state whose not to: refuse a file that someone other
    than this user (or root) owns, or that group or others may write (a GpuhpcError naming it).
    None there: fine."""
    from gpuhpc.errors import GpuhpcError

    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise GpuhpcError(f"{path}: not a regular file of this user's that only its owner may write "
                          f"(mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): refused, nothing reset",
                          hint="gpuhpc ledger sync-slurm writes it (0644) in the data directory")


def read_plan(path: Path | None = None) -> Plan | None:
    """The published plan, or None when there is none or it cannot be read (then nothing is reset)."""
    try:
        doc = json.loads((path or plan_path()).read_text(encoding="utf-8"))
        plan = Plan(str(doc["cluster"]), int(doc["generated"]))
        for q in doc["quotas"]:
            resets = tuple(Reset(int(r["at"]), {str(k): int(v) for k, v in r["GrpTRESMins"].items()})
                           for r in q["resets"])
            plan.entries.append(Entry(str(q["account"]), str(q["user"]), str(q["period"]), int(q["current"]),
                                      resets, str(q.get("qos") or "")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return plan


# ------------------------------------------------------------------ the state
def read_state(path: Path | None = None) -> dict[str, int]:
    """The period start (epoch s) last reset, by the rollover or by sync-slurm, per association key."""
    try:
        doc = json.loads((path or state_path()).read_text(encoding="utf-8"))
        return {str(k): int(v) for k, v in doc.get("reset", {}).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def write_state(state: dict[str, int], path: Path | None = None) -> None:
    from gpuhpc.fsutil import write_atomic

    write_atomic(path or state_path(), json.dumps({"version": 1, "reset": dict(sorted(state.items()))}, indent=1)
                 + "\n", mode=0o644, fsync=True)


# ------------------------------------------------------------------ applying it
@dataclass
class RolloverResult:
    applied: list[tuple[Entry, Reset]] = field(default_factory=list)
    failed: list[tuple[Entry, Reset, str]] = field(default_factory=list)
    commands: list[list[str]] = field(default_factory=list)
    plan_generated: int | None = None     # None: no readable plan
    next_reset: int | None = None          # the earliest reset still to come

    def as_dict(self) -> dict:
        return {"plan_generated": self.plan_generated, "next_reset": self.next_reset,
                "applied": [{"account": e.account, "user": e.user, "period_start": r.at} for e, r in self.applied],
                "failed": [{"account": e.account, "user": e.user, "period_start": r.at, "error": msg}
                           for e, r, msg in self.failed],
                "commands": [" ".join(c) for c in self.commands]}


def due(plan: Plan, state: dict[str, int], now: float) -> list[tuple[Entry, Reset]]:
    """Each association whose latest planned period start is past and newer than the one reset
    last (by sync-slurm: the plan's ``current``; by the rollover: ``state``). Several missed
    periods reset once, to the latest period's limits."""
    out = []
    for e in plan.entries:
        done = max(e.current, state.get(e.key, 0))
        passed = [r for r in e.resets if r.at <= now and r.at > done]
        if passed:
            out.append((e, passed[-1]))
    return out


def _tres(limits: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(limits.items()))


def apply(client, plan: Plan | None, state: dict[str, int], *, now: float | None = None, dry_run: bool = False,
          state_file: Path | None = None) -> RolloverResult:
    """Reset every due association through ``client`` (a SlurmClient): its ``GrpTRESMins`` for the
    new period, then ``RawUsage=0``, naming the plan's cluster. Each success is recorded in the
    state at once (``state_file``), so a reset is made once; a failure is reported and tried
    again on the next run."""
    from gpuhpc.errors import GpuhpcError

    now = time.time() if now is None else now
    res = RolloverResult()
    if plan is None:
        return res
    res.plan_generated = plan.generated
    upcoming = [r.at for e in plan.entries for r in e.resets if r.at > now]
    res.next_reset = min(upcoming) if upcoming else None
    where_on = [("cluster", plan.cluster)] if plan.cluster else []
    for e, r in due(plan, state, now):
        entity, where = ("account", [("name", e.account), *where_on]) if not e.user else \
            ("user", [("name", e.user), ("account", e.account), *where_on])
        if e.qos:                        # the qos mode: the budget is the QOS (one for the whole slurmdbd)
            entity, where = "qos", [("name", e.qos)]
        try:
            for setting in (("GrpTRESMins", _tres(r.limits)), ("RawUsage", "0")):
                res.commands.append(client.sacctmgr_modify(entity, where, [setting], dry_run=dry_run))
        except GpuhpcError as exc:
            res.failed.append((e, r, exc.one_line()))
            continue
        res.applied.append((e, r))
        if not dry_run:
            state[e.key] = r.at
            write_state(state, state_file)
    return res


def run(client, *, base: Path | None = None, now: float | None = None, dry_run: bool = False) -> RolloverResult:
    """``gpuhpc ledger rollover``: the plan and state under ``base`` (default the data directory),
    under the lock."""
    with locked(base):
        check_trusted(plan_path(base))
        check_trusted(state_path(base))
        return apply(client, read_plan(plan_path(base)), read_state(state_path(base)), now=now, dry_run=dry_run,
                     state_file=state_path(base))


def without_done(plans: list, state: dict[str, int]) -> list:
    """``sync-slurm``'s plans (:class:`gpuhpc.ledger.slurm_sync.AccountPlan`) less the resets the
    rollover already made for the same period (the database still remembers the period before)."""
    out = []
    for p in plans:
        reset = p.reset and not (p.period_start is not None
                                 and state.get(key(p.account), 0) >= int(p.period_start.timestamp()))
        users = tuple(u for u in p.user_resets
                      if state.get(key(p.account, u), 0) < int(p.user_periods[u].timestamp()))
        out.append(dataclasses.replace(p, reset=reset, user_resets=users)
                   if (reset, users) != (p.reset, p.user_resets) else p)
    return out


def mark_done(plans: list, state: dict[str, int], path: Path | None = None) -> None:
    """Record the resets ``sync-slurm`` just made (its plans' ``reset`` and ``user_resets``), so that a
    rollover reading the plan from before them does not make them again."""
    changed = False
    for p in plans:
        done = [(key(p.account), p.period_start)] if p.reset and p.period_start is not None else []
        done += [(key(p.account, u), p.user_periods[u]) for u in p.user_resets]
        for k, start in done:
            at = int(start.timestamp())
            if state.get(k, 0) < at:
                state[k] = at
                changed = True
    if changed:
        write_state(state, path)

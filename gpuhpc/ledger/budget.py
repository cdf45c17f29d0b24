"""What the ledger publishes for Slurm and for users who hold no ledger credential.

* **Billing units.** Slurm bills a job ``Σ TRESBillingWeights × allocated TRES`` per minute. The
  ledger's unit: a GPU's billing weight is its price per GPU-hour in millionths of the
  currency (``h100`` at 2.50/GPU-h -> ``2500000``; a ``1g.10gb`` at 1/7 of that ->
  ``357142.857143``), partition multipliers applied. So one Slurm *billing-minute* is
  1/60,000,000 of the currency, a money budget ``B`` is ``GrpTRESMins=billing=B × 60,000,000``,
  and a job's Slurm billing usage converts back to money by dividing by 60,000,000 (6 decimals,
  the ledger's own rounding).
* **The billing document** (``billing.json``): current rates and partition multipliers, which
  ``gpuhpc conf context --billing`` renders into ``TRESBillingWeights`` per partition (the same
  templates as every other slurm.conf line; a price change is an ``scontrol reconfigure``).
* **The budget snapshot** (``gpuhpc-budgets.txt`` next to slurm.conf): every quota's budget and
  what is left, the effective rates, and what one GPU of each type counts for in GPU-hours (a
  MIG slice its fraction of a GPU, :func:`gpuhpc.ledger.pricing.gpu_weight`: the one source of
  the weights, written here for job_submit.lua). ``job_submit.lua`` and ``gpuhpc submit`` (for a
  user without write access to the ledger) read it; neither reaches the database.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.ledger import periods, pricing

MICRO = 1_000_000
BILLING_MINUTES_PER_UNIT = 60 * MICRO          # Slurm billing-minutes per unit of currency
UNIT = "billing weight = price per GPU-hour in millionths of the currency; 60,000,000 billing-minutes = 1.00"
SNAPSHOT_NAME = "gpuhpc-budgets.txt"


def slurm_conf_dir() -> Path:
    return Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent


def snapshot_path() -> Path:
    """``$GPUHPC_BUDGET_SNAPSHOT``, else ``gpuhpc-budgets.txt`` next to slurm.conf (where
    job_submit.lua looks)."""
    env = (getenv("GPUHPC_BUDGET_SNAPSHOT") or "").strip()
    return Path(env) if env else slurm_conf_dir() / SNAPSHOT_NAME


def billing_path() -> Path:
    """``$GPUHPC_BILLING_FILE``, else ``/etc/gpuhpc/billing.json`` (the slurm_common role's default)."""
    return Path(getenv("GPUHPC_BILLING_FILE").strip())


def money_to_billing_minutes(amount: Decimal) -> int:
    return int(Decimal(amount) * BILLING_MINUTES_PER_UNIT)


def billing_minutes_to_money(minutes: int | float | Decimal) -> Decimal:
    return pricing.to_decimal(Fraction(Decimal(str(minutes))) / BILLING_MINUTES_PER_UNIT)


def billing_document(book: pricing.PriceBook, at: dt.datetime, currency: str = "USD") -> dict:
    """The rates Slurm bills with today (history stays in the ledger): ``rates`` per GPU type
    (and ``*``) as exact fractions in billing units, ``partitions`` their multipliers."""
    rates = {}
    for gpu_type in sorted(book.prices):
        r = book.rate(gpu_type, at)
        if r is not None:
            rates[gpu_type] = str(r * MICRO)
    parts = {name: str(book.multiplier("partition", name, at))
             for kind, name in sorted(book.multipliers) if kind == "partition"}
    return {"unit": UNIT, "currency": currency, "rates": rates, "partitions": parts}


def write_atomic(path: Path | str, text: str, mode: int = 0o644) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def write_billing(doc: dict, path: Path | str | None = None) -> Path:
    path = Path(path) if path else billing_path()
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


# ------------------------------------------------------------------ the snapshot
def period_label(period: str, start: dt.datetime, tz: dt.tzinfo | None = None) -> str:
    """``2026-11``, ``the week of 2026-11-30``; an allocation window ``2026-07-01 to 2027-06-30``
    (its first and last day), dated in ``tz`` (default the accounting zone, ``ledger.timezone``)."""
    if start.tzinfo is not None:
        start = start.astimezone(tz or periods.ledger_zone())
    window = periods.parse_window(period)
    if window is not None:
        first, following = window.bounds(start.date())
        return f"{first:%Y-%m-%d} to {following - dt.timedelta(days=1):%Y-%m-%d}"
    return {"day": f"{start:%Y-%m-%d}", "week": f"the week of {start:%Y-%m-%d}", "month": f"{start:%Y-%m}"}.get(
        period, "all time")


def quota_period(account: str, at: dt.datetime, *, user: str | None = None,
                 url: str | None = None) -> tuple[str, dt.datetime | None, dt.datetime | None]:
    """(period, start, end) of the account's quota (``user``: that user's) period or allocation
    window holding ``at``, in the accounting zone; (``total``, None, None) for a total quota. A
    GpuhpcError when there is no such quota. Reads only (a reader may ask for its own accounts)."""
    from sqlalchemy import select

    from gpuhpc.errors import GpuhpcError
    from gpuhpc.ledger import db
    from gpuhpc.ledger.orm import Account, Quota, User

    with db.session_scope(url) as s:
        stmt = select(Quota.period).join(Account, Account.id == Quota.account_id).where(Account.name == account)
        if user is None:
            stmt = stmt.where(Quota.user_id.is_(None))
        else:
            stmt = stmt.join(User, User.id == Quota.user_id).where(User.name == user)
        period = s.scalar(stmt)
    if period is None:
        who = f"account {account}" + (f" user {user}" if user else "")
        raise GpuhpcError(f"{who} has no quota", hint="gpuhpc quota show lists them")
    period = period.value
    if period == "total":
        return period, None, None
    tz = periods.ledger_zone()
    start = periods.period_start(period, at, tz)
    return period, start, periods.period_end(period, start, tz)


@dataclass(frozen=True)
class Budget:
    account: str
    user: str | None              # None: the whole account
    kind: str                     # "money" or "gpu_hours"
    label: str                    # "2026-11"
    ends: int                     # period end, epoch seconds; 0 = never
    budget: Decimal
    left: Decimal


@dataclass
class Snapshot:
    currency: str
    generated: int
    rates: dict[tuple[str, str], Decimal]        # (partition or "*", GPU type or "*") -> per GPU-hour
    budgets: list[Budget]
    weights: dict[str, Fraction] = field(default_factory=dict)   # GPU type -> GPU-hours per device-hour

    def weight(self, gpu_type: str | None) -> Fraction:
        """What one GPU of ``gpu_type`` counts for in GPU-hours, as the snapshot says (a type it
        does not name, or an untyped request: 1, a whole GPU; as job_submit.lua counts)."""
        return self.weights.get(gpu_type or "", Fraction(1))

    def rate(self, partition: str | None, gpu_type: str | None) -> Decimal | None:
        t = gpu_type or "*"
        return self.rates.get((partition or "*", t), self.rates.get(("*", t)))

    def budgets_of(self, account: str, user: str | None, now: float) -> list[Budget]:
        return [b for b in self.budgets if b.account == account and b.user in (None, user)
                and (b.ends == 0 or b.ends > now)]


def render_snapshot(statuses, book: pricing.PriceBook, at: dt.datetime, currency: str = "USD",
                    gpu_types: Iterable[str] = ()) -> str:
    """The snapshot text (tab-separated; read by job_submit.lua and :func:`read_snapshot`).
    ``gpu_types``: the cluster's GPU types (``scontrol show node``), whose weights are written
    beside the price book's (a MIG profile without a price still counts by its fraction)."""
    lines = ["# gpuhpc budget snapshot: written by `gpuhpc ledger sync-slurm`; read by job_submit.lua and",
             "# gpuhpc submit. rate: partition, GPU type, price per device-hour (multipliers applied).",
             "# weight: GPU type, GPU-hours one of it counts for an hour (a MIG slice: its fraction; unlisted: 1)",
             "# budget: account, user (* = all), kind, period, period end (epoch s; 0 = none), budget, left",
             "version\t1", f"generated\t{int(at.timestamp())}", f"currency\t{currency}"]
    types = sorted(book.prices)
    parts = sorted(name for kind, name in book.multipliers if kind == "partition")
    for part in ["*", *parts]:
        rates = {}
        for t in types:
            r = book.effective_rate(t, None if part == "*" else part, None, at)
            if r is not None:
                rates[t] = r
        if "*" not in rates and rates:
            rates["*"] = min(rates.values())       # an untyped request: the cheapest (as Slurm estimates it)
        for t, r in rates.items():
            lines.append(f"rate\t{part}\t{t}\t{pricing.to_decimal(r)}")
    for t in sorted((set(book.prices) | set(gpu_types)) - {pricing.WILDCARD}):
        w = pricing.gpu_weight(t)
        if w != 1:
            lines.append(f"weight\t{t}\t{w.numerator}/{w.denominator}")
    tz = periods.ledger_zone()   # the periods' zone (ledger.timezone): where a month ends
    for s in statuses:
        end = periods.period_end(s.period, s.period_start, tz)
        ends = int(end.timestamp()) if end else 0
        label = period_label(s.period, s.period_start.astimezone(tz))
        for kind, budget, left in (("money", s.money_budget, s.remaining_money),
                                   ("gpu_hours", s.gpu_hours_budget, s.remaining_gpu_hours)):
            if budget is not None:
                lines.append(f"budget\t{s.account}\t{s.user or '*'}\t{kind}\t{label}\t{ends}\t{budget}\t{left}")
    return "\n".join(lines) + "\n"


def write_snapshot(text: str, path: Path | str | None = None) -> Path:
    path = Path(path) if path else snapshot_path()
    write_atomic(path, text)
    return path


def read_snapshot(path: Path | str | None = None) -> Snapshot | None:
    """The published snapshot, or None when there is none (or it cannot be read)."""
    path = Path(path) if path else snapshot_path()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    snap = Snapshot("USD", 0, {}, [])
    for line in text.splitlines():
        f = line.split("\t")
        try:
            if f[0] == "currency":
                snap.currency = f[1]
            elif f[0] == "generated":
                snap.generated = int(f[1])
            elif f[0] == "rate":
                snap.rates[(f[1], f[2])] = Decimal(f[3])
            elif f[0] == "weight":
                w = Fraction(f[2])
                if w > 0:
                    snap.weights[f[1]] = w
            elif f[0] == "budget":
                snap.budgets.append(Budget(f[1], None if f[2] == "*" else f[2], f[3], f[4], int(f[5]),
                                           Decimal(f[6]), Decimal(f[7])))
        except (IndexError, ValueError, ArithmeticError):
            continue
    return snap


def fmt_money(v: Decimal, currency: str = "USD") -> str:
    return (f"${v:,.2f}" if currency == "USD" else f"{currency} {v:,.2f}")


def describe(b: Budget, currency: str, need: Decimal | None = None) -> str:
    """``account research: budget $1,000.00 for 2026-11, $3.20 left; this job may cost $40.00``."""
    who = f"account {b.account}" if b.user is None else f"user {b.user} in account {b.account}"

    def f(v: Decimal) -> str:
        return fmt_money(v, currency) if b.kind == "money" else f"{v:,.2f} GPU-hours"

    text = f"{who}: budget {f(b.budget)} for {b.label}, {f(max(b.left, Decimal(0)))} left"
    if need is not None:
        text += f"; this job may {'cost' if b.kind == 'money' else 'use'} {f(need)}"
    return text


def job_need(snap: Snapshot, b: Budget, *, partition: str | None, gpu_type: str | None, gpus: int,
             time_limit_s: int, array_size: int = 1) -> Decimal | None:
    """What one job (one array task when ``array_size`` is 1) may use of budget ``b``: GPU-hours
    weigh its GPUs by the snapshot's weight of their type (a ``1g.10gb`` hour is 1/7 GPU-hour);
    money is its device-hours at the snapshot's rate (a slice's rate is per slice-hour)."""
    hours = Fraction(gpus * max(array_size, 1) * time_limit_s, 3600)
    if b.kind == "gpu_hours":
        return pricing.to_decimal(hours * snap.weight(gpu_type))
    rate = snap.rate(partition, gpu_type)
    return None if rate is None else pricing.to_decimal(hours * Fraction(rate))


def check_job(snap: Snapshot, *, account: str, user: str | None, partition: str | None, gpu_type: str | None,
              gpus: int, time_limit_s: int, array_size: int = 1,
              now: float | None = None) -> tuple[list[str], str | None]:
    """(one line per budget that applies, the refusal or None) for a job, from the snapshot."""
    lines, refusal = [], None
    for b in snap.budgets_of(account, user, now if now is not None else time.time()):
        need = job_need(snap, b, partition=partition, gpu_type=gpu_type, gpus=gpus, time_limit_s=time_limit_s,
                        array_size=array_size)
        lines.append(describe(b, snap.currency, need))
        if need is not None and need > b.left and refusal is None:
            refusal = describe(b, snap.currency, need)
    return lines, refusal


# ------------------------------------------------------------------ pending reasons
_BUDGET_REASON = re.compile(r"^(Assoc|QOS)Grp(Billing|GRES)(Run)?Minutes$")


def is_budget_reason(reason: str | None) -> bool:
    """Slurm's reasons for a job held by a budget: ``AssocGrpBillingMinutes``,
    ``AssocGrpGRESMinutes``, ``QOSGrpBillingMinutes``, ... (and their ``RunMinutes`` forms)."""
    return bool(reason and _BUDGET_REASON.match(reason))


def gpus_of(tres_per_node: str | None) -> tuple[str | None, int]:
    """``gres:gpu:h100:2`` / ``gres/gpu:2`` / ``gpu:1g.10gb:1`` -> (type or None, count)."""
    typ, total = None, 0
    for item in (tres_per_node or "").split(","):
        parts = re.sub(r"^gres[:/]", "", item.strip()).split(":")
        if parts[0] != "gpu":
            continue
        rest = parts[1:]
        if rest and not rest[-1].isdigit():
            rest.append("1")
        if len(rest) >= 2:
            typ = rest[0]
        total += int(rest[-1]) if rest else 1
    return typ, total


def explain_reason(reason: str | None, *, account: str | None, user: str | None, partition: str | None,
                   tres_per_node: str | None, nodes: int, time_limit_s: int | None,
                   snap: Snapshot | None = None, now: float | None = None) -> str | None:
    """A budget reason in words, from the published snapshot: ``account research: budget
    $1,000.00 for 2026-11, $3.20 left; this job may cost $40.00`` (None: not a budget reason)."""
    if not is_budget_reason(reason) or not account:
        return None
    snap = snap if snap is not None else read_snapshot()
    if snap is None:
        return f"account {account}: its budget is used up ({reason})"
    typ, per_node = gpus_of(tres_per_node)
    want = "money" if "Billing" in (reason or "") else "gpu_hours"
    now = time.time() if now is None else now
    found = [b for b in snap.budgets_of(account, user, now) if b.kind == want] or snap.budgets_of(account, user, now)
    if not found:
        return f"account {account}: its budget is used up ({reason})"
    b = found[0]
    need = None
    if time_limit_s:
        need = job_need(snap, b, partition=partition, gpu_type=typ, gpus=per_node * max(nodes, 1),
                        time_limit_s=time_limit_s)
    return describe(b, snap.currency, need)

"""``gpuhpc ledger check``: does the running Slurm enforce what the ledger says? (issue 34)

Three comparisons, one line per difference (exit 1 when there is any, 0 when in step):

* **weights**: each partition's ``TRESBillingWeights`` in the running slurmctld against the
  weights today's price book gives (the billing document, :func:`gpuhpc.ledger.budget.billing_document`,
  rendered per partition by :func:`gpuhpc.conf.context.billing_weights` from the nodes' GPU
  types as Slurm reports them). A future-dated price that has become effective reaches
  slurm.conf only when the collection runs again: until then Slurm bills money budgets at
  the old rate.
* **limits**: each quota's ``GrpTRESMins`` (what ``gpuhpc ledger sync-slurm`` sets,
  :func:`gpuhpc.ledger.slurm_sync.plan`) against the account's and its users' associations in
  slurmdbd (``sacctmgr``), on this cluster; a limit changed by hand behind the ledger's back, an
  account without its association, a user limit the ledger has no quota for.
  In the qos mode (docs/ledger.md, "budget enforcement modes") the limits sit on each account's
  budget QOS (``sacctmgr list qos``), which must also carry ``Flags=NoDecay``, and the usage
  compared is the QOS's (``scontrol show assoc_mgr flags=qos``), never the decaying association's.
* **usage**: each quota's used GPU-minutes or billing-minutes in this period, in slurmctld's
  association manager (``GrpTRESMins=...(USED)``) against the ledger's counters, within a
  tolerance (Slurm adds usage up every ``PriorityCalcPeriod`` and counts whole minutes). An
  association with running jobs is not compared (Slurm counts a job as it runs, the ledger
  when ``gpuhpc ledger ingest`` settles it); a period that began without Slurm's usage being
  reset (``sync-slurm`` has not run since) is a difference of its own: it blocks the budget.

The ledger is read first and closed; Slurm is asked afterwards (no network call inside a
database transaction). ColdFront's ``slurm_check`` is the model: compare, print, exit non-zero.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path

from gpuhpc.ledger import adjust, admin, budget, db, periods, pricing, quota, slurm_sync
from gpuhpc.ledger.orm import utcnow

KINDS = ("weights", "limits", "usage", "reset", "pricing")
TRES = {"gpu_hours": "gres/gpu", "money": "billing"}
SYNC_HINT = "gpuhpc ledger sync-slurm"
WEIGHTS_HINT = ("gpuhpc ledger billing -o /etc/gpuhpc/billing.json, then run the gpuhpc.cluster collection "
                "(it rewrites TRESBillingWeights and runs scontrol reconfigure)")


@dataclass(frozen=True)
class Difference:
    kind: str               # one of KINDS
    what: str               # "partition gpu", "account research", "user alice in account research"
    slurm: str
    ledger: str
    fix: str

    def line(self) -> str:
        text = {"weights": f"{self.what}: TRESBillingWeights {self.slurm} in slurmctld, the price book gives {self.ledger}",
                "limits": f"{self.what}: GrpTRESMins {self.slurm} in Slurm, the ledger's quota gives {self.ledger}",
                "usage": f"{self.what}: used {self.slurm} in Slurm, {self.ledger} in the ledger",
                "reset": f"{self.what}: {self.ledger} began but Slurm still counts {self.slurm}",
                "pricing": f"{self.what}: {self.slurm} in slurmctld, the ledger's pricing needs {self.ledger}"}[self.kind]
        return f"{text}; fix: {self.fix}"

    def as_dict(self) -> dict:
        return {"kind": self.kind, "what": self.what, "slurm": self.slurm, "ledger": self.ledger, "fix": self.fix,
                "line": self.line()}


@dataclass
class CheckResult:
    differences: list[Difference] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=lambda: {k: 0 for k in KINDS})
    notes: list[str] = field(default_factory=list)       # what was not compared, and why

    @property
    def in_step(self) -> bool:
        return not self.differences

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in KINDS}
        for d in self.differences:
            out[d.kind] += 1
        return out

    def as_dict(self) -> dict:
        return {"in_step": self.in_step, "differences": [d.as_dict() for d in self.differences],
                "counts": self.counts(), "checked": dict(self.checked), "notes": list(self.notes)}


# ------------------------------------------------------------------ weights
def parse_weights(text: str | None) -> dict[str, Decimal] | None:
    """``CPU=0,GRES/gpu=357142.857143`` -> {"gres/gpu": Decimal(...)} (keys lower-cased, zero
    weights left out: a TRES a set ``TRESBillingWeights`` does not name weighs 0). None: no
    weights at all (Slurm then bills a job its CPUs)."""
    if text is None:
        return None
    out = {}
    for part in text.split(","):
        k, _, v = part.partition("=")
        if not k.strip():
            continue
        try:
            w = Decimal(v.strip())
        except InvalidOperation:
            w = Decimal(-1)                 # unreadable: never equal to an expectation
        if w != 0:
            out[k.strip().lower()] = w
    return out


def expected_weights(book: pricing.PriceBook, at: dt.datetime, partition_nodes: dict[str, list[str]],
                     node_gpu_types: dict[str, list[str]]) -> dict[str, str]:
    """``TRESBillingWeights`` per partition that today's price book gives, for the partitions and
    nodes' GPU types as Slurm reports them (the renderer's own function on the billing document)."""
    from gpuhpc import hostlist
    from gpuhpc.conf.context import billing_weights

    doc = budget.billing_document(book, at)
    node_rows = [{"nodes": n, "gres": ",".join(f"gpu:{t}:1" for t in types)} for n, types in node_gpu_types.items()]
    parts = [{"name": p, "nodes": hostlist.compress(nodes)} for p, nodes in partition_nodes.items()]
    types = sorted({t for ts in node_gpu_types.values() for t in ts})
    return billing_weights(doc, parts, node_rows, types)


def weight_differences(expected: dict[str, str], running: dict[str, str | None]) -> list[Difference]:
    out = []
    for part in sorted(running):
        if part not in expected:
            continue
        if parse_weights(expected[part]) != parse_weights(running[part]):
            out.append(Difference("weights", f"partition {part}", running[part] or "(none: Slurm bills CPUs)",
                                  expected[part], WEIGHTS_HINT))
    return out


# ------------------------------------------------------------------ limits
def _fmt_limit(limits: dict[str, int]) -> str:
    return ",".join(f"{k}={'none' if v == slurm_sync.UNSET else v}" for k, v in sorted(limits.items()))


def limit_differences(plans: list[slurm_sync.AccountPlan], assocs: list[dict[str, str]]) -> tuple[list[Difference], int]:
    """Each plan's GrpTRESMins (the account's, and each member's or per-user quota's) against the
    ``sacctmgr list association`` rows (Account, User, GrpTRESMins) of this cluster."""
    users_of: dict[str, dict[str, dict]] = {}
    for r in assocs:
        users_of.setdefault(r["Account"], {})[r["User"]] = r
    out, checked = [], 0
    for p in plans:
        have = users_of.get(p.account, {})
        budgeted = any(v != slurm_sync.UNSET for v in p.limits.values()) or bool(p.user_limits)
        fix = f"{SYNC_HINT} --account {p.account}"
        if "" not in have:
            if budgeted:
                out.append(Difference("limits", f"account {p.account}", "(no association)", _fmt_limit(p.limits), fix))
            continue
        checked += 1
        cur = slurm_sync.parse_tres(have[""].get("GrpTRESMins", ""))
        own = slurm_sync.association_limits(p)          # the qos mode: none (the budget QOS holds them)
        if any(cur.get(k, slurm_sync.UNSET) != v for k, v in own.items()):
            out.append(Difference("limits", f"account {p.account}", have[""].get("GrpTRESMins") or "(none)",
                                  _fmt_limit(own), fix))
        for u in sorted(set(p.users) | set(p.user_limits)):
            want = p.user_limits.get(u, {k: slurm_sync.UNSET for k in p.limits})
            ua = have.get(u)
            if ua is None:
                if u in p.user_limits:
                    out.append(Difference("limits", f"user {u} in account {p.account}", "(no association)",
                                          _fmt_limit(want), fix))
                continue
            checked += 1
            cur = slurm_sync.parse_tres(ua.get("GrpTRESMins", ""))
            if any(cur.get(k, slurm_sync.UNSET) != v for k, v in want.items()):
                out.append(Difference("limits", f"user {u} in account {p.account}", ua.get("GrpTRESMins") or "(none)",
                                      _fmt_limit(want), fix))
    return out, checked


def qos_limit_differences(plans: list[slurm_sync.AccountPlan], qos_rows: list[dict[str, str]]
                          ) -> tuple[list[Difference], int]:
    """The qos mode: each budget QOS (``sacctmgr list qos`` rows: Name, Flags, GrpTRESMins) has the
    plan's GrpTRESMins and ``NoDecay`` (without it the budget's usage decays)."""
    have = {r["Name"].lower(): r for r in qos_rows}
    out, checked = [], 0
    for p in plans:
        if not p.qos:
            continue
        what, fix = f"QOS {p.qos} of account {p.account}", f"{SYNC_HINT} --account {p.account}"
        row = have.get(p.qos.lower())
        if row is None:
            out.append(Difference("limits", what, "(no QOS)", _fmt_limit(p.limits), fix))
            continue
        checked += 1
        cur = slurm_sync.parse_tres(row.get("GrpTRESMins", ""))
        if any(cur.get(k, slurm_sync.UNSET) != v for k, v in p.limits.items()):
            out.append(Difference("limits", what, row.get("GrpTRESMins") or "(none)", _fmt_limit(p.limits), fix))
        if "nodecay" not in {f.strip().lower() for f in row.get("Flags", "").split(",")}:
            out.append(Difference("limits", what, f"Flags={row.get('Flags') or '(none)'} (its usage decays)",
                                  f"{_fmt_limit(p.limits)} with Flags=NoDecay", fix))
    return out, checked


# ------------------------------------------------------------------ usage
@dataclass(frozen=True)
class Tolerance:
    """How far Slurm's usage may be from the ledger's: the larger of ``percent`` of the larger
    figure and ``minutes`` GPU-minutes (for a money budget: that many minutes of the dearest GPU)."""

    percent: Decimal = Decimal(1)
    minutes: Decimal = Decimal(1)

    def allowed(self, a: Decimal, b: Decimal, minute: Decimal) -> Decimal:
        return max(self.minutes * minute, self.percent / 100 * max(abs(a), abs(b)))


def dearest_minute(book: pricing.PriceBook, at: dt.datetime) -> Decimal:
    """Billing-minutes of one minute of the dearest GPU (any partition multiplier applied)."""
    rates = [book.rate_or_default(t, at) for t in book.prices]
    rates = [r for r in rates if r]
    mults = [book.multiplier(k, n, at) for k, n in book.multipliers if k == "partition"]
    top = max(rates, default=Fraction(0)) * max([Fraction(1), *mults])
    return Decimal(int(top * budget.MICRO)) if top else Decimal(1)


def usage_differences(statuses: list[admin.QuotaStatus], plans: list[slurm_sync.AccountPlan], usage: list,
                      tol: Tolerance, money_minute: Decimal, qos_usage: list = ()
                      ) -> tuple[list[Difference], int, list[str]]:
    """Each quota's used amount this period, ledger (``statuses``) against slurmctld
    (``usage``: :class:`gpuhpc.slurm.parsers.AssocUsage` rows; in the qos mode an account's
    budget QOS, ``qos_usage``: :class:`gpuhpc.slurm.parsers.QosUsage` rows)."""
    by_assoc = {(a.account, a.user): a for a in usage}
    by_qos = {q.name.lower(): q for q in qos_usage}
    plan_of = {p.account: p for p in plans}
    out, checked, notes = [], 0, []
    for s in statuses:
        who = f"account {s.account}" if s.user is None else f"user {s.user} in account {s.account}"
        p = plan_of.get(s.account)
        assoc = by_assoc.get((s.account, s.user or ""))
        if p is not None and p.qos:
            # the qos mode: the budget's usage is the QOS's (NoDecay); the association's decays
            assoc = by_qos.get(p.qos.lower()) if s.user is None else None
            who = f"{who} (QOS {p.qos})"
        if p is None or assoc is None:
            continue                         # no association (or QOS): the limits comparison says so
        label = budget.period_label(s.period, s.period_start)
        fix = f"{SYNC_HINT} --account {s.account}"
        if (p.reset if s.user is None else s.user in p.user_resets):
            used = ", ".join(f"{TRES[k]} {assoc.used.get(TRES[k], 0)} min"
                             for k, b in (("gpu_hours", s.gpu_hours_budget), ("money", s.money_budget)) if b is not None)
            out.append(Difference("reset", who, f"{used} of an earlier period", f"period {label}", fix))
            continue
        for kind, b, used in (("gpu_hours", s.gpu_hours_budget, s.used_gpu_hours),
                              ("money", s.money_budget, s.used_money)):
            if b is None:
                continue
            tres = TRES[kind]
            if assoc.running.get(tres, 0):
                notes.append(f"{who}: {tres} usage not compared: jobs are running (Slurm counts them as they run, "
                             f"the ledger when ingest settles them)")
                continue
            checked += 1
            ledger_min = Decimal(used) * 60 if kind == "gpu_hours" else Decimal(used) * budget.BILLING_MINUTES_PER_UNIT
            slurm_min = Decimal(assoc.used.get(tres, 0))
            minute = Decimal(1) if kind == "gpu_hours" else money_minute
            allowed = tol.allowed(ledger_min, slurm_min, minute)
            if abs(ledger_min - slurm_min) > allowed:
                if kind == "gpu_hours":
                    have, want = f"{slurm_min / 60:.4f} GPU-hours", f"{Decimal(used):.4f} GPU-hours for {label}"
                else:
                    have = f"{budget.billing_minutes_to_money(slurm_min)} (billing={slurm_min} min)"
                    want = f"{Decimal(used)} for {label}"
                out.append(Difference("usage", who, have, f"{want} (tolerance {allowed:.0f} {tres}-minutes)",
                                      "run gpuhpc ledger ingest (Slurm counts a finished job before the ledger "
                                      "settles it); if the difference stays, compare sacct with gpuhpc report "
                                      "cost for the period"))
    return out, checked, notes


# ------------------------------------------------------------------ the whole check
def without_adjustments(s, st: admin.QuotaStatus, cluster: str | None = None) -> admin.QuotaStatus:
    """The quota's usage as Slurm counts it: adjustments (credits, refunds, corrections) are in
    the ledger's counter but not in Slurm's usage; sync-slurm moves the limit by them instead.
    ``cluster``: as Slurm on that cluster counts it: a quota for every cluster less the usage on
    the others (sync-slurm lowered the limit there by as much)."""
    import dataclasses

    end = periods.period_end(st.period, st.period_start, periods.ledger_zone())
    h, m = adjust.period_adjustments(s, st.account, st.user, st.period_start, end)
    # Slurm counts a MIG slice as a whole GPU (quota.mig_extra_gpu_hours; sync-slurm raised its limit by as much)
    h -= quota.mig_extra_gpu_hours(admin.session_tx(s), st.account, st.user, st.period_start, end, cluster)
    if cluster is not None and st.cluster is None:
        eh, em = quota.usage_elsewhere(admin.session_tx(s), st.account, st.user, cluster, st.period_start, end)
        h, m = h + eh, m + em
    if not h and not m:
        return st
    return dataclasses.replace(st, used_gpu_hours=st.used_gpu_hours - h, used_money=st.used_money - m)


def check(client, *, url: str | None = None, accounts: list[str] | None = None, now: dt.datetime | None = None,
          tolerance: Tolerance | None = None) -> CheckResult:
    """Compare the running Slurm (through the :class:`~gpuhpc.slurm.client.SlurmClient`) with the
    ledger; returns every difference (an empty list: in step)."""
    now = now or utcnow()
    tol = tolerance or Tolerance()
    cluster = client.cluster_name()          # this cluster's quotas and usage only (several on one ledger)
    # the ledger first, each read in its own closed session
    plans = slurm_sync.plan(url=url, accounts=accounts, now=now, cluster=cluster or None)
    statuses = [s for s in admin.quota_status(url=url, now=now) if (not accounts or s.account in accounts)
                and (not cluster or quota.quota_applies(s.cluster, cluster))]
    with db.session_scope(url) as s:
        book = admin.load_price_book(s)
        mode = adjust.policy(s, pricing.POLICY)
        statuses = [without_adjustments(s, st, cluster or None) for st in statuses]
    # one association, one usage: a quota for every cluster and this cluster's own count the same
    # runs here; the cluster's own is compared
    statuses = list({(st.account, st.user): st for st in sorted(statuses, key=lambda st: st.cluster is not None)}
                    .values())
    res = CheckResult()
    # then Slurm
    running = client.partition_billing_weights()
    if any(book.rate(t, now) is not None for t in book.prices):
        partition_nodes: dict[str, list[str]] = {p: [] for p in running}
        node_types: dict[str, list[str]] = {}
        nodes = client.nodes()
        for n in nodes:
            node_types[n.name] = sorted(t for t in n.gpus_total if t != "gpu")
            for p in n.partitions:
                partition_nodes.setdefault(p, []).append(n.name)
        want = expected_weights(book, now, partition_nodes, node_types)
        if mode == pricing.MAX_SHARE:       # MAX_TRES weights (pricing.max_share_weights), one node shape a partition
            want = pricing.max_share_weights(book, now, partition_nodes, pricing.fleet(nodes).shapes, budget.MICRO)
            res.notes += [f"partition {p}: not compared (its nodes differ in shape, or have no priced GPU: "
                          f"max_share has no single CPU and memory weight there)" for p in sorted(running) if p not in want]
        res.differences += weight_differences(want, running)
        res.checked["weights"] = sum(1 for p in running if p in want)
    else:
        res.notes.append("the price book has no GPU rate: TRESBillingWeights not compared")
    flags = pricing.flags_difference(mode, client.config().get("PriorityFlags"))
    if flags:
        res.differences.append(Difference("pricing", "PriorityFlags", *flags, WEIGHTS_HINT + f"; or gpuhpc ledger "
                                          f"policy set {pricing.POLICY} {pricing.MAX_SHARE if mode != pricing.MAX_SHARE else pricing.PER_GPU}"))
    res.checked["pricing"] = 1
    assocs = client.sacctmgr_list("association", *([f"cluster={cluster}"] if cluster else []),
                                  fields=["Account", "User", "GrpTRESMins"])
    diffs, res.checked["limits"] = limit_differences(plans, assocs)
    res.differences += diffs
    if any(p.qos for p in plans):
        diffs, n = qos_limit_differences(plans, client.sacctmgr_list("qos", fields=["Name", "Flags", "GrpTRESMins"]))
        res.differences += diffs
        res.checked["limits"] += n
    usage = client.assoc_usage(sorted({s.account for s in statuses}))
    qos_used = client.qos_usage([p.qos for p in plans if p.qos])
    diffs, res.checked["usage"], notes = usage_differences(statuses, plans, usage, tol, dearest_minute(book, now),
                                                           qos_used)
    res.differences += diffs
    res.notes += notes
    return res


def textfile(res: CheckResult, at: dt.datetime | None = None) -> str:
    """The result for node_exporter's textfile collector (Prometheus text format)."""
    at = at or utcnow()
    lines = ["# HELP gpuhpc_ledger_drift Differences between the ledger and the running Slurm that the last "
             "gpuhpc ledger check found, by kind (0: in step).",
             "# TYPE gpuhpc_ledger_drift gauge"]
    lines += [f'gpuhpc_ledger_drift{{kind="{k}"}} {n}' for k, n in res.counts().items()]
    lines += ["# HELP gpuhpc_ledger_check_timestamp_seconds When gpuhpc ledger check last compared the ledger "
              "with Slurm.", "# TYPE gpuhpc_ledger_check_timestamp_seconds gauge",
              f"gpuhpc_ledger_check_timestamp_seconds {at.timestamp():.0f}"]
    return "\n".join(lines) + "\n"


def write_textfile(res: CheckResult, path: Path | str, at: dt.datetime | None = None) -> None:
    from gpuhpc.fsutil import write_atomic

    write_atomic(path, textfile(res, at), mode=0o644)

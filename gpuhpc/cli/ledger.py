"""CLI for the cost and quota ledger: ``db``, ``ledger``, ``report`` and ``quota`` groups.

Heavy modules (sqlalchemy, alembic, rich) are imported inside the commands.
"""
from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path
from typing import Optional

import click

from gpuhpc.cli._oncluster import OnClusterGroup
from gpuhpc.cli.efficiency import report_efficiency
from gpuhpc.cli.main import help_for


@click.group("db", help=help_for("db"), no_args_is_help=True)
def db() -> None:
    pass


@click.group("ledger", help=help_for("ledger"), no_args_is_help=True)
def ledger() -> None:
    pass


@ledger.group("price", no_args_is_help=True)
def price() -> None:
    """The price book: GPU-type / MIG rates, partition and QOS multipliers."""


@ledger.group("account", no_args_is_help=True)
def account() -> None:
    """Ledger accounts (projects)."""


@ledger.group("user", no_args_is_help=True)
def user() -> None:
    """Ledger users and their account memberships."""


@click.group("report", cls=OnClusterGroup, help=help_for("report"), no_args_is_help=True)
def report() -> None:
    pass


report.add_command(report_efficiency)


@click.group("quota", help=help_for("quota"), no_args_is_help=True)
def quota() -> None:
    pass


_JSON = click.option("--json", "json_", is_flag=True)


def _when(text: str | None, what: str) -> dt.datetime | None:
    """ISO date/time (UTC unless an offset is given), or relative like ``7d`` / ``12h``."""
    if not text:
        return None
    from gpuhpc.errors import UserInputError

    t = text.strip()
    now = dt.datetime.now(dt.timezone.utc)
    if t[:-1].isdigit() and t[-1:] in ("d", "h", "m"):
        n = int(t[:-1])
        return now - {"d": dt.timedelta(days=n), "h": dt.timedelta(hours=n), "m": dt.timedelta(minutes=n)}[t[-1]]
    try:
        v = dt.datetime.fromisoformat(t)
    except ValueError:
        raise UserInputError(f"{what}: cannot parse {text!r}", hint="use 2026-11-01, 2026-11-01T12:00 or 7d") from None
    return v.replace(tzinfo=dt.timezone.utc) if v.tzinfo is None else v.astimezone(dt.timezone.utc)


def _money(value: str | None, what: str):
    if value is None:
        return None
    from gpuhpc.ledger.pricing import parse_money

    return parse_money(value, what=what)


def _admin(what: str) -> None:
    """Admin commands: one-line permission error (nothing changed) for a user who may not write the ledger."""
    from gpuhpc.ledger import admin

    admin.require_admin(what)


def _redacted_url() -> str:
    from sqlalchemy.engine import make_url

    from gpuhpc.ledger.paths import db_url

    return make_url(db_url()).render_as_string(hide_password=True)


# ------------------------------------------------------------------ db
@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
def db_upgrade(revision: str) -> None:
    """Create or migrate the ledger database (GPUHPC_DB_URL, else the embedded SQLite file)."""
    from gpuhpc.ledger import db

    before, after = db.upgrade(None, revision)
    if before == after:
        sys.stderr.write(f"ledger database {_redacted_url()}: already at {after}\n")
    else:
        sys.stderr.write(f"ledger database {_redacted_url()}: {before or 'empty'} -> {after}\n")


@db.command("current")
@_JSON
def db_current(json_: bool) -> None:
    """Show the schema revision of the ledger database and the one this gpuhpc needs."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import db

    cur = db.current_revision(db.get_engine())
    data = {"url": _redacted_url(), "current": cur, "head": db.SCHEMA_HEAD, "up_to_date": cur == db.SCHEMA_HEAD}
    if json_:
        print_json(data)
    else:
        sys.stdout.write(f"{data['url']}: {cur or 'no schema'} (head {db.SCHEMA_HEAD})"
                         f"{'' if data['up_to_date'] else ' — run `gpuhpc db upgrade`'}\n")


# ------------------------------------------------------------------ ledger
@ledger.command("ingest")
@click.option("--since", help="Start of the sacct window (default: a day before the last ingest, or the oldest "
                              "open reservation).")
@click.option("--until", help="End of the sacct window (default: now).")
@click.option("--metrics-dir", type=click.Path(path_type=Path),
              help="Where gpuhpc.report() files are (default $GPUHPC_METRICS_DIR or ~/.local/share/gpuhpc/metrics).")
@click.option("--reprice", is_flag=True, help="Also charge runs that were settled without a price (charged 0) and "
                                              "now have one; each correction is a charge of its own (kind reprice).")
@_JSON
def ledger_ingest(since: Optional[str], until: Optional[str], metrics_dir: Optional[Path], reprice: bool,
                  json_: bool) -> None:
    """Settle actual usage from sacct (every run of requeued jobs) and release leftover holds."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import db, ingest, paths
    from gpuhpc.slurm.client import SlurmClient

    _admin("ledger ingest")
    db.check_schema()
    start = _when(since, "--since") or ingest.default_since()
    end = _when(until, "--until")
    client = SlurmClient()
    # Slurm first, outside any database transaction
    open_jobs = ingest.open_reservation_jobs()
    active = client.active_job_ids(open_jobs)
    rows = client.job_runs(start, end, job_ids=open_jobs)
    res = ingest.ingest_rows(rows, since=start, active=active)
    if reprice:
        ingest.reprice(res=res)
    res.metrics = ingest.ingest_metrics(metrics_dir or paths.metrics_dir())
    res.utilisation, unsummarised = _summarise_runs(client)
    if json_:
        print_json({"since": start.isoformat(), **res.as_dict()})
    else:
        sys.stdout.write(f"ingested {res.runs_seen} runs since {start:%Y-%m-%d %H:%M} UTC: {res.runs_new} new, "
                         f"{res.runs_updated} updated, {res.charges} charges ({res.amount:,.2f}, "
                         f"{res.gpu_hours:,.2f} GPU-h), {res.reservations_settled} reservations settled, "
                         f"{res.reservations_expired} expired, {res.metrics} metrics, "
                         f"{res.utilisation} utilisation summaries\n")
        if reprice:
            sys.stdout.write(f"repriced {res.repriced_runs} runs settled without a price "
                             f"({res.repriced_amount:,.2f})\n")
    if unsummarised:
        from gpuhpc.cli._console import warn

        warn(f"no utilisation summaries this time (the next ingest tries again): {unsummarised}")
    if res.unpriced_runs:
        from gpuhpc.cli._console import warn

        warn(f"{res.unpriced_runs} runs used GPU types without a price (charged 0); "
             "set one with `gpuhpc ledger price set --gpu-type TYPE --rate R` (or a '*' default), "
             "then `gpuhpc ledger ingest --reprice` charges them")


def _summarise_runs(client) -> tuple[int, str]:
    """Per-run GPU utilisation summaries from Prometheus next to the charges (gpuhpc.monitoring.summaries);
    Prometheus unreachable is a warning, not a failed ingest."""
    from gpuhpc.errors import GpuhpcError
    from gpuhpc.monitoring import summaries

    try:
        return summaries.store_settled(client=client), ""
    except GpuhpcError as exc:
        return 0, exc.one_line()


@ledger.command("sync-slurm")
@click.option("--account", multiple=True, help="Only these accounts (repeatable).")
@click.option("--dry-run", is_flag=True, help="Print the sacctmgr commands only.")
@_JSON
def ledger_sync_slurm(account: tuple[str, ...], dry_run: bool, json_: bool) -> None:
    """Make Slurm enforce the budgets: accounts/users in slurmdbd, GrpTRESMins on each account
    (gres/gpu for GPU-hours, billing for money), RawUsage=0 at a new period; publish the billing
    document (TRESBillingWeights) and the budget snapshot (job_submit.lua, gpuhpc submit)."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import slurm_sync
    from gpuhpc.slurm.client import SlurmClient

    _admin("ledger sync-slurm")
    plans = slurm_sync.plan(accounts=list(account) or None)
    res = slurm_sync.sync(SlurmClient(), plans, dry_run=dry_run)
    if not dry_run:
        slurm_sync.record_periods(plans)
        billing_path, snap_path = slurm_sync.publish()
        sys.stderr.write(f"published {snap_path} and {billing_path} (apply a price change to slurm.conf with "
                         f"the gpuhpc.cluster collection: scontrol reconfigure)\n")
    if json_:
        print_json(res.as_dict())
    else:
        for c in res.commands:
            sys.stdout.write(" ".join(c) + "\n")
        sys.stderr.write(f"{len(plans)} accounts, {len(res.commands)} changes{' (dry run)' if dry_run else ''}\n")


@ledger.command("billing")
@click.option("--output", "-o", type=click.Path(path_type=Path), help="Write it here (default: print).")
def ledger_billing(output: Optional[Path]) -> None:
    """The billing document: today's prices as Slurm billing weights (gpuhpc conf context --billing)."""
    import json

    from gpuhpc.ledger import admin, budget, db

    with db.session_scope() as s:
        doc = budget.billing_document(admin.load_price_book(s), admin.utcnow())
    if output is None:
        sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    else:
        budget.write_billing(doc, output)
        sys.stderr.write(f"wrote {output}\n")


@price.command("set")
@click.option("--gpu-type", help="GPU type or MIG profile (h100, 3g.40gb, '*' = default).")
@click.option("--rate", help="Price per GPU-hour.")
@click.option("--of", help="Price this type as a fraction of another GPU type.")
@click.option("--fraction", help="With --of: exact fraction such as 3/7.")
@click.option("--partition", help="Partition whose multiplier to set.")
@click.option("--qos", help="QOS whose multiplier to set.")
@click.option("--multiplier", help="Multiplier for --partition/--qos (0.6 = 40% cheaper).")
@click.option("--effective", help="Effective from (default now).")
@click.option("--currency", default="USD", show_default=True)
def price_set(gpu_type: Optional[str], rate: Optional[str], of: Optional[str], fraction: Optional[str],
              partition: Optional[str], qos: Optional[str], multiplier: Optional[str], effective: Optional[str],
              currency: str) -> None:
    """Set a GPU rate and/or a partition/QOS multiplier (effective-dated)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import admin

    _admin("ledger price set")
    eff = _when(effective, "--effective")
    did = False
    if gpu_type:
        if of and not fraction:
            raise UserInputError("--of needs --fraction (e.g. 3/7)")
        admin.set_price(gpu_type, rate=_money(rate, "--rate"), base=of, fraction=fraction, effective_from=eff,
                        currency=currency)
        did = True
    if partition or qos:
        if multiplier is None:
            raise UserInputError("--partition/--qos need --multiplier")
        m = _money(multiplier, "--multiplier")
        if partition:
            admin.set_multiplier("partition", partition, m, effective_from=eff)
        if qos:
            admin.set_multiplier("qos", qos, m, effective_from=eff)
        did = True
    if not did:
        raise UserInputError("nothing to set", hint="--gpu-type T --rate R, or --partition P --multiplier M")


@price.command("load")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def price_load(file: Path) -> None:
    """Load a price book YAML FILE (see docs/ledger.md)."""
    from gpuhpc.ledger import pricebook

    _admin("ledger price load")
    n = pricebook.load_file(file)
    sys.stderr.write(f"loaded {n} price entries from {file}\n")


@price.command("list")
@_JSON
def price_list(json_: bool) -> None:
    """Show the price book."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import admin

    rows = admin.list_prices()
    if json_:
        print_json(rows)
        return
    from rich.table import Table

    t = Table("kind", "name", "rate / multiplier", "effective from")
    for r in rows:
        val = (f"{r['rate']} {r['currency']}/GPU-h" if r.get("rate") is not None else
               f"{r['fraction']} of {r['of']}" if r.get("of") else f"× {r['multiplier']}")
        t.add_row(r["kind"], r["name"], val, r["effective_from"])
    console().print(t)


@account.command("add")
@click.argument("name")
@click.option("--description", default="", help="Free text.")
def account_add(name: str, description: str) -> None:
    """Create a ledger account (project)."""
    from gpuhpc.ledger import admin

    _admin("ledger account add")
    created = admin.add_account(name, description=description)
    sys.stderr.write(f"account {name} {'created' if created else 'exists'}\n")


@account.command("list")
@_JSON
def account_list(json_: bool) -> None:
    """List accounts and their users (* = the user's default account)."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import admin

    rows = admin.list_accounts()
    if json_:
        print_json(rows)
        return
    from rich.table import Table

    t = Table("account", "description", "users")
    for r in rows:
        t.add_row(r["account"], r["description"], ", ".join(r["users"]))
    console().print(t)


@user.command("add")
@click.argument("name")
@click.option("--account", required=True, help="Account to join.")
@click.option("--default", is_flag=True, help="Make it the user's default account.")
def user_add(name: str, account: str, default: bool) -> None:
    """Add a user to an account."""
    from gpuhpc.ledger import admin

    _admin("ledger user add")
    created = admin.add_user(name, account, default=default)
    sys.stderr.write(f"user {name} {'added to' if created else 'already in'} {account}\n")


# ------------------------------------------------------------------ quota
@quota.command("set")
@click.argument("account")
@click.option("--user", help="A per-user quota within the account.")
@click.option("--gpu-hours", help="GPU-hours per period.")
@click.option("--money", help="Money per period.")
@click.option("--period", default="month", show_default=True, help="day, week, month or total.")
def quota_set(account: str, user: Optional[str], gpu_hours: Optional[str], money: Optional[str], period: str) -> None:
    """Set an account's (or a user's) quota."""
    from gpuhpc.ledger import admin

    _admin("quota set")
    admin.set_quota(account, user=user, gpu_hours=_money(gpu_hours, "--gpu-hours"), money=_money(money, "--money"),
                    period=period)


@quota.command("remove")
@click.argument("account")
@click.option("--user")
def quota_remove(account: str, user: Optional[str]) -> None:
    """Remove an account's (or user's) quota."""
    from gpuhpc.ledger import admin

    _admin("quota remove")
    ok = admin.remove_quota(account, user=user)
    sys.stderr.write("quota removed\n" if ok else "no such quota\n")


@quota.command("show")
@click.argument("account", required=False)
@_JSON
@click.option("--slurm/--no-slurm", default=True, show_default=True,
              help="Also show Slurm's usage of each budget (GrpTRESMins).")
def quota_show(account: Optional[str], json_: bool, slurm: bool) -> None:
    """Usage vs quota for the current period: the ledger's and Slurm's, side by side."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import admin, hooks, paths

    if not hooks.writable(paths.db_url()):
        return _quota_show_snapshot(account, json_)
    rows = admin.quota_status(account)
    slurm_used: dict[tuple[str, str], dict[str, int]] = {}
    if slurm and rows:
        from gpuhpc.errors import GpuhpcError
        from gpuhpc.slurm.client import SlurmClient

        try:
            for a in SlurmClient().assoc_budgets({r.account for r in rows}):
                slurm_used[(a.account, a.user)] = a.used
        except GpuhpcError:
            pass
    from gpuhpc.ledger import budget

    def slurm_of(r) -> tuple:
        u = slurm_used.get((r.account, r.user or ""))
        if u is None:
            return None, None
        return (pricing_q(u.get("gres/gpu", 0) / 60), budget.billing_minutes_to_money(u.get("billing", 0)))

    def pricing_q(v: float):
        from decimal import Decimal

        return Decimal(str(round(v, 6)))

    if json_:
        out = []
        for r in rows:
            h, m = slurm_of(r)
            out.append({**r.as_dict(), "slurm_used_gpu_hours": h, "slurm_used_money": m})
        print_json(out)
        return
    from rich.table import Table

    def fmt(used, held, budget_, rem) -> str:
        if budget_ is None:
            return "-"
        pct = (used + held) / budget_ * 100 if budget_ else 0
        return f"{used:,.2f} + {held:,.2f} held / {budget_:,.2f} ({pct:.0f}%), {rem:,.2f} left"

    t = Table("account", "user", "period", "GPU-hours (ledger)", "Slurm", "money (ledger)", "Slurm")
    for r in rows:
        h, m = slurm_of(r)
        t.add_row(r.account, r.user or "(all)", f"{r.period} from {r.period_start:%Y-%m-%d}",
                  fmt(r.used_gpu_hours, r.held_gpu_hours, r.gpu_hours_budget, r.remaining_gpu_hours),
                  "-" if h is None or r.gpu_hours_budget is None else f"{h:,.2f} used",
                  fmt(r.used_money, r.held_money, r.money_budget, r.remaining_money),
                  "-" if m is None or r.money_budget is None else f"{m:,.2f} used")
    console().print(t)


def _quota_show_snapshot(account: Optional[str], json_: bool) -> None:
    """A user without access to the ledger database: the budgets the ledger published."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import budget

    snap = budget.read_snapshot()
    rows = [b for b in (snap.budgets if snap else []) if account is None or b.account == account]
    if json_:
        print_json([{"account": b.account, "user": b.user, "kind": b.kind, "period": b.label,
                     "budget": b.budget, "left": b.left} for b in rows])
        return
    sys.stderr.write(f"(the published budget snapshot {budget.snapshot_path()}; the ledger database is "
                     f"for admins)\n")
    for b in rows:
        sys.stdout.write(budget.describe(b, snap.currency) + "\n")


# ------------------------------------------------------------------ report
@report.command("placement")
@click.option("--period", default="week", show_default=True, help="day, week or month.")
@click.option("--json", "json_", is_flag=True, help="JSON output.")
def report_placement(period: str, json_: bool) -> int:
    """Multi-node jobs spread over more leaf switches than they needed, worst first, with their GPU-hours."""
    from gpuhpc.cli.placement import placement_report

    return placement_report(period, json_)


@report.command("cost")
@click.option("--by", default="account", show_default=True, help="user, account, partition or gpu-type.")
@click.option("--period", default="month", show_default=True, help="day, week or month.")
@click.option("--since", help="Only runs started at/after (date or 7d).")
@click.option("--until", help="Only runs started before.")
@_JSON
@click.option("--csv", "csv_", is_flag=True)
@click.option("--html", type=click.Path(path_type=Path), help="Write a self-contained HTML page with charts.")
def report_cost(by: str, period: str, since: Optional[str], until: Optional[str], json_: bool, csv_: bool,
                html: Optional[Path]) -> None:
    """Cost grouped by user/account/partition/GPU type per day/week/month."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import hooks, paths, reports

    if not hooks.writable(paths.db_url()):
        from gpuhpc.errors import LedgerError

        raise LedgerError("the ledger database is readable by its admins only; `gpuhpc quota show` prints your "
                          "accounts' budgets (the published snapshot), an admin runs cost reports")

    rep = reports.cost_report(by=by, period=period, since=_when(since, "--since"), until=_when(until, "--until"))
    if html is not None:
        from gpuhpc.ledger import instances

        inst = instances.instance_report(since=_when(since, "--since"), until=_when(until, "--until"))
        html.write_text(reports.render_html(rep, instances=inst), encoding="utf-8")
        sys.stderr.write(f"wrote {html}\n")
    rows = rep.as_dicts()
    if json_:
        print_json(rows)
        return
    if csv_:
        import csv

        cols = ["period_start", "key", "gpu_hours", "cost", "jobs", *[f"cost_per_1m_{reports.unit(m)}" for m in rep.metrics]]
        w = csv.writer(sys.stdout)
        w.writerow([c if c != "key" else by for c in cols])
        for r in rows:
            w.writerow([r[c] if r[c] is not None else "" for c in cols])
        return
    if html is not None:
        return
    from rich.table import Table

    t = Table("period", by, "GPU-hours", "cost", "jobs", *[f"$/1M {reports.unit(m)}" for m in rep.metrics],
              title=f"cost by {by} per {period} (total {rep.total:,.2f})")
    for r in rows:
        t.add_row(r["period_start"], r["key"], f"{float(r['gpu_hours']):,.2f}", f"{float(r['cost']):,.2f}",
                  str(r["jobs"]), *[r[f"cost_per_1m_{reports.unit(m)}"] or "" for m in rep.metrics])
    console().print(t)
    _instances_table(_when(since, "--since"), _when(until, "--until"), quiet=True)


def _instances_table(since: Optional[dt.datetime], until: Optional[dt.datetime], *, quiet: bool = False) -> None:
    """Elastic capacity's instance-hours (gpuhpc.ledger.instances) as a table; nothing when
    ``quiet`` and the ledger holds no instance."""
    from rich.table import Table

    from gpuhpc.cli._console import console
    from gpuhpc.ledger import instances

    rep = instances.instance_report(since=since, until=until)
    if quiet and not rep.rows:
        return
    tot = instances.totals(rep.rows)
    t = Table("type", "market", "instances", "instance-h", "boot-h", "busy-h", "idle-h", "suspend-h", "orphan-h",
              "cost", "spot savings",
              title=f"elastic instances: {float(tot.get('instance_hours', 0)):,.2f} instance-hours, cost "
                    f"{float(tot.get('cost', 0)):,.2f}, spot savings {float(tot.get('spot_savings', 0)):,.2f}; "
                    f"jobs' GPU-hours {float(rep.job_gpu_hours):,.2f}, run hours {float(rep.job_hours):,.2f}")
    for r in (x.as_dict() for x in rep.rows):
        t.add_row(r["instance_type"], r["market"], str(r["instances"]),
                  *[f"{float(r[k]):,.3f}" for k in ("instance_hours", "boot_hours", "busy_hours", "idle_hours",
                                                    "suspend_hours", "orphan_hours")],
                  f"{float(r['cost']):,.2f}", f"{float(r['spot_savings']):,.2f}")
    console().print(t)


@report.command("instances")
@click.option("--since", help="Only instances launched at/after (date or 7d).")
@click.option("--until", help="Only instances launched before.")
@_JSON
def report_instances(since: Optional[str], until: Optional[str], json_: bool) -> None:
    """Elastic capacity: instance-hours per type and market (boot, busy, idle, suspend, orphan), cost, spot savings."""
    from gpuhpc.ledger import hooks, paths

    if not hooks.writable(paths.db_url()):
        from gpuhpc.errors import LedgerError

        raise LedgerError("the ledger database is readable by its admins only: an admin runs instance reports")
    start, end = _when(since, "--since"), _when(until, "--until")
    if json_:
        from gpuhpc.cli._console import print_json
        from gpuhpc.ledger import instances

        print_json(instances.instance_report(since=start, until=end).as_dict())
        return
    _instances_table(start, end)


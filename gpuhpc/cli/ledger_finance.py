"""``gpuhpc ledger report --jobs`` (per-job line items, CSV or JSON), ``gpuhpc ledger forecast``
(each budget's burn rate and the date it runs out) and ``gpuhpc ledger alerts`` (mail or webhook
to the PI at 80 % and 100 % of a budget, run by cron): what finance asks for
(:func:`gpuhpc.ledger.reports.job_lines`, :func:`~gpuhpc.ledger.reports.burn_forecast`,
:func:`gpuhpc.ledger.alerts.run`).

Registered on the ``ledger`` group by :mod:`gpuhpc.cli.ledger`. Heavy modules are imported
inside the commands."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from gpuhpc.cli.ledger_args import JSON, time_arg


@click.command("report")
@click.option("--jobs", is_flag=True, help="One line per run (its part inside the window) and per adjustment.")
@click.option("--csv", "csv_", is_flag=True, help="CSV with a header row (default: a table).")
@click.option("--since", help="Start of the window (ISO date or time, UTC unless an offset is given; or 30d).")
@click.option("--until", help="End of the window (exclusive; default now).")
@click.option("--account", help="Only this account.")
@click.option("--quota-period", "quota_at", metavar="WHEN",
              help="The window is the account's quota period or allocation window holding WHEN (now, or a date "
                   "or time): instead of --since/--until; needs --account.")
@click.option("--instances", is_flag=True, help="Elastic instance cost (with --by-account): to the accounts whose "
                                                "jobs ran on the instances, the rest as overhead, reconciled.")
@click.option("--by-account", is_flag=True, help="With --instances: per account, and each pool's overhead.")
@click.option("--period", type=click.Choice(["day", "week", "month"]),
              help="With --instances: the window is this period of the ledger's zone (instead of --since/--until).")
@click.option("--at", "at", metavar="WHEN", help="With --period: the period holding WHEN (default now).")
@click.option("--overhead", type=click.Choice(["overhead", "spread"]), default="overhead", show_default=True,
              help="With --instances: report overhead per pool, or spread it to the pool's accounts by their cost.")
@JSON
def report(jobs: bool, csv_: bool, since: Optional[str], until: Optional[str], account: Optional[str],
           quota_at: Optional[str], instances: bool, by_account: bool, period: Optional[str], at: Optional[str],
           overhead: str, json_: bool) -> Optional[int]:
    """Per-job line items for finance (with --jobs): each run's GPU-hours and cost inside the
    window, what adjustments did to it, and the account-level adjustments; they add up to
    `gpuhpc report cost` over the same window. With --instances --by-account: elastic instance
    cost per account and overhead per pool, with the reconciliation line (exit 1 if it fails)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import reports

    if instances:
        from gpuhpc.cli.ledger_instances import instances_by_account

        if jobs or account or quota_at:
            raise UserInputError("--instances is a report of its own", field="--instances",
                                 hint="--instances --by-account [--period month --at WHEN | --since/--until]")
        return instances_by_account(by_account=by_account, period=period, at=at, since=since, until=until,
                                    overhead=overhead, csv_=csv_, json_=json_)
    if not jobs:
        raise UserInputError("say which report", field="--jobs",
                             hint="--jobs for line items, --instances --by-account for elastic instance cost; "
                                  "totals per account or user: gpuhpc report cost")
    if csv_ and json_:
        raise UserInputError("give one of them", field="--csv/--json", hint="--csv for a spreadsheet, --json for tools")
    start, end = time_arg(since, "--since"), time_arg(until, "--until")
    if quota_at is not None:
        import datetime as dt

        from gpuhpc.ledger import budget

        if since or until or not account:
            raise UserInputError("--quota-period takes the window from the account's quota", field="--quota-period",
                                 hint="give --account A and no --since/--until")
        at = dt.datetime.now(dt.timezone.utc) if quota_at.strip() == "now" else time_arg(quota_at, "--quota-period")
        _period, start, end = budget.quota_period(account, at)
    lines = reports.job_lines(since=start, until=end, account=account)
    if csv_:
        sys.stdout.write(reports.lines_csv(lines))
        return
    if json_:
        from gpuhpc.cli._console import print_json

        print_json(lines)
        return
    from rich.table import Table

    from gpuhpc.cli._console import console

    t = Table("kind", "job", "account", "user", "GPU type", "GPU-h", "cost", "adjustments", "total")
    for x in lines:
        job = x["job_id"] + (f"_{x['array_task_id']}" if x["array_task_id"] else "")
        t.add_row(x["kind"], job, x["account"], x["user"], x["gpu_type"], x["gpu_hours"], x["cost"], x["adjustments"],
                  x["total"])
    console().print(t)


@click.command("forecast")
@click.option("--days", type=click.IntRange(1, 3660), default=14, show_default=True,
              help="The spend rate is the average over this many days before now.")
@click.option("--account", help="Only this account's budgets.")
@JSON
def forecast(days: int, account: Optional[str], json_: bool) -> None:
    """Each budget's spend per day (over the last --days) and the date it runs out at that rate,
    if that is before its period resets."""
    from gpuhpc.ledger import reports

    rows = reports.burn_forecast(days=days, account=account)
    if json_:
        from gpuhpc.cli._console import print_json

        print_json([r.as_dict() for r in rows])
        return
    for r in rows:
        who = r.account + (f"/{r.user}" if r.user else "")
        unit = "GPU-h" if r.measure == "gpu_hours" else ""
        when = ("exhausted" if r.runs_out is not None and r.remaining <= 0 else
                f"runs out {r.runs_out:%Y-%m-%d %H:%M} UTC" if r.runs_out is not None else
                "lasts the period" if r.per_day > 0 else "nothing spent")
        sys.stdout.write(f"{who} ({r.period}): {r.remaining:,.2f} {unit} left of {r.budget:,.2f}, "
                         f"{r.per_day:,.2f}{unit}/day over {r.days} days: {when}\n")


@click.command("alerts")
@click.option("--dry-run", is_flag=True, help="List the alerts that are due; send and record nothing.")
@click.option("--account", help="Only this account's quotas.")
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path),
              help="Write when this run went through and the alerts it sent and could not send, for "
                   "node_exporter's textfile collector (the LedgerAlertsStale and LedgerAlertsUndelivered alerts).")
@JSON
def alerts(dry_run: bool, account: Optional[str], textfile: Optional[Path], json_: bool) -> int:
    """Mail or POST each budget alert that is due to its account's contact (gpuhpc ledger account
    set --contact), once per threshold (gpuhpc quota set --alert-at; default 80,100) and period.
    Run it from cron; exit 1 when one could not be sent (the next run tries it again)."""
    from gpuhpc.cli.ledger_args import admin_only
    from gpuhpc.ledger import alerts as ledger_alerts

    admin_only("ledger alerts")
    rows = ledger_alerts.run(dry_run=dry_run, account=account)
    if textfile is not None and not dry_run:
        from gpuhpc.ledger import textfile as ledger_textfile

        ledger_textfile.write(textfile, ledger_textfile.alerts(rows))
    if json_:
        from gpuhpc.cli._console import print_json

        print_json([a.as_dict() for a in rows])
    else:
        for a in rows:
            state = "would send" if dry_run else a.status
            sys.stdout.write(f"{state}: {a.message} -> {ledger_alerts.shown(a.contact)}"
                             + (f" ({a.error})" if a.error else "") + "\n")
    failed = [a for a in rows if a.status == "failed"]
    if failed:
        sys.stderr.write(f"error: {len(failed)} of {len(rows)} budget alert(s) could not be sent; the next run "
                         f"tries again\n")
        return 1
    return 0


COMMANDS = (report, forecast, alerts)

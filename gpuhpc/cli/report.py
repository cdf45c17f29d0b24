"""CLI for reports: ``gpuhpc report`` (cost, placement, instances, efficiency; forwarded to
the cluster with ``--cluster``).

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
from gpuhpc.cli.ledger_args import JSON, time_arg
from gpuhpc.cli.main import help_for


@click.group("report", cls=OnClusterGroup, help=help_for("report"), no_args_is_help=True)
def report() -> None:
    pass


report.add_command(report_efficiency)


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
@JSON
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

    rep = reports.cost_report(by=by, period=period, since=time_arg(since, "--since"), until=time_arg(until, "--until"))
    if html is not None:
        from gpuhpc.ledger import instances

        inst = instances.instance_report(since=time_arg(since, "--since"), until=time_arg(until, "--until"))
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
    _instances_table(time_arg(since, "--since"), time_arg(until, "--until"), quiet=True)


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
@JSON
def report_instances(since: Optional[str], until: Optional[str], json_: bool) -> None:
    """Elastic capacity: instance-hours per type and market (boot, busy, idle, suspend, orphan), cost, spot savings."""
    from gpuhpc.ledger import hooks, paths

    if not hooks.writable(paths.db_url()):
        from gpuhpc.errors import LedgerError

        raise LedgerError("the ledger database is readable by its admins only: an admin runs instance reports")
    start, end = time_arg(since, "--since"), time_arg(until, "--until")
    if json_:
        from gpuhpc.cli._console import print_json
        from gpuhpc.ledger import instances

        print_json(instances.instance_report(since=start, until=end).as_dict())
        return
    _instances_table(start, end)

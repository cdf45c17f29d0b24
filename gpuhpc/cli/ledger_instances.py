"""``gpuhpc ledger report --instances --by-account``: elastic instance cost charged to the accounts
whose jobs ran on the instances, the rest as each pool's overhead, and the reconciliation line
(:mod:`gpuhpc.ledger.instance_cost`). Called by :func:`gpuhpc.cli.ledger_finance.report`; heavy
modules are imported inside."""
from __future__ import annotations

import datetime as dt
import sys
from typing import Optional

from gpuhpc.cli.ledger_args import time_arg


def instances_by_account(*, by_account: bool, period: Optional[str], at: Optional[str], since: Optional[str],
                         until: Optional[str], overhead: str, csv_: bool, json_: bool) -> int:
    """Print the report; exit 1 when it does not reconcile (it always should: a bug to report)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import instance_cost as ic
    from gpuhpc.ledger import reports

    if not by_account:
        raise UserInputError("say how to break the instances' cost down", field="--by-account",
                             hint="--instances --by-account; instance-hours per type: gpuhpc report instances")
    if csv_ and json_:
        raise UserInputError("give one of them", field="--csv/--json", hint="--csv for a spreadsheet, --json for tools")
    if overhead not in ic.POLICIES:
        raise UserInputError(f"unknown overhead policy {overhead!r}", field="--overhead", hint="overhead or spread")
    if at is not None and period is None:
        raise UserInputError("--at picks a period", field="--at", hint="--period month --at 2026-11-15")
    when = None if at is None or at.strip() == "now" else time_arg(at, "--at")
    start, end = ic.window(period, when, time_arg(since, "--since"), time_arg(until, "--until"))
    from gpuhpc.ledger import admin, db

    admin.require_admin("ledger report --instances")
    db.check_schema()
    from gpuhpc.slurm.client import SlurmClient

    nodes = ic.sacct_node_lists(SlurmClient(), start, end)        # Slurm first, outside any transaction
    rep = ic.instance_cost(since=start, until=end, node_lists=nodes, policy=overhead)
    if rep.unmatched:
        sys.stderr.write(f"warning: sacct has no node list for {len(rep.unmatched)} run(s) on the instances' "
                         f"clusters ({', '.join(rep.unmatched[:5])}{' ...' if len(rep.unmatched) > 5 else ''}): "
                         "their time on an instance counts as its pool's unused overhead\n")
    if csv_:
        sys.stdout.write(reports.rows_csv(ic.CSV_FIELDS, rep.csv_rows()))
    elif json_:
        from gpuhpc.cli._console import print_json

        print_json(rep.as_dict())
    else:
        _table(rep, start, end)
    sys.stderr.write(rep.reconciliation() + "\n")
    return 0 if rep.reconciled else 1


def _table(rep, start: Optional[dt.datetime], end: Optional[dt.datetime]) -> None:
    from rich.table import Table

    from gpuhpc.cli._console import console

    d = rep.as_dict()
    span = f"{start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC" if start and end else "all time"
    t = Table("account", "instance-h", "cost", "overhead share", "total", "jobs",
              title=f"elastic instance cost by account, {span} (overhead: {rep.policy})")
    for a in d["accounts"]:
        t.add_row(a["account"], a["instance_hours"], a["cost"], a["overhead_share"], a["total"], str(a["jobs"]))
    for o in d["overhead"]:
        t.add_row(f"overhead {o['pool']} ({o['part']})", o["instance_hours"], o["cost"], "", o["cost"], "")
    tot = d["totals"]
    t.add_row("instances", tot["instance_hours"], tot["instance_cost"], "", tot["printed_total"], "")
    console().print(t)

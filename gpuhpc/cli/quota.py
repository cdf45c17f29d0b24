"""CLI for quotas: ``gpuhpc quota set``, ``remove`` and ``show`` (the ledger's and Slurm's usage
side by side).

Heavy modules (sqlalchemy, alembic, rich) are imported inside the commands.
"""
from __future__ import annotations

import sys
from typing import Optional

import click

from gpuhpc.cli.ledger_args import JSON, admin_only, cluster_names, money_arg
from gpuhpc.cli.main import help_for


@click.group("quota", help=help_for("quota"), no_args_is_help=True)
def quota() -> None:
    pass


@quota.command("set")
@click.argument("account")
@click.option("--user", help="A per-user quota within the account.")
@click.option("--gpu-hours", help="GPU-hours per period.")
@click.option("--money", help="Money per period.")
@click.option("--period", help="day, week, month (the default) or total.")
@click.option("--window", help="An allocation window instead of a calendar period: START/LENGTH, e.g. 2026-07-01/1y "
                               "(a fiscal year from 1 July) or 2026-01-05/90d; it repeats from START.")
@click.option("--alert-at", help="Alert the account's contact at these percentages of the budget, once per period "
                                 "(default 80,100; none: no alerts). Alone: change only the thresholds.")
@click.option("--cluster", metavar="NAME", help="Count only this cluster's usage (ClusterName); default: the usage "
                                                "on every cluster of the ledger counts.")
def quota_set(account: str, user: Optional[str], gpu_hours: Optional[str], money: Optional[str],
              period: Optional[str], window: Optional[str], alert_at: Optional[str], cluster: Optional[str]) -> None:
    """Set an account's (or a user's) quota."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import admin, alerts, periods

    if window is not None and period is not None:
        raise UserInputError("give a calendar period or an allocation window, not both", field="--window",
                             hint="--period month, or --window 2026-07-01/1y")
    chosen = periods.window_arg(window) if window is not None else periods.check_period(period or "month")
    marks = None if alert_at is None else alerts.thresholds_arg(alert_at)
    hours, cash = money_arg(gpu_hours, "--gpu-hours"), money_arg(money, "--money")
    admin_only("quota set")
    on = _cluster_arg(cluster)
    if hours is None and cash is None and marks is not None and period is None and window is None:
        alerts.set_thresholds(account, marks, user=user, cluster=on)
        return
    admin.set_quota(account, user=user, gpu_hours=hours, money=cash, period=chosen, cluster=on)
    if marks is not None:
        alerts.set_thresholds(account, marks, user=user, cluster=on)


def _cluster_arg(cluster: Optional[str]) -> Optional[str]:
    if cluster is None:
        return None
    return cluster_names(cluster, None)[0]


@quota.command("remove")
@click.argument("account")
@click.option("--user")
@click.option("--cluster", metavar="NAME", help="The quota of this cluster (default: the one for every cluster).")
def quota_remove(account: str, user: Optional[str], cluster: Optional[str]) -> None:
    """Remove an account's (or user's) quota."""
    from gpuhpc.ledger import admin

    admin_only("quota remove")
    ok = admin.remove_quota(account, user=user, cluster=_cluster_arg(cluster))
    sys.stderr.write("quota removed\n" if ok else "no such quota\n")


@quota.command("show")
@click.argument("account", required=False)
@JSON
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

    from gpuhpc.ledger.periods import ledger_zone

    tz = ledger_zone()               # a period's first day, in the accounting zone
    t = Table("account", "user", "period", "GPU-hours (ledger)", "Slurm", "money (ledger)", "Slurm")
    for r in rows:
        h, m = slurm_of(r)
        t.add_row(r.account + (f" on {r.cluster}" if r.cluster else ""), r.user or "(all)",
                  f"{r.period} from {r.period_start.astimezone(tz):%Y-%m-%d}",
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

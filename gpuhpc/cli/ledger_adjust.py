"""``gpuhpc ledger adjust``, ``reprice``, ``adjustments``, ``audit`` and the ``policy`` group:
credits, debits and corrections booked as adjustments (charges are append-only), the ledger's
policies, and the audit trail (:mod:`gpuhpc.ledger.adjust`, :mod:`gpuhpc.ledger.audit`).

Registered on the ``ledger`` group by :mod:`gpuhpc.cli.ledger`. Heavy modules are imported
inside the commands.
"""
from __future__ import annotations

import sys
from typing import Optional

import click

from gpuhpc.cli.ledger_args import JSON, admin_only, time_arg


def _print_booked(booked, json_: bool, dry_run: bool = False) -> None:
    from gpuhpc.cli._console import print_json

    if json_:
        print_json(booked.as_dict())
        return
    for a in booked.adjustments:
        who = a.get("account", "") + (f"/{a['user']}" if a.get("user") else "")
        job = f" job {a['job_id']}" if a.get("job_id") else ""
        sys.stdout.write(f"{'would book' if dry_run else 'booked'} {a['kind']} {a.get('id', '')} {who}{job}: "
                         f"{a['amount']}" + (f", {a['gpu_hours']} GPU-h" if a.get("gpu_hours") else "") + "\n")
    sys.stderr.write(f"{booked.charges} charges, {booked.amount} in all{' (dry run: nothing booked)' if dry_run else ''}\n")


@click.command("adjust")
@click.argument("account")
@click.option("--credit", "kind", flag_value="credit", help="Give the account back (a refund, a goodwill credit).")
@click.option("--debit", "kind", flag_value="debit", help="Charge the account more.")
@click.option("--amount", help="Money, in the price book's currency (positive; --credit/--debit gives the sign).")
@click.option("--gpu-hours", help="GPU-hours (positive), for GPU-hour quotas.")
@click.option("--reason", help="Why (required; one line, kept with the adjustment and in the audit trail).")
@click.option("--user", help="One user's share in the account (that user's quota counts it too).")
@click.option("--job", help="The job it is about (must be the account's in the ledger; its user by default).")
@click.option("--cluster", help="The job's cluster, when the ledger has the job id on several.")
@click.option("--at", "at_", help="Date it counts at (default now): the quota period and report period it lands in.")
@JSON
def adjust(account: str, kind: Optional[str], amount: Optional[str], gpu_hours: Optional[str], reason: Optional[str],
           user: Optional[str], job: Optional[str], cluster: Optional[str], at_: Optional[str], json_: bool) -> None:
    """Credit or debit ACCOUNT with a reason (e.g. a NODE_FAIL refund): an adjustment row and its
    charge, counted in the quota period of --at; charges are never edited."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import adjust as adj
    from gpuhpc.ledger import db

    if kind is None:
        raise UserInputError("say which way", field="--credit/--debit", hint="--credit gives back, --debit charges")
    adj.check_reason(reason)
    admin_only("ledger adjust")
    db.check_schema()
    booked = adj.adjust(account, kind=kind, reason=reason or "", amount=amount, gpu_hours=gpu_hours, user=user,
                        job=job, cluster=cluster, at=time_arg(at_, "--at"))
    _print_booked(booked, json_)


@click.command("reprice")
@click.option("--gpu-type", required=True, help="The GPU type whose rate was wrong (as sacct names it: h100).")
@click.option("--rate", required=True, help="The corrected price per GPU-hour (partition/QOS multipliers still apply).")
@click.option("--since", required=True, help="Start of the period the rate was wrong (ISO date or time, UTC).")
@click.option("--until", required=True, help="End of that period (exclusive).")
@click.option("--reason", help="Why (required; kept with the adjustments and in the audit trail).")
@click.option("--account", help="Only this account's runs.")
@click.option("--dry-run", is_flag=True, help="Show what would be booked; book nothing.")
@JSON
def reprice(gpu_type: str, rate: str, since: str, until: str, reason: Optional[str], account: Optional[str],
            dry_run: bool, json_: bool) -> None:
    """Book the difference a corrected rate makes over a period as correction charges (one
    adjustment per account); the charges themselves stay. The price book is not changed: set the
    rate there too (ledger price set --effective) for usage still to come."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.ledger import adjust as adj
    from gpuhpc.ledger import db

    adj.check_reason(reason)
    start, end = time_arg(since, "--since"), time_arg(until, "--until")
    if start is None or end is None:
        raise UserInputError("a period is required", field="--since/--until", hint="--since 2026-11-01 --until 2026-12-01")
    admin_only("ledger reprice")
    db.check_schema()
    from gpuhpc.ledger import pricing

    runs = nodes = None
    if adj.pricing_mode() == pricing.MAX_SHARE:     # what each run held, and the nodes: from Slurm, first
        from gpuhpc.ledger import ingest
        from gpuhpc.slurm import client as slurm_client

        c = slurm_client.SlurmClient()
        runs = [r for v in ingest.group_jobs(c.job_runs(start, end)) for r in v.runs]
        nodes = pricing.fleet(c.nodes())
    booked = adj.reprice(gpu_type, rate, since=start, until=end, reason=reason or "", account=account,
                         dry_run=dry_run, runs=runs, nodes=nodes)
    _print_booked(booked, json_, dry_run)
    if booked.skipped:
        sys.stderr.write(f"{booked.skipped} runs left alone: sacct no longer has what they held (max_share)\n")


@click.command("adjustments")
@click.option("--account", help="Only this account.")
@click.option("--since", help="Booked since (ISO date or 7d).")
@JSON
def adjustments(account: Optional[str], since: Optional[str], json_: bool) -> None:
    """List credits, debits, refunds and corrections."""
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.ledger import adjust as adj

    rows = adj.list_adjustments(account=account, since=time_arg(since, "--since"))
    if json_:
        print_json(rows)
        return
    from rich.table import Table

    t = Table("id", "kind", "account", "user", "job", "GPU-h", "amount", "at", "by", "reason")
    for r in rows:
        t.add_row(str(r["id"]), r["kind"], r["account"], r["user"] or "", r["job_id"] or "", r["gpu_hours"],
                  r["amount"], r["at"], r["by"], r["reason"])
    console().print(t)


@click.command("audit")
@click.option("--since", help="Changes since (ISO date or 7d).")
@click.option("--action", help="Only actions starting with this (price, multiplier, quota, policy, adjust, reprice).")
@JSON
def audit(since: Optional[str], action: Optional[str], json_: bool) -> None:
    """Who changed prices, multipliers, quotas, policies and adjustments: when, before, after."""
    import json

    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import adjust as adj

    admin_only("ledger audit")
    rows = adj.audit_entries(since=time_arg(since, "--since"), action=action)
    if json_:
        print_json(rows)
        return
    for r in rows:
        sys.stdout.write(f"{r['at']}  {r['actor']}  {r['action']}  {r['target']}: "
                         f"{json.dumps(r['before'], sort_keys=True)} -> {json.dumps(r['after'], sort_keys=True)}\n")


@click.group("policy", no_args_is_help=True)
def policy() -> None:
    """Ledger policies (node_fail_refund: refund NODE_FAIL runs at ingest)."""


@policy.command("set")
@click.argument("name")
@click.argument("value")
def policy_set(name: str, value: str) -> None:
    """Set policy NAME to VALUE (audited)."""
    from gpuhpc.ledger import adjust as adj

    adj.check_policy(name, value)
    admin_only("ledger policy set")
    changed = adj.set_policy(name, value)
    sys.stderr.write(f"policy {name} = {value}{'' if changed else ' (unchanged)'}\n")


@policy.command("list")
@JSON
def policy_list(json_: bool) -> None:
    """Show the policies, their values and who set them."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import adjust as adj

    admin_only("ledger policy list")
    rows = adj.list_policies()
    if json_:
        print_json(rows)
        return
    for r in rows:
        by = f" (set by {r['updated_by']} at {r['updated_at']})" if r["updated_by"] else " (default)"
        sys.stdout.write(f"{r['name']} = {r['value']}{by}: {r['help']}\n")


COMMANDS = (adjust, reprice, adjustments, audit, policy)

"""CLI for the cost ledger: ``gpuhpc ledger`` and its own commands (ingest, sync-slurm, check,
billing). Each subgroup has a module of its own, added to the group here: ``price``
(:mod:`gpuhpc.cli.ledger_price`), ``account`` (:mod:`~gpuhpc.cli.ledger_account`), ``user``
(:mod:`~gpuhpc.cli.ledger_user`), the adjustments' commands (:mod:`~gpuhpc.cli.ledger_adjust`:
adjust, reprice, adjustments, audit, policy) and finance's (:mod:`~gpuhpc.cli.ledger_finance`:
report --jobs, forecast).

Heavy modules (sqlalchemy, alembic, rich) are imported inside the commands.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from gpuhpc.cli import ledger_account, ledger_adjust, ledger_finance, ledger_price, ledger_user
from gpuhpc.cli.ledger_args import JSON, admin_only, cluster_names, money_arg, time_arg
from gpuhpc.cli.main import help_for


@click.group("ledger", help=help_for("ledger"), no_args_is_help=True)
def ledger() -> None:
    pass


@ledger.command("ingest")
@click.option("--since", help="Start of the sacct window (default: a day before the last ingest, or the oldest "
                              "open reservation).")
@click.option("--until", help="End of the sacct window (default: now).")
@click.option("--metrics-dir", type=click.Path(path_type=Path),
              help="Where gpuhpc.report() files are (default $GPUHPC_METRICS_DIR or ~/.local/share/gpuhpc/metrics).")
@click.option("--reprice", is_flag=True, help="Also charge runs that were settled without a price (charged 0) and "
                                              "now have one; each correction is a charge of its own (kind reprice).")
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path),
              help="On success, also write gpuhpc_ledger_ingest_success_timestamp_seconds here, for node_exporter's "
                   "textfile collector (the LedgerIngestStale alert).")
@click.option("--cluster", "cluster", metavar="NAME",
              help="Ingest this cluster's jobs (default: the cluster this host's slurm.conf names, ClusterName); "
                   "its slurmdbd must be the one this host's sacct asks.")
@click.option("--clusters", "clusters", metavar="A,B",
              help="Ingest several clusters' jobs at once (sacct -M A,B: one slurmdbd serving them); each cluster "
                   "keeps its own watermark.")
@JSON
def ledger_ingest(since: Optional[str], until: Optional[str], metrics_dir: Optional[Path], reprice: bool,
                  textfile: Optional[Path], cluster: Optional[str], clusters: Optional[str], json_: bool) -> None:
    """Settle actual usage from sacct (every run of requeued jobs) and release leftover holds."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import db, ingest, metrics_ingest, paths
    from gpuhpc.slurm.client import SlurmClient

    admin_only("ledger ingest")
    db.check_schema()
    client = SlurmClient()
    local = client.cluster_name()
    names = cluster_names(cluster, clusters) or ([local] if local else [])
    start = time_arg(since, "--since") or ingest.default_since(clusters=names or None)
    end = time_arg(until, "--until")
    # Slurm first, outside any database transaction
    open_jobs = ingest.open_reservation_jobs(clusters=names or None)
    # squeue answers for this host's cluster only: another cluster's jobs settle on sacct's word
    active = client.active_job_ids(ingest.open_reservation_jobs(clusters=[local]) if local else open_jobs)
    rows = client.job_runs(start, end, job_ids=open_jobs, clusters=[] if names in ([local], []) else names)
    res = ingest.ingest_rows(rows, since=start, active=active, clusters=names or None, default_cluster=local,
                             active_cluster=local or None)
    if reprice:
        ingest.reprice(res=res)
    res.metrics = metrics_ingest.ingest_metrics(metrics_dir or paths.metrics_dir())
    res.utilisation, unsummarised = _summarise_runs(client)
    if textfile is not None:
        from gpuhpc.ledger import textfile as ledger_textfile

        ledger_textfile.write(textfile, ledger_textfile.ingest())
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
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path),
              help="On success, also write gpuhpc_ledger_sync_success_timestamp_seconds here, for node_exporter's "
                   "textfile collector (the LedgerSyncStale alert).")
@JSON
def ledger_sync_slurm(account: tuple[str, ...], dry_run: bool, textfile: Optional[Path], json_: bool) -> None:
    """Make Slurm enforce the budgets: accounts/users in slurmdbd, GrpTRESMins on each account
    (gres/gpu for GPU-hours, billing for money), RawUsage=0 at a new period; publish the billing
    document (TRESBillingWeights), the budget snapshot (job_submit.lua, gpuhpc submit) and the
    reset plan (gpuhpc ledger rollover)."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import rollover, slurm_sync
    from gpuhpc.slurm.client import SlurmClient

    admin_only("ledger sync-slurm")
    client = SlurmClient()
    # this cluster's limits: its own quotas, and those for every cluster less the others' usage
    cluster = client.cluster_name() or None
    plans = slurm_sync.plan(accounts=list(account) or None, cluster=cluster)
    with rollover.locked():        # only Slurm inside: a hung database never keeps the rollover waiting
        # a reset the rollover made while the database was away is not made again, and the
        # rollover does not make again the resets made here
        state = rollover.read_state()
        plans = rollover.without_done(plans, state)
        res = slurm_sync.sync(client, plans, dry_run=dry_run)
        if not dry_run:
            rollover.mark_done(plans, state)
    if not dry_run:
        slurm_sync.record_periods(plans, cluster=cluster)
        billing_path, snap_path = slurm_sync.publish(cluster=cluster)
        resets_path = rollover.publish(client.cluster_name())
        sys.stderr.write(f"published {snap_path}, {billing_path} and {resets_path} (apply a price change to "
                         f"slurm.conf with the gpuhpc.cluster collection: scontrol reconfigure)\n")
    if textfile is not None and not dry_run:
        from gpuhpc.ledger import textfile as ledger_textfile

        ledger_textfile.write(textfile, ledger_textfile.sync())
    if json_:
        print_json(res.as_dict())
    else:
        for c in res.commands:
            sys.stdout.write(" ".join(c) + "\n")
        sys.stderr.write(f"{len(plans)} accounts, {len(res.commands)} changes{' (dry run)' if dry_run else ''}\n")


@ledger.command("check")
@click.option("--account", multiple=True, help="Only these accounts' limits and usage (repeatable).")
@click.option("--tolerance-percent", default="1", show_default=True,
              help="Usage may differ by this percent of the larger figure (Slurm adds usage up every "
                   "PriorityCalcPeriod).")
@click.option("--tolerance-minutes", default="1", show_default=True,
              help="... or by this many GPU-minutes (a money budget: minutes of the dearest GPU), whichever is larger.")
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write gpuhpc_ledger_drift (differences by kind) and gpuhpc_ledger_drift_associations here, "
                   "for node_exporter's textfile collector (the LedgerSlurmDrift alert).")
@JSON
def ledger_check(account: tuple[str, ...], tolerance_percent: str, tolerance_minutes: str,
                 textfile: Optional[Path], json_: bool) -> int:
    """Compare the running Slurm with the ledger: TRESBillingWeights per partition against the price
    book, GrpTRESMins per quota against sync-slurm's, usage this period against the ledger's. One
    line per difference; exit 1 on any, 0 when in step."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import check, db
    from gpuhpc.slurm.client import SlurmClient

    admin_only("ledger check")
    db.check_schema()
    tol = check.Tolerance(money_arg(tolerance_percent, "--tolerance-percent"),
                          money_arg(tolerance_minutes, "--tolerance-minutes"))
    res = check.check(SlurmClient(), accounts=list(account) or None, tolerance=tol)
    if textfile is not None:
        from gpuhpc.ledger import textfile as ledger_textfile

        ledger_textfile.write(textfile, ledger_textfile.check(res))
    if json_:
        print_json(res.as_dict())
    else:
        for d in res.differences:
            sys.stdout.write(d.line() + "\n")
        for n in res.notes:
            sys.stderr.write(f"note: {n}\n")
        c = res.checked
        sys.stderr.write(f"{len(res.differences)} differences ({c['weights']} partitions, {c['limits']} associations, "
                         f"{c['usage']} budgets compared){'' if res.differences else ': the ledger and Slurm are in step'}\n")
    return 0 if res.in_step else 1


@ledger.command("rollover")
@click.option("--dry-run", is_flag=True, help="Print the sacctmgr commands only; remember nothing.")
@click.option("--textfile", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the rollover's figures here, for node_exporter's textfile collector.")
@JSON
def ledger_rollover(dry_run: bool, textfile: Optional[Path], json_: bool) -> int:
    """Reset each quota's Slurm usage at its period boundary from the plan sync-slurm wrote, without
    the ledger database (run it from cron every few minutes). Exit 1 when a reset failed."""
    import datetime as dt

    from gpuhpc.cli._console import print_json
    from gpuhpc.ledger import rollover
    from gpuhpc.slurm.client import SlurmClient

    res = rollover.run(SlurmClient(), dry_run=dry_run)
    if textfile is not None and not dry_run:
        from gpuhpc.ledger import textfile as ledger_textfile

        ledger_textfile.write(textfile, ledger_textfile.rollover(res))
    if json_:
        print_json(res.as_dict())
    else:
        for c in res.commands:
            sys.stdout.write(" ".join(c) + "\n")
        for e, r, msg in res.failed:
            start = dt.datetime.fromtimestamp(r.at, dt.timezone.utc)
            sys.stderr.write(f"error: {e.who()}: the reset for the period from {start:%Y-%m-%d %H:%M:%S} UTC "
                             f"failed: {msg}\n")
        if res.plan_generated is None:
            sys.stderr.write(f"no reset plan at {rollover.plan_path()} (gpuhpc ledger sync-slurm writes it): "
                             "nothing to reset\n")
        else:
            sys.stderr.write(f"{len(res.applied)} resets{' (dry run)' if dry_run else ''}, {len(res.failed)} failed\n")
    return 1 if res.failed else 0


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


for _command in (ledger_price.price, ledger_account.account, ledger_user.user, *ledger_adjust.COMMANDS,
                 *ledger_finance.COMMANDS):
    ledger.add_command(_command)

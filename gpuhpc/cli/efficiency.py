"""``gpuhpc report efficiency``: one job's GPU efficiency (jobstats-style), or an account's
jobs ranked by idle GPU-hours and their cost. Added to the ``report`` group of
:mod:`gpuhpc.cli.report`; the work is :mod:`gpuhpc.monitoring.efficiency`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click


@click.command("efficiency")
@click.argument("job_id", metavar="[JOBID]", required=False)
@click.option("--account", help="Rank this account's jobs by idle GPU-hours.")
@click.option("--period", default="week", show_default=True, help="With --account: day, week or month (the last one).")
@click.option("--idle-threshold", "threshold", type=float,
              help="Idle below this GPU utilisation, % (default $GPUHPC_IDLE_THRESHOLD or 5).")
@click.option("--prometheus", help="Prometheus URL (default $GPUHPC_PROMETHEUS_URL or http://127.0.0.1:9090).")
@click.option("--json", "json_", is_flag=True)
@click.option("--html", type=click.Path(path_type=Path), help="Write a self-contained HTML page with charts.")
def report_efficiency(job_id: Optional[str], account: Optional[str], period: str, threshold: Optional[float],
                      prometheus: Optional[str], json_: bool, html: Optional[Path]) -> None:
    """GPU efficiency of a job (utilisation and memory per GPU/MIG instance, time limit used,
    advice, idle GPU-hours priced in the ledger), or --account A --period week: jobs ranked
    by idle GPU-hours and their cost. Settled runs are read from their utilisation summaries
    in the ledger (`gpuhpc ledger ingest` stores them), the rest from Prometheus."""
    from gpuhpc.cli._console import print_json
    from gpuhpc.errors import UserInputError
    from gpuhpc.monitoring import efficiency as eff

    if (job_id is None) == (account is None):
        raise UserInputError("give a JOBID or --account", hint="gpuhpc report efficiency 123, or --account A")
    if threshold is not None and not 0 <= threshold <= 100:
        raise UserInputError("must be between 0 and 100", field="--idle-threshold")
    prom = eff.Prometheus(prometheus)
    if account is not None:
        if html is not None:
            raise UserInputError("--html is for one job", field="--html")
        notes: list[str] = []
        rows = eff.rank(account, period, prom=prom, threshold=threshold, notes=notes)
        _notes(notes)
        if json_:
            print_json([r.to_dict() for r in rows])
            return
        out = [f"{'job':>10} {'user':12} {'GPUs':>10} {'idle GPU-h':>11} {'idle cost':>10}"]
        for r in rows:
            cost = f"{r.idle_cost:,.2f}" if r.idle_cost is not None else "-"
            out.append(f"{r.job_id:>10} {r.user[:12]:12} {f'{r.gpus}x{r.gpu_type}':>10} "
                       f"{r.idle_gpu_hours:11.3f} {cost:>10}")
        if not rows:
            out.append(f"(no job of {account} held an idle GPU in the last {period})")
        sys.stdout.write("\n".join(out) + "\n")
        return
    rep = eff.job_report(job_id, prom=prom, threshold=threshold, series=html is not None)
    _notes(rep.notes)
    if html is not None:
        html.write_text(eff.render_html(rep), encoding="utf-8")
        sys.stderr.write(f"wrote {html}\n")
    if json_:
        print_json(rep.to_dict())
        return
    from gpuhpc.slurm.durations import format_duration

    used = rep.time_limit_used
    cost = f"{rep.idle_cost:,.2f}" if rep.idle_cost is not None else "no price in the ledger"
    out = [f"job {rep.job_id} ({rep.user}/{rep.account}, {rep.partition}): {rep.gpus} x {rep.gpu_type or 'GPU'}, "
           f"{rep.state}, elapsed {format_duration(rep.elapsed_s)} of {format_duration(rep.time_limit_s)}"
           + (f" ({used:.0%})" if used is not None else "")]
    for d in rep.devices:
        out.append(f"  {d.name:28} mean {d.mean_util:5.1f} %  peak mem {d.peak_mem_bytes / 1e9:6.1f} GB  "
                   f"idle {d.idle_hours:7.3f} GPU-h{'  IDLE' if d.idle else ''}")
    out.append(f"idle GPU-hours {rep.idle_gpu_hours:.3f} (under {rep.threshold:g} %), cost {cost}"
               + ("  [from the ledger's run summary]" if rep.source == "ledger" else ""))
    if rep.cpu_efficiency is not None:
        out.append(f"CPU {rep.cpu_used_seconds:,.0f} core-s of {rep.cpus} cores ({rep.cpu_efficiency:.0%})"
                   + (f", peak RSS {rep.peak_rss_bytes / 1e9:.2f} GB" if rep.peak_rss_bytes else ""))
    out += [f"advice: {a}" for a in rep.advice]
    sys.stdout.write("\n".join(out) + "\n")


def _notes(notes: list[str]) -> None:
    if notes:
        from gpuhpc.cli._console import warn

        for n in notes:
            warn(n)

"""``gpuhpc placement JOBID``: the leaf switches (and NVLink domains) a job's nodes spanned
against the fewest its partition allowed ("1 leaf (best 1)"; "spread: 2 leaves (best 1)";
"1 leaf (best 1); 2 NVLink domains (best 1)")."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.main import help_for


def job_placement(job_id: str, client=None) -> dict:
    """The job's nodes (scontrol while slurmctld knows it, else sacct), its partition's nodes and
    the topology -> :class:`gpuhpc.topology.placement.Placement` as a dict."""
    from gpuhpc.errors import GpuhpcError, UserInputError
    from gpuhpc.hostlist import expand
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.topology.placement import leaf_nodes, nvlink_domains, placement

    if not job_id.replace("_", "").isdigit():
        raise UserInputError(f"not a job id: {job_id!r}", field="JOBID")
    c = client or SlurmClient()
    nodelist, partition = "", ""
    rec = c.show_job(job_id)
    if rec is not None:
        nodelist, partition = rec.get("NodeList", ""), rec.get("Partition", "")
    if not nodelist or nodelist == "(null)":
        rows = [r for r in c.accounting(job_ids=[job_id]) if r.job_id == job_id]
        if not rows:
            raise GpuhpcError(f"JOBID: Slurm has no job {job_id}")
        nodelist, partition = rows[-1].nodelist, rows[-1].partition
    if not nodelist or nodelist in ("None assigned", "(null)"):
        raise GpuhpcError(f"job {job_id} has no nodes yet (pending)")
    records = c.topology()
    leaves = leaf_nodes(records)
    try:
        domains = nvlink_domains({n.name: n.features for n in c.nodes()}, records)
    except GpuhpcError:
        domains = nvlink_domains({}, records)
    if not leaves and not domains:
        raise GpuhpcError("the cluster has no tree topology (scontrol show topology lists no leaf switch) "
                          "and no NVLink domains (no node has an nvl-<domain> feature)")
    part = next((p for p in c.partitions() if p.name == partition), None)
    out = placement(leaves, expand(nodelist), expand(part.nodes) if part is not None and part.nodes else None,
                    domains)
    return {"job_id": job_id, "partition": partition, **out.to_dict()}


@click.command("placement", help=help_for("placement"))
@click.argument("job_id", metavar="JOBID")
@click.option("--json", "as_json", is_flag=True, help="nodes, leaves, best, spread as JSON.")
def placement_cmd(job_id: str, as_json: bool) -> int:
    res = job_placement(job_id)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(res)
    else:
        where = ", ".join(res["leaves"] + [f"NVLink {d}" for d in res["nvlink_domains"]])
        sys.stdout.write(f"job {job_id}: {res['summary']}: {where} "
                         f"({len(res['nodes'])} node(s), partition {res['partition']})\n")
    return 0


PERIOD_DAYS = {"day": 1, "week": 7, "month": 30}


def placement_report(period: str, as_json: bool, client=None) -> int:
    """``gpuhpc report placement``: the multi-node jobs of the last day/week/month that were
    spread over more leaves than their partition needed, worst first, with their GPU-hours."""
    import datetime as dt

    from gpuhpc.errors import GpuhpcError, UserInputError
    from gpuhpc.hostlist import expand
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.topology.placement import leaf_nodes, worst_spread

    if period not in PERIOD_DAYS:
        raise UserInputError(f"unknown period {period!r}", field="--period", hint="day, week or month")
    c = client or SlurmClient()
    leaves = leaf_nodes(c.topology())
    if not leaves:
        raise GpuhpcError("the cluster has no tree topology (scontrol show topology lists no leaf switch)")
    parts = {p.name: expand(p.nodes) for p in c.partitions() if p.nodes}
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=PERIOD_DAYS[period])
    jobs = [{"job_id": r.job_id, "user": r.user, "account": r.account, "partition": r.partition,
             "nodes": expand(r.nodelist) if r.nodelist and r.nodelist not in ("None assigned", "(null)") else [],
             "gpu_hours": sum(r.gpus.values()) * r.elapsed_s / 3600}
            for r in c.accounting(all_users=True, since=since.astimezone().strftime("%Y-%m-%dT%H:%M:%S"))]
    rows = worst_spread(jobs, leaves, parts)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(rows)
        return 0
    sys.stdout.write(f"{len(rows)} spread multi-node job(s) since {since:%Y-%m-%d %H:%M} UTC\n")
    for r in rows:
        sys.stdout.write(f"{r['job_id']:>10}  {r['user']:<10} {r['partition']:<10} {r['nodes']} nodes  "
                         f"{r['summary']:<26} {r['gpu_hours']:,.2f} GPU-h\n")
    return 0

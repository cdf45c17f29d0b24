"""What a job passes before ``sbatch``, in both modes: the jobs it waits for exist
(:func:`check_after`) and the ledger holds its cost (:func:`reserve`, :func:`with_reservation`:
the hold is released when the submission fails and tied to the job id when it succeeds).
"""
from __future__ import annotations

import getpass
from collections.abc import Callable
from typing import Any

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError
from gpuhpc.jobs.spec import Resources
from gpuhpc.slurm.state import JobState, SlurmState


def check_after(client, after: tuple[str, ...] = (), after_any: tuple[str, ...] = ()) -> None:
    """Every job a new one waits for is known to Slurm (slurmctld, else slurmdbd): Slurm 22.05
    takes a dependency on an unknown job id as already satisfied, so a mistyped id would start
    the job at once. An afterok on a job that already ended otherwise than COMPLETED could never
    be satisfied: refused as well. GpuhpcError (exit 1), before anything is reserved or
    submitted. One ``scontrol show job`` per id (a ``sacct`` for one slurmctld has forgotten)."""
    for kind, ids in (("ok", after), ("any", after_any)):
        for job_id in ids:
            rec = client.show_job(job_id)
            if rec:
                states = [SlurmState.parse(rec.get("JobState", "")).state]
            else:
                rows = [a for a in client.accounting(job_ids=[job_id])
                        if a.job_id == job_id or ("_" not in job_id and a.array_job_id == job_id)]
                if not rows:
                    raise GpuhpcError(f"job {job_id} not found", hint="check the id (gpuhpc status ID); "
                                                                      "nothing was submitted")
                states = [r.state.state for r in rows]
            bad = next((st for st in states if st.is_finished and st is not JobState.COMPLETED), None)
            if kind == "ok" and bad is not None:
                raise GpuhpcError(f"job {job_id} ended {bad.value}: a job after it (afterok) would never start",
                                  hint="wait for any end instead (--after-any, after_kind='any'); "
                                       "nothing was submitted")


def reserve(resources: Resources, name: str, client, array_size: int = 1) -> Any:
    """The ledger's pre-submit hold (None when the ledger is not in use). A user who may not
    write the ledger (it belongs to the admin) gets the published budget snapshot instead: the
    budgets are shown, a job that cannot fit is refused (exit 3), Slurm's limits bind."""
    import os

    from gpuhpc.ledger import hooks

    url = hooks.ledger_in_use()
    off = (getenv("GPUHPC_LEDGER") or "").strip().lower() in ("off", "0", "false", "no")
    if off:
        return None
    req = hooks.ChargeRequest(
        cluster="", user=getpass.getuser(), account=resources.account,
        partition=resources.partition, qos=resources.qos, gpu_type=resources.gpu_type,
        gpus=resources.total_gpus, time_limit_s=resources.time_s, array_size=array_size, job_name=name,
    )
    if url is not None and hooks.writable(url):
        import dataclasses

        try:
            cluster = client.cluster_name() or "default"
        except GpuhpcError:
            cluster = "default"
        req = dataclasses.replace(req, cluster=cluster, **share_request(resources, client))
    import sys

    account = resources.account or os.environ.get("SBATCH_ACCOUNT") or os.environ.get("SLURM_ACCOUNT")
    hold, lines = hooks.reserve_or_snapshot(req, account)     # a reader's role, a database down: the snapshot
    for line in lines:
        sys.stderr.write(f"budget: {line}\n")
    return hold


def share_request(resources: Resources, client) -> dict[str, Any]:
    """What the hold needs for the ledger's ``max_share`` pricing policy
    (:func:`gpuhpc.ledger.pricing.request_price`): the CPUs and memory one task names
    (``cpus_per_task`` × tasks per node × nodes; ``mem`` per node × nodes; ``exclusive``: its nodes
    whole) and the shape of its partition's nodes (one ``scontrol show node``). Empty when it names
    none of them or the shape is not one (the hold is then the per-GPU worst case)."""
    from gpuhpc.ledger import pricing

    r = resources
    cpus = r.nodes * (r.tasks_per_node or 1) * r.cpus_per_task if r.cpus_per_task else 0
    mem = int(pricing.mem_mb(r.mem)) * r.nodes if r.mem else 0
    if not (cpus or mem or r.exclusive):
        return {}
    try:
        nodes = client.nodes()
    except GpuhpcError:
        return {}
    shapes = pricing.fleet(nodes).shapes_of("", r.partition, [r.gpu_type] if r.gpu_type else [])
    if not shapes or len(shapes) != 1:
        return {}
    shape = shapes[0]
    if r.exclusive:
        cpus, mem = shape.cpus * r.nodes, shape.mem_mb * r.nodes
    return {"cpus": cpus, "mem_mb": mem, "shapes": (shape,) * r.nodes}


def with_reservation(resources: Resources, name: str, client, do_submit: Callable[[], str],
                     array_size: int = 1) -> str:
    """``do_submit()`` (returns the job id) inside the ledger's hold for ``resources``."""
    res = reserve(resources, name, client, array_size)
    try:
        job_id = do_submit()
    except BaseException:
        if res is not None:
            res.release()
        raise
    if res is not None:
        res.attach_job(job_id)
    return job_id

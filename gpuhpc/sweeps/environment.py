"""What a sweep's arrays inherit: the environment sbatch gets for its chunks and its driver,
whoever submits them (a login shell, the driver job, a job that runs ``sweep run``), less what
Slurm, the job template and the node set per job (:func:`job_only`)."""
from __future__ import annotations

from typing import Any

from gpuhpc.sweeps.store import db_url


#: Never handed from the submitting process to a sweep's arrays: what Slurm sets for a job
#: (``SLURM_*`` but ``SLURM_CONF``, ``SRUN_*``, ``SBATCH_*``: in the driver job
#: ``SLURM_CPUS_PER_TASK=1`` would reach every later chunk's torchrun/deepspeed/mpi steps), the
#: node's NCCL profile (``NCCL_*``: the driver's CPU node, not the trial's GPU node), and the
#: ``GPUHPC_*`` that the job template, the trial runner or the node's settings files set per
#: job (:data:`JOB_GPUHPC`). Every other ``GPUHPC_*`` is a user's setting and passes.
JOB_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "NCCL_")
JOB_GPUHPC = frozenset({
    # job-templates/_base.sbatch.j2 and its per-launcher blocks
    "GPUHPC_JOB_ID", "GPUHPC_RUN_ID", "GPUHPC_RESTART_COUNT", "GPUHPC_CHECKPOINT_DIR", "GPUHPC_STOP_DIR", "GPUHPC_SCRATCH",
    "GPUHPC_LATEST_CHECKPOINT", "GPUHPC_COLLECTIVE_TIMEOUT_S", "GPUHPC_GRACE_S", "GPUHPC_MAX_REQUEUES",
    "GPUHPC_NPROC_PER_NODE", "GPUHPC_LOCAL_RANK", "GPUHPC_SNAPSHOT", "GPUHPC_PROFILE", "GPUHPC_PROFILE_STEPS",
    "GPUHPC_PROFILE_OUTPUT",
    # the node's /etc/gpuhpc/scratch.env (the driver's node, not the trial's)
    "GPUHPC_SCRATCH_ROOT", "GPUHPC_NODE_CACHE_ROOT",
    # gpuhpc.sweeps.trial, per trial (GPUHPC_SWEEP_ID: the chunk's script sets it)
    "GPUHPC_SWEEP_ID", "GPUHPC_TRIAL_ID", "GPUHPC_PARAMS_JSON", "GPUHPC_TRIAL_DIR", "GPUHPC_METRICS_FILE",
    "GPUHPC_TRIAL_IN_IMAGE",
})


def job_only(name: str) -> bool:
    """Is ``name`` set for one job (by Slurm, the job template, the node), never a user's
    setting that a sweep's arrays should inherit?"""
    return name != "SLURM_CONF" and (name.startswith(JOB_PREFIXES) or name in JOB_GPUHPC)


def arrays_environment(environ: Any, sweep_db: str | None = None) -> dict[str, str]:
    """The environment sbatch gets for a sweep's arrays and its driver, whoever submits them (a
    login shell, the driver job, a job that runs ``sweep run``): ``environ`` less what
    :func:`job_only` names, with ``GPUHPC_DB_URL`` the sweep's database (the driver job has it
    set; so every chunk has, chunk 0 included). The sweep's own ``env:`` goes into each chunk's
    script and wins over all of this."""
    out = {k: v for k, v in environ.items() if not job_only(k)}
    if sweep_db:
        out["GPUHPC_DB_URL"] = sweep_db
    return out


def submit_client(c, url: str | None = None):
    """``c`` for a sweep's sbatch calls: over a local runner, one whose commands get
    :func:`arrays_environment` instead of this process's (over SSH the login node's own
    environment applies already); ``c`` itself for any other client."""
    runner = getattr(c, "runner", None)
    if runner is None or not getattr(runner, "is_local", False) or not hasattr(runner, "with_environment"):
        return c
    import copy

    out = copy.copy(c)
    out.runner = runner.with_environment(arrays_environment(runner.environment(), db_url(url)))
    return out

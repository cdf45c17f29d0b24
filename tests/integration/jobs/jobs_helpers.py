"""Helpers shared by the jobs integration tests (a uniquely named module: other test
directories have their own conftest.py)."""
from __future__ import annotations

from pathlib import Path

from gpuhpc.slurm.client import SlurmClient
from cli_helpers import gpuhpc  # noqa: F401  (tests/cli_helpers.py)
from ledger_helpers import research_quota  # noqa: F401  (tests/ledger_helpers.py, shared with sweeps)

HERE = Path(__file__).resolve().parent


def progress_runs(progress_text: str) -> list[dict]:
    """[{restart, resume, last, run_id}] per run of a counter program (counter_train.py, the
    Python-API Counter), from its progress log of ``start R RESUME RUN_ID`` and ``step N`` lines
    (RUN_ID: the run's $GPUHPC_RUN_ID)."""
    runs: list[dict] = []
    for line in progress_text.splitlines():
        parts = line.split()
        if parts[:1] == ["start"]:
            runs.append({"restart": int(parts[1]), "resume": int(parts[2]), "last": int(parts[2]), "run_id": parts[3]})
        elif parts[:1] == ["step"] and runs:
            runs[-1]["last"] = int(parts[1])
    return runs


def job_state(slurm: SlurmClient, job_id: str) -> str:
    rec = slurm.show_job(job_id)
    return rec.get("JobState", "") if rec else ""


def preempt(slurm: SlurmClient, nodelist: str, gres: str, track) -> str:
    """A short gpu-hi job on the same GPUs: partition_prio preemption requeues the gpu job."""
    job_id = slurm.submit_script(
        "#!/bin/bash\nsleep 1\n",
        extra=["--partition=gpu-hi", f"--nodelist={nodelist}", f"--gres={gres}", "--time=1",
               "--job-name=gpuhpc-test-preemptor", "--output=/dev/null"])
    track(job_id)
    return job_id


def interrupt(slurm: SlurmClient, job_id: str, action: str, *, node: str, gres: str, track,
              timeout: float = 150) -> None:
    """One chaos action on a running job, then wait until Slurm counts the restart:
    ``preempt`` (a gpu-hi job on ``node`` asking for ``gres``), ``requeue`` (``scontrol
    requeue``: SIGTERM), ``time_limit`` (TimeLimit=1: the limit falls inside the --signal grace,
    SIGUSR2 now, the template requeues itself; the limit is put back to 15 minutes after)."""
    before = slurm.restarts(job_id)
    if action == "preempt":
        preempt(slurm, node, gres, track)
    elif action == "requeue":
        slurm.requeue(job_id)
    elif action == "time_limit":
        slurm.update_job(job_id, TimeLimit="1")
    else:
        raise ValueError(action)
    from polling import wait_for

    wait_for(lambda: slurm.restarts(job_id) > before, timeout, f"{action} of job {job_id} to requeue it")
    if action == "time_limit":
        slurm.update_job(job_id, TimeLimit="15")


def private_gpu_cluster_fixtures(name: str, ports: tuple[int, int, int], nodes: list[str], accounting: bool = False,
                                 partitions: tuple[str, ...] = ()):
    """A module's ``private_cluster`` and ``slurm`` fixtures (private_slurm.module_fixtures) on a
    private controller with ``nodes`` as the local cluster's GPU nodes, in its ``gpu`` and
    ``gpu-hi`` partitions with its preemption (``gpu_shape``), the shared munged and its cred_expire;
    ``accounting=True``: under its own name in the shared slurmdbd (``sacct`` works). ``partitions``:
    more ``PartitionName=`` lines. In the module::

        private_cluster, slurm = private_gpu_cluster_fixtures(NAME, (CTLD, SLURMD, NODE_PORT), NODES)
    """
    from private_slurm import PrivateSlurm, gpu_shape, module_fixtures

    def make():
        shape = gpu_shape(nodes, accounting=accounting)
        cluster = PrivateSlurm(name, ports, shape["nodes"], [*shape["partitions"], *partitions], accounting=accounting,
                               extra={"SlurmdParameters": "config_overrides", "JobRequeue": "1", "KillWait": "5",
                                      "MinJobAge": "600", **shape["extra"]})
        return cluster, {"before_start": shape["before_start"]}

    return module_fixtures(make)

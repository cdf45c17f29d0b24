"""The requeue cap is a failure: a job with --max-requeues 1 that the warning stops twice (it
saved and exited 0 both times) is requeued once, then ends FAILED with exit code 75 and a
`requeue cap reached` line in its log, never COMPLETED (docs/jobs.md). The warning is the one
the time limit and a preemption send (SIGUSR2 to the batch shell, `scancel --signal --batch`).
It runs on a private controller (tests/private_slurm.py: a ``cpu`` partition of one 16-CPU node,
the shared munged and its cred_expire): isolated, beside the shared-cluster stream."""
from __future__ import annotations

import json

import pytest

from gpuhpc.slurm.client import SlurmClient
from jobs_helpers import gpuhpc, job_state
from polling import wait_for
from private_slurm import PrivateSlurm

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcrqcap"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16907, 16908, 17501          # unlike every other private cluster's

PROGRAM = 'trap "exit 0" USR2; echo "start $GPUHPC_RESTART_COUNT" >> "$1"; while :; do sleep 0.1; done'


@pytest.fixture
def slurm(monkeypatch) -> SlurmClient:
    """The private controller's client; SLURM_CONF points gpuhpc and the job at it for the test."""
    cluster = PrivateSlurm(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT),
                           {"rqcap-cpu1": "CPUs=16 RealMemory=32000 State=UNKNOWN"},
                           ["PartitionName=cpu Nodes=rqcap-cpu1 Default=YES MaxTime=INFINITE State=UP"],
                           extra={"SlurmdParameters": "config_overrides", "JobRequeue": "1", "KillWait": "5",
                                  "MinJobAge": "600"})
    with cluster:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster.client


def test_a_job_stopped_past_max_requeues_ends_failed_not_completed(jobs_env, tmp_path, slurm, track):
    progress = tmp_path / "progress"
    res = gpuhpc("submit", "--partition", "cpu", "--time", "15m", "--max-requeues", "1",
                 "--name", "gpuhpc-test-requeue-cap", "--json", "--", "bash", "-c", PROGRAM, "prog", str(progress))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def started(run: int):
        return lambda: progress.exists() and f"start {run}" in progress.read_text().split("\n")

    for run in (0, 1):
        wait_for(started(run), 90, f"run {run} of job {job_id} to start")
        slurm.run(["scancel", "--signal=USR2", "--batch", job_id])
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 60, f"job {job_id} to end")

    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    rec = slurm.show_job(job_id) or {}
    assert rec.get("JobState") == "FAILED" and rec.get("ExitCode") == "75:0", (rec, log[-2000:])
    assert rec.get("Restarts") == "1", rec
    assert "requeueing job" in log and "requeue cap reached" in log, log[-2000:]
    assert progress.read_text().split("\n")[:2] == ["start 0", "start 1"]

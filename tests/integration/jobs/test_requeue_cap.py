"""The requeue cap is a failure: a job with --max-requeues 1 that the warning stops twice (it
saved and exited 0 both times) is requeued once, then ends FAILED with exit code 75 and a
`requeue cap reached` line in its log, never COMPLETED (docs/jobs.md). The warning is the one
the time limit and a preemption send (SIGUSR2 to the batch shell, `scancel --signal --batch`)."""
from __future__ import annotations

import json

import pytest

from jobs_helpers import gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

PROGRAM = 'trap "exit 0" USR2; echo "start $GPUHPC_RESTART_COUNT" >> "$1"; while :; do sleep 0.1; done'


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

"""Python mode: a Checkpointable submitted with gpuhpc.submit survives a preemption, a
manual requeue and the time limit; its result equals an uninterrupted run.

Both run on a private controller of their own (jobs_helpers.private_gpu_cluster_fixtures: two GPU
nodes and the local cluster's gpu/gpu-hi partitions and preemption, the shared munged and its
cred_expire, the shared slurmdbd): isolated, beside the shared-cluster stream."""
from __future__ import annotations

import sys

import pytest

from jobs_helpers import HERE, job_state, preempt, private_gpu_cluster_fixtures, progress_runs
from polling import wait_for

sys.path.insert(0, str(HERE))
from jobs_counter_lib import Counter, uninterrupted  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

STEPS, STEP_S = 1200, 0.05
NAME = "gpuhpcpyapi"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17047, 17048, 17551          # unlike every other private cluster's
NODES = ["pyapi-node1", "pyapi-node2"]
NODE, GRES = NODES[1], "gpu:h100:8"

private_cluster, slurm = private_gpu_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), NODES,
                                                      accounting=True)


def test_python_callable_survives_preemption_and_requeue(jobs_env, tmp_path, slurm, track, monkeypatch):
    import gpuhpc

    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")
    progress = tmp_path / "progress.log"
    actions = ["preempt", "requeue", "time_limit"]
    # the runs before the last interruption step slowly (STEPS leaves room for the time limit's
    # signal, up to slurmctld's next ~30 s check); the last run counts the remaining steps at once
    job = gpuhpc.submit(
        Counter(), STEPS, STEP_S, str(progress), len(actions),
        resources=gpuhpc.Resources(partition="gpu", gpus=8, gpu_type="h100", nodelist=NODE, time="15m"),
        name="gpuhpc-test-pycall", grace=60, max_requeues=5)
    track(job.job_id)
    assert isinstance(job, gpuhpc.Job)

    def progressed(n: int, run: int):
        def check():
            if job_state(slurm, job.job_id) != "RUNNING" or not progress.exists():
                return False
            runs = progress_runs(progress.read_text())
            return len(runs) == run and runs[-1]["last"] - runs[-1]["resume"] >= n
        return check

    for i, action in enumerate(actions):
        wait_for(progressed(20, i + 1), 90, f"job {job.job_id} running before {action}")
        before = slurm.restarts(job.job_id)
        if action == "preempt":
            preempt(slurm, NODE, GRES, track)
        elif action == "requeue":
            slurm.requeue(job.job_id)
        else:  # the limit is now within the signal grace: submitit gets USR2 and requeues
            slurm.update_job(job.job_id, TimeLimit="1")
        wait_for(lambda: slurm.restarts(job.job_id) > before, 120, f"{action} to requeue job {job.job_id}")
        if action == "time_limit":
            slurm.update_job(job.job_id, TimeLimit="15")
        assert not job.state.is_finished

    assert job.result(timeout=240) == uninterrupted(STEPS)
    assert job.state is gpuhpc.JobState.COMPLETED
    runs = progress_runs(progress.read_text())
    assert len(runs) >= 4, runs
    for prev, cur in zip(runs, runs[1:]):
        assert 0 <= prev["last"] - cur["resume"] <= 1, (prev, cur)
    assert runs[-1]["restart"] >= 3
    assert {r["run_id"] for r in runs} == {job.job_id}                  # one GPUHPC_RUN_ID: the job's, every run
    assert "SIGUSR2" in job.logs() or "USR2" in job.logs()


def test_python_callable_requeue_cap_holds_against_preemption(jobs_env, tmp_path, slurm, track, monkeypatch):
    """--max-requeues in Python mode: once the cap is reached a preemption ends the job
    instead of Slurm requeueing it again (the job is made non-requeueable)."""
    import gpuhpc

    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")
    progress = tmp_path / "progress.log"
    job = gpuhpc.submit(
        Counter(), STEPS, STEP_S, str(progress),
        resources=gpuhpc.Resources(partition="gpu", gpus=8, gpu_type="h100", nodelist=NODE, time="15m"),
        name="gpuhpc-test-pycap", grace=60, max_requeues=1)
    track(job.job_id)

    def running_run(run: int):
        def check():
            if job_state(slurm, job.job_id) != "RUNNING" or not progress.exists():
                return False
            runs = progress_runs(progress.read_text())
            return len(runs) == run and runs[-1]["last"] - runs[-1]["resume"] >= 10
        return check

    wait_for(running_run(1), 90, f"job {job.job_id} running")
    preempt(slurm, NODE, GRES, track)
    wait_for(lambda: slurm.restarts(job.job_id) == 1, 120, f"first preemption to requeue job {job.job_id}")
    wait_for(running_run(2), 120, f"job {job.job_id} running again")
    preempt(slurm, NODE, GRES, track)                 # the cap (1) is reached: no second requeue
    wait_for(job.done, 150, f"job {job.job_id} to end at the requeue cap")
    assert slurm.restarts(job.job_id) == 1
    assert job.state is not gpuhpc.JobState.COMPLETED
    assert "not requeueing" in job.logs()

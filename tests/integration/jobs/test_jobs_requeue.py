"""Script mode survives a preemption, a manual requeue and the time limit, recomputing at most
one checkpoint interval per interruption, and ends as an uninterrupted run would. (Three
preemptions of one job, two in a row and one of a run restarted after a forced requeue:
test_multinode_chaos.py, whose torchrun script shares this one's stop/requeue logic,
job-templates/_base.sbatch.j2.) It runs on a private controller of its own
(jobs_helpers.private_gpu_cluster_fixtures: the local cluster's gpu/gpu-hi partitions and
preemption, the shared munged and its cred_expire, the shared slurmdbd for sacct): isolated,
beside the shared-cluster stream."""
from __future__ import annotations

import json
import os
import sys

import pytest

from jobs_helpers import HERE, gpuhpc, interrupt, job_state, private_gpu_cluster_fixtures, progress_runs
from polling import wait_for

sys.path.insert(0, str(HERE))
from counter_train import uninterrupted  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

STEPS, EVERY, STEP_S = 1500, 10, 0.05
ACTIONS = ["preempt", "requeue", "time_limit"]
NAME = "gpuhpcjrq"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17057, 17058, 17561          # unlike every other private cluster's
NODES = ["jrq-node1", "jrq-node2"]
NODE, GRES = NODES[1], "gpu:h100:8"

private_cluster, slurm = private_gpu_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), NODES,
                                                      accounting=True)


def test_script_job_survives_preemption_requeue_and_time_limit(jobs_env, tmp_path, slurm, track):
    progress, result = tmp_path / "progress.log", tmp_path / "result.json"
    res = gpuhpc("submit", "--partition", "gpu", "--gpus", "8", "--gpu-type", "h100", "--nodes", "1",
                 "--nodelist", NODE, "--time", "15m", "--grace", "60", "--name", "gpuhpc-test-requeue",
                 "--max-requeues", "8", "--json", "--",
                 sys.executable, str(HERE / "counter_train.py"), "--steps", str(STEPS), "--every", str(EVERY),
                 "--step-seconds", str(STEP_S), "--slow-runs", str(len(ACTIONS)), "--progress", str(progress),
                 "--result", str(result))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def progressed_since_start(n: int, run: int):
        def check():
            if job_state(slurm, job_id) != "RUNNING" or not progress.exists():
                return False
            runs = progress_runs(progress.read_text())
            return len(runs) == run and runs[-1]["last"] - runs[-1]["resume"] >= n
        return check

    # the runs before the last interruption step slowly (STEPS leaves room for a slow machine); the
    # last run counts the remaining steps at once
    for i, action in enumerate(ACTIONS):
        wait_for(progressed_since_start(2 * EVERY, i + 1), 90, f"job {job_id} running again before {action} #{i}")
        interrupt(slurm, job_id, action, node=NODE, gres=GRES, track=track, timeout=120)
        if action == "time_limit":
            assert job_state(slurm, job_id) != "TIMEOUT"

    wait_for(lambda: job_state(slurm, job_id) == "COMPLETED", 150, f"job {job_id} to complete")

    from gpuhpc.jobs.api import Job

    job = Job(job_id, client=slurm)
    assert job.state.value == "COMPLETED" and job.done()
    assert json.loads(result.read_text()) == uninterrupted(STEPS)
    runs = progress_runs(progress.read_text())
    assert len(runs) >= len(ACTIONS) + 1, runs
    for prev, cur in zip(runs, runs[1:]):
        assert 0 <= prev["last"] - cur["resume"] <= EVERY, (prev, cur)
    restarts = [r["restart"] for r in runs]
    assert restarts[0] == 0 and restarts == sorted(set(restarts))      # GPUHPC_RESTART_COUNT counts up
    assert {r["run_id"] for r in runs} == {job_id}                      # one GPUHPC_RUN_ID: the job's, every run
    # accounting shows the restarts: scontrol Restarts= and one sacct row per earlier run
    assert slurm.restarts(job_id) >= len(ACTIONS)
    rows = [r for r in slurm.accounting(job_ids=[job_id], duplicates=True) if r.job_id == job_id]
    assert len(rows) >= len(ACTIONS) + 1
    assert rows[-1].state.state.value == "COMPLETED"
    assert all(not r.state.is_finished for r in rows[:-1]), [r.state.raw for r in rows]
    log = job.logs()
    assert "SIGUSR2" in log and "requeueing job" in log


def test_preemptions_past_the_cap_with_progress_complete(jobs_env, tmp_path, slurm, track):
    """--max-requeues 1, preempted twice: every run saves a newer checkpoint (at the warning), so
    neither preemption counts against the cap and the job completes (it ended FAILED 75 at the
    second one when the cap counted preemptions)."""
    progress, result = tmp_path / "progress.log", tmp_path / "result.json"
    res = gpuhpc("submit", "--partition", "gpu", "--gpus", "8", "--gpu-type", "h100", "--nodes", "1",
                 "--nodelist", NODE, "--time", "15m", "--grace", "60", "--name", "gpuhpc-test-requeue-progress",
                 "--max-requeues", "1", "--json", "--",
                 sys.executable, str(HERE / "counter_train.py"), "--steps", "600", "--every", str(EVERY),
                 "--step-seconds", str(STEP_S), "--slow-runs", "2", "--progress", str(progress),
                 "--result", str(result))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def running(run: int):
        def check():
            if job_state(slurm, job_id) != "RUNNING" or not progress.exists():
                return False
            runs = progress_runs(progress.read_text())
            return len(runs) == run and runs[-1]["last"] - runs[-1]["resume"] >= 2
        return check

    for i in range(2):
        wait_for(running(i + 1), 90, f"job {job_id} running before preemption #{i}")
        interrupt(slurm, job_id, "preempt", node=NODE, gres=GRES, track=track, timeout=120)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED"), 150, f"job {job_id} to end")

    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    assert json.loads(result.read_text()) == uninterrupted(600)
    assert slurm.restarts(job_id) == 2
    assert log.count("after a preemption; progress") == 2, log[-3000:]
    assert "requeue cap reached" not in log


def processes_with(marker: str) -> list[str]:
    """This machine's processes that name ``marker`` (a test's own directory) in their command
    line or environment (a job's processes inherit its GPUHPC_CHECKPOINT_DIR, under the test's
    directory: spawned workers too, whose command line does not name the program)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read()
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if marker.encode() in argv or marker.encode() in env:
            found.append(pid + ": " + argv.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _dataloader_job_lives_through_a_preemption(tmp_path, slurm, track, python: str, program: str, name: str) -> None:
    """Submit ``python program`` (a training loop whose two data-loading workers have no SIGUSR2
    handler), preempt it, and check: no worker died, both answered during the one save, the next
    run resumed from it and completed, the preempted run ended by itself after its save (its
    workers stopped), not at the deadline, and no process of the job is left (a run left hanging
    outlives the job: its own session, which proctrack/linuxproc loses)."""
    progress, result = tmp_path / "progress.log", tmp_path / "result.json"
    res = gpuhpc("submit", "--partition", "gpu", "--gpus", "8", "--gpu-type", "h100", "--nodes", "1",
                 "--nodelist", NODE, "--time", "15m", "--grace", "60", "--name", name,
                 "--json", "--", python, str(HERE / program), "--steps", "400",
                 "--step-seconds", str(STEP_S), "--progress", str(progress), "--result", str(result))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) == "RUNNING" and progress.exists()
             and progress.read_text().startswith("start 0 0\n"), 90, f"job {job_id} to start")
    interrupt(slurm, job_id, "preempt", node=NODE, gres=GRES, track=track, timeout=120)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED"), 150, f"job {job_id} to end")

    lines = progress.read_text().splitlines()
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", (lines, log[-3000:])
    assert not [x for x in lines if x.startswith("worker died")], lines
    saved = [x for x in lines if x.startswith("saved ")]
    assert len(saved) == 1 and saved[0].endswith(" 2"), lines          # both workers answered during the save
    step = int(saved[0].split()[1])
    assert lines[lines.index(saved[0]) + 1] == f"start 1 {step}", lines      # resumed from that save
    assert lines[-1] == "done" and json.loads(result.read_text()) == {"step": 400}
    assert "did not exit by the deadline" not in log
    wait_for(lambda: not processes_with(str(tmp_path)), 10,
             lambda: f"job {job_id}'s processes to end: {processes_with(str(tmp_path))}")


def test_dataloader_workers_live_through_the_save(jobs_env, tmp_path, slurm, track):
    """SIGUSR2 goes to the program's leader only: the data-loading workers it forked (in its
    process group, no SIGUSR2 handler of their own: dataloader_train.py, a stand-in for torch's
    DataLoader(num_workers=2)) still answer while the leader saves at a preemption, and the job
    resumes from that save and completes. (The template signalled the whole group: the workers
    died, the save failed.)"""
    _dataloader_job_lives_through_a_preemption(tmp_path, slurm, track, sys.executable, "dataloader_train.py",
                                               "gpuhpc-test-dataloader")


def test_torch_dataloader_workers_live_through_the_save(jobs_env, tmp_path, slurm, track):
    """The same with real torch (Debian's python3-torch, torch_compat.TORCH_PYTHON): a training loop
    over ``torch.utils.data.DataLoader(num_workers=2)`` (torch_dataloader_train.py; spawned workers,
    no SIGUSR2 handler) is preempted: both workers hand out a batch during the save, the job resumes
    from it and completes, and no process of the job is left."""
    from torch_compat import TORCH_PYTHON, require_torch

    require_torch()
    _dataloader_job_lives_through_a_preemption(tmp_path, slurm, track, TORCH_PYTHON, "torch_dataloader_train.py",
                                               "gpuhpc-test-torch-dataloader")

"""A 2-node x 4-GPU torchrun job (examples/train.py: 8 ranks, a real all-reduce over TCP, one
shard per rank, launched by fake_torchrun.py) under chaos on the real cluster: preempted 3
times, force-requeued once, time-limited once. Every time all ranks stop after the same step,
`latest` only ever names a complete checkpoint, the job resumes from it, and the result
equals an uninterrupted run. A rank killed during a save leaves `latest` where it was.

Both run on a private controller of their own (tests/private_slurm.py, ``gpu_shape``: two GPU nodes
and the local cluster's gpu/gpu-hi partitions and preemption, the shared munged and its
cred_expire): isolated, beside the shared-cluster stream (about 2.5 min off CI's critical path)."""
from __future__ import annotations

import json

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from jobs_helpers import interrupt, job_state, private_gpu_cluster_fixtures
from multinode_helpers import EVERY, STEPS, WORLD, LatestWatcher, preemptor_gres, reference, runs, submit
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcmnchaos"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17027, 17028, 17531          # unlike every other private cluster's
NODES = ["mnchao-node1", "mnchao-node2"]
NODELIST, PREEMPT_NODE = ",".join(NODES), NODES[1]

private_cluster, slurm = private_gpu_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), NODES)


def test_two_nodes_survive_preemption_requeue_and_time_limit(jobs_env, tmp_path, slurm, track):
    progress, result = tmp_path / "progress", tmp_path / "result.json"
    actions = ["preempt", "preempt", "requeue", "preempt", "time_limit"]
    job_id = submit("gpuhpc-test-multinode", progress, result, opts=("--grace", "60", "--max-requeues", "8"),
                    slow_runs=len(actions), nodelist=NODELIST)
    track(job_id)
    ck_dir = jobs_env / "checkpoints" / job_id
    watcher = LatestWatcher(ck_dir)
    watcher.start()

    def running_and_progressed(run: int):
        def check():
            if job_state(slurm, job_id) != "RUNNING":
                return False
            per_rank_runs = runs(progress)
            return all(len(r) == run and r[-1]["last"] - r[-1]["resume"] >= 2 * EVERY for r in per_rank_runs)
        return check

    for i, action in enumerate(actions):
        wait_for(running_and_progressed(i + 1), 150, f"job {job_id} running again before {action} #{i}")
        interrupt(slurm, job_id, action, node=PREEMPT_NODE, gres=preemptor_gres(slurm, node=PREEMPT_NODE),
                  track=track)

    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 300,
             f"job {job_id} to end")
    watcher.done.set()
    watcher.join()
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    assert json.loads(result.read_text()) == reference(WORLD, STEPS)

    per_rank_runs = runs(progress)
    for i, run in enumerate(zip(*per_rank_runs)):          # shown with pytest -s
        print(f"run {i}: resume {sorted({r['resume'] for r in run})} last {sorted({r['last'] for r in run})} "
              f"stop {sorted({str(r['stop']) for r in run})}")
    print("latest:", watcher.seen)
    assert len({len(r) for r in per_rank_runs}) == 1 and len(per_rank_runs[0]) == len(actions) + 1, \
        [len(r) for r in per_rank_runs]
    for i, action in enumerate(actions):
        per_rank = [r[i] for r in per_rank_runs]
        nxt = [r[i + 1] for r in per_rank_runs]
        resume = {n["resume"] for n in nxt}
        assert len(resume) == 1, (action, nxt)                        # every rank resumed from one step
        if action == "requeue":         # SIGTERM, then srun's SIGKILL: back to the last periodic save
            assert all(0 <= p["last"] - nxt[0]["resume"] <= EVERY + 1 for p in per_rank), (action, per_rank, nxt)
        else:                           # SIGUSR2: all ranks stopped after one step and resumed from it
            stops = {p["stop"] for p in per_rank}
            assert len(stops) == 1 and None not in stops, (action, per_rank)
            assert resume == stops and all(p["last"] == p["stop"] for p in per_rank), (action, per_rank, nxt)
    assert watcher.seen and not watcher.bad, (watcher.seen, watcher.bad)
    latest = ckpt.latest_checkpoint(ck_dir)
    assert latest is not None and ckpt.read_manifest(latest)["world_size"] == WORLD
    assert "deadline" in log and "requeueing job" in log
    assert "SIGTERM: the job is being stopped" in log           # the forced requeue is explained, for srun too


def test_a_rank_killed_during_a_save_leaves_latest_on_the_previous_checkpoint(jobs_env, tmp_path, slurm, track):
    progress, result = tmp_path / "progress", tmp_path / "result.json"
    job_id = submit("gpuhpc-test-killed-save", progress, result, "--fail-rank", "5", "--fail-at", str(2 * EVERY),
                     steps=4 * EVERY, opts=("--no-requeue", "--env", "GPUHPC_SHARD_TIMEOUT=10"), nodelist=NODELIST)
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 240,
             f"job {job_id} to end")
    assert job_state(slurm, job_id) == "FAILED"
    ck_dir = jobs_env / "checkpoints" / job_id
    first, second = ck_dir / ckpt.step_dir_name(EVERY), ck_dir / ckpt.step_dir_name(2 * EVERY)
    assert (ck_dir / ckpt.POINTER).resolve() == first.resolve()
    assert ckpt.is_complete(first, verify=True)
    assert second.is_dir() and not ckpt.is_complete(second) and not (second / "MANIFEST.json").exists()
    assert ckpt.latest_checkpoint(ck_dir) == first.resolve()
    assert not result.exists()

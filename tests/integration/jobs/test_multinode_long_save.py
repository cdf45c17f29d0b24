"""Issue 15's "long save" on the real cluster: a 2-node x 4-rank torchrun job on the
gpu-grace partition (GraceTime=300, the DGX example's) is preempted by a gpu-hi job; every rank
then takes 12 s to write its shard, longer than the job's own --grace of 5 s, which once meant a
requeue a few seconds after the signal: now the template's deadline is the preemption time + the
partition's GraceTime, so the save completes (all shards, the manifest, `latest` moved) before
the job is requeued, nothing is killed, and the next run resumes from that checkpoint.
(The save only has to outlast --grace for that; 12 s instead of 90 s keeps the test short, and
the run after the requeue counts its remaining steps at once.) It runs on a private controller of
its own (jobs_helpers.private_gpu_cluster_fixtures: two GPU nodes, the local cluster's gpu-hi and a
gpu-grace partition as local.yaml's, the shared slurmdbd for sacct): isolated, beside the
shared-cluster stream."""
from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from jobs_helpers import job_state, preempt, private_gpu_cluster_fixtures
from multinode_helpers import EVERY, WORLD, preemptor_gres, reference, runs, submit
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

PARTITION, GRACE_TIME = "gpu-grace", 300
NAME = "gpuhpclsave"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17077, 17078, 17581          # unlike every other private cluster's
GPU_NODES = ["lsave-node1", "lsave-node2"]
PREEMPT_NODE = GPU_NODES[1]

# gpu-grace as examples/clusters/local.yaml makes it on the local cluster
private_cluster, slurm = private_gpu_cluster_fixtures(
    NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), GPU_NODES, accounting=True,
    partitions=(f"PartitionName={PARTITION} Nodes={','.join(GPU_NODES)} PriorityTier=1 PreemptMode=REQUEUE "
                f"GraceTime={GRACE_TIME} MaxTime=INFINITE DefCpuPerGPU=2 DefMemPerGPU=8000 State=UP",))
SAVE_S, GRACE = 12, 5         # the save outlasts the job's --grace; GraceTime allows it
STEPS = 6 * EVERY


def _epoch(slurm_time: str) -> float:
    """A Slurm time stamp (the host's local zone, whole seconds) as epoch seconds."""
    return dt.datetime.fromisoformat(slurm_time).timestamp()


def test_a_save_longer_than_grace_after_a_preemption_with_grace_time_300_completes_before_the_requeue(
        jobs_env, tmp_path, slurm, track):
    parts = {p.name: p for p in slurm.partitions()}
    assert PARTITION in parts, f"the private cluster has no {PARTITION} partition"
    assert parts[PARTITION].grace_time == GRACE_TIME

    progress, result = tmp_path / "progress", tmp_path / "result.json"
    job_id = submit("gpuhpc-test-long-save", progress, result, "--stop-save-seconds", str(SAVE_S), steps=STEPS,
                    partition=PARTITION, slow_runs=1, nodelist=",".join(GPU_NODES),
                    opts=("--max-requeues", "2", "--grace", str(GRACE),
                          # keep every checkpoint: the stop step's is checked at the end
                          "--env", "GPUHPC_KEEP_CHECKPOINTS=0"))
    track(job_id)

    def progressed():
        per_rank = runs(progress)
        return job_state(slurm, job_id) == "RUNNING" and all(len(r) == 1 and r[0]["last"] >= EVERY for r in per_rank)

    wait_for(progressed, 150, f"job {job_id} to run")
    preemptor = preempt(slurm, PREEMPT_NODE, preemptor_gres(slurm, node=PREEMPT_NODE), track)

    def preempt_time():
        rec = slurm.show_job(job_id) or {}
        t = rec.get("PreemptTime", "None")
        return None if t in ("None", "Unknown", "") else t

    preempted_at = _epoch(wait_for(preempt_time, 60, f"job {job_id} to be preempted"))
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 420,
             f"job {job_id} to end")
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    assert slurm.restarts(job_id) == 1, log[-3000:]

    # the ranks: one stop step, a SAVE_S save each, the next run resumed from it
    per_rank = runs(progress)
    assert all(len(r) == 2 for r in per_rank), [len(r) for r in per_rank]
    first, second = [r[0] for r in per_rank], [r[1] for r in per_rank]
    stops = {r["stop"] for r in first}
    assert len(stops) == 1 and None not in stops, first
    stop = stops.pop()
    assert all(r["saved"][-1] == stop and r["slow_save_at"] is not None for r in first), first
    assert all(r["slow_save_at"] >= preempted_at - 1 for r in first), (preempted_at, first)
    assert all(r["saved_at"][-1] - r["slow_save_at"] >= SAVE_S for r in first), first
    assert {r["resume"] for r in second} == {stop}, second
    assert json.loads(result.read_text()) == reference(WORLD, STEPS)

    # the checkpoint: complete, committed (manifest last, then `latest`) before the requeue
    step_dir = jobs_env / "checkpoints" / job_id / ckpt.step_dir_name(stop)
    assert ckpt.is_complete(step_dir, verify=True)
    assert ckpt.read_manifest(step_dir)["world_size"] == WORLD
    committed_at = (step_dir / "MANIFEST.json").stat().st_mtime

    # Slurm's account of the first run: requeued after the save and before GraceTime ran out
    rows = sorted((r for r in slurm.accounting(job_ids=[job_id], duplicates=True) if r.job_id == job_id),
                  key=lambda r: r.start)
    assert len(rows) == 2, rows
    requeued_at = _epoch(rows[0].end)
    saves_done = max(r["saved_at"][-1] for r in first)
    print(f"preempted {preempted_at:.0f}, saves {min(r['slow_save_at'] for r in first) - preempted_at:+.1f}"
          f"..{saves_done - preempted_at:+.1f} s, manifest {committed_at - preempted_at:+.1f} s, "
          f"requeued {requeued_at - preempted_at:+.0f} s")
    assert committed_at >= preempted_at + SAVE_S > preempted_at + GRACE    # past the job's own --grace
    assert requeued_at + 1 >= max(saves_done, committed_at), (requeued_at, saves_done, committed_at)
    assert requeued_at < preempted_at + GRACE_TIME, (requeued_at, preempted_at)
    pre_rows = [r for r in slurm.accounting(job_ids=[preemptor]) if r.job_id == preemptor]
    assert pre_rows and _epoch(pre_rows[0].start) + 1 >= requeued_at, pre_rows   # it waited for the save

    # the template's view: the deadline was the preemption time + GraceTime, and the program exited
    m = re.search(r"deadline (\d\d:\d\d:\d\d) \((\d+)s\)", log)
    assert m, log[-3000:]
    expected = dt.datetime.fromtimestamp(preempted_at + GRACE_TIME, dt.timezone.utc).strftime("%H:%M:%S")
    assert m.group(1) == expected and int(m.group(2)) > GRACE_TIME - 30, (m.group(0), expected)
    assert "program exited (0) after SIGUSR2" in log and "did not exit by the deadline" not in log, log[-3000:]

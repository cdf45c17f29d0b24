"""The shell side of the contract (docs/jobs.md, "Shell jobs") on the real cluster: 4 bash ranks
(the deepspeed template, 2 nodes x 2 GPUs) call the exported ``gpuhpc_should_stop`` and
``gpuhpc_save_shard`` after every step. They have no collective to keep them in step, so only
the stop protocol makes them stop after the same step. After a preemption every rank stops
there, the checkpoint is complete, and the next run resumes from it to the uninterrupted result.
It runs on a private controller of its own (jobs_helpers.private_gpu_cluster_fixtures: two GPU nodes,
the local cluster's gpu/gpu-hi partitions and preemption): isolated, beside the shared-cluster stream."""
from __future__ import annotations

import json
import sys

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from jobs_helpers import gpuhpc, job_state, preempt, private_gpu_cluster_fixtures
from multinode_helpers import preemptor_gres, runs
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcshrank"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17067, 17068, 17571          # unlike every other private cluster's
GPU_NODES = ["shrank-node1", "shrank-node2"]
PREEMPT_NODE = GPU_NODES[1]

private_cluster, slurm = private_gpu_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), GPU_NODES)

NODES, GPUS = 2, 2
WORLD = NODES * GPUS
STEPS, EVERY = 60, 10
RANK_SH = r"""#!/bin/bash
# one shell rank: a step changes the state; stop and save as docs/jobs.md says
set -u
progress="$1.$RANK" total=$2 state=0 start=0
trap '' USR2                              # the job script records the request for all ranks
if [ -n "${GPUHPC_LATEST_CHECKPOINT:-}" ]; then
  read -r start state < "$GPUHPC_LATEST_CHECKPOINT/$(printf 'rank-%05d.txt' "$RANK")"
fi
echo "start $GPUHPC_RESTART_COUNT $start" >> "$progress"
for ((step = start + 1; step <= total; step++)); do
  # ranks run at different speeds; the run after the preemption counts the rest at once
  if (( GPUHPC_RESTART_COUNT == 0 )); then sleep 0.$((2 + RANK)); fi
  state=$(( (state * 31 + step + RANK) % 1000003 ))
  echo "step $step" >> "$progress"
  if gpuhpc_should_stop "$step"; then stop=1; else stop=0; fi
  if (( step % EVERY == 0 || stop )); then
    echo "$step $state" > "$GPUHPC_SCRATCH/shard-$RANK.txt"
    gpuhpc_save_shard "$GPUHPC_SCRATCH/shard-$RANK.txt" "$step" || exit 1
  fi
  if (( stop )); then echo "stop $step" >> "$progress"; exit 0; fi
done
echo "done $state" >> "$progress"
"""


def _reference(rank: int) -> int:
    state = 0
    for step in range(1, STEPS + 1):
        state = (state * 31 + step + rank) % 1000003
    return state


def test_shell_ranks_stop_after_the_same_step_and_resume(jobs_env, tmp_path, slurm, track):
    script, progress = tmp_path / "rank.sh", tmp_path / "progress"
    script.write_text(RANK_SH.replace("EVERY", str(EVERY)))
    res = gpuhpc("submit", "--template", "deepspeed", "--nodes", str(NODES), "--gpus", str(GPUS), "--gpu-type",
                 "h100", "--partition", "gpu", "--nodelist", ",".join(GPU_NODES), "--time", "15m",
                 "--name", "gpuhpc-test-shell-ranks", "--max-requeues", "2", "--json", "--",
                 "bash", str(script), str(progress), str(STEPS))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)

    def progressed():
        per_rank = runs(progress, WORLD)
        return job_state(slurm, job_id) == "RUNNING" and all(len(r) == 1 and r[0]["last"] >= EVERY for r in per_rank)

    wait_for(progressed, 150, f"job {job_id} to run")
    preempt(slurm, PREEMPT_NODE, preemptor_gres(slurm, ours=GPUS, node=PREEMPT_NODE), track)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 300,
             f"job {job_id} to end")
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    per_rank = runs(progress, WORLD)
    print("first run:", [(r[0]["last"], r[0]["stop"]) for r in per_rank], file=sys.stderr)
    assert all(len(r) == 2 for r in per_rank), ([len(r) for r in per_rank], log[-3000:])
    stops = {r[0]["stop"] for r in per_rank}
    assert len(stops) == 1 and None not in stops, per_rank
    stop = stops.pop()
    assert {r[1]["resume"] for r in per_rank} == {stop}, per_rank
    step_dir = jobs_env / "checkpoints" / job_id / ckpt.step_dir_name(stop)
    assert ckpt.is_complete(step_dir, verify=True) and ckpt.read_manifest(step_dir)["world_size"] == WORLD
    assert [r[1]["done"] for r in per_rank] == [_reference(rank) for rank in range(WORLD)], per_rank

"""Standard rank semantics on the real cluster: a deepspeed-template job with 8 tasks on one node
sees LOCAL_RANK 0..7, as DeepSpeed's own launcher gives it, and every task sees all 8 of the
node's GPUs, so cuda:LOCAL_RANK is its own (docs/jobs.md, Templates)."""
from __future__ import annotations

import json

import pytest

from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration


def test_deepspeed_job_sees_local_rank_0_to_7_on_one_node(jobs_env, tmp_path, slurm, track):
    out = tmp_path / "ranks"
    out.mkdir()
    res = gpuhpc("submit", "--template", "deepspeed", "--nodes", "1", "--gpus", "8", "--gpu-type", "h100",
                 "--nodelist", "gpu-node1", "--partition", "gpu", "--time", "15m",
                 "--name", "gpuhpc-test-ds-local-rank", "--json", "--",
                 "python", str(HERE / "print_dist_env.py"), str(out))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 180,
             f"deepspeed job {job_id}")
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-2000:]
    envs = [json.loads(p.read_text()) for p in out.glob("rank-*.json")]
    assert sorted(int(e["RANK"]) for e in envs) == list(range(8)), log[-2000:]
    assert sorted(int(e["LOCAL_RANK"]) for e in envs) == list(range(8))
    assert all(e["LOCAL_RANK"] == e["RANK"] for e in envs)                  # one node
    assert {e["WORLD_SIZE"] for e in envs} == {"8"} and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"8"}
    assert {e["SLURMD_NODENAME"] for e in envs} == {"gpu-node1"}
    gpus = {e["CUDA_VISIBLE_DEVICES"] for e in envs}
    assert len(gpus) == 1 and len(gpus.pop().split(",")) == 8, envs      # the node's GPUs, for every rank

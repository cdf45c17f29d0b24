"""The NCCL/IB profile on the real cluster: a 2-node deepspeed job whose nodes have the DGX
example's profile (rendered as `gpuhpc conf render` and the gpudirect_rdma role write it; the
job names it with GPUHPC_NCCL_PROFILE instead of /etc/gpuhpc/nccl.env) gives every srun task
the profile's HCAs in rail order, the job's own --env wins, the run's collective timeout is
torch's 600 s and the stop handshake's is shorter than the grace period."""
from __future__ import annotations

import json
import sys

import pytest

from gpuhpc.conf.render import render_nccl_profiles
from gpuhpc.spec.cluster import load_spec
from jobs_helpers import HERE, gpuhpc, job_state
from polling import wait_for

pytestmark = pytest.mark.integration

PROBE = ("import json, os, sys; keys = ('NCCL_IB_HCA', 'TORCH_NCCL_ASYNC_ERROR_HANDLING', "
         "'GPUHPC_COLLECTIVE_TIMEOUT_S', 'GPUHPC_STOP_COLLECTIVE_TIMEOUT_S', 'SLURMD_NODENAME'); "
         "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w')"
         ".write(json.dumps({k: os.environ.get(k) for k in keys}))")


def test_every_rank_gets_the_profile_and_the_job_wins(jobs_env, tmp_path, slurm, track):
    profiles = render_nccl_profiles(load_spec(HERE.parents[2] / "examples" / "clusters" / "dgx-h100-pod.yaml"))
    profile = tmp_path / "nccl.env"
    profile.write_text(profiles["nccl-dgx.env"])
    hca = next(line for line in profile.read_text().splitlines() if "NCCL_IB_HCA" in line)
    rails = hca.split("NCCL_IB_HCA-", 1)[1].rstrip('}"')            # =mlx5_0:1,mlx5_3:1,...
    out = tmp_path / "ranks"
    out.mkdir()
    res = gpuhpc("submit", "--template", "deepspeed", "--nodes", "2", "--gpus", "1", "--gpu-type", "h100",
                 "--partition", "gpu", "--time", "10m", "--grace", "60", "--name", "gpuhpc-test-nccl-profile",
                 "--env", f"GPUHPC_NCCL_PROFILE={profile}", "--env", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3",
                 "--json", "--", sys.executable, "-c", PROBE, str(out))
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 120,
             f"job {job_id}")
    from gpuhpc.jobs.api import Job

    assert job_state(slurm, job_id) == "COMPLETED", Job(job_id, client=slurm).logs()
    ranks = [json.loads(p.read_text()) for p in sorted(out.iterdir())]
    assert len(ranks) == 2 and len({r["SLURMD_NODENAME"] for r in ranks}) == 2, ranks
    assert rails.startswith("=mlx5_0:1,mlx5_3:1") and {r["NCCL_IB_HCA"] for r in ranks} == {rails}, ranks
    assert {r["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for r in ranks} == {"3"}       # the job's own setting wins
    assert {r["GPUHPC_COLLECTIVE_TIMEOUT_S"] for r in ranks} == {"600"}          # the run's: torch's default
    assert {r["GPUHPC_STOP_COLLECTIVE_TIMEOUT_S"] for r in ranks} == {"45"}      # the handshake's: 3/4 of the 60 s grace

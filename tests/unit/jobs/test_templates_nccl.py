"""Job scripts source the cluster's NCCL profile; the job's own settings win; a collective
timeout shorter than the grace period and TORCH_NCCL_ASYNC_ERROR_HANDLING are set."""
from __future__ import annotations

import os
import subprocess

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec


def test_profile_is_sourced_and_the_job_wins(tmp_path):
    profile = tmp_path / "nccl.env"
    profile.write_text('export NCCL_IB_HCA="${NCCL_IB_HCA-=mlx5_0:1}"\n'
                       'export NCCL_IB_GID_INDEX="${NCCL_IB_GID_INDEX-3}"\n')
    spec = JobSpec(command=("bash", "-c", 'echo "$NCCL_IB_HCA|$NCCL_IB_GID_INDEX|$GPUHPC_COLLECTIVE_TIMEOUT_S|'
                                          '$TORCH_NCCL_ASYNC_ERROR_HANDLING"'),
                   env={"NCCL_IB_GID_INDEX": "5"}, grace=60, checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "job.sh").write_text(render(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL", "GPUHPC_COLL"))}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=20,
                         env={**env, "SLURM_JOB_ID": "12", "GPUHPC_NCCL_PROFILE": str(profile)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "=mlx5_0:1|5|45|1"

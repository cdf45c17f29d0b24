"""Job scripts source the cluster's NCCL profile; the job's own settings win; the run's
collective timeout is torch's long default (an evaluation or a compilation stall must not kill the
job under TORCH_NCCL_ASYNC_ERROR_HANDLING), the stop handshake's is shorter than the grace period."""
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
                                          '$TORCH_NCCL_ASYNC_ERROR_HANDLING|$GPUHPC_STOP_COLLECTIVE_TIMEOUT_S"'),
                   env={"NCCL_IB_GID_INDEX": "5"}, grace=60, checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "job.sh").write_text(render(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "TORCH_NCCL", "GPUHPC_COLL", "GPUHPC_STOP"))}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=20,
                         env={**env, "SLURM_JOB_ID": "12", "GPUHPC_NCCL_PROFILE": str(profile)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "=mlx5_0:1|5|600|1|45"


def test_the_job_sets_its_own_run_timeout(tmp_path):
    """--env GPUHPC_COLLECTIVE_TIMEOUT_S=1800 (a long compilation) wins over the default."""
    spec = JobSpec(command=("bash", "-c", 'echo "$GPUHPC_COLLECTIVE_TIMEOUT_S|$GPUHPC_STOP_COLLECTIVE_TIMEOUT_S"'),
                   env={"GPUHPC_COLLECTIVE_TIMEOUT_S": "1800"}, grace=300, checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "job.sh").write_text(render(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUHPC_COLL", "GPUHPC_STOP"))}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=20,
                         env={**env, "SLURM_JOB_ID": "12", "GPUHPC_NCCL_PROFILE": "/nonexistent"})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "1800|225"

"""What a sweep's arrays inherit from whoever submits them (issue 32.1): the driver job's
``SLURM_CPUS_PER_TASK=1``, its other SLURM_*, its per-job GPUHPC_* and its node's NCCL profile
never reach a chunk; a user's settings (and SLURM_CONF) do, and GPUHPC_DB_URL is the sweep's."""
from __future__ import annotations

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.sweeps import environment
from gpuhpc.transport.local import LocalRunner

DRIVER_ENV = {
    "PATH": "/usr/bin:/bin", "HOME": "/root", "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_CPUS_PER_TASK": "1", "SLURM_JOB_ID": "77", "SLURM_MEM_PER_CPU": "100", "SRUN_DEBUG": "3",
    "SBATCH_PARTITION": "cpu", "NCCL_IB_HCA": "mlx5_0", "NCCL_DEBUG": "INFO",
    "GPUHPC_COLLECTIVE_TIMEOUT_S": "45", "GPUHPC_CHECKPOINT_DIR": "/d/driver", "GPUHPC_JOB_ID": "77",
    "GPUHPC_SCRATCH": "/tmp/gpuhpc-77", "GPUHPC_SCRATCH_ROOT": "/nvme", "GPUHPC_SWEEP_ID": "3",
    "GPUHPC_DATA_DIR": "/home/u/data", "GPUHPC_SWEEP_ROOT": "/shared/sweeps", "GPUHPC_PYTHON": "/opt/py",
    "GPUHPC_DB_URL": "postgresql://old", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
}


def test_the_driver_jobs_own_environment_stays_behind():
    env = environment.arrays_environment(DRIVER_ENV, "postgresql://sweep")
    assert env == {"PATH": "/usr/bin:/bin", "HOME": "/root", "SLURM_CONF": "/etc/slurm/slurm.conf",
                   "GPUHPC_DATA_DIR": "/home/u/data", "GPUHPC_SWEEP_ROOT": "/shared/sweeps",
                   "GPUHPC_PYTHON": "/opt/py", "GPUHPC_DB_URL": "postgresql://sweep",
                   "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_sbatch_runs_with_that_environment(monkeypatch, tmp_path):
    """The client a sweep submits with runs its commands with :func:`arrays_environment`, not
    this process's environment (here ``env`` stands in for sbatch); the client it came from is
    unchanged."""
    for k, v in DRIVER_ENV.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("GPUHPC_DB_URL", f"sqlite:///{tmp_path / 'x.db'}")
    c = SlurmClient(LocalRunner(env={"SLURM_CONF": "/private/slurm.conf"}))
    sub = environment.submit_client(c, f"sqlite:///{tmp_path / 'x.db'}")
    seen = dict(line.split("=", 1) for line in sub.runner.run(["env"]).stdout.splitlines() if "=" in line)
    assert not [k for k in seen if k.startswith(("SRUN_", "SBATCH_", "NCCL_"))
                or (k.startswith("SLURM_") and k != "SLURM_CONF")], seen
    assert "GPUHPC_COLLECTIVE_TIMEOUT_S" not in seen and "GPUHPC_CHECKPOINT_DIR" not in seen
    assert seen["SLURM_CONF"] == "/private/slurm.conf" and seen["GPUHPC_SWEEP_ROOT"] == "/shared/sweeps"
    assert seen["GPUHPC_DB_URL"] == f"sqlite:///{tmp_path / 'x.db'}"
    again = dict(line.split("=", 1) for line in c.runner.run(["env"]).stdout.splitlines() if "=" in line)
    assert again["SLURM_CPUS_PER_TASK"] == "1"          # the caller's own client: as before


def test_a_client_without_a_local_runner_is_used_as_it_is():
    class Fake:
        pass

    c = Fake()
    assert environment.submit_client(c) is c

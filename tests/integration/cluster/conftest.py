"""The cluster that `ansible-playbook -i ansible/inventories/local ansible/site.yml` stood up.

These tests check the Ansible-built cluster itself, so they always talk to it through the
standard /etc/slurm/slurm.conf (never a SLURM_CONF pointing at another cluster on this machine).
Every test cancels the jobs it submitted (by id).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner

SLURM_CONF = "/etc/slurm/slurm.conf"
NODES = ("gpu-node1", "gpu-node2", "mig-node1", "cpu-node1")


@pytest.fixture(scope="session")
def slurm() -> SlurmClient:
    return SlurmClient(LocalRunner(env={"SLURM_CONF": SLURM_CONF}))


@pytest.fixture()
def submit(slurm: SlurmClient) -> Iterator[Callable[..., str]]:
    """sbatch a script; every job submitted through this is scancelled at teardown."""
    ids: list[str] = []

    def _submit(script: str, *extra: str) -> str:
        job_id = slurm.submit_script(script, extra=list(extra))
        ids.append(job_id)
        return job_id

    yield _submit
    for job_id in ids:
        slurm.cancel(job_id)   # scancel of a finished job is a no-op



"""The cluster that `scripts/cluster.sh up` stood up (the installed gpuhpc.cluster collection, run
with ansible/local/up.yml).

These tests check the Ansible-built cluster itself, so they always talk to it through the
standard /etc/slurm/slurm.conf (never a SLURM_CONF pointing at another cluster on this machine).
Every test cancels the jobs it submitted (by id).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from ansible_helpers import ansible_env  # noqa: F401  (the tests import it from here)

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




REPO = Path(__file__).resolve().parents[3]


def run_playbook(playbook: str, inventory: str, *extra: str, tmp: Path | None = None,
                 timeout: float = 600) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run([str(exe) if exe.exists() else "ansible-playbook", "-i", inventory, playbook, *extra],
                          cwd=REPO, env=ansible_env(tmp), capture_output=True, text=True, timeout=timeout)


def recap(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """changed= and failed= of the PLAY RECAP, summed over hosts."""
    text = proc.stdout[proc.stdout.rindex("PLAY RECAP"):]
    return {key: sum(int(n) for n in re.findall(rf"{key}=(\d+)", text)) for key in ("changed", "failed")}


@pytest.fixture(scope="session")
def collection() -> Path:
    """gpuhpc.cluster built (`ansible-galaxy collection build`) and installed into .ansible/collections,
    the way scripts/cluster.sh up does before every run; returns the installed collection's root."""
    proc = subprocess.run(["bash", "scripts/cluster.sh", "install"], cwd=REPO, env=ansible_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = REPO / ".ansible" / "collections" / "ansible_collections" / "gpuhpc" / "cluster"
    assert (root / "MANIFEST.json").is_file(), proc.stderr[-3000:]
    return root

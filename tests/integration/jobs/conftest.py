"""Fixtures for the jobs integration tests: a private data dir and job cleanup.

Every job a test submits is registered with ``track`` and scancelled by id at the end
(never ``scancel -u``: other engineers share the cluster)."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient

@pytest.fixture
def slurm() -> SlurmClient:
    return SlurmClient()


@pytest.fixture
def jobs_env(tmp_path, monkeypatch) -> Path:
    """GPUHPC_DATA_DIR (logs, checkpoints) in a per-test dir, ledger off unless a test opts in."""
    from ledger_helpers import private_data_dir

    return private_data_dir(tmp_path, monkeypatch, "GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT")


@pytest.fixture
def track(slurm):
    ids: list[str] = []
    yield ids.append
    for job_id in ids:
        slurm.run(["scancel", str(job_id)], check=False)

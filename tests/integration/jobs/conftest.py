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
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(data))
    monkeypatch.delenv("GPUHPC_LOG_DIR", raising=False)
    monkeypatch.delenv("GPUHPC_CHECKPOINT_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    return data


@pytest.fixture
def track(slurm):
    ids: list[str] = []
    yield ids.append
    for job_id in ids:
        slurm.run(["scancel", str(job_id)], check=False)

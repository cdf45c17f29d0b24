"""Fixtures for the ledger integration tests: a fresh SQLite file, both backends
(``pg_url``, a fresh PostgreSQL database, is tests/integration/conftest.py's), the local
cluster's client and the job ids a test cancels at teardown."""
from __future__ import annotations

import pytest

from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.client import SlurmClient


@pytest.fixture()
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request, tmp_path):
    """Both backends, for real."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture()
def client():
    return SlurmClient()


@pytest.fixture()
def jobs(client):
    """Job ids to scancel at teardown (ours only)."""
    ids: list[str] = []
    yield ids
    for j in ids:
        client.run(cmd.scancel(j), check=False)

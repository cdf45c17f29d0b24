"""Fixtures for the ledger integration tests: a fresh SQLite file, and both backends
(``pg_url``, a fresh PostgreSQL database, is tests/integration/conftest.py's)."""
from __future__ import annotations

import pytest


@pytest.fixture()
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request, tmp_path):
    """Both backends, for real."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return request.getfixturevalue("pg_url")

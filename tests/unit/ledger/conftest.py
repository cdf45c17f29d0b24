from __future__ import annotations

import pytest


@pytest.fixture()
def ledger_url(tmp_path, monkeypatch):
    """A fresh, migrated SQLite ledger; GPUHPC_DB_URL points at it."""
    from gpuhpc.ledger import db

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("GPUHPC_DB_URL", url)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    db.upgrade(url)
    return url

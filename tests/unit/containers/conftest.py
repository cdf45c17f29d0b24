from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    """Keep the template cache, logs and checkpoints of unit tests out of the home dir."""
    monkeypatch.setenv("GPUHPC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "data"))
    for var in ("GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT", "GPUHPC_TEMPLATE_DIR", "GPUHPC_DB_URL"):
        monkeypatch.delenv(var, raising=False)

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _shared_dir() -> Path:
    env = os.environ.get("GPUHPC_SHARED")
    if env:
        return Path(env)
    return REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    """Read-only real captures (ibnetdiscover dumps, nvidia-smi outputs)."""
    path = _shared_dir() / "fixtures"
    assert path.is_dir(), f"shared fixtures not found at {path} (set GPUHPC_SHARED)"
    return path

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "clusters"
SPECS = ("local", "dgx-h100-pod")


@pytest.fixture()
def local_data() -> dict:
    """examples/clusters/local.yaml as a plain dict, to break one field per test."""
    return copy.deepcopy(yaml.safe_load((EXAMPLES / "local.yaml").read_text()))


@pytest.fixture()
def write_spec(tmp_path):
    def _write(data: dict) -> Path:
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return _write

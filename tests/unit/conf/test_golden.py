"""Rendered configs of the example specs against tests/golden/<spec>/<file>.

Regenerate on purpose (after a deliberate template or spec change), then review the diff:
    GPUHPC_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/conf/test_golden.py
"""
from __future__ import annotations

import os

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO, SPECS

GOLDEN = REPO / "tests" / "golden"
REGEN = os.environ.get("GPUHPC_REGEN_GOLDEN") == "1"


@pytest.mark.parametrize("spec_name", SPECS)
def test_rendered_configs_match_golden(spec_name):
    files, warnings = render_spec(load_spec(EXAMPLES / f"{spec_name}.yaml"))
    assert warnings == []
    golden_dir = GOLDEN / spec_name
    if REGEN:
        golden_dir.mkdir(parents=True, exist_ok=True)
        for old in golden_dir.iterdir():
            old.unlink()
        for name, text in files.items():
            (golden_dir / name).write_text(text)
    assert sorted(p.name for p in golden_dir.iterdir()) == sorted(files), \
        "golden file set differs; regenerate with GPUHPC_REGEN_GOLDEN=1"
    for name, text in files.items():
        assert text == (golden_dir / name).read_text(), (
            f"{spec_name}/{name} differs from tests/golden; if intended: GPUHPC_REGEN_GOLDEN=1 pytest {__file__}")

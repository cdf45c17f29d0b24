"""The cluster spec's ``health`` block -> the conf context -> slurm.conf (HealthCheckProgram,
HealthCheckInterval, HealthCheckNodeState, Prolog, Epilog) and what the gpuhpc_slurm_common role
writes to hooks.env; without the block nothing is rendered. And the hooks exist."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpuhpc.conf.context import HOOKS_ENV_FILE, build_context
from gpuhpc.conf.render import render_context
from gpuhpc.errors import SpecError
from gpuhpc.spec.cluster import load_spec, spec_from_data

REPO = Path(__file__).resolve().parents[3]
HOOKS = REPO / "gpuhpc" / "health" / "hooks"
LOCAL = REPO / "examples" / "clusters" / "local.yaml"


def _spec(health):
    data = yaml.safe_load(LOCAL.read_text())
    if health is None:
        data.pop("health", None)
    else:
        data["health"] = health
    return spec_from_data(data)


def test_no_health_block_renders_no_health_lines():
    text = render_context(build_context(_spec(None)))["slurm.conf"]
    assert "HealthCheck" not in text and "Prolog=" not in text and "Epilog=" not in text


def test_health_block_renders_hooks_and_env():
    ctx = build_context(_spec({"interval": 45, "node_state": ["IDLE", "MIXED", "CYCLE"], "hooks_dir": "/opt/h",
                               "python": "/opt/venv/bin/python", "spec_file": "/etc/gpuhpc/health.yaml"}))
    text = render_context(ctx)["slurm.conf"]
    for line in ("HealthCheckProgram=/opt/h/gpuhpc-healthcheck", "HealthCheckInterval=45",
                 "HealthCheckNodeState=IDLE,MIXED,CYCLE", "Prolog=/opt/h/gpuhpc-prolog", "Epilog=/opt/h/gpuhpc-epilog"):
        assert line + "\n" in text
    h = ctx["health"]
    assert h["env_file"] == HOOKS_ENV_FILE == "/etc/gpuhpc/hooks.env"
    assert h["hooks"] == ["gpuhpc-healthcheck", "gpuhpc-prolog", "gpuhpc-epilog"]
    assert h["env"] == {"GPUHPC_PYTHON": "/opt/venv/bin/python", "GPUHPC_JOBMAP_DIR": "/run/gpuhpc/jobmap",
                        "GPUHPC_HEALTH_SPEC": "/etc/gpuhpc/health.yaml"}


def test_prolog_epilog_off_and_own_program():
    ctx = build_context(_spec({"prolog": False, "epilog": False, "program": "/usr/sbin/nhc"}))
    text = render_context(ctx)["slurm.conf"]
    assert "HealthCheckProgram=/usr/sbin/nhc\n" in text and "HealthCheckInterval=300\n" in text
    assert "HealthCheckNodeState=ANY\n" in text
    assert "Prolog=" not in text and "Epilog=" not in text
    assert ctx["health"]["hooks"] == ["gpuhpc-healthcheck"]


def test_local_cluster_runs_the_gate_every_10s_on_any_node():
    h = build_context(load_spec(LOCAL))["health"]
    assert h["interval"] == 10 and h["node_state"] == "ANY"
    assert h["prolog"] == "/usr/local/sbin/gpuhpc-prolog" and h["epilog"] == "/usr/local/sbin/gpuhpc-epilog"


@pytest.mark.parametrize("health, needle", [
    ({"interval": 5}, "health.interval"),
    ({"node_state": ["CYCLE"]}, "CYCLE needs a state"),
    ({"node_state": ["ANY", "IDLE"]}, "ANY already covers"),
    ({"node_state": ["DRAIN"]}, "health.node_state[0]"),
    ({"hooks_dir": "relative/dir"}, "health.hooks_dir"),
    ({"intervall": 30}, "health.intervall"),
])
def test_bad_health_block_is_a_one_line_spec_error(health, needle):
    with pytest.raises(SpecError) as ei:
        _spec(health)
    assert needle in ei.value.one_line() and "\n" not in ei.value.one_line()


def test_hooks_are_executable_and_call_the_entry_points():
    for name, needle in (("gpuhpc-healthcheck", "-m gpuhpc.health --apply"),
                         ("gpuhpc-prolog", "--mode prolog --apply"), ("gpuhpc-epilog", "jobmap epilog")):
        path = HOOKS / name
        assert os.access(path, os.X_OK), path
        assert needle in path.read_text()

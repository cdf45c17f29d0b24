"""slurm.conf.j2 names the health hooks when the context carries ``health`` (the conf
context does not set it yet: the rendered goldens are unchanged), and the hooks exist."""
from __future__ import annotations

import os
from pathlib import Path

from gpuhpc.conf.context import build_context
from gpuhpc.conf.render import render_context
from gpuhpc.spec.cluster import load_spec

REPO = Path(__file__).resolve().parents[3]
HOOKS = REPO / "gpuhpc" / "health" / "hooks"


def test_health_lines_render_only_when_asked():
    ctx = build_context(load_spec(REPO / "examples" / "clusters" / "local.yaml"))
    plain = render_context(ctx)["slurm.conf"]
    assert "HealthCheckProgram" not in plain and "Prolog=" not in plain
    ctx["health"] = {"program": "/usr/local/sbin/gpuhpc-healthcheck", "interval": 60,
                     "prolog": "/usr/local/sbin/gpuhpc-prolog", "epilog": "/usr/local/sbin/gpuhpc-epilog"}
    text = render_context(ctx)["slurm.conf"]
    for line in ("HealthCheckProgram=/usr/local/sbin/gpuhpc-healthcheck", "HealthCheckInterval=60",
                 "HealthCheckNodeState=ANY", "Prolog=/usr/local/sbin/gpuhpc-prolog", "Epilog=/usr/local/sbin/gpuhpc-epilog"):
        assert line + "\n" in text


def test_hooks_are_executable_and_call_the_entry_points():
    for name, needle in (("gpuhpc-healthcheck", "-m gpuhpc.health --apply"),
                         ("gpuhpc-prolog", "--mode prolog --apply"), ("gpuhpc-epilog", "jobmap epilog")):
        path = HOOKS / name
        assert os.access(path, os.X_OK), path
        assert needle in path.read_text()

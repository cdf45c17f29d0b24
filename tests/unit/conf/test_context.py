"""The template context the Ansible roles consume (`gpuhpc conf context SPEC`)."""
from __future__ import annotations

import json

from gpuhpc.cli.main import main

from .conftest import EXAMPLES


def _context(capsys, name: str) -> dict:
    rc = main(["conf", "context", str(EXAMPLES / f"{name}.yaml")])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)


def test_local_context_nodes_ports_and_devices(capsys):
    ctx = _context(capsys, "local")
    nodes = {n["name"]: n for n in ctx["nodes"]}
    assert {n: nodes[n]["port"] for n in nodes} == {
        "gpu-node1": 17101, "gpu-node2": 17102, "mig-node1": 17103, "cpu-node1": 17104}
    assert nodes["gpu-node1"]["pid_file"] == "/run/slurm/slurmd-gpu-node1.pid"
    assert nodes["gpu-node1"]["spool_dir"] == "/var/spool/slurmd/gpu-node1"
    mig = [g["type"] for g in nodes["mig-node1"]["gpus"]]
    assert mig == ["1g.10gb"] * 7 + ["3g.40gb"] * 2
    files = [g["file"] for n in nodes.values() for g in n["gpus"]]
    assert len(files) == len(set(files)) == 25
    assert ctx["accounting"]["tres"] == "gres/gpu,gres/gpu:h100,gres/gpu:1g.10gb,gres/gpu:3g.40gb"
    assert ctx["accounting"]["pass"] == ctx["munge_socket"]
    assert not ctx["uses_cgroup"]


def test_dgx_context_merges_identical_nodes_and_uses_nvml_for_mig(capsys):
    ctx = _context(capsys, "dgx-h100-pod")
    assert [n["nodes"] for n in ctx["node_lines"]] == ["dgx[001-030]", "dgx[031-032]"]
    mig_rows = [g for g in ctx["gres_lines"] if g["nodes"] == "dgx[031-032]"]
    assert mig_rows and all(g["file"] is None and g["count"] for g in mig_rows)
    assert sum(g["count"] for g in mig_rows) == 34     # 4 x 4 + 2 x 7 + 2 x 2 slices per node
    assert ctx["uses_cgroup"]

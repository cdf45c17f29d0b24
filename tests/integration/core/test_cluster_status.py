"""`gpuhpc cluster status` against the real local cluster."""
from __future__ import annotations

import json
import subprocess
import sys


def _gpuhpc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuhpc", *args], capture_output=True, text=True, timeout=120)


def test_cluster_status_json_reports_typed_gpus_and_mig():
    res = _gpuhpc("cluster", "status", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    nodes = {n["name"]: n for n in data["nodes"]}
    assert {"gpu-node1", "gpu-node2", "mig-node1", "cpu-node1"} <= set(nodes)
    gpus = {g["gpu_type"]: g for g in data["gpus"]}
    assert gpus["h100"]["total"] >= 16 and not gpus["h100"]["mig"]
    assert gpus["1g.10gb"]["mig"] and gpus["3g.40gb"]["mig"]
    for g in gpus.values():
        assert g["free"] == g["total"] - g["allocated"]
    parts = {p["name"]: p for p in data["partitions"]}
    assert parts["gpu-hi"]["priority_tier"] > parts["gpu"]["priority_tier"]


def test_cluster_status_table():
    res = _gpuhpc("cluster", "status")
    assert res.returncode == 0, res.stderr
    for word in ("gpu-node1", "mig-node1", "1g.10gb", "Partitions"):
        assert word in res.stdout

"""`gpuhpc cluster status` against the real local cluster: its GPU counts are checked against
``scontrol show node`` (read here, not through gpuhpc's parser) while a job holds GPUs."""
from __future__ import annotations

import json
import re
import subprocess
import uuid

import pytest
from cli_helpers import gpuhpc
from polling import wait_for

pytestmark = pytest.mark.integration


def _scontrol_nodes() -> dict[str, dict[str, dict[str, int]]]:
    """node -> {"total": {type: n}, "alloc": {type: n}} from Gres= and AllocTRES=."""
    out = subprocess.run(["scontrol", "show", "node", "--oneliner"], capture_output=True, text=True,
                         check=True).stdout
    nodes = {}
    for line in out.splitlines():
        name = re.search(r"NodeName=(\S+)", line).group(1)
        gres = re.search(r"\bGres=(\S+)", line).group(1)
        alloc = re.search(r"\bAllocTRES=(\S*)", line).group(1)
        nodes[name] = {"total": {m[0]: int(m[1]) for m in re.findall(r"gpu:([^:,()]+):(\d+)", gres)},
                       "alloc": {m[0]: int(m[1]) for m in re.findall(r"gres/gpu:([^=,]+)=(\d+)", alloc)}}
    return nodes


@pytest.fixture
def gpu_job():
    """A running job holding 3 of mig-node1's 1g.10gb instances; cancelled at the end."""
    name = f"gpuhpc-test-status-{uuid.uuid4().hex[:8]}"
    res = subprocess.run(["sbatch", "--parsable", "--partition=mig", "--gres=gpu:1g.10gb:3", "--time=5",
                          f"--job-name={name}", "--output=/dev/null", "--wrap=sleep 300"],
                         capture_output=True, text=True, check=True)
    job_id = res.stdout.strip().split(";")[0]
    try:
        state = lambda: subprocess.run(["squeue", "--noheader", "--format=%T", f"--jobs={job_id}"],  # noqa: E731
                                       capture_output=True, text=True).stdout.strip()
        wait_for(lambda: state() == "RUNNING", 120, f"job {job_id} to run")
        yield job_id
    finally:
        subprocess.run(["scancel", job_id], check=False)


def test_gpu_counts_match_scontrol_while_a_job_holds_gpus(gpu_job):
    # other tests share the cluster: compare with an scontrol snapshot taken just before and
    # just after (the same both times), so that no job started or ended in between
    def consistent():
        before = _scontrol_nodes()
        res = gpuhpc("cluster", "status", "--json")
        assert res.returncode == 0, res.stderr
        return (before, json.loads(res.stdout)) if _scontrol_nodes() == before else None

    truth, data = wait_for(consistent, 120, "a quiet moment on the cluster")
    assert truth["mig-node1"]["alloc"].get("1g.10gb", 0) >= 3          # our job is in there
    nodes = {n["name"]: n for n in data["nodes"]}
    assert set(nodes) == set(truth)
    for name, t in truth.items():
        assert nodes[name]["gpus_total"] == t["total"], name
        assert {k: v for k, v in nodes[name]["gpus_alloc"].items() if v} == t["alloc"], name
        assert nodes[name]["gpus_free"] == {k: n - t["alloc"].get(k, 0) for k, n in t["total"].items()}, name
    by_type = {g["gpu_type"]: g for g in data["gpus"]}
    for gpu_type in {k for t in truth.values() for k in t["total"]}:
        total = sum(t["total"].get(gpu_type, 0) for t in truth.values())
        alloc = sum(t["alloc"].get(gpu_type, 0) for t in truth.values())
        assert (by_type[gpu_type]["total"], by_type[gpu_type]["allocated"], by_type[gpu_type]["free"]) == (
            total, alloc, total - alloc), gpu_type
    assert by_type["1g.10gb"]["mig"] and not by_type["h100"]["mig"]
    parts = {p["name"]: p for p in data["partitions"]}
    assert parts["gpu-hi"]["priority_tier"] > parts["gpu"]["priority_tier"]


def test_partitions_table_compresses_and_wraps_node_lists_at_80_columns():
    res = gpuhpc("cluster", "status", env={"COLUMNS": "80"})
    assert res.returncode == 0, res.stderr
    assert "…" not in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    part = res.stdout[res.stdout.index("Partitions"):]
    rows = {}
    for line in part.splitlines()[3:]:              # title, header, rule
        cells = [c.strip() for c in line.split("│")]
        if cells[0]:
            rows[cells[0]] = cells[2]
        else:                                       # a wrapped node list continues
            rows[last] += " " + cells[2]
        last = cells[0] or last
    assert rows["gpu"] == "gpu-node[1-2]"
    all_nodes = subprocess.run(["scontrol", "show", "hostnames", rows["all"].replace(" ", "")],
                               capture_output=True, text=True, check=True).stdout.split()
    assert sorted(all_nodes) == ["cpu-node1", "gpu-node1", "gpu-node2", "mig-node1"]

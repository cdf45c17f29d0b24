"""Placement that follows the fabric on the local cluster (topology/tree): a 2-node job gets
``--switches`` for the fewest leaves and lands under one leaf (`gpuhpc placement`: "1 leaf (best
1)"); a job forced onto two leaves (--nodelist, --switches off) is reported as spread."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.topology.placement import leaf_nodes

pytestmark = pytest.mark.integration


def _gpuhpc(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuhpc", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def _submit(*extra: str) -> str:
    proc = _gpuhpc("submit", "--nodes", "2", "--partition", "all", "--template", "mpi", "--time", "2m",
                   "--mem", "100M", "--cpus-per-task", "1", "--name", "placement-test", "--json", *extra,
                   "--", "sleep", "60")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def _placement_when_running(client: SlurmClient, job_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rec = client.show_job(job_id) or {}
        if rec.get("JobState") == "RUNNING":
            proc = _gpuhpc("placement", job_id, "--json")
            assert proc.returncode == 0, proc.stderr
            return json.loads(proc.stdout) | {"switches": rec.get("Switches", "")}
        time.sleep(0.5)
    pytest.fail(f"job {job_id} did not start in {timeout}s")


@pytest.fixture
def client():
    c = SlurmClient()
    ids: list[str] = []
    c.track = ids.append
    yield c
    for job_id in ids:
        c.run(["scancel", job_id], check=False)


def test_two_node_job_under_one_leaf_and_a_forced_spread(client, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path))
    leaves = leaf_nodes(client.topology())
    assert len(leaves) >= 2 and all(len(v) >= 2 for v in leaves.values()), leaves
    one = _submit()
    client.track(one)
    a, b = (sorted(v)[0] for v in list(leaves.values())[:2])      # one node of each of two leaves
    spread = _submit("--nodelist", f"{a},{b}", "--switches", "off")
    client.track(spread)

    got = _placement_when_running(client, one)
    assert got["switches"].startswith("1@")                 # the fewest leaves `all` allows: 1
    assert (len(got["leaves"]), got["best"], got["spread"]) == (1, 1, False)
    assert got["summary"] == "1 leaf (best 1)"

    got = _placement_when_running(client, spread)
    assert (len(got["leaves"]), got["best"], got["spread"]) == (2, 1, True)
    assert got["summary"] == "spread: 2 leaves (best 1)"

    # the report reads accounting: slurmdbd learns a job's nodes from slurmctld a moment after
    # it starts (later on a busy controller), so poll until the spread job is there
    deadline = time.monotonic() + 60
    while True:
        report = _gpuhpc("report", "placement", "--period", "day", "--json")
        assert report.returncode == 0, report.stderr
        rows = {r["job_id"]: r for r in json.loads(report.stdout)}
        if spread in rows or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert spread in rows, f"job {spread} not in the placement report after 60 s: {sorted(rows)}"
    assert rows[spread]["extra_leaves"] == 1 and one not in rows

"""Placement that follows the fabric on the local cluster (topology/tree): a 2-node job gets
``--switches`` for the fewest leaves and lands under one leaf (`gpuhpc placement`: "1 leaf (best
1)"); a job forced onto two leaves (--nodelist, --switches off) is reported as spread."""
from __future__ import annotations

import json

import pytest

from cli_helpers import gpuhpc
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.topology.placement import leaf_nodes
from polling import wait_for

pytestmark = pytest.mark.integration


def _submit(*extra: str) -> str:
    proc = gpuhpc("submit", "--nodes", "2", "--partition", "all", "--template", "mpi", "--time", "2m",
                   "--mem", "100M", "--cpus-per-task", "1", "--name", "placement-test", "--json", *extra,
                   "--", "sleep", "60")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def _placement_when_running(client: SlurmClient, job_id: str, timeout: float = 90) -> dict:
    rec = wait_for(lambda: (rec := client.show_job(job_id) or {}).get("JobState") == "RUNNING" and rec, timeout,
                   lambda: f"job {job_id} to start (now {(client.show_job(job_id) or {}).get('JobState')})")
    proc = gpuhpc("placement", job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) | {"switches": rec.get("Switches", "")}


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
    def with_spread() -> dict | None:
        report = gpuhpc("report", "placement", "--period", "day", "--json")
        assert report.returncode == 0, report.stderr
        rows = {r["job_id"]: r for r in json.loads(report.stdout)}
        return rows if spread in rows else None

    rows = wait_for(with_spread, 60, f"job {spread} in the placement report", interval=1)
    assert rows[spread]["extra_leaves"] == 1 and one not in rows

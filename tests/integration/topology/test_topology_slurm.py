"""topology.conf from an ibnetdiscover dump, loaded by the real Slurm of the local cluster.

The dump (local-fabric.out, written with ``gpuhpc topology synth --hosts ...``) puts
gpu-node1 + gpu-node2 on leaf r0-leaf001 and mig-node1 + cpu-node1 on r0-leaf002, which is
NOT the cluster's stock topology (leaf1 = gpu-node1 + mig-node1), so a same-leaf placement
proves Slurm uses ours. The original topology.conf is restored (and slurmctld reconfigured)
at teardown whatever happens: other tests share the cluster.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.hostlist import expand
from gpuhpc.slurm import SlurmClient
from gpuhpc.slurm import commands as cmd
from polling import wait_for

HERE = Path(__file__).resolve().parent
DUMP = HERE / "local-fabric.out"
OURS = {"r0-leaf001": {"gpu-node1", "gpu-node2"}, "r0-leaf002": {"mig-node1", "cpu-node1"}}

pytestmark = pytest.mark.integration


def _topology_by_name(client: SlurmClient) -> dict[str, dict[str, str]]:
    return {r["SwitchName"]: r for r in client.topology() if "SwitchName" in r}


def _reconfigure_and_wait(client: SlurmClient, expect_switch: str | None, timeout: float = 60) -> dict:
    client.run(cmd.scontrol_reconfigure())
    def loaded() -> dict | None:
        topo = _topology_by_name(client)
        return topo if expect_switch is None or expect_switch in topo else None

    return wait_for(loaded, timeout, lambda: f"slurmctld to load switch {expect_switch} ({_topology_by_name(client)})",
                    interval=1)


@pytest.fixture(scope="module")
def client() -> SlurmClient:
    return SlurmClient()


@pytest.fixture(scope="module")
def installed(client):
    """Install our topology.conf next to the cluster's slurm.conf; restore it afterwards."""
    slurm_conf = client.config()["SLURM_CONF"]
    path = Path(slurm_conf).parent / "topology.conf"
    original = path.read_bytes() if path.exists() else None
    before = _topology_by_name(client)
    try:
        res = subprocess.run([sys.executable, "-m", "gpuhpc", "topology", "from-ibnetdiscover", str(DUMP),
                              "-o", str(path)], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert res.stdout == ""
        topo = _reconfigure_and_wait(client, "r0-leaf001")
        yield path, topo
    finally:
        if original is None:
            path.unlink(missing_ok=True)
        else:
            tmp = path.with_name(f".{path.name}.restore")
            tmp.write_bytes(original)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        after = _reconfigure_and_wait(client, next(iter(before), None))
        assert set(after) == set(before), f"topology not restored: {after} vs {before}"


def _run_job(client: SlurmClient, *extra: str, timeout: float = 120) -> list[str]:
    """Submit a short 2-node job, wait until it has nodes, return them; cancels its own job."""
    job_id = client.submit_script("#!/bin/bash\nsleep 3\n", extra=[
        "--job-name=gpuhpc-topology-it", "--partition=all", "-N2", "--switches=1", "--ntasks-per-node=1",
        "--cpus-per-task=1", "--mem=100M", "--time=2", "--output=/dev/null", *extra])

    def nodes() -> list[str] | None:
        rec = client.show_job(job_id) or {}
        nodes = rec.get("NodeList", "")
        return expand(nodes) if rec.get("JobState", "") not in ("PENDING", "") and nodes and nodes != "(null)" else None

    try:
        return wait_for(nodes, timeout, lambda: f"job {job_id} to get nodes ({client.show_job(job_id)})", interval=1)
    finally:
        rec = client.show_job(job_id) or {}
        if rec.get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "SUSPENDED"):
            client.cancel(job_id)


def test_stdout_is_clean_topology_conf():
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "topology", "from-ibnetdiscover", str(DUMP)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = [l for l in res.stdout.splitlines() if not l.startswith("#")]
    assert lines == ["SwitchName=r0-leaf001 Nodes=gpu-node[1-2]",
                     "SwitchName=r0-leaf002 Nodes=cpu-node1,mig-node1",
                     "SwitchName=r0-spine001 Switches=r0-leaf[001-002]"]


def test_slurm_loads_our_tree(installed):
    _path, topo = installed
    assert set(expand(topo["r0-leaf001"]["Nodes"])) == OURS["r0-leaf001"]
    assert set(expand(topo["r0-leaf002"]["Nodes"])) == OURS["r0-leaf002"]
    assert topo["r0-leaf001"]["Level"] == "0" and topo["r0-spine001"]["Level"] == "1"
    assert set(expand(topo["r0-spine001"]["Switches"])) == set(OURS)


def test_two_node_job_with_switches_1_stays_under_one_leaf(installed, client):
    nodes = _run_job(client)
    assert len(nodes) == 2
    assert any(set(nodes) <= members for members in OURS.values()), nodes


def test_leaf_mate_is_chosen_from_our_topology(installed, client):
    # in the stock topology mig-node1 shares leaf1 with gpu-node1; in ours with cpu-node1
    nodes = _run_job(client, "--nodelist=mig-node1")
    assert set(nodes) == {"mig-node1", "cpu-node1"}

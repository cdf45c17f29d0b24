"""The health gate on the real local cluster, fault injected: a fake GPU device of gpu-node2
removed -> the health run Slurm would start (``python -m gpuhpc.health --apply`` with
``SLURMD_NODENAME``, as HealthCheckProgram runs it) drains the node with a ``gpuhpc:hw`` reason
and a 16-H100 job stays PENDING; the device restored -> the next run resumes the node; a drain
an admin set stays. gpu-node2 is shared with other tests: the device and the node state are
restored in ``finally`` whatever happens, and the node is drained for seconds only."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from gpuhpc.slurm.client import SlurmClient

pytestmark = pytest.mark.integration

NODE = "gpu-node2"
ADMIN_REASON = "gpuhpc-test admin maintenance"


def _device(client: SlurmClient) -> str:
    from gpuhpc.health.checks import parse_gres_conf

    conf = os.path.join(os.path.dirname(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"), "gres.conf")
    with open(conf) as fh:
        files = [f for g in parse_gres_conf(fh.read(), NODE) for f in g.files]
    assert len(files) == 8, files
    return files[3]


def _health(*args: str) -> dict:
    """One health run as Slurm starts HealthCheckProgram on the node: no node argument, the
    node's name in SLURMD_NODENAME."""
    env = {**os.environ, "SLURMD_NODENAME": NODE}
    proc = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--apply", "--json", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def _state(client: SlurmClient):
    n = client.node(NODE)
    assert n is not None
    return n.state, n.reason


def test_missing_gpu_drains_pending_job_restored_resumes_admin_drain_stays(tmp_path):
    client = SlurmClient()
    dev = _device(client)
    st = os.stat(dev)
    assert stat.S_ISCHR(st.st_mode)
    state0, reason0 = _state(client)
    assert "DRAIN" not in state0, f"{NODE} is already drained ({reason0}): cannot run the test"
    job_id = None
    try:
        os.unlink(dev)
        out = _health()
        assert not out["healthy"] and out["decision"]["action"] == "drain" and out["applied"]
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith("gpuhpc:hw: gpu count 7/8"), (state, reason)

        # a job that needs both H100 nodes waits for the drained one instead of failing
        job_id = client.submit_script("#!/bin/bash\ntrue\n", extra=[
            "--partition=gpu", "--nodes=2", "--gres=gpu:h100:8", "--time=1", "--job-name=gpuhpc-health-16gpu",
            f"--output={tmp_path}/%j.out"])
        time.sleep(4)                       # sched_interval=2: the scheduler has looked at it
        rows = client.queue(job_ids=[job_id])
        assert rows and rows[0].state.raw == "PENDING", rows
        client.cancel(job_id)
        job_id = None

        # a second failing run keeps the node drained with the same reason (no flapping)
        assert _health()["decision"]["action"] == "none"

        os.mknod(dev, st.st_mode, st.st_rdev)
        out = _health()
        assert out["healthy"] and out["decision"]["action"] == "resume" and out["applied"]
        state, reason = _state(client)
        assert "DRAIN" not in state, (state, reason)

        # an admin's drain: a healthy run leaves it, and so does a failing one
        client.drain_node(NODE, ADMIN_REASON)
        assert _health()["decision"]["action"] == "none"
        os.unlink(dev)
        assert _health()["decision"]["action"] == "none"
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith(ADMIN_REASON), (state, reason)
    finally:
        if job_id:
            client.cancel(job_id)
        if not os.path.exists(dev):
            os.mknod(dev, st.st_mode, st.st_rdev)
            os.chown(dev, st.st_uid, st.st_gid)
        state, reason = _state(client)
        if "DRAIN" in state and (reason.startswith("gpuhpc:") or reason.startswith(ADMIN_REASON)):
            client.resume_node(NODE)
    assert "DRAIN" not in _state(client)[0]


def test_prolog_subset_over_the_cli_is_fast_and_healthy():
    env = {**os.environ, "SLURMD_NODENAME": "mig-node1"}
    proc = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--mode", "prolog", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["healthy"] and {r["check"] for r in out["results"]} == {"gpu-devices", "mounts", "scratch", "munge"}
    assert out["results"][0]["message"] == "9 GPU devices: 1g.10gb 7, 3g.40gb 2"


def test_node_health_cli_json():
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "health", "gpu-node1", "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["node"] == "gpu-node1" and out["decision"]["action"] == "none" and not out["applied"]


def test_prolog_and_epilog_hooks_as_slurmd_runs_them(tmp_path):
    """The hook scripts slurm.conf names (Prolog=, Epilog=), run with the environment slurmd
    gives them: the job's GPUs mapped, the fast checks pass, the epilog clears the map."""
    from pathlib import Path

    from gpuhpc.monitoring import jobmap

    hooks = Path(__file__).resolve().parents[3] / "gpuhpc" / "health" / "hooks"
    envfile = tmp_path / "hooks.env"
    envfile.write_text(f"GPUHPC_PYTHON={sys.executable}\nGPUHPC_JOBMAP_DIR={tmp_path / 'jobmap'}\n")
    env = {"PATH": os.environ["PATH"], "GPUHPC_HOOKS_ENV": str(envfile), "SLURMD_NODENAME": "gpu-node1",
           "SLURM_JOB_ID": "424242", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "2,3"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    proc = subprocess.run([str(hooks / "gpuhpc-prolog")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert jobmap.read("gpu-node1", str(tmp_path / "jobmap")) == {2: {"job_id": "424242", "user": "alice"},
                                                                    3: {"job_id": "424242", "user": "alice"}}
    proc = subprocess.run([str(hooks / "gpuhpc-epilog")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert jobmap.read("gpu-node1", str(tmp_path / "jobmap")) == {}

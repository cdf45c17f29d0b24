"""The health gate on the real local cluster, run by Slurm itself (HealthCheckProgram every
HealthCheckInterval, from the spec's ``health`` block; the test never runs the checks on
gpu-node2): a fake GPU device of gpu-node2 removed -> Slurm's health run drains the node with a
``gpuhpc:hw`` reason within one interval and a 16-H100 job stays PENDING; the device restored ->
the node stays drained through Slurm's next run (a lost GPU is a hardware fault: the drain sticks)
until the admin resumes it, after which the gate leaves it in service; a drain an admin set stays,
whether the node fails or passes. gpu-node2
is shared with other tests: the device and the node state are restored in ``finally`` whatever
happens. Figures (drain and return latency) go to stdout (``pytest -s``)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import pytest

from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

pytestmark = pytest.mark.integration

NODE = "gpu-node2"
ADMIN_REASON = "gpuhpc-test admin maintenance"
SLACK = 15          # s past one interval: the run itself (~1 s on a loaded 2-core machine), polling


def _device(client: SlurmClient) -> str:
    from gpuhpc.health.checks import parse_gres_conf

    conf = os.path.join(os.path.dirname(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"), "gres.conf")
    with open(conf) as fh:
        files = [f for g in parse_gres_conf(fh.read(), NODE) for f in g.files]
    assert len(files) == 8, files
    return files[3]


def _restore(dev: str, st: os.stat_result) -> None:
    """Put the device back (a concurrent ``scripts/cluster.sh up`` may have made it already)."""
    if not os.path.exists(dev):
        os.mknod(dev, st.st_mode, st.st_rdev)
        os.chown(dev, st.st_uid, st.st_gid)


def _state(client: SlurmClient):
    n = client.node(NODE)
    assert n is not None
    return n.state, n.reason


def _interval(client: SlurmClient) -> int:
    cfg = client.config()
    assert cfg.get("HealthCheckProgram", "(null)").endswith("/gpuhpc-healthcheck"), (
        "the local cluster runs no gpuhpc HealthCheckProgram: apply the spec's health block (scripts/cluster.sh up)")
    assert "ANY" in cfg.get("HealthCheckNodeState", ""), cfg.get("HealthCheckNodeState")
    return int(cfg["HealthCheckInterval"].split()[0])


def _wait(client: SlurmClient, pred, timeout: float) -> tuple[float, tuple[str, str]]:
    """Poll the node until ``pred(state, reason)``; (seconds waited, (state, reason))."""
    t0 = time.monotonic()

    def met() -> tuple[str, str] | None:
        st = _state(client)
        return st if pred(*st) else None

    st = wait_for(met, timeout, lambda: f"{NODE} to change state (still {_state(client)}; a concurrent "
                  "`scripts/cluster.sh up` recreates a removed fake GPU device)", interval=0.25)
    return time.monotonic() - t0, st


def test_slurm_health_check_drains_missing_gpu_until_admin_resume_keeps_admin_drain(tmp_path, full_runs):
    client = SlurmClient()
    interval = _interval(client)
    dev = _device(client)
    st = os.stat(dev)
    assert stat.S_ISCHR(st.st_mode)
    state0, reason0 = _state(client)
    assert "DRAIN" not in state0, f"{NODE} is already drained ({reason0}): cannot run the test"
    job_id = None
    runs = full_runs(NODE)
    try:
        os.unlink(dev)
        drained_in, (state, reason) = _wait(client, lambda s, r: "DRAIN" in s, interval + SLACK)
        assert reason.startswith("gpuhpc:hw: gpu count 7/8"), (state, reason)
        print(f"\nhealth: {NODE} drained by Slurm's health run {drained_in:.1f} s after its GPU device went "
              f"(interval {interval} s): {reason}")

        # a job that needs both H100 nodes waits for the drained one instead of failing
        job_id = client.submit_script("#!/bin/bash\ntrue\n", extra=[
            "--partition=gpu", "--nodes=2", "--gres=gpu:h100:8", "--time=1", "--job-name=gpuhpc-health-16gpu",
            f"--output={tmp_path}/%j.out"])
        # the scheduler has looked at it (squeue's reason is no longer "None") and left it pending
        rows = wait_for(lambda: (q := client.queue(job_ids=[job_id])) and q[0].reason not in ("", "None") and q,
                        30, f"the scheduler to look at job {job_id}")
        assert rows[0].state.raw == "PENDING", rows
        client.cancel(job_id)
        job_id = None

        # the device back (as after a reboot): Slurm's next run passes but leaves the hardware drain
        _restore(dev, st)
        runs.wait_for_one_since(runs.now(), interval + SLACK)
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith("gpuhpc:hw: gpu count 7/8"), (state, reason)
        # the admin returns it (scontrol update State=RESUME), and the passing gate leaves it in service
        client.resume_node(NODE)
        runs.wait_for_one_since(runs.now(), interval + SLACK)
        assert "DRAIN" not in _state(client)[0]

        # an admin's drain, on a failing node: the next run leaves it (no gpuhpc reason over it) ...
        client.drain_node(NODE, ADMIN_REASON)
        os.unlink(dev)
        runs.wait_for_one_since(runs.now(), interval + SLACK)
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith(ADMIN_REASON), (state, reason)
        # ... and on a healthy one: the next run does not resume it
        _restore(dev, st)
        runs.wait_for_one_since(runs.now(), interval + SLACK)
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith(ADMIN_REASON), (state, reason)
    finally:
        if job_id:
            client.cancel(job_id)
        _restore(dev, st)
        state, reason = _state(client)
        # ours to undo: gpuhpc's drain, the test's admin drain, or Slurm's own if another job's
        # Prolog met the missing device (the node was not drained when the test started)
        if "DRAIN" in state and (reason.startswith(("gpuhpc:", ADMIN_REASON)) or "prolog" in reason.lower()):
            client.resume_node(NODE)
    assert "DRAIN" not in _state(client)[0]


def test_prolog_subset_over_the_cli_is_fast_and_healthy():
    env = {**os.environ, "SLURMD_NODENAME": "mig-node1"}
    proc = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--mode", "prolog", "--json"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    assert out["healthy"] and {r["check"] for r in out["results"]} == {"gpu-devices", "mounts", "scratch", "filesystems",
                                                                       "munge"}
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

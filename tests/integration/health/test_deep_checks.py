"""The deep checks on the real local cluster, with stand-in ``dcgmi`` and ``all_reduce_perf``
executables that print recorded output (tests/unit/health/fixtures; no DCGM or nccl-tests
here): the first passing run records gpu-node1's all-reduce baseline in the ledger database; a
slow all-reduce drains the node with ``gpuhpc:perf: nccl 313<391 GB/s``, which the regular
checks leave alone and the next passing deep run undoes; a DCGM failure drains with
``gpuhpc:hw: dcgm diag ...``; an admin's drain stays; the scheduled run waits while every slot
is taken. Every deep run is a deep-check job on the held node (a maintenance reservation, an
exclusive job; a drained node resumed inside it for the job: test_deep_held.py has the waiting).
The node is shared with other tests: its state is restored in ``finally``."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhpc.health.deep import Slot
from gpuhpc.slurm.client import SlurmClient

pytestmark = pytest.mark.integration

NODE = "gpu-node1"
ADMIN_REASON = "gpuhpc-test admin: fan"


def _deep(env: dict) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "health", NODE, "--deep", "--apply", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 1) and proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _state(client: SlurmClient) -> tuple[str, str]:
    n = client.node(NODE)
    return n.state, n.reason


def test_deep_checks_drain_and_return_the_node(standins):
    use, env = standins
    client = SlurmClient()
    state, reason = _state(client)
    assert "DRAIN" not in state, f"{NODE} is drained already ({reason}): the test would not see its own drain"
    t0 = time.monotonic()
    try:
        use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
        rc, out = _deep(env)
        assert rc == 0 and out["decision"]["action"] == "none", out
        msgs = {r["check"]: r["message"] for r in out["results"]}
        assert msgs["nccl-allreduce"] == "nccl 435 GB/s (no baseline yet)" and "41 results pass" in msgs["dcgm-diag"]
        # the first passing run set the baseline (435): the slow run is measured against it
        # (each run is a deep-check job on the held node: gpuhpc.health.deep.run_held)
        use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8-slow.txt")
        rc, out = _deep(env)
        assert {r["check"]: r["message"] for r in out["results"]}["nccl-allreduce"] == "nccl 313<391 GB/s", out
        assert rc == 1 and out["decision"]["action"] == "drain" and out["applied"], out
        state, reason = _state(client)
        assert "DRAIN" in state and reason.startswith("gpuhpc:perf: nccl 313<391 GB/s"), (state, reason)
        # the regular checks (HealthCheckProgram's run) pass or fail, but never undo the deep drain
        subprocess.run([sys.executable, "-m", "gpuhpc.health", "--node", NODE, "--apply"], capture_output=True,
                       text=True, timeout=120)
        assert _state(client)[1].startswith("gpuhpc:perf: nccl 313<391 GB/s")

        use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
        rc, out = _deep(env)
        assert rc == 0 and out["decision"]["action"] == "resume", out
        assert "DRAIN" not in _state(client)[0]

        use("dcgmi-diag-r2-fail.json", "all_reduce_perf-h100x8.txt", dcgm_rc=226)
        rc, out = _deep(env)
        state, reason = _state(client)
        assert rc == 1 and "DRAIN" in state and reason.startswith("gpuhpc:hw: dcgm diag -r 2 GPU Memory gpu 3"), reason
        use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
        assert _deep(env)[1]["decision"]["action"] == "resume"

        # an admin's drain stays, whatever the deep checks say
        client.drain_node(NODE, ADMIN_REASON)
        rc, out = _deep(env)
        assert rc == 0 and out["decision"]["action"] == "none"
        assert _state(client)[1].startswith(ADMIN_REASON)
        client.resume_node(NODE)

        # the scheduled run: with the only slot taken it tests nothing and says so
        slots = Path(env["GPUHPC_DATA_DIR"]) / "slots"
        held = Slot(str(slots), 1)
        assert held.acquire()
        use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8-slow.txt")
        proc = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--mode", "deep", "--apply", "--node", NODE,
                               "--slots", str(slots), "--cap", "1"], env=env, capture_output=True, text=True,
                              timeout=120)
        held.release()
        assert proc.returncode == 0 and "slots busy" in proc.stderr, proc.stderr
        assert "DRAIN" not in _state(client)[0]
    finally:
        state, reason = _state(client)
        if "DRAIN" in state and (reason.startswith("gpuhpc:") or reason.startswith(ADMIN_REASON)):
            client.resume_node(NODE)
    print(f"\ndeep-check drain/return cycle on {NODE}: {time.monotonic() - t0:.1f} s")

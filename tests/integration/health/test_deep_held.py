"""The deep checks hold the node they test (issue 35.8), on the real local cluster with the
stand-in ``dcgmi`` / ``all_reduce_perf`` of ``conftest.py``: with a user's job running on
gpu-node2 the deep-check job waits (pending, the user's job alone on the node) and runs once
that job has ended; a MIG node runs the checks that fit MIG (``dcgmi diag -r 1``, no nccl), its
job holding every MIG device. The drain-and-return of a failing deep check is
test_deep_checks.py's (its runs go through the same job)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpuhpc.slurm import reservations
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

NODE = "gpu-node2"


def _deep_jobs(client: SlurmClient, after: int) -> list:
    return [r for r in client.queue() if r.name == "gpuhpc-deep" and int(r.job_id) > after]


def _cli(env: dict, node: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuhpc", "node", "health", node, "--deep", "--apply", "--json"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_deep_check_waits_for_the_users_job_and_runs_after(standins, tmp_path):
    use, env = standins
    use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
    client = SlurmClient()
    assert "DRAIN" not in client.node(NODE).state, "gpu-node2 is drained: the test would not see the job run"
    user = client.submit_script("#!/bin/sh\nsleep 300\n", extra=["--job-name=gpuhpc-test-user", f"--nodelist={NODE}",
                                                                   "--partition=gpu", "--gres=gpu:h100:1",
                                                                   "--cpus-per-task=1", "--time=6",
                                                                   f"--output={tmp_path}/user-%j.out"])
    proc, deep = None, None
    try:
        # a shared cluster: other tests' jobs may hold gpu-node2 for a while
        wait_for(lambda: client.show_job(user)["JobState"] == "RUNNING", 300, "the user's job to run on gpu-node2")
        proc = _cli(env, NODE)
        deep = wait_for(lambda: _deep_jobs(client, int(user)), 60, "the deep-check job in the queue")[0].job_id
        # slurmctld has looked at it and left it waiting: the node is the user's job's
        info = wait_for(lambda: (lambda j: j if j["Reason"] != "None" else None)(client.show_job(deep)), 60,
                        "slurmctld's reason for keeping the deep-check job waiting")
        assert info["JobState"] == "PENDING" and info["ReqNodeList"] == NODE, info
        assert info["Reservation"] == f"gpuhpc-deep-{NODE}" and info["OverSubscribe"] == "NO", info
        assert client.show_job(user)["JobState"] == "RUNNING" and proc.poll() is None
        client.cancel(user)
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        doc = json.loads(out)
        assert doc["decision"]["action"] == "none" and doc["healthy"] and doc["job_id"] == deep, doc
        msgs = {r["check"]: r["message"] for r in doc["results"]}
        assert "41 results pass" in msgs["dcgm-diag"] and msgs["nccl-allreduce"].startswith("nccl 435 GB/s"), msgs
        started, ended = client.show_job(deep)["StartTime"], client.show_job(user)["EndTime"]
        assert started >= ended, (started, ended)               # after the user's job, never beside it
        assert not client.run(reservations.delete_argv(f"gpuhpc-deep-{NODE}"), check=False).ok   # released
    finally:
        client.cancel(user)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if deep is not None:
            client.cancel(deep)
        reservations.delete(client, f"gpuhpc-deep-{NODE}")


@pytest.mark.parametrize("node", ["mig-node1"])
def test_mig_node_runs_the_checks_that_fit_mig(standins, node):
    use, env = standins
    use("dcgmi-diag-r2-pass.json", "all_reduce_perf-h100x8.txt")
    client = SlurmClient()
    assert "DRAIN" not in client.node(node).state, f"{node} is drained"
    proc = _cli(env, node)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        reservations.delete(client, f"gpuhpc-deep-{node}")
    assert proc.returncode == 0, err
    doc = json.loads(out)
    got = {r["check"]: (r["status"], r["message"]) for r in doc["results"]}
    assert got["dcgm-diag"][0] == "ok" and got["dcgm-diag"][1].startswith("dcgm diag -r 1:"), got
    assert got["nccl-allreduce"] == ("skip", "MIG node: an nccl all-reduce does not run across MIG instances")
    job = client.show_job(doc["job_id"])
    assert job["JobName"] == "gpuhpc-deep" and job["NodeList"] == node and job["OverSubscribe"] == "NO", job
    assert job["TresPerNode"] == "gres:gpu:1g.10gb:7,gres:gpu:3g.40gb:2", job        # every MIG device

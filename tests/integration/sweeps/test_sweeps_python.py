"""The Python API: a 24-trial sweep of a callable returns the right results in trial order,
including after its array tasks are preempted (gpu partition, a gpu-hi job on the node): a
preempted trial resumes from its checkpoint, not from step 0.

It runs on a private controller of its own, shaped as the local cluster's GPU nodes and partitions
(sweeps_helpers.private_cluster_fixtures with gpu=True): isolated, beside the shared-cluster stream."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from sweeps_helpers import HERE, assert_one_charge_per_run, private_cluster_fixtures, research_quota

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcswpy"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17037, 17038, 17541          # unlike every other private cluster's
GRES = "gpu:h100:8"

private_cluster, slurm = private_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), gpu=True)
N = 24                  # 3 waves of 8: the preemption lands in one, the chunking (2 arrays) shows


def _progress(d: Path, trial: int) -> list[str]:
    p = d / "trials" / str(trial) / "progress"
    return p.read_text().splitlines() if p.exists() else []


def test_python_sweep_results_in_order_after_a_preemption(private_cluster, sweep_env, sweeps, track, slurm: SlurmClient,
                                                          monkeypatch):
    import gpuhpc as api

    node = private_cluster.gpu_nodes[1]

    research_quota(monkeypatch, 1000)               # the ledger on: one reservation per chunk, charges per run
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{sys.path[0]}")
    sys.path.insert(0, str(HERE))
    from sweeps_lib import Objective

    sw = api.sweep(Objective(steps=30, step_s=0.1), {"x": {"type": "int", "low": 0, "high": N - 1}},
                      method="grid", parallelism=8, metric={"name": "objective", "goal": "minimize"},
                      resources={"partition": "gpu", "gpus": 1, "gpu_type": "h100", "nodelist": node, "time": "10m"},
                      chunk_size=N // 2, name="t-pysweep")
    sweeps(sw.id)
    assert isinstance(sw, api.Sweep)
    d = Path(sw.info()["directory"])
    # preempt the running trials once some have made progress
    wait_for(lambda: any(len(_progress(d, t)) > 5 for t in range(N)), 180, "a trial to pass step 5", interval=1)
    running = [t for t in range(N) if 5 < len(_progress(d, t)) < 30]
    pid = slurm.submit_script("#!/bin/bash\nsleep 1\n", extra=[
        "--partition=gpu-hi", f"--nodelist={node}", f"--gres={GRES}", "--time=1",
        "--job-name=gpuhpc-test-preemptor", "--output=/dev/null"])
    track(pid)
    assert sw.wait(timeout=480, poll=1) is True
    assert sw.results() == [float(x * x + 30) for x in range(N)]       # in trial order
    rows = sw.rows()
    assert [r["trial"] for r in rows] == list(range(N))
    restarted = [r for r in rows if r["restarts"] > 0]
    assert restarted, "the preemption requeued no trial"
    resumed = 0
    for r in restarted:
        starts = [line for line in _progress(d, r["trial"]) if line.startswith("start ")]
        # a trial preempted before its callable began has no first start line: its one run is
        # the restarted one, so only the last line's restart count is certain
        assert starts and int(starts[-1].split()[1]) >= 1, (r["trial"], starts)
        if int(starts[-1].split()[2]) > 0:          # resumed from its checkpoint, not from step 0
            resumed += 1
    assert resumed >= 1, (running, [(r["trial"], _progress(d, r["trial"])[:3]) for r in restarted])
    assert sw.best()["trial"] == 0
    again = api.Sweep.load(sw.id)
    assert again.resume() == []                      # nothing to resubmit: never a finished trial
    # the ledger: each chunk reserved with its real array size; one usage record and one charge
    # per run (a preempted task's runs each count once), nothing twice
    import sqlite3

    chunks = sw.info()["chunks"]
    con = sqlite3.connect(sweep_env / "ledger.db")
    sizes = {j: n for j, n in con.execute("SELECT job_id, array_size FROM reservations")}
    assert all(sizes[c["job_id"]] == c["n_tasks"] for c in chunks), (sizes, chunks)
    assert_one_charge_per_run(slurm, sweep_env / "ledger.db", [c["job_id"] for c in chunks])

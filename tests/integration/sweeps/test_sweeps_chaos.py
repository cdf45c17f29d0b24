"""Chaos: while a 100-trial sweep runs, at least 10 running trials are force-requeued
(`scontrol requeue`) and the driver job itself is requeued once. Every trial still finishes once,
with the right metric; requeued trials show their restarts (from sacct --duplicates)."""
from __future__ import annotations

import random
import time

import pytest

from gpuhpc.slurm.client import SlurmClient
from sweeps_helpers import report_cmd, results, run_sweep, write_sweep

pytestmark = pytest.mark.integration


def test_requeued_trials_and_driver_still_finish_exactly_once(sweep_env, sweeps, slurm: SlurmClient, tmp_path):
    from gpuhpc.sweeps import engine

    f = write_sweep(tmp_path / "chaos.yaml", name="t-chaos", method="grid",
                    command=f"sleep 4; v={{x}}; {report_cmd('v*v+1')}",
                    parameters={"x": {"type": "int", "low": 0, "high": 99}}, parallelism=16,
                    resources={"partition": "cpu", "time": "10m"}, metric={"name": "loss", "goal": "minimize"},
                    chunk_size=25, max_queued=50, max_requeues=5)
    sid = run_sweep(f)
    sweeps(sid)
    driver = engine.sweep_info(sid)["driver_job_id"]
    assert driver
    rng = random.Random(1)
    requeued: set[str] = set()
    driver_requeued = False
    deadline = time.monotonic() + 300
    while (len(requeued) < 10 or not driver_requeued) and time.monotonic() < deadline:
        chunks = [c["job_id"] for c in engine.sweep_info(sid)["chunks"]]
        running = [f"{r.array_job_id}_{r.array_task_id}" for r in slurm.queue(job_ids=chunks)
                   if r.state.state.value == "RUNNING" and r.array_task_id.isdigit()]
        for job in rng.sample(running, min(3, len(running))):
            if job not in requeued and len(requeued) < 12:
                slurm.requeue(job)
                requeued.add(job)
        if not driver_requeued and len(requeued) >= 4:
            rec = slurm.show_job(driver)
            if rec and rec.get("JobState") == "RUNNING":
                slurm.requeue(driver)
                driver_requeued = True
        time.sleep(1.5)
    assert len(requeued) >= 10 and driver_requeued, (requeued, driver_requeued)
    from gpuhpc.sweeps.api import Sweep

    assert Sweep(sid).wait(timeout=600, poll=5) is True
    rows = results(sid)
    assert len(rows) == 100
    for r in rows:
        x = r["params"]["x"]
        assert r["state"] == "completed" and r["metrics"]["loss"] == float(x * x + 1), r
    assert sum(1 for r in rows if r["restarts"] > 0) >= 10
    assert {r["job_id"] for r in rows if r["restarts"] > 0} >= requeued - {driver}
    assert slurm.restarts(driver) >= 1
    info = engine.sweep_info(sid)
    assert info["status"] == "done" and sum(c["n_tasks"] for c in info["chunks"]) == 100

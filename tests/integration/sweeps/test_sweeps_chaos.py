"""Chaos, 128 trials (8 waves on the 16 GPUs): while the sweep runs, random trials are preempted by high-priority jobs
(a gpu-hi job on a node whose GPUs the trials fill: partition_prio preemption requeues the
trials it picks), at least 10 running trials are force-requeued (``scontrol requeue``), the
driver job itself is requeued once and slurmctld is restarted once. Every trial still finishes
exactly once, with the right metric; the restarts show (sacct --duplicates); the ledger has
exactly one charge per run.

It runs on a private controller of its own, shaped as the local cluster's GPU nodes and partitions
(sweeps_helpers.private_cluster_fixtures with gpu=True): it restarts that slurmctld, not the shared one,
and runs beside the shared-cluster stream (marked isolated; about 4 min off CI's critical path)."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.durations import reported_seconds
from sweeps_helpers import (assert_one_charge_per_run, private_cluster_fixtures, research_quota, restart_slurmctld,
                            results, run_sweep, shell_report, write_sweep)

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

N = 128
NAME = "gpuhpcswchaos"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17017, 17018, 17521          # unlike every other private cluster's

private_cluster, slurm = private_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), gpu=True)


def _started(directory: Path, job_id_raw: str) -> bool:
    """Has the trial runner of this task printed its first line (so the job template's signal
    trap, set before it, is in place)? Elapsed seconds alone do not say so on a loaded host."""
    return any("gpuhpc: sweep" in p.read_text(errors="replace") for p in directory.glob(f"logs/*-{job_id_raw}.out"))


def _preempt(slurm: SlurmClient, node: str, chunks: list[str], track, directory: Path) -> str | None:
    """A short gpu-hi job on all of ``node``'s GPUs, only while the trials hold all of them: it
    must preempt the trials running there (a trial lasts seconds, so asking for fewer GPUs
    would often just wait for one to end). Only trials whose batch script has been running for
    a few seconds: one preempted at its very start gets SIGUSR2 before the job template has
    set its trap, and dies of it (a known gap of the template, not of sweeps)."""
    info = slurm.node(node)
    if info is None or info.gpus_alloc.get("h100", 0) < info.gpus_total.get("h100", 8):
        return None
    here = [r for r in slurm.queue(job_ids=chunks) if r.state.state.value == "RUNNING" and r.nodelist == node]
    if len(here) < info.gpus_total.get("h100", 8) or any((reported_seconds(r.elapsed) or 0) < 3 for r in here):
        return None
    if not all(_started(directory, r.job_id_raw) for r in here):
        return None
    job = slurm.submit_script("#!/bin/bash\nsleep 1\n", extra=[
        "--partition=gpu-hi", f"--nodelist={node}", f"--gres=gpu:h100:{info.gpus_total['h100']}", "--time=1",
        "--job-name=gpuhpc-test-preemptor", "--output=/dev/null"])
    track(job)
    return job


def test_a_sweep_survives_preemption_requeues_driver_requeue_and_slurmctld_restart(
        private_cluster, sweep_env, sweeps, track, slurm: SlurmClient, tmp_path, monkeypatch):
    from gpuhpc.sweeps import store

    nodes = private_cluster.gpu_nodes
    from gpuhpc.sweeps.api import Sweep

    research_quota(monkeypatch, 1000)           # the ledger on: reservations per chunk, a charge per run
    f = write_sweep(tmp_path / "chaos.yaml", name="t-chaos", method="grid",
                    # 8 s: a preemptor waits for 8 trials running >= 3 s on one node (slurmd starts them at once here)
                    command=f"sleep 8; v={{x}}; {shell_report('v*v+1')}",
                    parameters={"x": {"type": "int", "low": 0, "high": N - 1}}, parallelism=16,
                    resources={"partition": "gpu", "gpus": 1, "gpu_type": "h100", "time": "10m"},
                    metric={"name": "loss", "goal": "minimize"}, max_queued=64, max_requeues=8)
    sid = run_sweep(f)
    sweeps(sid)
    driver = store.sweep_info(sid)["driver_job_id"]
    assert driver                                # max_queued < trials: the driver submits the rest
    rng = random.Random(1)
    requeued: set[str] = set()
    preemptors: list[str] = []
    driver_requeued = restarted = False
    deadline = time.monotonic() + 300
    while not (len(requeued) >= 10 and len(preemptors) >= 2 and driver_requeued and restarted) \
            and time.monotonic() < deadline:
        chunks = [c["job_id"] for c in store.sweep_info(sid)["chunks"] if c["job_id"]]
        running = [f"{r.array_job_id}_{r.array_task_id}" for r in slurm.queue(job_ids=chunks)
                   if r.state.state.value == "RUNNING" and r.array_task_id.isdigit()]
        for job in rng.sample(running, min(2, len(running))):
            if job not in requeued and len(requeued) < 12:
                slurm.requeue(job)
                requeued.add(job)
        if len(preemptors) < 2 and len(requeued) >= 2 + 4 * len(preemptors):
            for node in rng.sample(nodes, len(nodes)):      # the first node the trials fill
                job = _preempt(slurm, node, chunks, track, Path(store.sweep_info(sid)["directory"]))
                if job:
                    preemptors.append(job)
                    break
        if not driver_requeued and len(requeued) >= 4:
            rec = slurm.show_job(driver)
            if rec and rec.get("JobState") == "RUNNING":
                slurm.requeue(driver)
                driver_requeued = True
        if not restarted and driver_requeued and len(requeued) >= 6:
            restart_slurmctld()                  # (the private one) mid-sweep: trials keep running on the nodes
            restarted = True
        time.sleep(1)
    assert len(requeued) >= 10 and len(preemptors) >= 2 and driver_requeued and restarted, (
        requeued, preemptors, driver_requeued, restarted)

    assert Sweep(sid).wait(timeout=600, poll=1) is True
    rows = results(sid)
    assert [r["trial"] for r in rows] == list(range(N))           # each trial once
    for r in rows:
        x = r["params"]["x"]
        assert r["state"] == "completed" and r["metrics"]["loss"] == float(x * x + 1), r
    restarted_jobs = {r["job_id"] for r in rows if r["restarts"] > 0}
    assert restarted_jobs >= requeued, requeued - restarted_jobs
    assert slurm.restarts(driver) >= 1
    info = store.sweep_info(sid)
    submitted = [c for c in info["chunks"] if c["job_id"]]     # a chunk sbatch refused (slurmctld down) has none
    assert info["status"] == "done" and sum(c["n_tasks"] for c in submitted) == N
    assert_one_charge_per_run(slurm, sweep_env / "ledger.db", [c["job_id"] for c in submitted])
    for job in preemptors:                       # each got the GPUs it needed: trials made way
        assert slurm.show_job(job) is None or slurm.show_job(job).get("JobState") == "COMPLETED", job
    assert restarted_jobs - requeued, "no trial was restarted by a preemption alone"

"""Parallelism P holds whatever the chunking (issue 21): under MaxSubmitJobsPerUser=40 (a QOS and
an account this test creates for itself and removes afterwards) a 200-trial sweep of 5 s trials
at parallelism 16 goes out in many small arrays, and still runs 16 trials at once: within 1.2x
of the ideal wall time (ceil(200/16) waves of the trials' own run time plus Slurm's start
latency), never more than 16 at once."""
from __future__ import annotations

import datetime as dt
import math
import statistics
import time
import uuid

import pytest

from gpuhpc.slurm.client import SlurmClient
from sweeps_helpers import gpuhpc, report_cmd, results, run_sweep, write_sweep

pytestmark = pytest.mark.integration

N, P, LIMIT = 200, 16, 40


@pytest.fixture
def submit_limited(slurm: SlurmClient):
    """An account and a QOS (MaxSubmitJobsPerUser=40, the association's default QOS) for this
    user, so that the limit binds only this test's jobs; removed afterwards."""
    import getpass

    name = f"gpuhpc-t-{uuid.uuid4().hex[:6]}"
    user = getpass.getuser()
    slurm.sacctmgr("add", "qos", name, f"MaxSubmitJobsPerUser={LIMIT}")
    try:
        slurm.sacctmgr("add", "account", name, "parent=root")
        slurm.sacctmgr("add", "user", user, f"account={name}", f"qos={name}", f"defaultqos={name}")
        yield name
    finally:
        for job in {r.array_job_id or r.job_id for r in slurm.queue(user=user) if r.account == name}:
            slurm.run(["scancel", job.split("_")[0]], check=False)
        slurm.sacctmgr("delete", "user", user, f"account={name}", check=False)
        slurm.sacctmgr("delete", "account", name, check=False)
        slurm.sacctmgr("delete", "qos", name, check=False)


def _t(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_200_trials_hold_parallelism_16_under_max_submit_jobs_40(sweep_env, sweeps, slurm: SlurmClient, tmp_path,
                                                                 submit_limited, monkeypatch):
    from gpuhpc.sweeps import engine

    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "1")     # 5 s trials: hand freed slots on within a second

    f = write_sweep(tmp_path / "p.yaml", name="t-par", method="grid", command=f"sleep 5; {report_cmd('{x}')}",
                    parameters={"x": {"type": "int", "low": 0, "high": N - 1}}, parallelism=P,
                    resources={"partition": "all", "time": "5m", "account": submit_limited, "qos": submit_limited},
                    metric={"name": "loss", "goal": "minimize"}, driver_partition="all")
    t0 = time.time()
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "600", "--poll", "2", timeout=650)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert all(r["state"] == "completed" for r in results(sid))
    chunks = [c["job_id"] for c in engine.sweep_info(sid)["chunks"] if c["job_id"]]
    runs = [r for r in slurm.accounting(job_ids=chunks) if r.array_task_id is not None]
    starts, ends = [_t(r.start) for r in runs], [_t(r.end) for r in runs]
    assert len(runs) == N, len(runs)
    # never more than P at once (1 s resolution: a task ending in the second another starts)
    events = sorted([(s, 1) for s in starts] + [(e, -1) for e in ends], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    trial = statistics.median(e - s for s, e in zip(starts, ends))
    latency = min(starts) - t0
    ideal = math.ceil(N / P) * trial + latency
    wall = max(ends) - t0
    print(f"\n{N} trials, parallelism {P}, MaxSubmitJobsPerUser {LIMIT}: {len(chunks)} arrays, peak {peak} at once; "
          f"trial {trial:.1f} s, start latency {latency:.1f} s, ideal {ideal:.1f} s, wall {wall:.1f} s, "
          f"ratio {wall / ideal:.2f} (goal <= 1.2)")
    assert peak <= P
    assert len(chunks) >= 5                  # the limit did split it

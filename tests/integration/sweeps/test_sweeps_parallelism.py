"""Parallelism P holds whatever the chunking (issue 21): under MaxSubmitJobsPerUser=40 (a QOS and
an account this test creates for itself and removes afterwards) a 200-trial sweep of 5 s trials
at parallelism 16 goes out in many small arrays, and still runs 16 trials at once: within 1.2x
of the ideal wall time (ceil(200/16) waves of the trials' own run time plus Slurm's start
latency; printed), never more than 16 at once and 16 at once at some moment (a count from the
tasks' start and end times in sacct).

The same sweep proves the chunking (what test_sweeps_cli's 200-trial sweep did): arrays that fit
(each starts at task 0 and stays below MaxArraySize, never --array=1000-1999), the driver
submitting all but the first and completing by itself, exact metrics in trial order, each trial
run once, best, results --csv and the HTML report.

It runs on a private controller (tests/private_slurm.py: its own ports, state and logs, two
16-CPU nodes, the shared cluster's MaxArraySize and the shared munged and slurmdbd under a cluster
name of its own), driver included: SLURM_CONF in the environment points gpuhpc, the sweep driver
job and every Slurm call of the test at it, so that its minutes run beside the shared-cluster
stream. Everything it adds to slurmdbd (a cluster, a QOS, an account) is removed afterwards."""
from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import time
import uuid
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from private_slurm import PrivateSlurm
from sweeps_helpers import gpuhpc, results, run_sweep, shell_report, write_sweep

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

N, P, LIMIT = 200, 16, 40
NAME = "gpuhpcswpar"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16947, 16948, 17451


@pytest.fixture
def private_cluster(monkeypatch):
    """The private controller (two 16-CPU nodes in partition ``all``) under its own cluster
    name in the shared slurmdbd (``PrivateSlurm.in_slurmdbd``); SLURM_CONF points at it for the
    test (and the jobs it submits). Stopped, and its cluster removed from slurmdbd, at the end
    even after a failure."""
    cluster = PrivateSlurm(
        NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT),
        {f"swpar-node{i}": "CPUs=16 RealMemory=32000 State=UNKNOWN" for i in (1, 2)},
        ["PartitionName=all Nodes=swpar-node[1-2] Default=YES MaxTime=INFINITE State=UP"],
        extra={"SlurmdParameters": "config_overrides", "MaxArraySize": "51", "MinJobAge": "600", "JobRequeue": "1",
               "AccountingStorageEnforce": "associations,limits,qos,safe", "KillWait": "5",
               "SchedulerParameters": "batch_sched_delay=0,sched_interval=2,bf_interval=5"},
        accounting=True)              # in_slurmdbd() sets FirstJobId past the earlier runs' records
    with cluster.in_slurmdbd():
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster


@pytest.fixture
def slurm(private_cluster) -> SlurmClient:
    return private_cluster.client


@pytest.fixture
def submit_limited(slurm: SlurmClient):
    """An account and a QOS (MaxSubmitJobsPerUser=40, the association's default QOS) for this
    user on the private cluster, so that the limit binds only this test's jobs; removed afterwards."""
    import getpass

    name = f"gpuhpc-t-{uuid.uuid4().hex[:6]}"
    user = getpass.getuser()
    slurm.sacctmgr("add", "qos", name, f"MaxSubmitJobsPerUser={LIMIT}")
    try:
        slurm.sacctmgr("add", "account", name, "parent=root", f"cluster={NAME}")
        slurm.sacctmgr("add", "user", user, f"account={name}", f"qos={name}", f"defaultqos={name}",
                       f"cluster={NAME}")
        yield name
    finally:
        for job in {r.array_job_id or r.job_id for r in slurm.queue(user=user) if r.account == name}:
            slurm.run(["scancel", job.split("_")[0]], check=False)
        slurm.sacctmgr("delete", "user", user, f"account={name}", f"cluster={NAME}", check=False)
        slurm.sacctmgr("delete", "account", name, f"cluster={NAME}", check=False)
        slurm.sacctmgr("delete", "qos", name, check=False)


def _t(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def test_200_trials_hold_parallelism_16_under_max_submit_jobs_40(sweep_env, sweeps, slurm: SlurmClient, tmp_path,
                                                                 submit_limited, monkeypatch):
    from gpuhpc.sweeps import store

    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "1")     # 5 s trials: hand freed slots on within a second

    f = write_sweep(tmp_path / "p.yaml", name="t-par", method="grid",
                    command=f"sleep 5; v={{x}}; {shell_report('(v-37)*(v-37)')}",
                    parameters={"x": {"type": "int", "low": 0, "high": N - 1}}, parallelism=P,
                    resources={"partition": "all", "time": "5m", "account": submit_limited, "qos": submit_limited},
                    metric={"name": "loss", "goal": "minimize"}, driver_partition="all")
    t0 = time.time()
    sid = run_sweep(f)
    sweeps(sid)
    first = store.sweep_info(sid)
    assert len(first["chunks"]) == 1 and first["driver_job_id"]      # the rest is the driver's
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "600", "--poll", "1", timeout=650)
    assert res.returncode == 0, (res.stdout, res.stderr)
    rows = results(sid)
    assert [r["trial"] for r in rows] == list(range(N))
    for r in rows:
        x = r["params"]["x"]
        assert x == r["trial"] and r["state"] == "completed" and r["metrics"]["loss"] == float((x - 37) ** 2), r
    info = store.sweep_info(sid)
    chunks = [c["job_id"] for c in info["chunks"] if c["job_id"]]
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
    # Slurm's own hand-off inside one array, in the same run: the first array (all P slots from
    # the start, so no driver raises its throttle) starts its (P+i)-th task after its i-th end
    first_runs = [r for r in runs if r.array_job_id == chunks[0]]
    s0, e0 = sorted(_t(r.start) for r in first_runs), sorted(_t(r.end) for r in first_runs)
    handoff = statistics.median([s0[P + i] - e0[i] for i in range(len(s0) - P)] or [0.0])
    slurm_ideal = math.ceil(N / P) * (trial + handoff) + latency
    print(f"\n{N} trials, parallelism {P}, MaxSubmitJobsPerUser {LIMIT}: {len(chunks)} arrays, peak {peak} at once; "
          f"trial {trial:.1f} s, start latency {latency:.1f} s, ideal {ideal:.1f} s, wall {wall:.1f} s, "
          f"ratio {wall / ideal:.2f} (goal <= 1.2); Slurm's own task-to-task hand-off in one array "
          f"{handoff:.1f} s, ideal with it {slurm_ideal:.1f} s, ratio {wall / slurm_ideal:.2f}")
    assert peak <= P
    # and it does run P at once (issue 40.1): a sweep running fewer trials at a time passes the bound
    assert peak == P, f"at most {peak} trials ran at once, not parallelism {P}"
    assert len(chunks) >= 5                  # the limit did split it
    # every array starts at task 0 and stays below MaxArraySize (never --array=1000-1999)
    max_array = int(slurm.config()["MaxArraySize"])
    sizes = {c["job_id"]: c["n_tasks"] for c in info["chunks"] if c["job_id"]}
    assert sum(sizes.values()) == N and max(sizes.values()) < max_array and info["status"] == "done", sizes
    for job, n in sizes.items():
        assert {int(r.array_task_id) for r in runs if r.array_job_id == job} == set(range(n)), job
    d = Path(info["directory"])                  # one report per trial: none ran twice
    assert all(len((d / "trials" / str(i) / "metrics.jsonl").read_text().splitlines()) == 1 for i in range(N))
    wait_for(lambda: [r for r in slurm.accounting(job_ids=[info["driver_job_id"]])
                      if r.state.state.value == "COMPLETED"], 60, "the driver job to complete by itself")
    best = json.loads(gpuhpc("sweep", "best", str(sid), "--json").stdout)
    assert best["trial"] == 37 and best["metrics"]["loss"] == 0.0
    csv = gpuhpc("sweep", "results", str(sid), "--csv")
    assert csv.returncode == 0 and len(csv.stdout.splitlines()) == N + 1
    html = tmp_path / "r.html"
    rep = gpuhpc("sweep", "report", str(sid), "--html", str(html))
    assert rep.returncode == 0, rep.stderr
    assert html.read_text().count("<svg") == 2

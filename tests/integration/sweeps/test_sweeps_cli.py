"""Sweeps on the real cluster: bad files, a refused first array, quota. (Arrays that fit, the
driver, exact metrics and best are proved by the 200-trial sweep of test_sweeps_parallelism;
resume of only the missing trials, hostile values and state on PostgreSQL by test_sweeps_robust,
on private controllers.)"""
from __future__ import annotations

import json

import pytest

from gpuhpc.slurm.client import SlurmClient
from sweeps_helpers import gpuhpc, research_quota, write_sweep

pytestmark = pytest.mark.integration

CPU = {"partition": "cpu", "time": "10m"}


@pytest.mark.parametrize("change, field", [
    ({"parameters": {"x": {"type": "uniform", "low": 1.0, "high": 1.0}}}, "parameters.x.high"),
    ({"parameters": {"x": {"type": "uniform", "low": 2.0, "high": 1.0}}}, "parameters.x.low"),
    ({"method": "annealing"}, "method"),
    ({"parallelism": -4}, "parallelism"),
    ({"method": "grid", "parameters": {"x": {"values": []}}}, "parameters.x.values"),
    ({"command": "echo {x} {y}"}, "command"),
    ({"grace": "soon"}, "grace"),                                       # the job's checks, before any row
    ({"env": {"1BAD": "x"}}, "env.1BAD"),
    ({"command": "echo \"$(echo {x})\"", "parameters": {"x": {"values": ["a", "b"]}}}, "command"),
    ({"method": "grid", "trials": None, "command": "echo {p0}",
      "parameters": {f"p{i}": {"type": "int", "low": 1, "high": 10} for i in range(5)}}, "trials"),   # 100,000
])
def test_bad_files_exit_2_and_submit_nothing(sweep_env, tmp_path, change, field):
    data = {"name": "t-bad", "command": "echo {x}", "parameters": {"x": {"type": "uniform", "low": 0, "high": 1}},
            "method": "random", "trials": 3, "resources": CPU, "metric": {"name": "loss"}}
    data.update(change)
    f = write_sweep(tmp_path / "bad.yaml", **data)
    res = gpuhpc("sweep", "run", str(f))
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: {field}:") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (sweep_env / "sweeps").exists()      # nothing written, nothing submitted
    q = SlurmClient().queue(user=None)
    assert not [r for r in q if r.name.startswith("t-bad-")]


def test_a_sweep_whose_first_array_slurm_refuses_leaves_nothing_behind(sweep_env, tmp_path):
    from gpuhpc.sweeps import store

    f = write_sweep(tmp_path / "r.yaml", name="t-refused", command="echo {x}", method="random", trials=3,
                    parameters={"x": {"type": "uniform", "low": 0, "high": 1}}, metric={"name": "loss"},
                    resources={**CPU, "account": "gpuhpc-no-such-account"})
    res = gpuhpc("sweep", "run", str(f))
    assert res.returncode == 1 and "sbatch" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    conn = store.connect(None)
    try:
        with conn.transaction() as tx:
            assert tx.one("SELECT count(*) FROM sweeps", ())[0] == 0        # no "running" sweep left behind
            assert tx.one("SELECT count(*) FROM sweep_trials", ())[0] == 0
    finally:
        conn.close()
    assert list((sweep_env / "sweeps").iterdir()) == []


def test_over_quota_sweep_is_refused_saying_how_many_fit(sweep_env, tmp_path, monkeypatch):
    # a trial holds 30 min of a 1g.10gb: 1/14 GPU-hour (a slice is 1/7 of a GPU, issue 34.9); 2 fit in 0.15
    research_quota(monkeypatch, 0.15)
    f = write_sweep(tmp_path / "q.yaml", name="t-quota", command="echo {x}",
                    parameters={"x": {"type": "uniform", "low": 0, "high": 1}}, trials=10,
                    resources={"partition": "mig", "gpus": 1, "gpu_type": "1g.10gb", "time": "30m"},
                    metric={"name": "loss"})
    res = gpuhpc("sweep", "run", str(f))
    assert res.returncode == 3, res.stderr
    assert "2 of the sweep's 10 trials would fit" in res.stderr
    from gpuhpc.ledger.db import session_scope
    from gpuhpc.ledger.orm import Sweep

    with session_scope() as s:
        assert s.query(Sweep).count() == 0


def test_submit_array_reserves_every_task(sweep_env, tmp_path, monkeypatch, track):
    """`gpuhpc submit --array` (what sweeps and the API use) holds the real array size, not 1."""
    research_quota(monkeypatch, 100)
    res = gpuhpc("submit", "--array", "0-9%2", "--partition", "mig", "--gpus", "1", "--gpu-type", "1g.10gb",
                 "--time", "30m", "--hold", "--name", "t-array", "--json", "--", "true")
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    import sqlite3

    con = sqlite3.connect(sweep_env / "ledger.db")
    size, hours = con.execute("SELECT array_size, gpu_hours FROM reservations WHERE job_id = ?", (job_id,)).fetchone()
    assert size == 10 and float(hours) == 0.714286          # 10 × 30 min of a 1g.10gb, 1/7 of a GPU (issue 34.9)
    res = gpuhpc("submit", "--array", "0-9;id", "--dry-run", "--", "true")
    assert res.returncode == 2 and "array" in res.stderr

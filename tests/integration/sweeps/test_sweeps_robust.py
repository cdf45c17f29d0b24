"""Sweeps that hold up (issue 21): trials run where the user ran ``sweep run``, whoever submits
them; a failing ``squeue``/``sacct`` never ends a trial nor makes ``resume`` run one twice."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from sweeps_helpers import PY, gpuhpc, results, run_sweep, write_sweep

pytestmark = pytest.mark.integration

CPU = {"partition": "cpu", "time": "5m"}
ALL = {"partition": "all", "time": "5m"}         # more CPUs than `cpu`: parallelism 20 runs 20 at once


def _trial_script(work: Path) -> None:
    (work / "trial.sh").write_text(f'v=$1\n{PY} -m gpuhpc report-metric loss $(( v * 2 ))\n')


def _all_completed_once(sid: int, n: int, directory: str) -> list[dict]:
    rows = results(sid)
    assert [r["trial"] for r in rows] == list(range(n))
    for r in rows:
        assert r["state"] == "completed" and r["metrics"]["loss"] == 2.0 * r["params"]["x"], r
    d = Path(directory)
    lines = {i: len((d / "trials" / str(i) / "metrics.jsonl").read_text().splitlines()) for i in range(n)}
    assert set(lines.values()) == {1}, {i: k for i, k in lines.items() if k != 1}     # each ran once
    return rows


def _flaky_wrappers(bin_dir: Path, every: int = 3) -> Path:
    """``squeue`` and ``sacct`` that fail (exit 1, nothing on stdout) on every ``every``-th call,
    and otherwise run the real ones: put ``bin_dir`` first on PATH. Returns the counter dir."""
    import shutil

    bin_dir.mkdir()
    for tool in ("squeue", "sacct"):
        real = shutil.which(tool)
        assert real, tool
        script = bin_dir / tool
        script.write_text(f"""#!/bin/bash
exec 9>>"{bin_dir}/{tool}.lock"; flock 9
n=$(( $(cat "{bin_dir}/{tool}.count" 2>/dev/null || echo 0) + 1 )); echo $n > "{bin_dir}/{tool}.count"
flock -u 9
if (( n % {every} == 0 )); then echo "{tool}: injected failure" >&2; exit 1; fi
exec {real} "$@"
""")
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bin_dir


def test_trials_run_in_the_users_directory_and_survive_a_failing_squeue_and_sacct(sweep_env, sweeps, tmp_path,
                                                                                   monkeypatch):
    """``command: bash trial.sh {x}`` (a relative path), more trials than MaxArraySize (51 on
    the CI cluster) and a small max_queued: the driver submits most chunks, from its own
    directory, and every trial still finds trial.sh. Meanwhile every second ``squeue`` and
    ``sacct`` fails (for the CLI and for the driver job, which inherits PATH): no trial is
    ended by a query that failed, and a ``resume`` in the middle resubmits nothing."""
    from gpuhpc.sweeps import engine

    work = tmp_path / "work"
    work.mkdir()
    _trial_script(work)
    f = write_sweep(work / "s.yaml", name="t-cwd", method="grid", command="bash trial.sh {x}",
                    parameters={"x": {"type": "int", "low": 0, "high": 59}}, parallelism=20, resources=ALL,
                    metric={"name": "loss", "goal": "minimize"}, max_queued=24)
    flaky = _flaky_wrappers(tmp_path / "bin", every=2)
    monkeypatch.setenv("PATH", f"{flaky}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(work)
    sid = run_sweep(Path("s.yaml"))
    sweeps(sid)
    from polling import wait_for

    from gpuhpc.sweeps.api import Sweep

    sw = Sweep(sid)
    wait_for(lambda: sum(r["state"] == "completed" for r in sw.rows(refresh=False)) >= 12, 240,
             "12 trials completed (the driver refreshes)", interval=1)
    resumed = wait_for(lambda: (lambda r: r.returncode == 0 and r)(gpuhpc("sweep", "resume", str(sid), "--json")),
                       60, "a resume that could ask squeue", interval=0.2)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "400", "--poll", "1", timeout=450)
    assert res.returncode == 0, (res.stdout, res.stderr)
    info = engine.sweep_info(sid)
    assert len(info["chunks"]) >= 3 and info["spec"].workdir == str(work)     # most from the driver
    rows = _all_completed_once(sid, 60, info["directory"])
    assert {r["attempts"] for r in engine.trial_rows(sid)} == {1}, resumed.stdout     # none resubmitted
    assert all(int((flaky / f"{t}.count").read_text()) >= 3 for t in ("squeue", "sacct"))     # each failed
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])     # the real sacct again
    slurm = SlurmClient()                        # the driver saw the sweep done and ended by itself
    wait_for(lambda: [r for r in slurm.accounting(job_ids=[info["driver_job_id"]])
                      if r.state.state.value == "COMPLETED"], 60, "the driver job to complete")
    assert rows


def test_tpe_proposes_40_distinct_parameter_sets(sweep_env, sweeps, tmp_path):
    """TPE asks for every free slot, told the finished trials and registered the running ones,
    its sampler drawing afresh each round: 40 trials, 40 distinct parameter sets."""
    pytest.importorskip("optuna", reason="method tpe needs Optuna (pip install 'gpuhpc[tpe]')")
    f = write_sweep(tmp_path / "tpe.yaml", name="t-tpe", method="tpe", seed=3, trials=40,
                    command=f"{PY} -m gpuhpc report-metric loss $(( ({{layers}} - 5) * ({{layers}} - 5) ))",
                    parameters={"lr": {"type": "loguniform", "low": 1.0e-5, "high": 1.0e-1},
                                "layers": {"type": "int", "low": 1, "high": 12}},
                    parallelism=20, resources=ALL, metric={"name": "loss", "goal": "minimize"})
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "400", "--poll", "1", timeout=450)
    assert res.returncode == 0, (res.stdout, res.stderr)
    rows = results(sid)
    assert len(rows) == 40 and all(r["state"] == "completed" for r in rows)
    assert len({json.dumps(r["params"], sort_keys=True) for r in rows}) == 40


def test_wait_on_a_sweep_whose_driver_died_exits_1_with_the_restart_command(sweep_env, sweeps, slurm: SlurmClient,
                                                                           tmp_path):
    """`sweep wait` reads what the driver writes; when the driver's heartbeat stops and its job
    is gone, it exits 1 in one line naming the command that restarts it, which works."""
    from gpuhpc.sweeps import engine

    f = write_sweep(tmp_path / "d.yaml", name="t-dead", method="grid", command=f"sleep 1; {PY} -m gpuhpc "
                    "report-metric loss {x}", parameters={"x": {"type": "int", "low": 0, "high": 11}},
                    parallelism=4, resources=CPU, metric={"name": "loss", "goal": "minimize"}, chunk_size=4)
    sid = run_sweep(f)
    sweeps(sid)
    driver = engine.sweep_info(sid)["driver_job_id"]
    assert driver
    slurm.cancel(driver)                         # killed, not requeued: nothing follows the sweep now
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.count("\n") == 1 and f"restart it with: gpuhpc sweep resume {sid}" in res.stderr, res.stderr
    res = gpuhpc("sweep", "resume", str(sid), "--json")
    assert res.returncode == 0, res.stderr
    assert engine.sweep_info(sid)["driver_job_id"] not in (None, driver)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert [r["state"] for r in results(sid)] == ["completed"] * 12

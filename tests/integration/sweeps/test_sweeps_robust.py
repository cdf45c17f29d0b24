"""Sweeps that hold up (issue 21): trials run where the user ran ``sweep run``, whoever submits
them; a failing ``squeue``/``sacct`` never ends a trial nor makes ``resume`` run one twice; a
``resume`` after part of a sweep was cancelled resubmits only the missing trials; a dead driver is
named with the command that restarts it; hostile parameter values arrive literally; the same
bookkeeping holds with the sweep state on PostgreSQL.

Every test here runs on one private controller for the module (tests/private_slurm.py: its own
ports, state and logs; partitions ``cpu``, one 16-CPU node, and ``all``, three, as the shared
cluster's; the shared munged, MaxArraySize and slurmdbd under a cluster name of its own), driver
included: SLURM_CONF in the environment points gpuhpc, the sweep driver job and every Slurm call
of the tests at it, so that their minutes run beside the shared-cluster stream (issue 19)."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from sweeps_helpers import PY, gpuhpc, private_cluster_fixtures, report_cmd, results, run_sweep, write_sweep

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcswrob"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16977, 16978, 17461          # unlike every other private cluster's
CPU = {"partition": "cpu", "time": "5m"}
ALL = {"partition": "all", "time": "5m"}         # more CPUs than `cpu`: parallelism 20 runs 20 at once
N_RESUME, P_RESUME = 24, 8

private_cluster, slurm = private_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT))


def _trial_script(work: Path, gate_from: int) -> None:
    """trial.sh: trials from ``gate_from`` on wait (polling) until the test creates ``work/go``."""
    (work / "trial.sh").write_text(f'v=$1\nif (( v >= {gate_from} )); then while [ ! -e "{work}/go" ]; do sleep 0.2; '
                                   f'done; fi\n{PY} -m gpuhpc report-metric loss $(( v * 2 ))\n')


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


def test_trials_run_in_the_users_directory_and_survive_a_failing_squeue_and_sacct(sweep_env, sweeps, slurm,
                                                                                   tmp_path, monkeypatch):
    """``command: bash trial.sh {x}`` (a relative path), more trials than MaxArraySize (51 on
    the CI cluster) and a small max_queued: the driver submits most chunks, from its own
    directory, and every trial still finds trial.sh. Meanwhile every second ``squeue`` and
    ``sacct`` fails (for the CLI and for the driver job, which inherits PATH): no trial is
    ended by a query that failed, and a ``resume`` in the middle resubmits nothing (trials 40-59
    wait for the test's go-ahead after it: the sweep cannot have ended before it)."""
    from gpuhpc.sweeps import store

    work = tmp_path / "work"
    work.mkdir()
    _trial_script(work, gate_from=40)
    f = write_sweep(work / "s.yaml", name="t-cwd", method="grid", command="bash trial.sh {x}",
                    parameters={"x": {"type": "int", "low": 0, "high": 59}}, parallelism=20, resources=ALL,
                    metric={"name": "loss", "goal": "minimize"}, max_queued=24)
    flaky = _flaky_wrappers(tmp_path / "bin", every=2)
    monkeypatch.setenv("PATH", f"{flaky}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(work)
    sid = run_sweep(Path("s.yaml"))
    sweeps(sid)
    from gpuhpc.sweeps.api import Sweep

    sw = Sweep(sid)
    wait_for(lambda: sum(r["state"] == "completed" for r in sw.rows(refresh=False)) >= 12, 240,
             "12 trials completed (the driver refreshes)", interval=1)
    resumed = wait_for(lambda: (lambda r: r.returncode == 0 and r)(gpuhpc("sweep", "resume", str(sid), "--json")),
                       60, "a resume that could ask squeue", interval=0.2)
    (work / "go").touch()                        # the rest of the sweep may end now
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "400", "--poll", "1", timeout=450)
    assert res.returncode == 0, (res.stdout, res.stderr)
    info = store.sweep_info(sid)
    assert len(info["chunks"]) >= 3 and info["spec"].workdir == str(work)     # most from the driver
    rows = _all_completed_once(sid, 60, info["directory"])
    assert {r["attempts"] for r in store.trial_rows(sid)} == {1}, resumed.stdout     # none resubmitted
    assert all(int((flaky / f"{t}.count").read_text()) >= 3 for t in ("squeue", "sacct"))     # each failed
    monkeypatch.setenv("PATH", os.environ["PATH"].split(os.pathsep, 1)[1])     # the real sacct again
    # the driver saw the sweep done and ended by itself
    wait_for(lambda: [r for r in slurm.accounting(job_ids=[info["driver_job_id"]])
                      if r.state.state.value == "COMPLETED"], 60, "the driver job to complete")
    assert rows


def test_tpe_proposes_40_distinct_parameter_sets(sweep_env, sweeps, tmp_path):
    """TPE asks for every free slot, told the finished trials and registered the running ones,
    its sampler drawing afresh each round: 40 trials, 40 distinct parameter sets."""
    import optuna  # noqa: F401  (the `test` extra installs it: a missing Optuna fails here, never skips)
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
    is gone, it exits 1 in one line naming the command that restarts it, which works.
    16 trials in chunks of 4 at parallelism 4: the driver may have submitted the second chunk
    before it was killed, and ``resume`` still leaves trials waiting for a new driver."""
    from gpuhpc.sweeps import store

    f = write_sweep(tmp_path / "d.yaml", name="t-dead", method="grid", command=f"sleep 1; {PY} -m gpuhpc "
                    "report-metric loss {x}", parameters={"x": {"type": "int", "low": 0, "high": 15}},
                    parallelism=4, resources=CPU, metric={"name": "loss", "goal": "minimize"}, chunk_size=4)
    sid = run_sweep(f)
    sweeps(sid)
    driver = store.sweep_info(sid)["driver_job_id"]
    assert driver
    slurm.cancel(driver)                         # killed, not requeued: nothing follows the sweep now
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 1, (res.stdout, res.stderr)
    assert res.stderr.count("\n") == 1 and f"restart it with: gpuhpc sweep resume {sid}" in res.stderr, res.stderr
    res = gpuhpc("sweep", "resume", str(sid), "--json")
    assert res.returncode == 0, res.stderr
    assert store.sweep_info(sid)["driver_job_id"] not in (None, driver)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert [r["state"] for r in results(sid)] == ["completed"] * 16


def _sweep_info(sid: int) -> dict:
    from gpuhpc.sweeps import store

    return store.sweep_info(sid)


def test_resume_resubmits_only_the_missing_trials(sweep_env, sweeps, slurm: SlurmClient, tmp_path):
    f = write_sweep(tmp_path / "r.yaml", name="t-resume", method="grid",
                    command=f"sleep 1; v={{x}}; {report_cmd('v*3')}",
                    parameters={"x": {"type": "int", "low": 0, "high": N_RESUME - 1}},
                    parallelism=P_RESUME, resources=CPU, metric={"name": "loss", "goal": "maximize"}, chunk_size=12)
    sid = run_sweep(f)
    sweeps(sid)
    from gpuhpc.sweeps.api import Sweep

    sw = Sweep(sid)
    trials = Path(_sweep_info(sid)["directory"]) / "trials"
    # P+2 reports: the last two started in slots that 2 ended trials gave up
    wait_for(lambda: len(list(trials.glob("*/metrics.jsonl"))) >= P_RESUME + 2, 240,
             f"{P_RESUME + 2} trials reported (before accounting says so)", interval=0.2)
    # and the driver has submitted the second array: trials resumed beyond the first new chunk then
    # wait with the record of a cancelled array behind them, which must never be read as theirs
    wait_for(lambda: sum(1 for c in _sweep_info(sid)["chunks"] if c["job_id"]) >= 2, 240,
             "the second array submitted", interval=0.2)
    # "part of the sweep": the driver (so that nothing submits the rest), then every array
    slurm.cancel(_sweep_info(sid)["driver_job_id"])
    for c in _sweep_info(sid)["chunks"]:
        if c["job_id"]:
            slurm.cancel(c["job_id"])
    live = ("pending", "running", "requeued")      # until Slurm has ended every cancelled task
    before = {r["trial"]: r for r in wait_for(lambda: (lambda rows: not any(r["state"] in live for r in rows)
                                                                and rows)(sw.rows()), 120, "cancelled trials",
                                              interval=0.5)}
    done = {t for t, r in before.items() if r["state"] == "completed"}
    assert 2 <= len(done) < N_RESUME    # one that had just reported may be cancelled on its way out
    assert all(r["state"] in ("cancelled", "waiting") for t, r in before.items() if t not in done)
    n_chunks = len(_sweep_info(sid)["chunks"])
    res = gpuhpc("sweep", "resume", str(sid), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["resubmitted"] == sorted(set(range(N_RESUME)) - done)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "400", "--poll", "1", timeout=500)
    assert res.returncode == 0, (res.stdout, res.stderr)
    chunks = _sweep_info(sid)["chunks"]
    new = [c for c in chunks[n_chunks:] if c["job_id"]]
    assert sum(c["n_tasks"] for c in new) == N_RESUME - len(done)     # only the missing ones: count the jobs
    after = {r["trial"]: r for r in results(sid)}
    for t, r in after.items():
        assert r["state"] == "completed" and r["metrics"]["loss"] == 3.0 * t
        if t in done:                                          # never resubmitted
            assert r["job_id"] == before[t]["job_id"]
    assert json.loads(gpuhpc("sweep", "resume", str(sid), "--json").stdout)["resubmitted"] == []
    assert len(_sweep_info(sid)["chunks"]) == len(chunks)


HOSTILE = ["lion; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a\nb; touch PWNED", "it's \"q\" | & >x",
           "-n", "*"]


def test_hostile_values_arrive_literally(sweep_env, sweeps, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    f = write_sweep(tmp_path / "h.yaml", name="t-hostile", method="grid",
                    command=f"printf '%s' {{v}} > \"$GPUHPC_TRIAL_DIR/out\"; {PY} -m gpuhpc report-metric loss 1",
                    parameters={"v": {"values": HOSTILE}}, parallelism=7, resources=CPU,
                    metric={"name": "loss"}, workdir=str(work))
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "240", "--poll", "1", timeout=300)
    assert res.returncode == 0, res.stderr
    d = Path(_sweep_info(sid)["directory"])
    for i, v in enumerate(HOSTILE):
        assert (d / "trials" / str(i) / "out").read_text() == v
        assert json.loads(json.dumps(results(sid)[i]["params"]))["v"] == v
    assert list(work.iterdir()) == []              # nothing executed: no PWNED, no x


def test_sweep_state_on_postgresql(pg_sweep_db, sweeps, tmp_path):
    """The same sweep with the gpuhpc database on PostgreSQL (run, driver, resume bookkeeping)."""
    f = write_sweep(tmp_path / "pg.yaml", name="t-pg", method="grid", command=f"v={{x}}; {report_cmd('v+10')}",
                    parameters={"x": {"type": "int", "low": 0, "high": 9}}, parallelism=5, resources=CPU,
                    metric={"name": "loss", "goal": "maximize"}, chunk_size=4, max_queued=8)
    sid = run_sweep(f)
    sweeps(sid)
    assert _sweep_info(sid)["driver_job_id"]
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=400)
    assert res.returncode == 0, res.stderr
    rows = results(sid)
    assert [r["metrics"]["loss"] for r in rows] == [float(x + 10) for x in range(10)]
    assert json.loads(gpuhpc("sweep", "best", str(sid), "--json").stdout)["trial"] == 9


#: per trial or per job by design: compared by name only
_PER_TRIAL = {"GPUHPC_TRIAL_ID", "GPUHPC_PARAMS_JSON", "GPUHPC_TRIAL_DIR", "GPUHPC_METRICS_FILE",
              "GPUHPC_CHECKPOINT_DIR", "GPUHPC_LATEST_CHECKPOINT", "GPUHPC_JOB_ID", "GPUHPC_STOP_DIR",
              "GPUHPC_SCRATCH", "GPUHPC_RUN_ID"}


def _trial_env(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_chunks_the_driver_submits_run_with_the_same_environment_as_the_first(sweep_env, sweeps, tmp_path):
    """Issue 32.1: 6 trials, at most 2 queued, in arrays of 2: `sweep run` submits the first
    array, the driver job (its own ``--cpus-per-task=1``, SLURM_*, GPUHPC_* and the node's NCCL
    profile in its environment) the two others. Every trial sees the same CPU count, the same
    SLURM_* names, no SLURM_CPUS_PER_TASK it did not ask for, and the same GPUHPC_*/NCCL_*."""
    from gpuhpc.sweeps import store

    out = tmp_path / "env"
    out.mkdir()
    f = write_sweep(tmp_path / "e.yaml", name="t-env", method="grid",
                    command=f'(env; echo "NPROC=$(nproc)") > "{out}/{{x}}.env"',
                    parameters={"x": {"type": "int", "low": 0, "high": 5}}, parallelism=2, chunk_size=2, max_queued=2,
                    resources=CPU, metric={"name": "loss", "goal": "minimize"})
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 0, (res.stdout, res.stderr)
    info = store.sweep_info(sid)
    assert info["driver_job_id"] and len([c for c in info["chunks"] if c["job_id"]]) == 3, info["chunks"]
    envs = {i: _trial_env(out / f"{i}.env") for i in range(6)}
    first = envs[0]                              # chunk 0, submitted by `sweep run`

    def shape(env: dict[str, str]) -> tuple:
        slurm_names = sorted(k for k in env if k.startswith("SLURM_"))
        ours = {k: ("" if k in _PER_TRIAL else v) for k, v in env.items() if k.startswith(("GPUHPC_", "NCCL_"))}
        return env.get("NPROC"), env.get("SLURM_CPUS_PER_TASK"), slurm_names, ours

    # one GPUHPC_RUN_ID per trial, whichever chunk ran it (experiment trackers, issue 33.2)
    assert sorted(e["GPUHPC_RUN_ID"] for e in envs.values()) == sorted(f"sweep{sid}-trial{n}" for n in range(6))
    assert all(e["GPUHPC_RUN_ID"] == f"sweep{sid}-trial{e['GPUHPC_TRIAL_ID']}" for e in envs.values())
    for i in range(2, 6):                        # chunks 1 and 2, submitted by the driver
        assert shape(envs[i]) == shape(first), (i, {k: v for k, v in envs[i].items() if first.get(k) != v},
                                                {k: v for k, v in first.items() if k not in envs[i]})


def test_the_driver_takes_its_partitions_max_time(sweep_env, sweeps, slurm: SlurmClient, tmp_path):
    """Issue 32.2: the driver's partition (``cpu``) allows 30 minutes: the driver asks for 30
    minutes, not 7 days (which, under this controller's EnforcePartLimits=NO, would leave it
    pending with PartitionTimeLimit for ever), starts, and finishes the sweep."""
    from gpuhpc.sweeps import store

    slurm.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=30"])
    try:
        f = write_sweep(tmp_path / "t.yaml", name="t-drvtime", method="grid", command="true",
                        parameters={"x": {"type": "int", "low": 0, "high": 3}}, parallelism=2, chunk_size=2,
                        max_queued=2, resources=CPU, metric={"name": "loss", "goal": "minimize"})
        sid = run_sweep(f)
        sweeps(sid)
        driver = store.sweep_info(sid)["driver_job_id"]
        assert driver
        job = slurm.show_job(driver)
        assert job is not None and job["TimeLimit"] == "00:30:00" and job["Partition"] == "cpu", job
        res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
        assert res.returncode == 0, (res.stdout, res.stderr)
    finally:
        slurm.run(["scontrol", "update", "PartitionName=cpu", "MaxTime=INFINITE"])


def test_every_trial_gets_the_sweep_files_setup_venv_and_sbatch_args(sweep_env, sweeps, slurm: SlurmClient, tmp_path):
    """Issue 33.3 and 33.4 in sweep files: ``setup:`` lines, ``venv:`` and ``sbatch_args:`` as in a
    job file, for every trial, in the arrays ``sweep run`` submits and in those the driver submits
    later (4 trials, arrays of 2, at most 2 queued). Each trial sees the setup line's variable and the
    activated venv, and its job the passed-through ``--comment`` (read from slurmctld while it runs:
    slurmdbd keeps comments only with AccountingStoreFlags=job_comment)."""
    import subprocess
    import sys

    from gpuhpc.sweeps import store

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    out = tmp_path / "out"
    out.mkdir()
    f = write_sweep(tmp_path / "setup.yaml", name="t-setup", method="grid",
                    command=f'c=$(scontrol show job "$SLURM_JOB_ID" | grep -o "Comment=[^ ]*" | sort -u); '
                            f'echo "setup=$SWEEP_SETUP venv=$VIRTUAL_ENV python=$(command -v python) $c" > "{out}/{{x}}"; '
                            + report_cmd("x"),
                    parameters={"x": {"type": "int", "low": 0, "high": 3}}, parallelism=2, chunk_size=2, max_queued=2,
                    resources=CPU, metric={"name": "loss"}, setup=["export SWEEP_SETUP=from-the-sweep-file"],
                    venv=str(venv), sbatch_args=["--comment=t-setup-comment"])
    sid = run_sweep(f)
    sweeps(sid)
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "300", "--poll", "1", timeout=350)
    assert res.returncode == 0, (res.stdout, res.stderr)
    for x in range(4):
        assert (out / str(x)).read_text().strip() == \
            f"setup=from-the-sweep-file venv={venv} python={venv}/bin/python Comment=t-setup-comment", x
    info = store.sweep_info(sid)
    jobs = [c["job_id"] for c in info["chunks"] if c["job_id"]]
    assert info["driver_job_id"] and len(jobs) == 2, info["chunks"]

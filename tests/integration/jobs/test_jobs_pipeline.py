"""Pipelines and many calls on the real cluster (issue 33.5/33.6): ``--after`` (afterok) starts a
job only once its predecessor ended COMPLETED and never after a failed one; bad or unknown ids
submit nothing; a sweep ``--after`` a job; a job ``--after-sweep`` gets the best parameters;
``map_array`` is one array with results in order; ``batch()`` is one array; ``as_completed``
asks Slurm once per poll for all its jobs.

Jobs run on partition ``cpu`` for a few seconds; each test cleans up only its own ids."""
from __future__ import annotations

import json
import os
import uuid

import pytest
from jobs_helpers import gpuhpc
from pipeline_lib import square
from polling import wait_for

from gpuhpc.slurm.client import SlurmClient

pytestmark = pytest.mark.integration

NO_SUCH_JOB = "67000000"        # below Slurm's MaxJobId, far above what tests reach
CPU = {"partition": "cpu", "time": "5m", "cpus_per_task": 1}


def _name() -> str:
    return f"gpuhpc-test-pipe-{uuid.uuid4().hex[:8]}"


def _submit(track, *args: str) -> str:
    res = gpuhpc("submit", "--partition", "cpu", "--time", "5m", "--name", _name(), *args)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    track(job_id)
    return job_id


def _ended(slurm: SlurmClient, job_id: str):
    """The job's sacct row once it has ended (else None)."""
    rows = [r for r in slurm.accounting(job_ids=[job_id]) if r.job_id == job_id]
    return rows[-1] if rows and rows[-1].state.state.is_finished and rows[-1].end not in ("", "Unknown") else None


@pytest.fixture(autouse=True)
def _importable(monkeypatch):
    """The jobs unpickle ``square`` from pipeline_lib: this directory on their PYTHONPATH."""
    from pathlib import Path

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parent),
                                                      *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.fixture
def sbatch_calls(jobs_env, tmp_path, monkeypatch):
    """A recording ``sbatch`` first on PATH for this test's ``gpuhpc`` commands."""
    from recording import record_calls

    calls = record_calls(tmp_path / "bin", "sbatch")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_after_starts_b_only_once_a_completed(jobs_env, slurm, track):
    a = _submit(track, "--", "sleep", "3")
    b = _submit(track, "--after", a, "--", "true")
    rec = slurm.show_job(b)
    assert rec["Dependency"].startswith(f"afterok:{a}"), rec["Dependency"]
    end_a = wait_for(lambda: _ended(slurm, a), 60, f"job {a} to end")
    end_b = wait_for(lambda: _ended(slurm, b), 60, f"job {b} to end")
    assert end_a.state.state.value == "COMPLETED" and end_b.state.state.value == "COMPLETED"
    assert end_b.start >= end_a.end, (end_a.end, end_b.start)         # ISO times: text order is time order


def test_afterok_on_a_failing_job_never_runs(jobs_env, slurm, track):
    a = _submit(track, "--", "sh", "-c", "sleep 2; exit 3")
    b = _submit(track, "--after", a, "--", "true")
    wait_for(lambda: (slurm.show_job(b) or {}).get("Reason") == "DependencyNeverSatisfied", 60,
             f"job {b} to be DependencyNeverSatisfied after {a} failed")
    rec = slurm.show_job(b)
    assert rec["JobState"] == "PENDING" and rec.get("StartTime") in ("Unknown", "None", ""), rec
    slurm.cancel(b)
    # and a job after a job that already failed is refused before sbatch (it could never start)
    res = gpuhpc("submit", "--partition", "cpu", "--after", a, "--", "true")
    assert res.returncode == 1 and f"job {a} ended FAILED" in res.stderr, res.stderr


def test_bad_and_unknown_after_ids_submit_nothing(sbatch_calls, track):
    for args, code, text in [(["--after", "12x"], 2, "after[0]"), (["--after-any", "1,2;3"], 2, "after_any[1]"),
                             (["--after", "1", "-d", "afterok:2"], 2, "after:"),
                             (["--after-sweep", "x1"], 2, "--after-sweep"),
                             (["--after", NO_SUCH_JOB], 1, f"job {NO_SUCH_JOB} not found")]:
        res = gpuhpc("submit", "--partition", "cpu", *args, "--", "true")
        assert res.returncode == code and text in res.stderr and len(res.stderr.strip().splitlines()) == 1, \
            (args, res.returncode, res.stderr)
    assert sbatch_calls() == []
    _submit(track, "--", "true")                # the recording sbatch is on this path
    assert len(sbatch_calls()) == 1


def test_map_array_of_30_calls_is_one_array_with_results_in_order(jobs_env, slurm, track):
    import gpuhpc as g

    jobs = g.map_array(square, range(30), resources=CPU, client=slurm)
    parents = {j.job_id.split("_")[0] for j in jobs}
    for p in parents:
        track(p)
    assert len(parents) == 1 and [j.job_id for j in jobs] == [f"{next(iter(parents))}_{i}" for i in range(30)]
    assert len(list(g.as_completed(jobs, timeout=120, poll=1))) == 30
    assert [j.result() for j in jobs] == [x * x for x in range(30)]


def test_batch_of_three_submits_is_one_array(jobs_env, slurm, track):
    import gpuhpc as g

    with g.batch():
        jobs = [g.submit(square, x, resources=CPU, client=slurm) for x in (2, 3, 4)]
        assert all(j.job_id is None for j in jobs)           # nothing submitted inside the block
    parents = {j.job_id.split("_")[0] for j in jobs}
    for p in parents:
        track(p)
    assert len(parents) == 1 and [j.job_id.split("_")[1] for j in jobs] == ["0", "1", "2"]
    assert [j.result(timeout=120) for j in jobs] == [4, 9, 16]


class CountingClient(SlurmClient):
    """A real SlurmClient that records the program of every Slurm command it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.programs: list[str] = []      # not `calls`: SlurmClient.calls counts reads per transport

    def run(self, argv, **kw):
        self.programs.append(os.path.basename(argv[0]))
        return super().run(argv, **kw)


def test_as_completed_asks_slurm_once_per_poll_for_all_jobs(jobs_env, track):
    import gpuhpc as g
    from gpuhpc.jobs.watch import Watcher

    client = CountingClient()
    jobs = [g.submit(square, x, resources=CPU, client=client) for x in range(6)]     # 6 separate jobs
    for j in jobs:
        track(j.job_id)
    client.programs.clear()
    watcher = Watcher(client)
    seen = [j.job_id for j in g.as_completed(jobs, timeout=120, poll=1, watcher=watcher)]
    assert sorted(seen) == sorted(j.job_id for j in jobs)
    assert watcher.polls >= 1 and client.programs == ["sacct"] * watcher.polls, (watcher.polls, client.programs)
    assert [j.result() for j in jobs] == [x * x for x in range(6)]


@pytest.mark.parametrize("max_queued", [3, 2], ids=["no-driver", "driver"])
def test_sweep_after_a_job_and_a_job_after_the_sweep_gets_the_best_params(jobs_env, slurm, track, tmp_path,
                                                                        monkeypatch, max_queued):
    """3 trials in one array (no driver: the job waits afterany on the sweep's arrays), or 2 at
    a time (the third is the driver's to submit: the job waits afterok on the driver)."""
    import sys

    import yaml

    from gpuhpc.sweeps import control, store

    monkeypatch.delenv("GPUHPC_DB_URL", raising=False)
    monkeypatch.delenv("GPUHPC_SWEEP_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "2")
    a = _submit(track, "--hold", "--", "true")
    f = tmp_path / "sweep.yaml"
    f.write_text(yaml.safe_dump({
        "name": "pipe", "method": "grid", "parameters": {"x": [1, 2, 3]},
        "command": f"{sys.executable} -m gpuhpc report-metric loss $(( ({{x}} - 2) * ({{x}} - 2) ))",
        "metric": {"name": "loss", "goal": "minimize"}, "resources": CPU, "max_queued": max_queued}))
    res = gpuhpc("sweep", "run", str(f), "--after", a, "--json")
    assert res.returncode == 0, res.stderr
    sid = json.loads(res.stdout)["sweep_id"]
    try:
        info = store.sweep_info(sid)
        arrays = [c["job_id"] for c in info["chunks"]] + ([info["driver_job_id"]] if info["driver_job_id"] else [])
        for j in arrays:
            track(j)
            rec = slurm.show_job(j)
            assert rec["Dependency"].startswith(f"afterok:{a}"), rec
            # the reason is set by slurmctld's next scheduling pass (None just after the submit)
            wait_for(lambda j=j: slurm.show_job(j)["Reason"] == "Dependency", 60, f"job {j} pending on its dependency")
        log = tmp_path / "best.out"
        c = _submit(track, "--after-sweep", str(sid), "--", "sh", "-c", f'echo "$GPUHPC_BEST_PARAMS" > {log}')
        assert bool(info["driver_job_id"]) == (max_queued == 2)
        want = f"afterok:{info['driver_job_id']}" if info["driver_job_id"] else "afterany:"
        assert slurm.show_job(c)["Dependency"].startswith(want), slurm.show_job(c)["Dependency"]
        slurm.run(["scontrol", "release", a])
        end_c = wait_for(lambda: _ended(slurm, c), 90, f"job {c} after sweep {sid} to end")
        assert end_c.state.state.value == "COMPLETED", end_c
        ends = [r.end for j in arrays + [ch["job_id"] for ch in store.sweep_info(sid)["chunks"]]
                for r in slurm.accounting(job_ids=[j])]
        assert end_c.start >= max(ends), (end_c.start, ends)
        assert json.loads(log.read_text()) == {"x": 2}
    finally:
        control.cancel(sid, client=slurm)

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
    directory, and every trial still finds trial.sh. Meanwhile every third ``squeue`` and
    ``sacct`` fails (for the CLI and for the driver job, which inherits PATH): no trial is
    ended by a query that failed, and a ``resume`` in the middle resubmits nothing."""
    from gpuhpc.sweeps import engine

    work = tmp_path / "work"
    work.mkdir()
    _trial_script(work)
    f = write_sweep(work / "s.yaml", name="t-cwd", method="grid", command="bash trial.sh {x}",
                    parameters={"x": {"type": "int", "low": 0, "high": 59}}, parallelism=12, resources=CPU,
                    metric={"name": "loss", "goal": "minimize"}, max_queued=24)
    flaky = _flaky_wrappers(tmp_path / "bin")
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
    res = gpuhpc("sweep", "wait", str(sid), "--timeout", "400", timeout=450)
    assert res.returncode == 0, (res.stdout, res.stderr)
    info = engine.sweep_info(sid)
    assert len(info["chunks"]) >= 3 and info["spec"].workdir == str(work)     # most from the driver
    rows = _all_completed_once(sid, 60, info["directory"])
    assert {r["attempts"] for r in engine.trial_rows(sid)} == {1}, resumed.stdout     # none resubmitted
    assert sum(int((flaky / f"{t}.count").read_text()) for t in ("squeue", "sacct")) >= 30     # it did fail
    assert rows

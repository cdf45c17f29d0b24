"""``GPUHPC_RUN_ID`` (issue 33.2): the one id an experiment tracker resumes, the same in every run
of a job (Slurm keeps the job id across requeues) and of a sweep trial (whichever array, requeue
or ``sweep resume`` runs it). The rendered template runs under bash with a stand-in scontrol;
the real cluster's requeue: tests/integration/jobs/test_jobs_launch.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.sweeps import environment, trial


def _run(tmp_path: Path, restart: int, inherited: str | None = None, **env: str) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    (bindir / "scontrol").chmod(0o755)
    out = tmp_path / f"out-{restart}.txt"
    spec = JobSpec(command=(sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['GPUHPC_RUN_ID'])"),
                   checkpoint_dir=str(tmp_path / "ck" / "%j"), resources=Resources(time="1h"), env=env)
    script = tmp_path / "job.sh"
    script.write_text(render(spec))
    run_env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="4242",
                   SLURM_RESTART_COUNT=str(restart), GPUHPC_SCRATCH_ROOT=str(tmp_path / "scratch"))
    run_env.pop("GPUHPC_RUN_ID", None)
    if inherited is not None:
        run_env["GPUHPC_RUN_ID"] = inherited            # sbatch exports the submitter's environment
    res = subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return out.read_text()


def test_a_job_keeps_its_run_id_across_requeues_and_drops_an_inherited_one(tmp_path):
    assert [_run(tmp_path, r, inherited="77") for r in (0, 1, 2)] == ["4242"] * 3


def test_a_run_id_given_with_env_wins(tmp_path):
    assert _run(tmp_path, 1, inherited="77", GPUHPC_RUN_ID="exp-7") == "exp-7"


def test_a_sweep_trial_has_one_run_id_whichever_job_runs_it(tmp_path):
    assert trial.run_id(12, 3) == trial.run_id("12", 3) == "sweep12-trial3" != trial.run_id(12, 4)
    # the driver's own never reaches a later array (it is a job's, like GPUHPC_JOB_ID)
    assert "GPUHPC_RUN_ID" in environment.JOB_GPUHPC

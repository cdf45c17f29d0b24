"""Issue 33 as an ordinary user (its acceptance: "as an ordinary user where it matters"): a
throwaway Unix user (the hostile-user suite's, with a Slurm association in ``research``) runs the
gpuhpc every user can run (``.venv/site``), with its own data directory, no root anywhere:

* a job with a venv, a setup line, a passed-through sbatch option and a webhook (``--notify``):
  the program sees the setup and the activated venv, ``gpuhpc logs`` shows its output to its owner,
  and the user's own notifier run (``python -m gpuhpc.jobs.notify``, its cron line) posts the end;
* a sweep file with a setup line: every trial sees it, and ``sweep results`` ranks them.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from polling import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/integration: the security suite's user
from security.conftest import hostile, site_python  # noqa: E402,F401  (the throwaway user; gpuhpc it can run)

pytestmark = pytest.mark.integration


def _as_user(hostile, site_python, *args: str, timeout: float = 120):
    data = hostile.workdir / "gpuhpc-data"
    return hostile.run([site_python, "-m", "gpuhpc.cli.main", *args], timeout=timeout,
                       env={"GPUHPC_DATA_DIR": str(data), "GPUHPC_SWEEP_DRIVER_POLL": "1"})


def _state(hostile, job: str) -> str:
    res = hostile.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job])
    return res.stdout.strip().split(" ")[0] if res.returncode == 0 else ""


def test_an_ordinary_users_job_gets_its_setup_venv_logs_and_webhook(hostile, site_python, hook):
    venv = hostile.workdir / "venv"
    made = hostile.run([site_python, "-m", "venv", "--without-pip", str(venv)], timeout=180)
    assert made.returncode == 0, made.stderr
    url = f"http://127.0.0.1:{hook.server_port}/day1"
    res = _as_user(hostile, site_python, "submit", "-A", "research", "-p", "cpu", "-t", "5m", "--name", "gpuhpc-day1",
                   "--venv", str(venv), "--setup", "export DAY1=the-setup-ran", "--sbatch-arg=--comment=day1",
                   "--notify", f"webhook={url}", "--log-dir", str(hostile.workdir / "logs"), "--json", "--",
                   "bash", "-c", 'echo "day1 $DAY1 $VIRTUAL_ENV $(id -un)"; '
                                 'scontrol show job "$SLURM_JOB_ID" | grep -o "Comment=[^ ]*"')
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)["job_id"]
    hostile.jobs.append(job)
    wait_for(lambda: _state(hostile, job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 120, f"job {job} to end")
    assert _state(hostile, job) == "COMPLETED"
    logs = _as_user(hostile, site_python, "logs", job)
    assert logs.returncode == 0, logs.stderr
    assert f"day1 the-setup-ran {venv} {hostile.name}" in logs.stdout and "Comment=day1" in logs.stdout, logs.stdout

    def notified() -> bool:
        run = hostile.run([site_python, "-m", "gpuhpc.jobs.notify"], timeout=60,
                          env={"GPUHPC_DATA_DIR": str(hostile.workdir / "gpuhpc-data")})
        assert run.returncode == 0, run.stderr
        return "/day1" in hook.got

    wait_for(notified, 60, "the user's notifier to post the job's end")
    assert (hook.got["/day1"]["event"], hook.got["/day1"]["job_id"], hook.got["/day1"]["state"]) == \
        ("end", job, "COMPLETED")


def test_an_ordinary_users_sweep_file_runs_its_setup_in_every_trial(hostile, site_python):
    out = hostile.workdir / "trials"
    sweep = hostile.workdir / "day1.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "day1", "method": "grid", "parallelism": 3, "metric": {"name": "loss"},
        "parameters": {"x": {"type": "int", "low": 0, "high": 2}},
        "resources": {"partition": "cpu", "time": "5m", "account": "research"},
        "setup": ["export DAY1_SWEEP=set-up"],
        "command": f'echo "$DAY1_SWEEP $(id -un)" > "{out}-{{x}}"; {site_python} -m gpuhpc report-metric loss {{x}}'},
        sort_keys=False))
    run = _as_user(hostile, site_python, "sweep", "run", str(sweep), "--json")
    assert run.returncode == 0, run.stderr
    sid = str(json.loads(run.stdout)["sweep_id"])
    waited = _as_user(hostile, site_python, "sweep", "wait", sid, "--timeout", "240", "--poll", "1", timeout=300)
    assert waited.returncode == 0, (waited.stdout, waited.stderr)
    for x in range(3):
        assert Path(f"{out}-{x}").read_text() == f"set-up {hostile.name}\n", x
    res = _as_user(hostile, site_python, "sweep", "results", sid, "--json")
    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)
    assert [(r["trial"], r["state"], r["metrics"]["loss"]) for r in rows] == [(0, "completed", 0.0),
                                                                               (1, "completed", 1.0),
                                                                               (2, "completed", 2.0)], rows

"""Every command that works on the login node works with --cluster the same way, from a laptop
of its own (``apart``: the cluster user's home, where the profile's remote_dir is, is not
visible to it): a job submitted from there runs gpuhpc's helpers and the ``--profile`` wrapper
with the cluster's Python (the profile's ``python``, never this interpreter, which the cluster
cannot run), ``gpuhpc profile JOBID`` lists the traces there, and ``gpuhpc sprint FILE`` runs
the sprint there, from the code snapshot. Both on a private controller (``private_login``)."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml
from polling import wait_for

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner

REPO = Path(__file__).resolve().parents[3]
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "")

pytestmark = pytest.mark.isolated           # a private controller only


def test_a_profiled_job_runs_the_clusters_python_and_profile_lists_its_trace_there(private_login, laptop):
    # the profiled command writes its trace file: the GPUHPC_PYTHON it was given
    res = laptop.gpuhpc("--cluster", "lab", "submit", "--partition", "cpu", "--time", "2m", "--profile", "torch",
                        "--no-snapshot", "--json", "--", "bash", "-c",
                        'printf %s "$GPUHPC_PYTHON" > "$GPUHPC_PROFILE_OUTPUT"', apart=True)
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    slurm = SlurmClient(LocalRunner())
    try:
        rec = wait_for(lambda: (r := slurm.show_job(job_id) or {}).get("JobState", "") not in LIVE and r, 120,
                       f"job {job_id} to end")
        assert rec["JobState"] == "COMPLETED", rec      # the wrapper ran: the cluster's Python
        listing = laptop.gpuhpc("--cluster", "lab", "profile", job_id, "--json", apart=True)
        assert listing.returncode == 0, listing.stderr
        out = json.loads(listing.stdout)
        assert out["directory"] == str(laptop.remote / "logs" / "profile"), out
        [trace] = out["traces"]
        assert Path(trace["path"]).name == f"{job_id}-r0-rank0.pt.trace.json"
        assert Path(trace["path"]).read_text() == laptop.python      # GPUHPC_PYTHON: the cluster's
    finally:
        slurm.cancel(job_id)


def test_a_sprint_from_the_laptop_runs_on_the_cluster_from_the_snapshot(private_login, laptop, tmp_path):
    repo = tmp_path / "proj"
    repo.mkdir()
    shutil.copy(REPO / "examples" / "sprints" / "toy_train.py", repo / "toy_train.py")
    (repo / "sprint.yaml").write_text(yaml.safe_dump({
        "name": "laptop-sprint", "command": f"{laptop.python} toy_train.py --batch-size {{batch_size}} --seconds 0.1",
        "axes": {"batch_size": [64, 256]}, "request": False, "prices": {"h100": 2.5}, "metric": "samples_per_s",
        "budget": {"trials": 2}, "resources": {"partition": "cpu", "time": "2m"}}))
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)
    res = laptop.gpuhpc("--cluster", "lab", "sprint", "sprint.yaml", "--json", "--no-utilisation", "--timeout", "150",
                        cwd=repo, apart=True, timeout=240)
    assert res.returncode == 0, res.stderr
    assert "code snapshot" in res.stderr and "uploaded" in res.stderr
    out = json.loads(res.stdout)
    assert sorted(r["batch_size"] for r in out["rows"]) == [64, 256]
    assert all(r["state"] == "completed" for r in out["rows"]), out["rows"]
    # the cluster user's sweep, run in the snapshot's copy of the repository
    db = Path(laptop.home) / ".local" / "share" / "gpuhpc" / "ledger.db"
    with sqlite3.connect(db) as conn:
        name, spec = conn.execute("SELECT name, spec FROM sweeps WHERE id = ?", (out["sweep_id"],)).fetchone()
    assert name == "sprint-laptop-sprint"
    assert json.loads(spec)["workdir"].startswith(str(laptop.remote / "snapshots")), spec

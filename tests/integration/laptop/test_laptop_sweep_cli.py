"""`gpuhpc --cluster NAME sweep ...` from a laptop (this process) through the real sshd, as the
non-root user: the sweep command runs on the cluster (its database and trial files are the
cluster user's), from the code snapshot of the repository it was started in; a sweep file
with a bad field is refused here, before anything is sent. The 20-trial sweep's login node runs
a private controller (``private_login``)."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}
OBJECTIVE = "import sys\n\nimport gpuhpc\n\nx = int(sys.argv[1])\ngpuhpc.report(loss=float((x - {c}) ** 2))\n"


def _repo(tmp_path, laptop):
    r = tmp_path / "proj"
    r.mkdir()
    (r / "objective.py").write_text(OBJECTIVE.format(c=3))
    (r / "sweep.yaml").write_text(yaml.safe_dump({
        "name": "laptop-cli-sweep", "command": f"{laptop.python} objective.py {{x}}",
        "parameters": {"x": {"type": "int", "low": 0, "high": 19}}, "method": "grid", "parallelism": 10,
        "resources": {"partition": "cpu", "time": "5m"}, "metric": {"name": "loss", "goal": "minimize"}}))
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v1"]):
        subprocess.run(["git", "-C", str(r), *args], check=True, capture_output=True, env=GIT_ENV)
    (r / "objective.py").write_text(OBJECTIVE.format(c=7))        # uncommitted: the best is x=7
    return r


@pytest.mark.isolated                       # a private controller only
def test_a_20_trial_sweep_with_cluster_then_best(private_login, laptop, tmp_path):
    repo = _repo(tmp_path, laptop)
    res = laptop.gpuhpc("--cluster", "lab", "sweep", "run", "sweep.yaml", "--json", cwd=repo)
    assert res.returncode == 0, res.stderr
    sid = str(json.loads(res.stdout)["sweep_id"])
    done = False
    try:
        assert "code snapshot" in res.stderr and "uploaded" in res.stderr
        wait = laptop.gpuhpc("--cluster", "lab", "sweep", "wait", sid, "--timeout", "300", "--poll", "2",
                             timeout=360)
        assert wait.returncode == 0, wait.stderr
        done = True                 # every trial ended; the driver ends by itself
        best = laptop.gpuhpc("--cluster", "lab", "sweep", "best", sid, "--json", env={"GPUHPC_CLUSTER": "lab"})
        assert best.returncode == 0, best.stderr
        b = json.loads(best.stdout)
        assert b["params"] == {"x": 7} and b["metrics"]["loss"] == 0.0 and b["state"] == "completed", b
        rows = json.loads(laptop.gpuhpc("--cluster", "lab", "sweep", "results", sid, "--json").stdout)
        assert sorted(r["metrics"]["loss"] for r in rows) == sorted(float((x - 7) ** 2) for x in range(20))
        page = tmp_path / "sweep.html"
        rep = laptop.gpuhpc("--cluster", "lab", "sweep", "report", sid, "--html", str(page))
        assert rep.returncode == 0 and f"wrote {page}" in rep.stderr, rep.stderr
        assert "<svg" in page.read_text()
        cost = laptop.gpuhpc("--cluster", "lab", "report", "cost", "--json")   # the cluster user's ledger
        assert cost.returncode == 0, cost.stderr
        json.loads(cost.stdout)
    finally:
        if not done:
            laptop.gpuhpc("--cluster", "lab", "sweep", "cancel", sid)


def test_a_bad_sweep_file_is_refused_before_anything_is_sent(laptop, tmp_path):
    repo = _repo(tmp_path, laptop)
    (repo / "sweep.yaml").write_text(yaml.safe_dump({"name": "bad", "command": "true", "parameters": {
        "x": {"type": "int", "low": 5, "high": 1}}, "resources": {"partition": "cpu"}, "metric": {"name": "loss"}}))
    res = laptop.gpuhpc("--cluster", "lab", "sweep", "run", "sweep.yaml", cwd=repo)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert "parameters.x" in res.stderr
    assert not laptop.remote.exists()                       # no snapshot, no file, no sweep
    res = laptop.gpuhpc("--cluster", "lab", "sweep", "best", "999999")
    assert res.returncode == 1 and res.stderr.strip() == "error: ID: no sweep 999999", res.stderr

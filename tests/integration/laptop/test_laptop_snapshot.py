"""From a laptop (the test process) through the real sshd, as a non-root user: a script job submitted from a git
repository with an uncommitted change runs the changed code from its snapshot; the same
snapshot is not uploaded twice; a snapshot over the limit is refused before anything is
submitted."""
from __future__ import annotations

import json
import subprocess

import pytest

from polling import wait_for

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    (r / "src" / "train.py").write_text("print('committed code')\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v1"]):
        subprocess.run(["git", "-C", str(r), *args], check=True, capture_output=True, env=GIT_ENV)
    (r / "src" / "train.py").write_text("import os, pwd\n"
                                        "print('uncommitted code in', os.getcwd(), 'as', pwd.getpwuid(os.getuid())[0])\n")
    return r


def _wait(laptop, job_id, timeout=120):
    def finished() -> dict | None:
        st = laptop.gpuhpc("--cluster", "lab", "status", job_id, "--json")
        return json.loads(st.stdout) if st.returncode == 0 and json.loads(st.stdout)["finished"] else None

    return wait_for(finished, timeout, f"job {job_id} to finish", interval=1)


def test_job_runs_the_uncommitted_code_from_its_snapshot(laptop, repo, tmp_path):
    remote = laptop.remote
    submit = ("--cluster", "lab", "submit", "--partition", "cpu", "--time", "5m", "--name", "snap",
              "--", "python3", "train.py")
    res = laptop.gpuhpc(*submit, cwd=repo / "src")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    try:
        assert "uploaded" in res.stderr and "code snapshot" in res.stderr
        st = _wait(laptop, job_id)
        assert st["state"] == "COMPLETED", st
        logs = laptop.gpuhpc("--cluster", "lab", "logs", job_id)
        snaps = list((remote / "snapshots").iterdir())
        assert len(snaps) == 1 and snaps[0].name.isalnum()
        assert f"uncommitted code in {snaps[0]}/src as {laptop.user}" in logs.stdout, logs.stdout
        assert str(remote / "logs") in st["log"]           # the default log dir is on the cluster
    finally:
        laptop.gpuhpc("--cluster", "lab", "cancel", job_id)
    again = laptop.gpuhpc(*submit, cwd=repo / "src")
    assert again.returncode == 0, again.stderr
    laptop.gpuhpc("--cluster", "lab", "cancel", again.stdout.strip())
    assert "already on the cluster" in again.stderr
    assert len(list((remote / "snapshots").iterdir())) == 1


def test_a_snapshot_over_the_limit_is_refused_before_submitting(laptop, repo, tmp_path):
    laptop.profile("lab", snapshot_max_mb=1)
    (repo / "src" / "weights.bin").write_bytes(b"0" * (3 * 1024 * 1024))
    before = laptop.gpuhpc("--cluster", "lab", "jobs", "--json")
    res = laptop.gpuhpc("--cluster", "lab", "submit", "--partition", "cpu", "--time", "5m", "--name", "snap-big",
                        "--", "python3", "train.py", cwd=repo / "src")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "src/weights.bin (3.0 MB)" in res.stderr and "over the 1 MB limit" in res.stderr
    after = laptop.gpuhpc("--cluster", "lab", "jobs", "--json")
    assert [j for j in json.loads(after.stdout) if j["name"] == "snap-big"] == \
        [j for j in json.loads(before.stdout) if j["name"] == "snap-big"]
    assert not (laptop.remote / "snapshots").exists()


def test_follow_logs_then_cancel(laptop, repo, tmp_path):
    res = laptop.gpuhpc("--cluster", "lab", "submit", "--partition", "cpu", "--time", "5m", "--name", "follow",
                        "--", "bash", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done",
                        cwd=repo)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    import os
    import sys

    follow = subprocess.Popen([sys.executable, "-m", "gpuhpc", "--cluster", "lab", "logs", "-f", job_id],
                              env={**os.environ, **laptop.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ticks: list[str] = []
        while len(ticks) < 3:
            ln = follow.stdout.readline()
            assert ln, follow.stderr.read()
            if ln.startswith("tick "):
                ticks.append(ln)
        assert ticks == ["tick 1\n", "tick 2\n", "tick 3\n"], ticks
    finally:
        cancel = laptop.gpuhpc("--cluster", "lab", "cancel", job_id)
    assert cancel.returncode == 0, cancel.stderr
    follow.wait(timeout=60)                     # the follower ends with the job
    assert follow.returncode == 0, follow.stderr.read()

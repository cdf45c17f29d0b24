"""The compiled client and command server on the real cluster: jobs submitted through it run,
are listed, followed and cancelled through it; hostile names stay harmless; quota holds are
reserved and attached by reused workers; concurrent submissions all go through; a caller whose
resource limits or group differ from the server's is not served by it, and its jobs see the
caller's values."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from jobs_helpers import gpuhpc, job_state, research_quota
from polling import wait_for

pytestmark = pytest.mark.integration


def test_submit_status_logs_cancel_through_the_server(cmd_client, jobs_env, slurm, track):
    tag = uuid.uuid4().hex[:8]
    res = cmd_client.run("submit", "-p", "cpu", "-t", "15m", "--name", "gpuhpc-test-cs", "--json", "--",
                         "bash", "-c", f"echo hello-{tag}; echo env=$GPUHPC_RESTART_COUNT")
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", ""), 120, f"job {job_id} to finish")
    logs = cmd_client.run("logs", job_id)
    assert logs.returncode == 0 and f"hello-{tag}" in logs.stdout and "env=0" in logs.stdout
    status = json.loads(cmd_client.run("status", job_id, "--json").stdout)
    assert status["state"] == "COMPLETED"

    long = cmd_client.run("submit", "-p", "cpu", "-t", "15m", "--name", "gpuhpc-test-cs-long", "--", "sleep", "600")
    assert long.returncode == 0, long.stderr
    long_id = long.stdout.strip()
    track(long_id)
    listed = json.loads(cmd_client.run("jobs", "--json").stdout)
    assert long_id in {str(j["job_id"]) for j in listed}
    wait_for(lambda: job_state(slurm, long_id) == "RUNNING", 120, f"job {long_id} to start")

    # logs -f runs until Ctrl-C, which the client forwards
    follow = subprocess.Popen([cmd_client.path, "logs", "-f", long_id], env=cmd_client.env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert cmd_client.taken(follow) == "server"    # a worker runs it (polled; was a fixed 3 s)
    assert follow.poll() is None
    follow.send_signal(signal.SIGINT)
    _out, err = follow.communicate(timeout=30)
    assert follow.returncode == 130, err

    assert cmd_client.run("cancel", long_id).returncode == 0
    wait_for(lambda: job_state(slurm, long_id) in ("CANCELLED", ""), 60, f"job {long_id} to be cancelled")


def test_hostile_name_and_argument_through_the_server(cmd_client, jobs_env, slurm, track, tmp_path):
    for f in ("/var/tmp/gpuhpc-pwned", "/var/tmp/gpuhpc-pwned2"):
        if os.path.exists(f):
            os.unlink(f)
    res = cmd_client.run("submit", "-p", "cpu", "-t", "15m", "--name", "x; touch /var/tmp/gpuhpc-pwned", "--", "echo",
                         "$(touch /var/tmp/gpuhpc-pwned2)", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", ""), 120, f"job {job_id} to finish")
    assert not os.path.exists("/var/tmp/gpuhpc-pwned") and not os.path.exists("/var/tmp/gpuhpc-pwned2")
    assert "$(touch /var/tmp/gpuhpc-pwned2)" in cmd_client.run("logs", job_id).stdout


def test_quota_holds_through_reused_workers(cmd_client, jobs_env, slurm, track, monkeypatch):
    research_quota(monkeypatch, gpu_hours=1)
    ids = []
    for _ in range(4):                # 4 x 0.25 GPU-hours fills the quota exactly
        res = cmd_client.run("submit", "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t", "15m",
                             "-A", "research", "--hold", "--name", "gpuhpc-test-cs-quota", "--", "true")
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip())
        track(ids[-1])
    over = cmd_client.run("submit", "-p", "gpu", "--gpus", "1", "--gpu-type", "h100", "-t", "15m",
                          "-A", "research", "--hold", "--name", "gpuhpc-test-cs-over", "--", "true")
    assert over.returncode == 3 and over.stderr.startswith("error: quota exceeded") and over.stdout == ""
    assert not [r for r in slurm.queue(user="root") if r.name == "gpuhpc-test-cs-over"]
    shown = json.loads(gpuhpc("quota", "show", "--json").stdout)
    row = next(q for q in shown if q["account"] == "research" and q["user"] is None)
    assert float(row["held_gpu_hours"]) == pytest.approx(1.0)
    import sqlite3

    db = next(jobs_env.rglob("*.db"))
    with sqlite3.connect(db) as conn:
        attached = {r[0] for r in conn.execute("SELECT job_id FROM reservations WHERE job_id IS NOT NULL")}
    assert set(ids) <= attached, "every hold is attached to its job id"


def test_concurrent_submissions(cmd_client, jobs_env, track):
    def one(i: int) -> subprocess.CompletedProcess:
        return cmd_client.run("submit", "-p", "cpu", "-t", "15m", "--hold", "--name", f"gpuhpc-test-cs-par{i}",
                              "--", "true")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    for res in results:
        assert res.returncode == 0, res.stderr
        track(res.stdout.strip())
    assert len({r.stdout.strip() for r in results}) == 16


def test_jobs_see_the_callers_limits_and_group(cmd_client, jobs_env, slurm, track):
    """Slurm gives a job the resource limits of the process that ran sbatch
    (PropagateResourceLimits=ALL) and records its gid. A caller whose limits or gid differ
    from the server's is declined by the worker (its log says why) and its own process runs
    the Python CLI, so the job sees the caller's values, as with raw sbatch."""
    import grp
    import shutil
    import tempfile

    group = "gpuhpc-test-cs"
    subprocess.run(["groupadd", "-f", group], check=True)
    gid = grp.getgrnam(group).gr_gid
    out = tempfile.mkdtemp(prefix="gpuhpc-test-cs-", dir="/var/tmp")    # jobs may get a private /tmp
    probe = 'echo "nofile=$(ulimit -n) stack=$(ulimit -s) gid=$SLURM_JOB_GID" > "$0"'
    cases = {   # name: (wrapper that execs the client, the reason the server logs, what the job sees)
        "limits": (("bash", "-c", 'ulimit -n 777; ulimit -s 4321; exec "$@"', "-"),
                   "declined submit: limits: RLIMIT_STACK 4424704/4424704 != ",
                   f"nofile=777 stack=4321 gid={os.getgid()}"),
        "group": (("setpriv", f"--regid={gid}", "--keep-groups", "--"),
                  "declined submit: identity: uid/gid", f"gid={gid}"),
        "same": ((), None, f"gid={os.getgid()}"),      # served by the server: the control
    }
    try:
        for name, (wrap, declined, seen) in cases.items():
            cmd_client.start()        # (in a shared checkout, someone's edit may have stopped it)
            before = len(cmd_client.declines())
            res = cmd_client.run("submit", "-p", "cpu", "-t", "15m", "--name", f"gpuhpc-test-cs-{name}", "--",
                                 "bash", "-c", probe, f"{out}/{name}.txt", wrap=wrap)
            assert res.returncode == 0, res.stderr
            job_id = res.stdout.strip()
            track(job_id)
            new = cmd_client.declines()[before:]
            if declined:
                assert len(new) == 1 and declined in new[0], (name, new)
            else:
                assert not new, (name, new)
            wait_for(lambda: os.path.exists(f"{out}/{name}.txt") and job_state(slurm, job_id) in ("COMPLETED", ""),
                     120, f"job {job_id} ({name}) to finish")
            with open(f"{out}/{name}.txt") as fh:
                assert seen in fh.read(), name
        assert "RLIMIT_NOFILE 777/777" in "".join(cmd_client.declines())
        cmd_client.start()            # (in a shared checkout, someone's edit may have stopped it)
        assert cmd_client.who_runs() == "server"       # the control's path: the server
    finally:
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)

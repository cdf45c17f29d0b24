"""Point 10: the local cluster's defaults: a user outside gpu-hi's accounts cannot preempt
everyone with it; submissions are bounded per user (MaxSubmitJobsPerUser on the QOS); the
root-run Slurm exporter answers on loopback only; ``sweep wait --poll 0`` is refused."""
from __future__ import annotations

import subprocess
import uuid


def _sacctmgr(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=120)
    assert not check or res.returncode == 0, res.stderr or res.stdout
    return res


def test_a_user_outside_the_allowed_accounts_cannot_use_the_preempting_partition(hostile):
    acct = f"gsec{uuid.uuid4().hex[:8]}"
    _sacctmgr("add", "account", acct, "description=hostile-user test", "organization=gpuhpc")
    try:
        _sacctmgr("add", "user", hostile.name, f"account={acct}")
        res = hostile.run(["sbatch", "--parsable", "-A", acct, "-p", "gpu-hi", "--gres=gpu:h100:8", "-t", "1",
                           "-J", "gpuhpc-sec-preempt", "-o", "/dev/null", "--wrap", "true"])
        if res.returncode == 0:                      # a job was made: cancel it, then fail
            hostile.jobs.append(res.stdout.strip().split(";")[0])
        assert res.returncode != 0 and "account/partition combination" in res.stderr.lower(), res.stderr
        queued = hostile.run(["squeue", "-h", "-u", hostile.name, "-p", "gpu-hi", "-o", "%i"])
        assert queued.returncode == 0 and queued.stdout.strip() == ""
        # the same user, in the partition everyone may use, is not refused: the restriction is the partition's
        ok = hostile.run(["sbatch", "--parsable", "-A", acct, "-p", "gpu", "-t", "1", "-J", "gpuhpc-sec-ok",
                          "-o", "/dev/null", "--hold", "--wrap", "true"])
        assert ok.returncode == 0, ok.stderr
        hostile.jobs.append(ok.stdout.strip().split(";")[0])
        subprocess.run(["scancel", hostile.jobs[-1]], capture_output=True, timeout=60)
    finally:
        _sacctmgr("delete", "user", f"name={hostile.name}", f"account={acct}", check=False)
        _sacctmgr("delete", "account", acct, check=False)


def test_every_qos_bounds_submissions_per_user():
    rows = subprocess.run(["sacctmgr", "-nP", "list", "qos", "normal,low,high", "format=name,maxsubmitjobsperuser"],
                          capture_output=True, text=True, timeout=60, check=True).stdout.split()
    limits = dict(r.split("|") for r in rows)
    assert set(limits) == {"normal", "low", "high"} and all(v.isdigit() and int(v) > 0 for v in limits.values()), limits


def test_the_slurm_exporter_listens_on_loopback_only():
    out = subprocess.run(["ss", "-Htln", "sport = :9410"], capture_output=True, text=True, timeout=60,
                         check=True).stdout.split("\n")
    local = [line.split()[3] for line in out if line.strip()]
    assert local and all(a.startswith("127.") or a.startswith("[::1]") for a in local), local


def test_sweep_wait_with_no_pause_is_refused(hostile, site_python):
    res = hostile.run([site_python, "-P", "-m", "gpuhpc", "sweep", "wait", "1", "--poll", "0"])
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--poll" in res.stderr, res.stderr

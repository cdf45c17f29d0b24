"""The sweep driver is supervised (issue 21, point 5): a PostgreSQL restart under its sweep
state and a full disk under its SQLite state file are retried with a growing pause, and the same
driver job finishes the sweep once the fault is gone. (Requeueing itself after
``GPUHPC_SWEEP_DRIVER_GIVE_UP`` of nothing but errors is tests/unit/sweeps/
test_driver_supervision.py: here a requeue would cost the cluster's ``cred_expire`` (+ 1 s) and more.)
A Python callable stopped at its requeue cap ends FAILED with exit 75 and a ``requeue cap
reached`` line, as a script job does (docs/jobs.md).

Each case is a real sweep on a private controller for the module (sweeps_helpers.private_cluster_fixtures:
partitions ``cpu`` and ``all`` as the local cluster's, accounting in the shared slurmdbd; the
tests are isolated and run beside the shared-cluster stream) with state on a server or file
system of the test's own (a private PostgreSQL on a free port, a small tmpfs), so a fault
disturbs no other test. The wait on a sweep whose driver was killed is in test_sweeps_robust."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from sweeps_helpers import private_cluster_fixtures, run_sweep, write_sweep

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcswdrv"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16997, 16998, 17481          # unlike every other private cluster's
CPU = {"partition": "cpu", "time": "5m"}

private_cluster, slurm = private_cluster_fixtures(NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT))


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MiB tmpfs of the test's own, unmounted after."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0755", "gpuhpc-test-small", str(mnt)],
                   check=True, timeout=30)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, timeout=30)


def _fill(mnt: Path) -> Path:
    """Write a file until the file system is full (ENOSPC); returns it."""
    filler = mnt / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 1 << 12):
            block = b"\1" * size
            while True:
                try:
                    os.write(fd, block)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    assert shutil.disk_usage(mnt).free < 1 << 12
    return filler


def _sweep(tmp_path: Path, name: str) -> int:
    """4 quick trials (no second Python: a shell test) in arrays of 2 at parallelism 2: `sweep
    run` submits the first array and the driver job the second."""
    f = write_sweep(tmp_path / f"{name}.yaml", name=name, method="grid",
                    command="test {x} -ge 0",
                    parameters={"x": {"type": "int", "low": 0, "high": 3}}, parallelism=2, chunk_size=2,
                    resources=CPU, metric={"name": "loss", "goal": "minimize"})
    return run_sweep(f)


def _driver_log(sid: int):
    from gpuhpc.sweeps import store

    logs = Path(store.sweep_info(sid)["directory"]) / "logs"
    return lambda: "".join(p.read_text(errors="replace") for p in sorted(logs.glob("*driver*")))


def _finishes(sid: int, log) -> None:
    from gpuhpc.sweeps.api import Sweep

    assert Sweep(sid).wait(timeout=180, poll=0.5), log()
    rows = Sweep(sid).rows(refresh=False)
    assert [(r["trial"], r["state"]) for r in rows] == [(x, "completed") for x in range(4)], rows


def _done(log_text: str) -> bool:
    """The driver saw the sweep done and exited by itself (either of its two ways)."""
    return "sweep done: " in log_text or "all 4 trials finished" in log_text


def test_the_driver_retries_through_a_postgresql_restart(private_pg, sweeps, slurm: SlurmClient, tmp_path,
                                                         monkeypatch):
    """PostgreSQL stops under a running driver (its connections cut) and starts again: the
    driver logs the error, retries after a pause and finishes the sweep, in the same job run."""
    url, pg = private_pg
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "1")
    sid = _sweep(tmp_path, "t-pg")
    sweeps(sid)
    from gpuhpc.sweeps import store

    driver = store.sweep_info(sid)["driver_job_id"]
    log = _driver_log(sid)
    wait_for(lambda: f"sweep {sid}: starting" in log(), 60, f"driver job {driver} to start")
    pg("stop")
    try:
        wait_for(lambda: "retrying in" in log(), 60, "the driver to log the lost database and retry")
    finally:
        pg("start")
    _finishes(sid, log)
    text = log()
    # the lost server as the sweep tables' one data path (DB-API, issue 40.11) says it: a connection
    # it cannot open (LedgerUnwritable's line) or, cut inside a transaction, psycopg's OperationalError
    lost = "cannot connect to the ledger database" in text or "OperationalError" in text
    assert lost and _done(text[text.index("retrying in"):]), text
    assert slurm.restarts(driver) == 0, text          # retried in place, not requeued


def test_the_driver_retries_through_a_full_disk(sweep_env, small_fs, sweeps, slurm: SlurmClient, tmp_path,
                                               monkeypatch):
    """The SQLite state file's file system fills up under a running driver: its rounds fail
    ("database or disk is full") and are retried with a growing pause; once space is freed the
    driver finishes the sweep, in the same job run, and the state file is intact."""
    monkeypatch.setenv("GPUHPC_DB_URL", f"sqlite:///{small_fs / 'gpuhpc.db'}")
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "1")
    sid = _sweep(tmp_path, "t-full")
    sweeps(sid)
    from gpuhpc.sweeps import store

    driver = store.sweep_info(sid)["driver_job_id"]
    log = _driver_log(sid)
    wait_for(lambda: f"sweep {sid}: starting" in log(), 60, f"driver job {driver} to start")
    filler = _fill(small_fs)
    try:
        wait_for(lambda: "disk is full" in log(), 60, "the driver to meet the full disk")
    finally:
        filler.unlink()
    _finishes(sid, log)
    text = log()
    assert "retrying in" in text and _done(text[text.index("disk is full"):]), text
    assert slurm.restarts(driver) == 0, text          # retried in place, not requeued
    import sqlite3

    con = sqlite3.connect(small_fs / "gpuhpc.db")
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        con.close()


def test_python_callables_stopped_at_their_requeue_cap_end_failed_75(sweep_env, slurm: SlurmClient, tmp_path,
                                                                    monkeypatch):
    """gpuhpc.submit through submitit, max_requeues=0, a Checkpointable and a plain function at
    once: the first warning (SIGUSR2, as a preemption sends it) finds the cap reached, so
    neither is requeued; each ends FAILED with exit code 75 and a `requeue cap reached` line,
    never COMPLETED, as a script job at its cap does; job.result() raises."""
    import gpuhpc
    from sweeps_faults_lib import count
    from sweeps_lib import Objective

    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    monkeypatch.setenv("GPUHPC_TRIAL_DIR", str(tmp_path))          # where Objective writes its progress
    res = gpuhpc.Resources(partition="cpu", time="15m")
    jobs = {tmp_path / "progress": gpuhpc.submit(Objective(steps=3000, step_s=0.1), 1, name="gpuhpc-test-pycap75",
                                                 max_requeues=0, resources=res, grace=30),
            tmp_path / "plain": gpuhpc.submit(count, str(tmp_path / "plain"), 3000, 0.1,
                                              name="gpuhpc-test-plaincap75", max_requeues=0, resources=res, grace=30)}
    try:
        for progress, job in jobs.items():
            wait_for(lambda: progress.exists() and "step 1\n" in progress.read_text(), 90, f"job {job.job_id} to run")
            slurm.run(["scancel", "--signal=USR2", job.job_id])
        for job in jobs.values():
            wait_for(job.done, 60, f"job {job.job_id} to end at its requeue cap")
            rec = slurm.show_job(job.job_id) or {}
            log = job.logs()
            assert (rec.get("JobState"), rec.get("ExitCode"), rec.get("Restarts")) == ("FAILED", "75:0", "0"), \
                (rec, log)
            assert "gpuhpc: requeue cap reached: already requeued 0 times" in log, log
            with pytest.raises(Exception, match="requeue"):
                job.result(timeout=30)
    finally:
        for job in jobs.values():
            slurm.cancel(job.job_id)

"""Python mode from a laptop (this process) through the real sshd: a callable from the
repository's own module runs from the code snapshot and its result comes back over SFTP; a
closure is pickled by value; the cluster's Python is checked before anything is sent. The requeue
and the 20-trial sweep reach a private controller behind the same sshd (``private_login``)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuhpc import submit
from gpuhpc.errors import UserInputError
from gpuhpc.jobs.api import JobFailed
from polling import wait_for

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"}


@pytest.fixture
def on_laptop(laptop, tmp_path, monkeypatch):
    for k, v in laptop.env.items():
        monkeypatch.setenv(k, v)
    repo = tmp_path / "proj"
    repo.mkdir()
    (repo / "lapmod_helper.py").write_text("import os\n\ndef double(x):\n    return 2 * x, os.environ['GPUHPC_SNAPSHOT']\n")
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "v1"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=GIT_ENV)
    (repo / "lapmod_helper.py").write_text("import os\n\ndef double(x):\n    return 3 * x, os.environ['GPUHPC_SNAPSHOT']\n")
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    yield laptop
    sys.modules.pop("lapmod_helper", None)


def test_a_callable_runs_on_the_cluster_and_returns_its_result(on_laptop, tmp_path):
    import lapmod_helper

    res = {"partition": "cpu", "time": "5m"}
    job = submit(lapmod_helper.double, 7, resources=res, cluster="lab")
    closure_base = 100
    job2 = submit(lambda y: (y + closure_base, os.environ.get("GPUHPC_PYTHON")), 1, resources=res, cluster="lab",
                  name="closure")
    failing = submit(lambda: 1 / 0, resources=res, cluster="lab", name="failing")
    try:
        value, snap = job.result(timeout=180)
        assert value == 21                                  # the uncommitted change ran
        assert snap.startswith(str(on_laptop.remote / "snapshots"))
        assert job2.result(timeout=180) == (101, on_laptop.python)     # gpuhpc's helpers: the cluster's Python
        with pytest.raises(JobFailed, match="ZeroDivisionError"):
            failing.result(timeout=180)
    finally:
        for j in (job, job2, failing):
            j.cancel()


def test_a_different_python_minor_is_refused_before_submitting(on_laptop):
    import shutil
    import tempfile

    where = tempfile.mkdtemp(prefix="gpuhpc-python-old-", dir="/var/tmp")     # one the laptop user can run
    fake = os.path.join(where, "python")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 3.8\n")
    os.chmod(where, 0o755)
    os.chmod(fake, 0o755)
    on_laptop.profile("lab", python=fake)
    try:
        with pytest.raises(UserInputError) as err:
            submit(print, "x", resources={"partition": "cpu", "time": "5m"}, cluster="lab")
    finally:
        shutil.rmtree(where)
    assert f"Python {sys.version_info[0]}.{sys.version_info[1]} here but 3.8 on the cluster" in err.value.one_line()
    assert not on_laptop.remote.exists()                    # nothing was sent


COUNTER = '''
import time

from gpuhpc.jobs.checkpoint import Checkpointable


class Counter(Checkpointable):
    def __init__(self):
        self.step = 0

    def __call__(self, steps, progress):
        with open(progress, "a", buffering=1) as log:
            log.write(f"start {self.restarts} {self.step}\\n")
            while self.step < steps:
                time.sleep(0 if self.restarts else 0.25)     # the run after the requeue: at once
                self.step += 1
                log.write(f"step {self.step}\\n")
        return self.step
'''


@pytest.mark.isolated                       # a private controller only
def test_a_checkpointable_survives_a_requeue_as_in_local_python_mode(private_login, on_laptop, tmp_path):
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport.local import LocalRunner

    (tmp_path / "proj" / "lapmod_counter.py").write_text(COUNTER)
    import lapmod_counter

    progress = on_laptop.remote / "progress.log"             # written by the job, as the laptop user
    job = submit(lapmod_counter.Counter(), 60, str(progress), resources={"partition": "cpu", "time": "10m"},
                 cluster="lab", name="laptop-counter", grace=30)
    slurm = SlurmClient(LocalRunner())
    try:
        wait_for(lambda: progress.exists() and progress.read_text().count("step ") >= 8, 90,
                 f"job {job.job_id} to take 8 steps")
        slurm.requeue(job.job_id)
        assert job.result(timeout=240) == 60
        starts = [ln.split() for ln in progress.read_text().splitlines() if ln.startswith("start")]
        assert len(starts) == 2 and starts[0] == ["start", "0", "0"]
        assert starts[1][1] == "1" and int(starts[1][2]) >= 8        # resumed, not restarted
    finally:
        job.cancel()


@pytest.mark.isolated                       # a private controller only
def test_a_20_trial_sweep_from_the_laptop_gives_best(private_login, on_laptop, tmp_path):
    import gpuhpc

    offset = 7

    def objective(x):
        return float((x - offset) ** 2)

    sw = gpuhpc.sweep(objective, {"x": {"type": "int", "low": 0, "high": 19}}, method="grid", parallelism=10,
                      metric={"name": "objective", "goal": "minimize"}, name="laptop-sweep",
                      resources={"partition": "cpu", "time": "5m"}, cluster="lab",
                      driver_resources={"partition": "cpu", "time": "15m"},
                      driver_env={"GPUHPC_DATA_DIR": str(on_laptop.remote / "cluster-data"), "GPUHPC_LEDGER": "off",
                                  "GPUHPC_SWEEP_DRIVER_POLL": "2"})
    try:
        assert sw.wait(timeout=400) is True
        assert sw.results() == [float((x - 7) ** 2) for x in range(20)]
        best = sw.best()
        assert best["trial"] == 7, best
    finally:
        sw.cancel()                         # the driver (its trials are 5-minute jobs at most)


@pytest.mark.isolated                       # a private controller only
def test_a_laptop_sweep_is_made_once_and_a_requeue_of_its_driver_follows_the_same_sweep(private_login, on_laptop):
    """The sweep exists (its id known) when gpuhpc.sweep returns; its driver job, requeued while
    the trials run (held there by a gate file), runs again and follows that same sweep: one
    sweep row, each trial started once."""
    import sqlite3
    import threading

    from polling import wait_for

    import gpuhpc
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport.local import LocalRunner

    data, gate, started = on_laptop.remote / "cluster-data", str(on_laptop.remote / "gate"), \
        str(on_laptop.remote / "started.log")

    def objective(x):
        import os
        import time

        with open(started, "a") as f:
            f.write(f"{x}\n")
        while not os.path.exists(gate):     # held until the test has requeued the driver
            time.sleep(0.2)
        return float(x)

    sw = gpuhpc.sweep(objective, {"x": [0, 1, 2, 3]}, method="grid", parallelism=4, name="laptop-once",
                      metric={"name": "objective", "goal": "maximize"}, resources={"partition": "cpu", "time": "5m"},
                      cluster="lab", driver_resources={"partition": "cpu", "time": "10m"},
                      driver_env={"GPUHPC_DATA_DIR": str(data), "GPUHPC_LEDGER": "off", "GPUHPC_SWEEP_DRIVER_POLL": "2"})
    slurm = SlurmClient(LocalRunner())

    def sweeps():
        with sqlite3.connect(data / "ledger.db") as db:
            return db.execute("SELECT id, n_trials FROM sweeps ORDER BY id").fetchall()

    def driver() -> dict:
        return slurm.show_job(sw.job.job_id) or {}

    try:
        got: dict = {}                      # the id without waiting for the driver (which the gate holds)
        threading.Thread(target=lambda: got.setdefault("id", sw.id), daemon=True).start()
        sid = wait_for(lambda: got.get("id"), 60, "RemoteSweep.id while the sweep runs")
        assert sweeps() == [(sid, 4)]               # made before gpuhpc.sweep returned
        wait_for(lambda: os.path.exists(started) and driver().get("JobState") == "RUNNING", 120,
                 lambda: f"a trial and the driver running (driver: {driver().get('JobState')})")
        slurm.requeue(sw.job.job_id)
        wait_for(lambda: driver().get("Restarts") == "1" and driver().get("JobState") == "RUNNING", 120,
                 lambda: f"the requeued driver running again ({driver().get('JobState')})")
        open(gate, "w").close()
        assert sw.wait(timeout=300) is True
        assert sw.results() == [0.0, 1.0, 2.0, 3.0]
        assert sweeps() == [(sid, 4)]               # the rerun made no second sweep
        with open(started) as f:
            assert sorted(f.read().split()) == ["0", "1", "2", "3"]     # each trial started once
        log = open(sw.job.remote_call.log).read()
        assert f"following sweep {sid} (run 2)" in log, log
    finally:
        open(gate, "w").close()
        sw.cancel()

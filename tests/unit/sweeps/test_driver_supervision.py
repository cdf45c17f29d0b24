"""The sweep driver survives errors of any kind (database, OS, Slurm): it retries with a growing
pause, and after too long it requeues its own job (issue 21, point 5)."""
from __future__ import annotations

import sqlite3

import pytest

from gpuhpc.sweeps import driver, store, submission


class _Client:
    def __init__(self) -> None:
        self.requeued: list[str] = []

    def requeue(self, job_id: str) -> None:
        self.requeued.append(job_id)


def _setup(monkeypatch, errors: list[BaseException]):
    client = _Client()
    monkeypatch.setattr(store, "slurm_client", lambda *a, **k: client)
    monkeypatch.setattr(submission, "recover", lambda *a, **k: None)
    calls = []

    def step(sid, c, url, limits):
        calls.append(sid)
        if errors:
            raise errors.pop(0)
        return True

    monkeypatch.setattr(driver, "_step", step)
    monkeypatch.setattr(driver.time, "sleep", lambda s: None)
    return client, calls


def test_database_and_os_errors_are_retried(monkeypatch):
    client, calls = _setup(monkeypatch, [sqlite3.OperationalError("database is locked"), OSError(28, "No space left"),
                                         RuntimeError("anything")])
    assert driver.run(7, poll=0.01) == 0
    assert len(calls) == 4 and client.requeued == []


def test_a_driver_failing_for_too_long_requeues_its_own_job(monkeypatch):
    client, calls = _setup(monkeypatch, [OSError("disk full")] * 10)
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_GIVE_UP", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert driver.run(7, poll=0.01) == 0
    assert client.requeued == ["4242"]
    monkeypatch.delenv("SLURM_JOB_ID")
    assert driver.run(7, poll=0.01) == 1            # outside Slurm: exit 1, for whoever runs it


def test_a_fatal_error_outside_the_loop_requeues_the_driver_a_few_times(monkeypatch):
    client = _Client()
    monkeypatch.setattr(store, "slurm_client", lambda *a, **k: client)

    def run(sid):
        raise RuntimeError("cannot start")

    monkeypatch.setattr(driver, "run", run)
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    assert driver.main(["7"]) == 0 and client.requeued == ["4243"]
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(driver.MAX_FATAL_REQUEUES))
    assert driver.main(["7"]) == 1 and client.requeued == ["4243"]     # then it ends: `sweep wait` says so


@pytest.mark.parametrize("paced, draining, want", [
    (True, False, 40.0),        # a slot is expected in 60 s: 4 polls, not every poll
    (True, True, 40.0),         # the draining floor does not shorten an expected wait
    (False, False, 10.0),       # a pruner or fail_fast reads progress: every poll
    (False, True, 2.0),         # ... and while an array drains, every couple of seconds
])
def test_the_driver_asks_again_when_a_slot_is_expected_to_free(monkeypatch, paced, draining, want):
    from gpuhpc.sweeps import refresh
    from gpuhpc.sweeps.pacing import Pace

    client = _Client()
    monkeypatch.setattr(store, "slurm_client", lambda *a, **k: client)
    monkeypatch.setattr(submission, "recover", lambda *a, **k: None)
    monkeypatch.setattr(store, "draining", lambda sid, url=None: draining)
    pace = Pace()
    pace.saw(ended=[60.0], running=[0.0, 0.0], pending=0)
    monkeypatch.setitem(refresh.PACES, 7, pace)
    rounds = iter([False, True])

    def step(sid, c, url, memo):
        memo["paced"] = paced
        return next(rounds)

    slept: list[float] = []
    monkeypatch.setattr(driver, "_step", step)
    monkeypatch.setattr(driver.time, "sleep", slept.append)
    assert driver.run(7, poll=10.0) == 0
    assert slept == [pytest.approx(want, abs=0.5)]

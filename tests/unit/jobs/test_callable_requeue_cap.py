"""The requeue cap of a Python callable (gpuhpc.submit through submitit): below it a preemption's
SIGUSR2 requeues, a time-out does not requeue a plain function, and at the cap the job is not
requeued and ends with exit code 75, as a script job does (docs/jobs.md)."""
from __future__ import annotations

import os
import time

import pytest

from gpuhpc.jobs import submitit_adapters as adapters
from gpuhpc.jobs.checkpoint import Checkpointable


@pytest.fixture
def exits(monkeypatch):
    codes: list[int] = []
    monkeypatch.setattr(adapters, "_exit_code_at_exit", codes.append)     # never os._exit in pytest
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("GPUHPC_RESTART_COUNT", raising=False)
    return codes


def test_a_plain_callable_is_requeued_by_a_preemption_below_the_cap(monkeypatch, exits):
    plain = adapters.SubmititPlain(len, 2, 3600)
    plain.started = time.time()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = plain.checkpoint([1, 2])
    assert again is not None and again.function is plain and again.args == ([1, 2],) and exits == []
    plain.started = time.time() - 3000                  # near the time limit: a time-out, not requeued
    assert plain.checkpoint([1, 2]) is None and exits == []


def test_at_the_cap_neither_kind_is_requeued_and_the_job_exits_75(monkeypatch, exits, capsys):
    class Work(Checkpointable):
        def __call__(self):
            return 1

    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    plain = adapters.SubmititPlain(len, 2, 3600)
    plain.started = time.time()
    assert plain.checkpoint([]) is None
    assert adapters.SubmititCallable(Work(), 2).checkpoint() is None
    assert exits == [os.EX_TEMPFAIL] * 2 == [75, 75]
    assert capsys.readouterr().out.count("gpuhpc: requeue cap reached: already requeued 2 times") == 2

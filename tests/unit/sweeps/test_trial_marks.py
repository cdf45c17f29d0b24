"""A trial tells the driver it ended through the sweep directory (no Slurm query), and the
driver asks squeue less while nothing changes (issue 21, calm polling)."""
from __future__ import annotations

import json
import signal

import pytest

from gpuhpc.sweeps import driver, trial


@pytest.fixture
def task(monkeypatch):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_program_that_exits_by_itself_leaves_an_end_mark_with_its_exit_code(tmp_path, task):
    assert trial.run_command(tmp_path, "exit 3") == 3
    assert json.loads((tmp_path / "ends" / "77_3").read_text()) == {"rc": 3, "restarts": 2}
    assert [p.name for p in (tmp_path / "ends").iterdir()] == ["77_3"]        # no temporary left


def test_a_signalled_trial_leaves_no_end_mark(tmp_path, task):
    """The job script signals the trial's whole process group (a preemption warning, a time
    limit, scancel) and may requeue it: only Slurm's record says how it ended."""
    assert trial.run_command(tmp_path, "kill -USR2 $PPID; exit 0") == 0
    assert not (tmp_path / "ends").exists()


def test_squeue_is_asked_less_while_it_tells_nothing_new():
    s = driver.Schedule(5.0)
    assert s.ask_slurm(1, None)                     # the first round asks
    gaps = []
    for _ in range(6):
        s.asked(told=False)
        gaps.append(s.gap)
    assert gaps == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0] and not s.ask_slurm(1, None)
    s.asked(told=True)
    assert s.gap == 5.0
    pauses = [s.round_done(changed=False) for _ in range(4)]
    assert pauses == [10.0, 15.0, 15.0, 15.0]       # under the 6 polls after which a driver counts as dead
    assert s.round_done(changed=True) == 5.0

"""Polling by expectation (issue 32.5): a sweep's follower asks Slurm again when a running trial is
expected to end, from the run times seen so far, at most every poll and at least every 4 polls."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial
from gpuhpc.slurm.state import SlurmState
from gpuhpc.sweeps import refresh, store
from gpuhpc.sweeps.pacing import Pace, next_free_in, pause
from gpuhpc.sweeps.spec import SweepSpec, spec_json


def _pace(durations, running, at=100.0) -> Pace:
    p = Pace()
    p.saw(ended=durations, running=running, pending=0, at=at)
    return p


def test_nothing_is_expected_before_a_trial_ended_or_while_none_runs():
    assert next_free_in(None) is None
    assert next_free_in(_pace([], [5.0])) is None            # no run time seen yet
    assert next_free_in(_pace([60.0], [])) is None           # nothing running: a pending one may start any time
    assert pause(_pace([], [5.0]), 10.0) == 10.0             # then: every poll


def test_the_first_running_trial_to_end_by_the_median_run_time():
    p = _pace([50.0, 60.0, 300.0], [10.0, 25.0], at=100.0)  # median 60: the one at 25 s ends in 35 s
    assert next_free_in(p, now=100.0) == pytest.approx(35.0)
    assert next_free_in(p, now=110.0) == pytest.approx(25.0)  # time since the refresh counts
    assert next_free_in(p, now=200.0) == 0.0                 # overdue: at once


def test_the_pause_is_at_least_a_poll_and_at_most_four():
    assert pause(_pace([60.0], [25.0], at=0.0), 5.0, now=0.0) == pytest.approx(20.0)   # 35 s away: 4 polls
    assert pause(_pace([60.0], [25.0], at=0.0), 10.0, now=0.0) == pytest.approx(35.0)  # within 4 polls: then
    assert pause(_pace([60.0], [59.0], at=0.0), 10.0, now=0.0) == 10.0                  # 1 s away: one poll
    assert pause(_pace([60.0], [59.0], at=0.0), 10.0, floor=2.0, now=0.0) == 2.0        # a draining array's floor
    assert pause(_pace([60.0], [0.0], at=0.0), 10.0, floor=10.0, most=10.0, now=0.0) == 10.0   # pruner: every poll


SPEC = {"name": "p", "command": "echo {x}", "parameters": {"x": {"type": "int", "low": 0, "high": 3}},
        "method": "grid", "parallelism": 2, "resources": {"partition": "cpu", "time": "5m"},
        "metric": {"name": "loss", "goal": "minimize"}}


class _Client:
    """Array 700: round 1 both tasks run (0:40 and 0:10); round 2 task 0 has COMPLETED after 0:45."""

    def __init__(self) -> None:
        self.round = 1

    def queue(self, job_ids=()):
        rows = {1: [(0, "RUNNING", "0:40"), (1, "RUNNING", "0:10")],
                2: [(0, "COMPLETED", "0:45"), (1, "RUNNING", "0:15")]}[self.round]
        return [SimpleNamespace(job_id=f"700_{t}", array_job_id="700", array_task_id=str(t),
                                state=SlurmState.parse(st), elapsed=el) for t, st, el in rows]

    def accounting(self, job_ids=(), duplicates=False):
        return []


def test_a_refresh_notes_the_run_times_it_sees(tmp_path):
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(url)
    with db.session_scope(url) as s:
        sw = Sweep(name="p", user_name="u", cluster="c", spec=spec_json(SweepSpec.from_mapping(SPEC)),
                   status="running", directory=str(tmp_path), n_trials=2)
        s.add(sw)
        s.flush()
        ch = SweepChunk(sweep_id=sw.id, number=0, job_id="700", n_tasks=2, trials="[0, 1]", state="submitted")
        s.add(ch)
        s.flush()
        for t in (0, 1):
            s.add(SweepTrial(sweep_id=sw.id, number=t, params=f'{{"x": {t}}}', state="running", chunk_id=ch.id,
                             task_id=t, job_id=f"700_{t}", raw_state="RUNNING"))
        sid = sw.id
    c = _Client()
    refresh.refresh(sid, client=c, url=url)
    p = refresh.pace_of(sid)
    assert p.durations == [] and sorted(p.running) == [10.0, 40.0]
    c.round = 2
    refresh.refresh(sid, client=c, url=url)
    p = refresh.pace_of(sid)
    assert p.durations == [45.0] and p.running == (15.0,)          # the ended one's run time, once
    refresh.refresh(sid, client=c, url=url)
    assert refresh.pace_of(sid).durations == [45.0]
    assert next_free_in(p, now=p.at) == pytest.approx(30.0)

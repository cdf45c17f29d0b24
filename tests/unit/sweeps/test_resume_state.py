"""A trial that ``resume`` gave back (``waiting``) belongs to no array until it is submitted
again: the record of the array it ran in before (cancelled) is never read as its own. CI saw
the race this closes: trials resumed beyond the first chunk were turned ``cancelled`` by the
next refresh, from their old array's sacct rows, and ``sweep wait`` exited 1."""
from __future__ import annotations

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial
from gpuhpc.sweeps import refresh, store
from gpuhpc.sweeps.spec import SweepSpec, spec_json

SPEC = {"name": "r", "command": "echo {x}", "parameters": {"x": {"type": "int", "low": 0, "high": 3}},
        "method": "grid", "parallelism": 2, "resources": {"partition": "cpu", "time": "5m"},
        "metric": {"name": "loss", "goal": "minimize"}}


class _Client:
    """Records every job id squeue and sacct are asked about; the queue and accounting are empty."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def queue(self, job_ids=()):
        self.asked += list(job_ids)
        return []

    def accounting(self, job_ids=(), duplicates=False):
        self.asked += list(job_ids)
        return []


def _sweep(url: str, tmp_path, state: str) -> int:
    with db.session_scope(url) as s:
        sw = Sweep(name="r", user_name="u", cluster="c", spec=spec_json(SweepSpec.from_mapping(SPEC)),
                   status="running", directory=str(tmp_path), n_trials=1)
        s.add(sw)
        s.flush()
        ch = SweepChunk(sweep_id=sw.id, number=0, job_id="500", n_tasks=1, trials="[0]", state="submitted")
        s.add(ch)
        s.flush()
        s.add(SweepTrial(sweep_id=sw.id, number=0, params='{"x": 0}', state=state, chunk_id=ch.id, task_id=0,
                         job_id="500_0", raw_state="CANCELLED"))
        return sw.id


@pytest.mark.parametrize("state, asked", [("waiting", False), ("pending", True)])
def test_only_a_trial_with_a_task_now_is_followed_in_its_array(tmp_path, state, asked):
    """waiting (given back by a resume): its old array is never asked about and it stays waiting;
    pending, with the same rows otherwise: followed in its array (the guard is the state)."""
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(url)
    sid = _sweep(url, tmp_path, state)
    c = _Client()
    refresh.refresh(sid, client=c, url=url)
    assert ("500" in c.asked) is asked, c.asked
    if not asked:
        assert c.asked == [] and [r["state"] for r in store.trial_rows(sid, url=url)] == ["waiting"]

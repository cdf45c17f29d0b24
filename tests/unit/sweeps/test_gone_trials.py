"""A trial that neither squeue nor sacct has shown for 5 minutes (issue 32.3: a lagging
slurmdbd) is decided only after one direct ``sacct -j ARRAY``, and never failed when its
metrics file says it finished."""
from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial
from gpuhpc.slurm.state import SlurmState
from gpuhpc.sweeps import refresh, store
from gpuhpc.sweeps.state import TrialState
from gpuhpc.sweeps.spec import SweepSpec, spec_json

SPEC = {"name": "g", "command": "echo {x}", "parameters": {"x": {"type": "int", "low": 0, "high": 3}},
        "method": "grid", "parallelism": 2, "resources": {"partition": "cpu", "time": "5m"},
        "metric": {"name": "loss", "goal": "minimize"}}


def _row(state: str, task: int = 0, job: str = "500"):
    return SimpleNamespace(job_id=f"{job}_{task}", array_job_id=job, array_task_id=str(task), job_id_raw="501",
                           state=SlurmState.parse(state), exit_code="0:0", elapsed_s=3, gpus={})


@pytest.mark.parametrize("runs, rng, finished, had_runs, want", [
    ([_row("COMPLETED")], None, False, False, TrialState.COMPLETED),      # the direct query has it
    ([_row("REQUEUED"), _row("FAILED")], None, True, True, TrialState.FAILED),   # accounting's word wins
    ([], _row("CANCELLED"), False, False, TrialState.CANCELLED),           # a cancelled pending range
    ([], None, True, False, TrialState.COMPLETED),                         # its metrics say it finished
    ([_row("RUNNING")], None, True, True, TrialState.COMPLETED),            # lost end record, finished
    ([_row("RUNNING")], None, False, True, TrialState.FAILED),
    ([], None, False, False, TrialState.CANCELLED),                        # never known to accounting
])
def test_the_verdict(runs, rng, finished, had_runs, want):
    st, raw = refresh.gone_verdict(runs, rng, finished, had_runs)
    assert st is want and len(raw) <= 64


class _Client:
    """Not in the queue; the routine per-task sacct knows nothing; the direct ``sacct -j 500``
    returns ``direct``."""

    def __init__(self, direct: list) -> None:
        self.direct, self.asked = direct, []

    def queue(self, job_ids=()):
        return []

    def accounting(self, job_ids=(), duplicates=False):
        self.asked.append(list(job_ids))
        return self.direct if list(job_ids) == ["500"] else []


def _gone_trial(url: str, tmp_path) -> int:
    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=10)
    with db.session_scope(url) as s:
        sw = Sweep(name="g", user_name="u", cluster="c", spec=spec_json(SweepSpec.from_mapping(SPEC)),
                   status="running", directory=str(tmp_path), n_trials=1)
        s.add(sw)
        s.flush()
        ch = SweepChunk(sweep_id=sw.id, number=0, job_id="500", n_tasks=1, trials="[0]", state="submitted",
                        created_at=old)
        s.add(ch)
        s.flush()
        s.add(SweepTrial(sweep_id=sw.id, number=0, params='{"x": 0}', state="running", chunk_id=ch.id, task_id=0,
                         job_id="500_0", raw_state="gone from the queue", updated_at=old))
        return sw.id


@pytest.mark.parametrize("direct, metrics, want", [
    ([_row("COMPLETED")], None, "completed"),       # slurmdbd lagged: the direct query has it
    ([], {"loss": 0.5}, "completed"),               # no record anywhere, but its metrics file has the metric
    ([], None, "cancelled"),                        # nothing anywhere: as before
])
def test_a_gone_trial_is_confirmed_before_it_is_ended(tmp_path, direct, metrics, want):
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(url)
    sid = _gone_trial(url, tmp_path)
    if metrics is not None:
        (tmp_path / "trials" / "0").mkdir(parents=True)
        (tmp_path / "trials" / "0" / "metrics.jsonl").write_text(json.dumps({"metrics": metrics}) + "\n")
    c = _Client(direct)
    refresh.refresh(sid, client=c, url=url)
    row = store.trial_rows(sid, url=url)[0]
    assert row["state"] == want, row
    assert c.asked.count(["500"]) == 1, c.asked          # one direct query of the array
    if metrics is not None:
        assert row["objective"] == 0.5

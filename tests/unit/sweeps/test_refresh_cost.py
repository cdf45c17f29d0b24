"""A refresh round (the driver's, every few seconds) costs what is live, not the sweep's size
(issue 32.4): it loads only the trials not yet finished and opens only their metrics files; a
finished trial's file (even one without the metric) is read once, in the round it finished."""
from __future__ import annotations

import json
from types import SimpleNamespace

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial
from gpuhpc.slurm.state import SlurmState
from gpuhpc.sweeps import metrics, queries, refresh, store
from gpuhpc.sweeps.spec import SweepSpec, spec_json

N_DONE = 300
SPEC = {"name": "c", "command": "echo {x}", "parameters": {"x": {"type": "int", "low": 0, "high": N_DONE + 1}},
        "method": "grid", "parallelism": 2, "resources": {"partition": "cpu", "time": "5m"},
        "metric": {"name": "loss", "goal": "minimize"}}


class _Client:
    """Array 900: task 0 runs throughout; task 1 runs in round 1 and has COMPLETED from round 2."""

    def __init__(self) -> None:
        self.round = 1

    def queue(self, job_ids=()):
        tasks = (0, 1) if self.round == 1 else (0,)
        return [SimpleNamespace(job_id=f"900_{t}", array_job_id="900", array_task_id=str(t),
                                state=SlurmState.parse("RUNNING")) for t in tasks]

    def accounting(self, job_ids=(), duplicates=False):
        return [SimpleNamespace(job_id="900_1", array_job_id="900", array_task_id="1", job_id_raw="902",
                                state=SlurmState.parse("COMPLETED"), exit_code="0:0", elapsed_s=2, gpus={})]


def _sweep(url: str, tmp_path) -> int:
    with db.session_scope(url) as s:
        sw = Sweep(name="c", user_name="u", cluster="c", spec=spec_json(SweepSpec.from_mapping(SPEC)),
                   status="running", directory=str(tmp_path), n_trials=N_DONE + 2)
        s.add(sw)
        s.flush()
        old = SweepChunk(sweep_id=sw.id, number=0, job_id="800", n_tasks=N_DONE, trials="[]", state="submitted")
        ch = SweepChunk(sweep_id=sw.id, number=1, job_id="900", n_tasks=2, trials="[]", state="submitted")
        s.add_all([old, ch])
        s.flush()
        for i in range(N_DONE):         # finished, and without the metric (its files say nothing)
            s.add(SweepTrial(sweep_id=sw.id, number=i, params=f'{{"x": {i}}}', state="completed", chunk_id=old.id,
                             task_id=i, job_id=f"800_{i}", raw_state="COMPLETED"))
        for t in (0, 1):
            s.add(SweepTrial(sweep_id=sw.id, number=N_DONE + t, params=f'{{"x": {N_DONE + t}}}', state="running",
                             chunk_id=ch.id, task_id=t, job_id=f"900_{t}", raw_state="RUNNING"))
        sid = sw.id
    for i in range(N_DONE + 2):
        d = tmp_path / "trials" / str(i)
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text(json.dumps({"metrics": {"other": 1.0}}) + "\n")
    return sid


def test_a_round_loads_and_reads_only_live_trials(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(url)
    sid = _sweep(url, tmp_path)
    loaded: list[int] = []
    opened: list[str] = []
    real_open = open

    def counting_open(path, *args, **kwargs):
        if str(path).endswith("metrics.jsonl"):
            opened.append(str(path).split("/trials/")[1].split("/")[0])
        return real_open(path, *args, **kwargs)

    real_trials = queries.trials

    def counting_trials(tx, sid, **kw):     # every trial row read from the database
        got = real_trials(tx, sid, **kw)
        loaded.extend(t.number for t in got)
        return got

    monkeypatch.setattr(metrics, "open", counting_open, raising=False)
    monkeypatch.setattr(queries, "trials", counting_trials)
    c = _Client()
    per_round = []
    for r in (1, 2, 3):
        c.round = r
        loaded.clear()
        opened.clear()
        counts = refresh.refresh(sid, client=c, url=url)
        per_round.append((sorted(loaded), sorted(opened), counts))
    a, b = str(N_DONE), str(N_DONE + 1)
    # round 1: both live trials; round 2: trial N_DONE+1 finishes (its file read once more);
    # round 3: only the one still running
    assert per_round[0][:2] == ([N_DONE, N_DONE + 1], [a, b]), per_round[0][:2]
    assert per_round[1][:2] == ([N_DONE, N_DONE + 1], [a, b]), per_round[1][:2]
    assert per_round[2][:2] == ([N_DONE], [a]), per_round[2][:2]
    assert per_round[0][2] == {"completed": N_DONE, "running": 2}
    assert per_round[2][2] == {"completed": N_DONE + 1, "running": 1}

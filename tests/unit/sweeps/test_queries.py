"""The sweep tables' named queries (:mod:`gpuhpc.sweeps.queries`) on a migrated SQLite file:
typed rows back, the values stored as the ledger's ORM stores and reads them (both layers
share the tables), and the writes the sweep code makes."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial
from gpuhpc.sweeps import queries, store
from gpuhpc.sweeps.state import ChunkState, SweepStatus, TrialState

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture
def url(tmp_path):
    u = f"sqlite:///{tmp_path / 'sweeps.db'}"
    db.upgrade(u)
    return u


def _seed(url) -> int:
    """A sweep (ORM-written, as the ledger's admin tools would): 2 chunks, 4 trials."""
    with db.session_scope(url) as s:
        sw = Sweep(name="q", user_name="u", cluster="c", spec="{}", status="running", directory="/d", n_trials=4,
                   created_at=T0, updated_at=T0)
        s.add(sw)
        s.flush()
        c1 = SweepChunk(sweep_id=sw.id, number=1, job_id=None, n_tasks=1, trials="[3]", state="submitting",
                        created_at=T0)
        c0 = SweepChunk(sweep_id=sw.id, number=0, job_id="70", n_tasks=2, trials="[0, 1]", state="submitted",
                        created_at=T0)
        s.add_all([c1, c0])
        s.flush()
        s.add_all([SweepTrial(sweep_id=sw.id, number=1, params='{"x": 1}', state="running", chunk_id=c0.id, task_id=1,
                              job_id="70_1", gpu_hours=Decimal("1.250000"), objective=0.5, updated_at=T0),
                   SweepTrial(sweep_id=sw.id, number=0, params='{"x": 0}', state="completed", chunk_id=c0.id,
                              task_id=0, job_id="70_0", job_id_raw="71", gpu_hours=Decimal("0.333333"),
                              updated_at=T0),
                   SweepTrial(sweep_id=sw.id, number=3, params='{"x": 3}', state="pending", chunk_id=c1.id,
                              updated_at=T0),
                   SweepTrial(sweep_id=sw.id, number=2, params='{"x": 2}', state="waiting", updated_at=T0)])
        return sw.id


def test_reads_return_typed_rows_as_the_orm_stored_them(url):
    sid = _seed(url)
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            sw = queries.sweep(tx, sid)
            assert queries.sweep(tx, sid + 1) is None
            chunks = queries.chunks(tx, sid)
            submitting = queries.chunks(tx, sid, state=ChunkState.SUBMITTING)
            trials = queries.trials(tx, sid)
            live = queries.trials(tx, sid, not_in=[st for st in TrialState if st.is_terminal])
            redo = queries.trials(tx, sid, states=(TrialState.WAITING, TrialState.FAILED))
            done = queries.state_counts(tx, sid, states=[TrialState.COMPLETED, TrialState.FAILED])
            counts = queries.state_counts(tx, sid)
            n, last = queries.trial_count(tx, sid), queries.last_trial_number(tx, sid)
    finally:
        conn.close()
    assert isinstance(sw, queries.SweepRecord)
    assert (sw.id, sw.name, sw.status, sw.n_trials, sw.driver_job_id, sw.kind) == (sid, "q", "running", 4, None,
                                                                                    "command")
    assert sw.created_at == T0 and sw.updated_at == T0 and sw.updated_at.tzinfo is not None
    assert [(c.number, c.job_id, c.state) for c in chunks] == [(0, "70", "submitted"), (1, None, "submitting")]
    assert [c.number for c in submitting] == [1] and submitting[0].created_at == T0
    assert [t.number for t in trials] == [0, 1, 2, 3]          # trial order, whatever the insert order
    t0, t1 = trials[0], trials[1]
    assert isinstance(t0, queries.TrialRecord)
    assert (t0.gpu_hours, t1.gpu_hours) == (Decimal("0.333333"), Decimal("1.250000"))
    assert isinstance(t0.gpu_hours, Decimal) and t1.objective == 0.5 and t0.objective is None
    assert (t0.job_id_raw, t1.task_id, t1.updated_at) == ("71", 1, T0)
    assert [t.number for t in live] == [1, 2, 3]
    assert [t.number for t in redo] == [2]
    assert done == {"completed": 1}
    assert counts == {"completed": 1, "running": 1, "pending": 1, "waiting": 1}
    assert (n, last) == (4, 3)


def test_writes_are_read_back_by_the_orm(url):
    sid = _seed(url)
    t1 = dt.datetime(2026, 3, 2, 8, 30, tzinfo=UTC)
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            tid = next(t.id for t in queries.trials(tx, sid) if t.number == 1)
            queries.update_trial(tx, tid, state=TrialState.COMPLETED.value, raw_state="COMPLETED",
                                 gpu_hours=Decimal(7) / 3, objective=0.25, updated_at=t1)
            queries.update_sweep(tx, sid, status=SweepStatus.DONE.value, message=None, updated_at=t1)
            queries.add_trials(tx, sid, 4, [{"x": 5}, {"x": 4}], t1)
            chunk = queries.chunks(tx, sid, state=ChunkState.SUBMITTING)[0]
            queries.fail_chunk(tx, sid, chunk.id)            # its trial (no job) waits again, still in it
            t3 = queries.trials(tx, sid, states=[TrialState.WAITING])
            assert [(t.number, t.chunk_id) for t in t3 if t.number == 3] == [(3, chunk.id)]
            queries.wait_again(tx, sid, [3], t1)
            with pytest.raises(ValueError, match="not a column"):
                queries.update_trial(tx, tid, **{"state = 'x', number": 1})
    finally:
        conn.close()
    with db.session_scope(url) as s:
        sw = s.get(Sweep, sid)
        assert (sw.status, sw.updated_at) == ("done", t1)
        rows = {t.number: t for t in s.query(SweepTrial).filter_by(sweep_id=sid)}
        ch = s.query(SweepChunk).filter_by(sweep_id=sid, number=1).one()
    assert (rows[1].state, rows[1].gpu_hours, rows[1].objective, rows[1].updated_at) == (
        "completed", Decimal("2.333333"), 0.25, t1)
    assert [(rows[n].params, rows[n].state, rows[n].gpu_hours, rows[n].attempts) for n in (4, 5)] == [
        ('{"x": 5}', "waiting", Decimal("0.000000"), 0), ('{"x": 4}', "waiting", Decimal("0.000000"), 0)]
    assert (rows[3].state, rows[3].chunk_id, rows[3].task_id, rows[3].raw_state) == ("waiting", None, None, None)
    assert ch.state == "failed"
    assert rows[0].state == "completed"                        # untouched

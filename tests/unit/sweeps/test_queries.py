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
            statuses = queries.trial_statuses(tx, sid, not_in=[TrialState.WAITING])
            none = queries.trial_statuses(tx, sid, states=[])
            waiting = queries.waiting_trials(tx, sid)
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
    assert statuses == [(0, "completed", None, "70_0"), (1, "running", None, "70_1"), (3, "pending", None, None)]
    assert none == [] and waiting == [(2, '{"x": 2}')]


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


def test_submitting_a_chunk_claims_waiting_trials_once(url, tmp_path):
    """What submit_waiting records: a chunk claims its trials only while all still wait (else
    nothing of it stays), then its array job id and each trial's task are attached."""
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            sid = queries.insert_sweep(tx, name="s", user_name="u", cluster="c", spec="{}", kind="command",
                                       n_trials=4, directory_of=lambda i: tmp_path / str(i), at=T0)
            queries.add_trials(tx, sid, 0, [{"x": i} for i in range(4)], T0)
            assert queries.last_chunk_number(tx, sid) is None
            c0 = queries.insert_chunk(tx, sid, 0, [0, 1], T0)
            assert queries.claim_trials(tx, sid, c0, [0, 1])
            c1 = queries.insert_chunk(tx, sid, 1, [1, 2], T0)       # trial 1 is taken: no chunk 1
            assert not queries.claim_trials(tx, sid, c1, [1, 2])
            assert [c.number for c in queries.chunks(tx, sid)] == [0] and queries.last_chunk_number(tx, sid) == 0
            assert queries.submitted_jobs(tx, sid) == []
            queries.attach_jobs(tx, sid, [(c0, "900", [0, 1])], T0)
            queries.update_sweep(tx, sid, status="failed", when_status="done")      # not done: unchanged
            sw = queries.sweep(tx, sid)
            trials = queries.trials(tx, sid)
            queued = queries.queued_trials(tx, sid)
            jobs, chunk_jobs = queries.submitted_jobs(tx, sid), queries.chunk_jobs(tx, sid)
            assert not queries.forget_sweep(tx, sid)                # a chunk reached Slurm: kept
    finally:
        conn.close()
    assert (sw.status, sw.directory, sw.n_trials, sw.created_at) == ("running", str(tmp_path / str(sid)), 4, T0)
    assert [(t.number, t.state, t.chunk_id, t.task_id, t.job_id, t.raw_state, t.attempts) for t in trials] == [
        (0, "pending", c0, 0, "900_0", "PENDING", 1), (1, "pending", c0, 1, "900_1", "PENDING", 1),
        (2, "waiting", None, None, None, None, 0), (3, "waiting", None, None, None, None, 0)]
    assert queued == [(c0, "pending", "PENDING")] * 2
    assert jobs == ["900"] and chunk_jobs == [(c0, "900")]
    with db.session_scope(url) as s:
        assert s.get(SweepChunk, c0).state == "submitted" and s.get(SweepChunk, c0).trials == "[0, 1]"


def test_a_sweep_no_chunk_of_which_reached_slurm_is_forgotten(url, tmp_path):
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            sid = queries.insert_sweep(tx, name="s", user_name="u", cluster="c", spec="{}", kind="command",
                                       n_trials=1, directory_of=lambda i: tmp_path / str(i), at=T0)
            queries.add_trials(tx, sid, 0, [{"x": 0}], T0)
            queries.claim_trials(tx, sid, queries.insert_chunk(tx, sid, 0, [0], T0), [0])
            assert queries.forget_sweep(tx, sid)
            assert (queries.sweep(tx, sid), queries.trials(tx, sid), queries.chunks(tx, sid)) == (None, [], [])
    finally:
        conn.close()





#: a file migrated by a process of its own, then two transactions in another (no SQLAlchemy
#: engine of this process or the migration's holds the file open): after each, are the WAL and
#: its index still there?
_MIGRATE = "import sys; from gpuhpc.ledger import db; db.upgrade(sys.argv[1])"
_TWO_TRANSACTIONS = """
import datetime as dt, os, sys
from gpuhpc.sweeps import queries, store
url, path = sys.argv[1], sys.argv[2]
for n in range(2):
    conn = store.connect(url)
    try:
        with conn.transaction() as tx:
            queries.insert_sweep(tx, name=str(n), user_name="u", cluster="c", spec="{}", kind="command", n_trials=0,
                                 directory_of=str, at=dt.datetime.now(dt.timezone.utc))
    finally:
        conn.close()
    print(os.path.exists(path + "-wal"), os.path.exists(path + "-shm"))
"""


def test_an_sqlite_files_wal_outlives_a_transactions_connection(tmp_path):
    """store.connect keeps one idle connection to the file open (as the ORM's pool did): closing
    a transaction's connection neither checkpoints nor deletes the WAL and its index, so a disk
    that fills up under the driver fails the next write with "database or disk is full" (not
    with an I/O error in creating them again: test_sweeps_driver_faults' full disk)."""
    import subprocess
    import sys

    path = str(tmp_path / "wal.db")
    url = f"sqlite:///{path}"
    subprocess.run([sys.executable, "-c", _MIGRATE, url], capture_output=True, timeout=120, check=True)
    out = subprocess.run([sys.executable, "-c", _TWO_TRANSACTIONS, url, path], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.split() == ["True"] * 4, out

"""The sweep tables' one data path: named queries over a DB-API transaction.

The tables (declared with the ledger's, ``gpuhpc/ledger/orm.py``, migration 0003, so that the
one metadata Alembic compares holds them):

- ``sweeps``: one row per sweep (its validated spec as JSON, status, directory, driver job);
- ``sweep_chunks``: one row per submitted array (``--array=0-(k-1)%P``), with the array job
  id and the trial of each task id (also in the chunk's parameter file the tasks read);
- ``sweep_trials``: one row per trial: its parameters, the array task it runs as now, and what
  Slurm's accounting says about it (state, restarts, GPU-hours), plus its reported metrics.

Every read and write of them in :mod:`gpuhpc.sweeps` goes through a :class:`gpuhpc.dbapi.Tx`
(opened by :func:`gpuhpc.sweeps.store.connect`: SQLite with ``BEGIN IMMEDIATE``, or PostgreSQL),
never SQLAlchemy, so ``gpuhpc sweep run`` and the driver's loop pay for the standard library
only. The functions here take that transaction and return plain typed rows
(:class:`SweepRecord`, :class:`ChunkRecord`, :class:`TrialRecord`); times are UTC-aware and
GPU-hours :class:`~decimal.Decimal`, as the ledger's ORM reads the same columns.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

from gpuhpc.sweeps.state import ChunkState, SweepStatus, TrialState


@dataclass(frozen=True)
class SweepRecord:
    """A ``sweeps`` row."""

    id: int
    name: str
    user_name: str
    cluster: str
    spec: str                               # the validated spec as JSON (spec_from_json)
    kind: str
    status: str
    message: str | None
    directory: str
    n_trials: int
    driver_job_id: str | None
    created_at: dt.datetime | None
    updated_at: dt.datetime | None


@dataclass(frozen=True)
class ChunkRecord:
    """A ``sweep_chunks`` row: one submitted array."""

    id: int
    sweep_id: int
    number: int
    job_id: str | None
    n_tasks: int
    trials: str                             # JSON list: task id -> trial number
    state: str
    created_at: dt.datetime | None


@dataclass(frozen=True)
class TrialRecord:
    """A ``sweep_trials`` row."""

    id: int
    sweep_id: int
    number: int
    params: str                             # JSON object
    state: str
    raw_state: str | None
    chunk_id: int | None
    task_id: int | None
    job_id: str | None
    job_id_raw: str | None
    attempts: int
    restarts: int
    gpu_hours: Decimal | None
    exit_code: str | None
    metrics: str | None                     # JSON: last value per name
    objective: float | None
    updated_at: dt.datetime | None


def _columns(record: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(record))


SWEEP_COLUMNS = _columns(SweepRecord)
CHUNK_COLUMNS = _columns(ChunkRecord)
TRIAL_COLUMNS = _columns(TrialRecord)
_TIMES = frozenset({"created_at", "updated_at"})


def _record(tx, record: type, columns: Sequence[str], row: Sequence[Any]) -> Any:
    values = dict(zip(columns, row))
    for k in _TIMES & values.keys():
        if values[k] is not None:
            values[k] = tx.parse_ts(values[k])
    if values.get("gpu_hours") is not None:
        values["gpu_hours"] = tx.dec(values["gpu_hours"])
    if values.get("objective") is not None:
        values["objective"] = float(values["objective"])
    return record(**values)


def _bind(tx, v: Any) -> Any:
    """A value as the database stores it (the ORM's binding): times UTC, GPU-hours numeric."""
    if isinstance(v, dt.datetime):
        return tx.ts(v)
    if isinstance(v, Decimal):
        return tx.num(v)
    if isinstance(v, (TrialState, ChunkState)):
        return v.value
    return v


def _assignments(tx, allowed: Sequence[str], values: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """``col = ?, ...`` and its parameters; a column name not in ``allowed`` is a bug."""
    unknown = sorted(set(values) - set(allowed) - {"id"}) or sorted(set(values) & {"id"})
    if unknown:
        raise ValueError(f"not a column to set: {', '.join(unknown)}")
    return ", ".join(f"{k} = ?" for k in values), [_bind(tx, v) for v in values.values()]


def _in(values: Sequence[Any]) -> str:
    return f"({', '.join('?' * len(values))})"


def _states(states: Iterable[TrialState | str]) -> list[str]:
    return [s.value if isinstance(s, TrialState) else str(s) for s in states]


# ---------------------------------------------------------------- sweeps
def sweep(tx, sid: int) -> SweepRecord | None:
    """Sweep ``sid`` (None: there is none)."""
    row = tx.one(f"SELECT {', '.join(SWEEP_COLUMNS)} FROM sweeps WHERE id = ?", (sid,))
    return None if row is None else _record(tx, SweepRecord, SWEEP_COLUMNS, row)


def update_sweep(tx, sid: int, *, when_status: str | None = None, **values: Any) -> None:
    """``UPDATE sweeps SET <values> WHERE id = sid`` (times and numbers bound as the ORM does);
    with ``when_status``, only while the sweep's status is that (``AND status = ?``)."""
    if not values:
        return
    sets, params = _assignments(tx, SWEEP_COLUMNS, values)
    if when_status is None:
        tx.execute(f"UPDATE sweeps SET {sets} WHERE id = ?", (*params, sid))
    else:
        tx.execute(f"UPDATE sweeps SET {sets} WHERE id = ? AND status = ?", (*params, sid, when_status))


# ---------------------------------------------------------------- chunks
def chunks(tx, sid: int, *, state: ChunkState | None = None) -> list[ChunkRecord]:
    """The sweep's chunks (only those in ``state``, when given), in chunk order."""
    where, params = "sweep_id = ?", [sid]
    if state is not None:
        where, params = where + " AND state = ?", params + [state.value]
    return [_record(tx, ChunkRecord, CHUNK_COLUMNS, r) for r in tx.execute(
        f"SELECT {', '.join(CHUNK_COLUMNS)} FROM sweep_chunks WHERE {where} ORDER BY number", params).fetchall()]


def fail_chunk(tx, sid: int, chunk_id: int) -> None:
    """A chunk that never reached Slurm: ``failed``, and its trials not yet given a job wait again."""
    tx.execute("UPDATE sweep_chunks SET state = ? WHERE id = ?", (ChunkState.FAILED.value, chunk_id))
    tx.execute("UPDATE sweep_trials SET state = ? WHERE sweep_id = ? AND chunk_id = ? AND job_id IS NULL",
               (TrialState.WAITING.value, sid, chunk_id))


# ---------------------------------------------------------------- trials
class TrialStatus(NamedTuple):
    """A trial's number and where it stands (the narrow read of the driver's every round)."""

    number: int
    state: str
    raw_state: str | None
    job_id: str | None


class WaitingTrial(NamedTuple):
    number: int
    params: str                             # JSON object


def _trial_filter(sid: int, states: Iterable[TrialState | str] | None,
                  not_in: Iterable[TrialState | str] | None) -> tuple[str, list[Any]] | None:
    """``WHERE`` text and parameters for the sweep's trials in ``states`` and not in ``not_in``
    (None: ``states`` is empty, no trial can match)."""
    where, params = "sweep_id = ?", [sid]
    for op, given in (("IN", states), ("NOT IN", not_in)):
        if given is not None:
            vals = _states(given)
            if not vals:
                if op == "IN":
                    return None
                continue
            where += f" AND state {op} {_in(vals)}"
            params += vals
    return where, params


def trials(tx, sid: int, *, states: Iterable[TrialState | str] | None = None,
           not_in: Iterable[TrialState | str] | None = None) -> list[TrialRecord]:
    """The sweep's trials, whole rows (in ``states``, and not in ``not_in``, when given), in trial order."""
    f = _trial_filter(sid, states, not_in)
    if f is None:
        return []
    return [_record(tx, TrialRecord, TRIAL_COLUMNS, r) for r in tx.execute(
        f"SELECT {', '.join(TRIAL_COLUMNS)} FROM sweep_trials WHERE {f[0]} ORDER BY number", f[1]).fetchall()]


def trial_statuses(tx, sid: int, *, states: Iterable[TrialState | str] | None = None,
                   not_in: Iterable[TrialState | str] | None = None) -> list[TrialStatus]:
    """:func:`trials`' filter, four columns each (a pruner's and ``fail_fast``'s every round)."""
    f = _trial_filter(sid, states, not_in)
    if f is None:
        return []
    return [TrialStatus(*r) for r in tx.execute(
        f"SELECT number, state, raw_state, job_id FROM sweep_trials WHERE {f[0]} ORDER BY number", f[1]).fetchall()]


def waiting_trials(tx, sid: int) -> list[WaitingTrial]:
    """The ``waiting`` trials and their parameters, in trial order (what a submission sends out)."""
    return [WaitingTrial(*r) for r in tx.execute(
        "SELECT number, params FROM sweep_trials WHERE sweep_id = ? AND state = ? ORDER BY number",
        (sid, TrialState.WAITING.value)).fetchall()]


def state_counts(tx, sid: int, *, states: Iterable[TrialState | str] | None = None) -> dict[str, int]:
    """{state: trials in it} (only ``states``, when given)."""
    where, params = "sweep_id = ?", [sid]
    if states is not None:
        vals = _states(states)
        if not vals:
            return {}
        where += f" AND state IN {_in(vals)}"
        params += vals
    return {st: n for st, n in tx.execute(f"SELECT state, count(*) FROM sweep_trials WHERE {where} GROUP BY state",
                                          params).fetchall()}


def trial_count(tx, sid: int) -> int:
    """How many trials the sweep has created."""
    return tx.one("SELECT count(*) FROM sweep_trials WHERE sweep_id = ?", (sid,))[0]


def last_trial_number(tx, sid: int) -> int | None:
    """The highest trial number (None: no trial yet)."""
    return tx.one("SELECT max(number) FROM sweep_trials WHERE sweep_id = ?", (sid,))[0]


def add_trials(tx, sid: int, first: int, params: Sequence[Mapping[str, Any]], at: dt.datetime) -> None:
    """New ``waiting`` trials ``first``, ``first``+1, ... with ``params`` (one executemany)."""
    zero, t = tx.num(Decimal(0)), tx.ts(at)
    tx.execute_many("INSERT INTO sweep_trials (sweep_id, number, params, state, attempts, restarts, gpu_hours, "
                    "updated_at) VALUES (?, ?, ?, ?, 0, 0, ?, ?)",
                    [(sid, first + i, json.dumps(p, sort_keys=True), TrialState.WAITING.value, zero, t)
                     for i, p in enumerate(params)])


def update_trial(tx, trial_id: int, **values: Any) -> None:
    """``UPDATE sweep_trials SET <values> WHERE id = trial_id``."""
    if not values:
        return
    sets, params = _assignments(tx, TRIAL_COLUMNS, values)
    tx.execute(f"UPDATE sweep_trials SET {sets} WHERE id = ?", (*params, trial_id))


def wait_again(tx, sid: int, numbers: Sequence[int], at: dt.datetime) -> None:
    """Trials ``numbers`` back to ``waiting``, out of any chunk (a resume resubmits them)."""
    if not numbers:
        return
    tx.execute(f"UPDATE sweep_trials SET state = ?, chunk_id = NULL, task_id = NULL, raw_state = NULL, updated_at = ? "
               f"WHERE sweep_id = ? AND number IN {_in(numbers)}",
               (TrialState.WAITING.value, tx.ts(at), sid, *numbers))


# ---------------------------------------------------------------- what is queued (the driver's every round)
class QueuedTrial(NamedTuple):
    """A trial queued or running in one of the sweep's arrays (as last refreshed)."""

    chunk_id: int
    state: str
    raw_state: str | None


class ChunkJob(NamedTuple):
    """A chunk not ``failed``: its id and array job id (None: its sbatch is not recorded yet)."""

    id: int
    job_id: str | None


LIVE = (TrialState.PENDING, TrialState.RUNNING, TrialState.REQUEUED)


def queued_trials(tx, sid: int) -> list[QueuedTrial]:
    """The sweep's trials ``pending``, ``running`` or ``requeued`` in a chunk (two columns each:
    the driver asks every round)."""
    return [QueuedTrial(*r) for r in tx.execute(
        "SELECT chunk_id, state, raw_state FROM sweep_trials WHERE sweep_id = ? AND state IN (?, ?, ?) "
        "AND chunk_id IS NOT NULL", (sid, *_states(LIVE))).fetchall()]


def chunk_jobs(tx, sid: int) -> list[ChunkJob]:
    """The sweep's chunks not ``failed``, oldest first."""
    return [ChunkJob(*r) for r in tx.execute("SELECT id, job_id FROM sweep_chunks WHERE sweep_id = ? AND state != ? "
                                             "ORDER BY number", (sid, ChunkState.FAILED.value)).fetchall()]


def submitted_jobs(tx, sid: int) -> list[str]:
    """The array job ids of the sweep's chunks that reached Slurm."""
    return [j for (j,) in tx.execute("SELECT job_id FROM sweep_chunks WHERE sweep_id = ? AND job_id IS NOT NULL",
                                     (sid,)).fetchall()]


# ---------------------------------------------------------------- creating and forgetting a sweep
def insert_sweep(tx, *, name: str, user_name: str, cluster: str, spec: str, kind: str, n_trials: int,
                 directory_of: Any, at: dt.datetime) -> int:
    """A new ``running`` sweep; ``directory_of(id)`` names its directory (known once the id is).
    Returns its id."""
    t = tx.ts(at)
    sid = tx.insert("INSERT INTO sweeps (name, user_name, cluster, spec, kind, status, message, directory, "
                    "n_trials, driver_job_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, NULL, '', ?, "
                    "NULL, ?, ?)", (name, user_name, cluster, spec, kind, SweepStatus.RUNNING.value, n_trials, t, t))
    tx.execute("UPDATE sweeps SET directory = ? WHERE id = ?", (str(directory_of(sid)), sid))
    return sid


def forget_sweep(tx, sid: int) -> bool:
    """Delete the sweep, its chunks and trials, unless a chunk of it reached Slurm (then False)."""
    if tx.one("SELECT count(*) FROM sweep_chunks WHERE sweep_id = ? AND job_id IS NOT NULL", (sid,))[0]:
        return False
    tx.execute("DELETE FROM sweep_trials WHERE sweep_id = ?", (sid,))
    tx.execute("DELETE FROM sweep_chunks WHERE sweep_id = ?", (sid,))
    tx.execute("DELETE FROM sweeps WHERE id = ?", (sid,))
    return True


# ---------------------------------------------------------------- submitting chunks
def insert_chunk(tx, sid: int, number: int, trial_numbers: Sequence[int], at: dt.datetime) -> int:
    """A new ``submitting`` chunk of ``trial_numbers`` (task id -> trial); returns its id."""
    return tx.insert("INSERT INTO sweep_chunks (sweep_id, number, job_id, n_tasks, trials, state, created_at) "
                     "VALUES (?, ?, NULL, ?, ?, ?, ?)",
                     (sid, number, len(trial_numbers), json.dumps(list(trial_numbers)), ChunkState.SUBMITTING.value,
                      tx.ts(at)))


def last_chunk_number(tx, sid: int) -> int | None:
    """The highest chunk number (None: no chunk yet)."""
    return tx.one("SELECT max(number) FROM sweep_chunks WHERE sweep_id = ?", (sid,))[0]


def claim_trials(tx, sid: int, chunk_id: int, trial_numbers: Sequence[int]) -> bool:
    """Trials ``trial_numbers``, all still ``waiting``, become ``pending`` in chunk ``chunk_id``.
    When another submitter took any of them meanwhile, the claim is undone and the chunk
    deleted (False)."""
    tx.execute(f"UPDATE sweep_trials SET state = ?, chunk_id = ?, job_id = NULL WHERE sweep_id = ? AND "
               f"state = ? AND number IN {_in(trial_numbers)}",
               (TrialState.PENDING.value, chunk_id, sid, TrialState.WAITING.value, *trial_numbers))
    if tx.cur.rowcount == len(trial_numbers):
        return True
    tx.execute("UPDATE sweep_trials SET state = ?, chunk_id = NULL WHERE chunk_id = ?",
               (TrialState.WAITING.value, chunk_id))
    tx.execute("DELETE FROM sweep_chunks WHERE id = ?", (chunk_id,))
    return False


def attach_jobs(tx, sid: int, done: Sequence[tuple[int, str, Sequence[int]]], at: dt.datetime) -> None:
    """Each chunk ``(chunk id, array job id, its trial numbers by task)`` reached Slurm:
    ``submitted`` with its job id, and each of its trials ``pending`` as task *i* of it (a new
    attempt: restarts, exit code and accounting's job id cleared). One executemany each."""
    t = tx.ts(at)
    tx.execute_many("UPDATE sweep_chunks SET job_id = ?, state = ? WHERE id = ?",
                    [(job_id, ChunkState.SUBMITTED.value, chunk_id) for chunk_id, job_id, _ in done])
    tx.execute_many("UPDATE sweep_trials SET chunk_id = ?, task_id = ?, job_id = ?, job_id_raw = NULL, state = ?, "
                    "raw_state = 'PENDING', attempts = attempts + 1, restarts = 0, exit_code = NULL, updated_at = ? "
                    "WHERE sweep_id = ? AND number = ?",
                    [(chunk_id, task, f"{job_id}_{task}", TrialState.PENDING.value, t, sid, number)
                     for chunk_id, job_id, numbers in done for task, number in enumerate(numbers)])

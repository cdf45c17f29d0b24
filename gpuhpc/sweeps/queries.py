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
from typing import Any

from gpuhpc.sweeps.state import ChunkState, TrialState


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


def update_sweep(tx, sid: int, **values: Any) -> None:
    """``UPDATE sweeps SET <values> WHERE id = sid`` (times and numbers bound as the ORM does)."""
    if not values:
        return
    sets, params = _assignments(tx, SWEEP_COLUMNS, values)
    tx.execute(f"UPDATE sweeps SET {sets} WHERE id = ?", (*params, sid))


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
def trials(tx, sid: int, *, states: Iterable[TrialState | str] | None = None,
           not_in: Iterable[TrialState | str] | None = None) -> list[TrialRecord]:
    """The sweep's trials (in ``states``, and not in ``not_in``, when given), in trial order."""
    where, params = "sweep_id = ?", [sid]
    for op, given in (("IN", states), ("NOT IN", not_in)):
        if given is not None:
            vals = _states(given)
            if not vals:
                if op == "IN":
                    return []
                continue
            where += f" AND state {op} {_in(vals)}"
            params += vals
    return [_record(tx, TrialRecord, TRIAL_COLUMNS, r) for r in tx.execute(
        f"SELECT {', '.join(TRIAL_COLUMNS)} FROM sweep_trials WHERE {where} ORDER BY number", params).fetchall()]


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

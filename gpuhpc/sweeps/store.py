"""The sweep state store: where a sweep's state lives and how it is read.

- the gpuhpc database (the ledger's: SQLite or PostgreSQL; the tables and their named queries
  in :mod:`gpuhpc.sweeps.queries`), through one data path: a DB-API :func:`connect`
  (:mod:`gpuhpc.dbapi`, no SQLAlchemy import, so ``gpuhpc sweep run`` stays close to sbatch);
- the sweep directory under :func:`sweep_root` (chunk parameter files, ``throttles.json``,
  each trial's directory);
- the reads every other module shares: :func:`trial_rows`, :func:`trial_records`,
  :func:`sweep_info`, :func:`counts_of`, the live chunks and the slots they hold
  (:func:`live_chunks`, :func:`queued_now`, :func:`draining`).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps import queries
from gpuhpc.sweeps.spec import spec_from_json
from gpuhpc.sweeps.state import TrialState, ended, trial_over


UTC = dt.timezone.utc


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


def sweep_root() -> Path:
    """``$GPUHPC_SWEEP_ROOT``, else ``<gpuhpc data dir>/sweeps``: every node must see it (the
    trials read their parameter files and write metrics there)."""
    from gpuhpc.config import getenv

    env = getenv("GPUHPC_SWEEP_ROOT")
    if env:
        return Path(env).expanduser().absolute()
    from gpuhpc.fsutil import data_dir

    return (data_dir() / "sweeps").absolute()


def slurm_client(client=None):
    """``client``, else a :class:`~gpuhpc.slurm.client.SlurmClient` of the default runner."""
    if client is not None:
        return client
    from gpuhpc.slurm.client import SlurmClient

    return SlurmClient()


def db_url(url: str | None = None) -> str:
    """The gpuhpc database (the ledger's). The embedded SQLite file is created (migrated to
    head) on first use; any other database must be at head (``gpuhpc db upgrade``)."""
    from gpuhpc.ledger import paths

    url = url or paths.db_url()
    if url.startswith("sqlite") and not os.path.exists(paths.default_db_path() if url == paths.db_url() else "/"):
        from gpuhpc.ledger import db

        f = db.sqlite_file(url)
        if f is not None and not f.exists():
            db.upgrade(url)
    return url


#: SQLite files this process keeps one idle connection to (the latest few; never used for a
#: statement): while one is open, SQLite keeps the file's WAL and shared-memory index, so a
#: transaction's own connection neither checkpoints and deletes them on close nor has to create
#: them again on open. As the ORM's connection pool did: a file system that fills up under the
#: driver fails its next write with "database or disk is full", not with an I/O error in opening.
_KEPT_OPEN: dict[str, Any] = {}
_KEEP_AT_MOST = 4


def _keep_open(url: str) -> None:
    from gpuhpc.ledger import quota

    if url in _KEPT_OPEN or not url.startswith("sqlite"):
        return
    try:
        conn = quota.Connection(url)        # its set-up reads the file: the WAL index is open
    except Exception:                       # noqa: BLE001 - only an optimisation; the caller's own connection says why
        return
    _KEPT_OPEN[url] = conn
    while len(_KEPT_OPEN) > _KEEP_AT_MOST:
        _KEPT_OPEN.pop(next(iter(_KEPT_OPEN))).close()


def connect(url: str | None):
    """A DB-API connection (:mod:`gpuhpc.dbapi`) to the sweep database: the ledger's (its
    :class:`gpuhpc.ledger.quota.Connection`, whose first transaction checks the schema). The
    one way to the sweep tables: every read and write is a transaction on it, through
    :mod:`gpuhpc.sweeps.queries`."""
    from gpuhpc.ledger import quota

    url = db_url(url)
    conn = quota.Connection(url)
    _keep_open(url)
    return conn


@contextlib.contextmanager
def transaction(url: str | None):
    """One transaction on the sweep database (:func:`connect`), its connection closed after it."""
    conn = connect(url)
    try:
        with conn.transaction() as tx:
            yield tx
    finally:
        conn.close()


def write_json(path: Path, data: Any) -> None:
    from gpuhpc.fsutil import write_atomic

    write_atomic(path, json.dumps(data, sort_keys=True), fsync=False)


def write_chunk_file(directory: Path, number: int, rows: Sequence[tuple[int, str]]) -> Path:
    """``chunks/<n>.jsonl``: line *i* = array task *i*: ``{"trial": N, "params": {...}}``."""
    from gpuhpc.fsutil import write_atomic

    path = directory / "chunks" / f"{number}.jsonl"
    write_atomic(path, "".join(f'{{"trial": {t}, "params": {p}}}\n' for t, p in rows))
    return path


def set_sweep(sid: int, url: str | None, **values: Any) -> None:
    """Set columns of sweep ``sid`` (:func:`gpuhpc.sweeps.queries.update_sweep`) in a transaction of its own."""
    with transaction(url) as tx:
        queries.update_sweep(tx, sid, **values)


def sweep_record(sid: int, url: str | None) -> queries.SweepRecord:
    """Sweep ``sid``'s row, read in a transaction of its own; exit 2 naming it when there is none."""
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
    if sw is None:
        raise UserInputError(f"no sweep {sid}", field="ID")
    return sw


def forget(sid: int, url: str | None, directory: Path) -> None:
    """Remove a sweep none of whose chunks reached Slurm (its rows, its directory)."""
    import shutil

    with transaction(url) as tx:
        if not queries.forget_sweep(tx, sid):
            return
    shutil.rmtree(directory, ignore_errors=True)


def n_waiting(sid: int, url: str | None) -> int:
    with transaction(url) as tx:
        return queries.state_counts(tx, sid, states=[TrialState.WAITING]).get(TrialState.WAITING.value, 0)


def read_throttles(directory: Path) -> dict[int, int]:
    """``<sweep dir>/throttles.json``: {chunk id: its array's ``%N`` now}."""
    try:
        return {int(k): int(v) for k, v in json.loads((directory / "throttles.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


def save_throttles(directory: Path, throttles: dict[int, int]) -> None:
    write_json(directory / "throttles.json", {str(k): v for k, v in sorted(throttles.items())})


def live_chunks(tx, sid: int, *, slots: bool = False) -> list[tuple[int, str | None, int]]:
    """[(chunk id, array job id, trials of it still queued or running)], oldest first. With
    ``slots``, a task in COMPLETING no longer counts (:func:`trial_over`: the parallelism
    slots); without, it does (slurmctld counts it against MaxSubmitJobs until it is gone)."""
    over = trial_over if slots else ended
    counts: dict[int, int] = {}
    for t in queries.queued_trials(tx, sid):
        if not over(t.raw_state):
            counts[t.chunk_id] = counts.get(t.chunk_id, 0) + 1
    return [(cid, job, counts[cid]) for cid, job in queries.chunk_jobs(tx, sid) if counts.get(cid)]


def queued_now(sid: int, url: str | None = None) -> int:
    """The sweep's trials queued or running in Slurm now (slurmctld's view, as last refreshed)."""
    with transaction(url) as tx:
        return sum(left for _, _, left in live_chunks(tx, sid))


def draining(sid: int, url: str | None = None) -> bool:
    """Trials wait while an array of the sweep runs its last wave (no task of it pending): its
    slots free up one by one, and each should go to a waiting trial soon."""
    with transaction(url) as tx:
        if not queries.state_counts(tx, sid, states=[TrialState.WAITING]):
            return False
        states: dict[int, set[str]] = {}
        for t in queries.queued_trials(tx, sid):
            if not ended(t.raw_state):
                states.setdefault(t.chunk_id, set()).add(t.state)
        return any(st == {TrialState.RUNNING.value} for st in states.values())


def utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def counts_of(sid: int, *, url: str | None = None) -> dict[str, int]:
    """Trials per state as the database holds them (what the driver last wrote)."""
    with transaction(url) as tx:
        return queries.state_counts(tx, sid)


def trial_records(sid: int, *, url: str | None = None) -> list[queries.TrialRecord]:
    """Every trial of the sweep as the database holds it, in trial order."""
    with transaction(url) as tx:
        return queries.trials(tx, sid)


def trial_rows(sid: int, *, url: str | None = None) -> list[dict[str, Any]]:
    """One row per trial, in trial order: trial, params, state, metrics, job_id, restarts, gpu_hours."""
    return [dict(trial=t.number, params=json.loads(t.params), state=t.state,
                 metrics=json.loads(t.metrics) if t.metrics else {}, job_id=t.job_id, restarts=t.restarts,
                 gpu_hours=round(float(t.gpu_hours or 0), 6), objective=t.objective, raw_state=t.raw_state,
                 attempts=t.attempts)
            for t in trial_records(sid, url=url)]


def sweep_info(sid: int, *, url: str | None = None) -> dict[str, Any]:
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        chunks = queries.chunks(tx, sid)
    return dict(sweep_id=sw.id, name=sw.name, status=sw.status, message=sw.message, directory=sw.directory,
                n_trials=sw.n_trials, driver_job_id=sw.driver_job_id, kind=sw.kind,
                spec=spec_from_json(sw.spec),
                chunks=[dict(number=ch.number, job_id=ch.job_id, n_tasks=ch.n_tasks, state=ch.state)
                        for ch in chunks])


def best(rows: Sequence[dict[str, Any]], goal: str) -> dict[str, Any] | None:
    """The completed trial with the best objective (the lowest trial number on a tie)."""
    done = [r for r in rows if r["state"] == TrialState.COMPLETED.value and r["objective"] is not None]
    if not done:
        return None
    sign = 1 if goal == "minimize" else -1
    return min(done, key=lambda r: (sign * r["objective"], r["trial"]))

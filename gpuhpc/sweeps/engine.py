"""Sweeps on Slurm: chunked arrays that fit the cluster, state from accounting, resume, cancel.

Submitting (:func:`create` then :func:`submit_waiting`):

- the limits come from the controller (``MaxArraySize``, ``MaxJobCount``) and the user's
  association/QOS (``MaxSubmitJobs``) through :meth:`SlurmClient.submit_limits`;
- trials go out in chunks of at most ``MaxArraySize`` tasks, each ``--array=0-(k-1)%P`` with a
  parameter file (``<sweep dir>/chunks/<n>.jsonl``: line *i* is task *i*'s trial) — never
  ``--array=1000-1999``;
- chunks are chained with ``--dependency=afterany:<previous chunk>``, so the ``%P`` cap holds
  across chunks too (the trade-off: a chunk's last trials run before the next chunk starts);
- each chunk is reserved in the ledger with its real array size before its sbatch
  (:func:`gpuhpc.jobs.api.submit_spec`); the whole first batch is checked first, and an
  over-quota sweep is refused (exit 3) saying how many trials would fit;
- what the limits do not allow now is left ``waiting`` for the **sweep driver**, a small
  requeueable job on the CPU partition (:mod:`gpuhpc.sweeps.driver`) that submits further chunks
  as earlier ones drain. Its state is the database, so it resumes after its own requeue.

Following (:func:`refresh`): a trial's state is what ``sacct --duplicates`` says about its
array task (each requeued run is a row: restarts = rows − 1), never a heartbeat; its metrics are
the lines it appended to ``<sweep dir>/trials/<n>/metrics.jsonl`` (:func:`gpuhpc.report`).
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, QuotaExceeded, UserInputError
from gpuhpc.sweeps.state import SweepStatus, TrialState
from gpuhpc.sweeps.spec import SweepSpec, spec_from_json, spec_json

UTC = dt.timezone.utc
_BRACKET = re.compile(r"^(\d+)_\[([0-9,\-]+)(%\d+)?\]$")
#: Slurm state -> trial state (anything else: pending)
_STATE = {
    "PENDING": TrialState.PENDING, "CONFIGURING": TrialState.RUNNING, "RUNNING": TrialState.RUNNING,
    "COMPLETING": TrialState.RUNNING, "SUSPENDED": TrialState.RUNNING, "STOPPED": TrialState.RUNNING,
    "SIGNALING": TrialState.RUNNING, "STAGE_OUT": TrialState.RUNNING, "RESIZING": TrialState.RUNNING,
    "COMPLETED": TrialState.COMPLETED, "CANCELLED": TrialState.CANCELLED,
    "FAILED": TrialState.FAILED, "TIMEOUT": TrialState.FAILED, "OUT_OF_MEMORY": TrialState.FAILED,
    "BOOT_FAIL": TrialState.FAILED, "DEADLINE": TrialState.FAILED, "REVOKED": TrialState.FAILED,
    "SPECIAL_EXIT": TrialState.FAILED,
    "REQUEUED": TrialState.REQUEUED, "REQUEUE_HOLD": TrialState.REQUEUED, "REQUEUE_FED": TrialState.REQUEUED,
    "PREEMPTED": TrialState.REQUEUED, "NODE_FAIL": TrialState.REQUEUED,
}


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


# ---------------------------------------------------------------- places
def sweep_root() -> Path:
    """``$GPUHPC_SWEEP_ROOT``, else ``<gpuhpc data dir>/sweeps``: every node must see it (the
    trials read their parameter files and write metrics there)."""
    env = os.environ.get("GPUHPC_SWEEP_ROOT")
    if env:
        return Path(env).expanduser().absolute()
    from gpuhpc.fsutil import data_dir

    return (data_dir() / "sweeps").absolute()


def _client(client=None):
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


def _session(url: str | None):
    """An ORM session (the readers: refresh, resume, cancel, results). The submit path uses
    :func:`_conn` (DB-API, no SQLAlchemy import: ``gpuhpc sweep run`` stays close to sbatch)."""
    from gpuhpc.ledger.db import session_scope

    return session_scope(db_url(url))


def _conn(url: str | None):
    """A DB-API connection to the sweep database (:class:`gpuhpc.ledger.quota.Connection`)."""
    from gpuhpc.ledger import quota

    return quota.Connection(db_url(url))


def _many(tx, sql: str, rows: list) -> None:
    tx.cur.executemany(sql.replace("?", "%s") if tx.pg else sql, rows)


def _ledger_url(url: str | None) -> str | None:
    """The ledger for reservations: the sweep database when the ledger is not switched off."""
    from gpuhpc.ledger import hooks

    if hooks.ledger_in_use() is None and not url:
        return None
    if os.environ.get("GPUHPC_LEDGER", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    return db_url(url)


# ---------------------------------------------------------------- quota
def _request(spec: SweepSpec, n: int, cluster: str, name: str | None = None):
    from gpuhpc.ledger import hooks

    r = spec.res
    return hooks.ChargeRequest(cluster=cluster, user=getpass.getuser(), account=r.account, partition=r.partition,
                               qos=r.qos, gpu_type=r.gpu_type, gpus=r.total_gpus, time_limit_s=r.time_s,
                               array_size=n, job_name=name or spec.name)


def _reserves_here(url: str | None) -> bool:
    """Does the ledger reserve in the sweep database itself (the usual case), so that a chunk's
    hold can be taken in the transaction that records the chunk? Otherwise (the ledger off, a
    ledger this user may not write, or one elsewhere) each sbatch reserves on its own
    (:func:`gpuhpc.jobs.api.submit_spec`)."""
    from gpuhpc.ledger import hooks

    lurl = hooks.ledger_in_use()
    return lurl is not None and lurl == db_url(url) and hooks.writable(lurl)


class _Rollback(Exception):
    pass


def _fits(url: str, spec: SweepSpec, n: int, cluster: str) -> QuotaExceeded | None:
    """Would a hold of ``n`` trials' worst case fit? (a transaction that is always rolled back)"""
    from gpuhpc.ledger import quota

    conn = quota.Connection(url)
    try:
        try:
            with conn.transaction() as tx:
                quota.reserve_in(tx, _request(spec, n, cluster), now(), url)
                raise _Rollback
        except _Rollback:
            return None
        except QuotaExceeded as exc:
            return exc
    finally:
        conn.close()


def check_quota(spec: SweepSpec, n: int, cluster: str, url: str | None) -> None:
    """Refuse (exit 3) a batch of ``n`` trials whose worst case (trials × GPUs × time limit,
    priced) does not fit the quotas, saying how many would."""
    lurl = _ledger_url(url)
    if lurl is None or n < 1:
        return
    exc = _fits(lurl, spec, n, cluster)
    if exc is None:
        return
    lo, hi = 0, n - 1                 # the largest m < n that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(lurl, spec, mid, cluster) is None:
            lo = mid
        else:
            hi = mid - 1
    raise QuotaExceeded(f"{exc.message}; {lo} of the sweep's {n} trials would fit",
                        hint="lower trials, GPUs per trial or the time limit")


# ---------------------------------------------------------------- files
def _write_json(path: Path, data: Any) -> None:
    from gpuhpc.fsutil import write_atomic

    write_atomic(path, json.dumps(data, sort_keys=True), fsync=False)


def _write_chunk_file(directory: Path, number: int, rows: Sequence[tuple[int, str]]) -> Path:
    """``chunks/<n>.jsonl``: line *i* = array task *i*: ``{"trial": N, "params": {...}}``."""
    from gpuhpc.fsutil import write_atomic

    path = directory / "chunks" / f"{number}.jsonl"
    write_atomic(path, "".join(f'{{"trial": {t}, "params": {p}}}\n' for t, p in rows))
    return path


# ---------------------------------------------------------------- creating
def create(spec: SweepSpec, *, kind: str = "command", client=None, url: str | None = None,
           payload: bytes | None = None, submit: bool = True) -> int:
    """Record a sweep and its trials, then submit what the cluster allows now (and the driver
    when something is left). Returns the sweep id. Nothing is written or submitted when the
    resources cannot fit (exit 2) or the quota is exceeded (exit 3)."""
    c = _client(client)
    from gpuhpc.jobs.spec import check_fits_on

    n_first = spec.n_trials if spec.method != "tpe" else min(spec.parallelism, spec.n_trials)
    # the questions to slurmctld are independent: ask them at once (each is a process and a
    # round trip; MaxJobCount's count is only needed for a large first batch)
    asks = {"limits": lambda: _limits(c, spec), "fits": lambda: check_fits_on(spec.res, c)}
    if _needs_records(n_first, None):
        asks["records"] = c.job_records
    got = _concurrently(asks)
    try:
        cluster = c.cluster_name() or "default"
    except GpuhpcError:
        cluster = "default"
    plan = plan_submission(spec, c, len_waiting=n_first, records=got.get("records"))
    check_quota(spec, plan.now, cluster, url)
    n = spec.n_trials
    first = spec.generate(0, n) if spec.method != "tpe" else []
    root = sweep_root()
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            t = tx.ts(now())
            sid = tx.insert("INSERT INTO sweeps (name, user_name, cluster, spec, kind, status, message, directory, "
                            "n_trials, driver_job_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, NULL, '', ?, "
                            "NULL, ?, ?)", (spec.name, getpass.getuser(), cluster, spec_json(spec), kind,
                                            SweepStatus.RUNNING.value, n, t, t))
            tx.q("UPDATE sweeps SET directory = ? WHERE id = ?", (str(root / str(sid)), sid))
            zero, waiting = tx.num(Decimal(0)), TrialState.WAITING.value
            _many(tx, "INSERT INTO sweep_trials (sweep_id, number, params, state, attempts, restarts, gpu_hours, "
                      "updated_at) VALUES (?, ?, ?, ?, 0, 0, ?, ?)",
                  [(sid, i, json.dumps(p, sort_keys=True), waiting, zero, t) for i, p in enumerate(first)])
    finally:
        conn.close()
    directory = root / str(sid)
    (directory / "chunks").mkdir(parents=True, exist_ok=True)
    (directory / "trials").mkdir(exist_ok=True)
    _write_json(directory / "sweep.json", {"sweep_id": sid, "name": spec.name, "command": spec.command,
                                           "kind": kind, "metric": spec.metric.name})
    if payload is not None:
        from gpuhpc.fsutil import write_atomic

        write_atomic(directory / "fn.pkl", payload)
    if submit:
        submit_waiting(sid, client=c, url=url, limit=plan.now)
        if spec.method == "tpe" or plan.now < n:
            start_driver(sid, client=c, url=url)
    return sid


def _limits(client, spec: SweepSpec, fresh: bool = False):
    """The submission limits, asked once per client (the driver asks afresh each round)."""
    cached = None if fresh else getattr(client, "_gpuhpc_sweep_limits", None)
    if cached is None:
        r = spec.res
        cached = client.submit_limits(getpass.getuser(), r.account, r.qos)
        try:
            client._gpuhpc_sweep_limits = cached
        except AttributeError:
            pass
    return cached


class Plan:
    """How many trials go out now and in chunks of what size."""

    def __init__(self, now: int, chunk: int, limits: Any) -> None:
        self.now, self.chunk, self.limits = now, chunk, limits


def _concurrently(calls: dict[str, Any]) -> dict[str, Any]:
    """Run independent calls (Slurm queries: a process each) in threads; their results by
    name, the first exception re-raised."""
    import threading

    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def one(name: str, fn) -> None:
        try:
            out[name] = fn()
        except BaseException as exc:        # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=item) for item in list(calls.items())[1:]]
    for th in threads:
        th.start()
    first = next(iter(calls.items()), None)
    if first is not None:
        one(*first)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out


def _needs_records(len_waiting: int, limits: Any) -> bool:
    return len_waiting > (100 if limits is None else min(100, limits.max_job_count // 20))


def plan_submission(spec: SweepSpec, client, *, len_waiting: int, queued_by_sweep: int = 0,
                    fresh: bool = False, records: int | None = None) -> Plan:
    """``now``: how many of ``len_waiting`` trials may be queued at once: the sweep's
    ``max_queued``, the user's MaxSubmitJobs less the jobs already queued, MaxJobCount less the
    jobs slurmctld holds; ``chunk``: at most MaxArraySize (and the sweep's ``chunk_size``)."""
    limits = _limits(client, spec, fresh)
    chunk = min(limits.max_array_size, spec.chunk_size or limits.max_array_size)
    room = len_waiting
    if spec.max_queued is not None:
        room = min(room, spec.max_queued - queued_by_sweep)
    if limits.max_submit_jobs is not None:
        room = min(room, limits.max_submit_jobs - limits.submitted - 1)     # one left for the driver
    if _needs_records(len_waiting, limits):
        # slurmctld refuses ("temporarily unable to accept job") an array whose tasks would
        # take it past MaxJobCount; finished and cancelled tasks count until MinJobAge
        held = client.job_records() if records is None else records
        room = min(room, limits.max_job_count - held - max(10, limits.max_job_count // 100))
    return Plan(max(0, room), max(1, chunk), limits)


def _trial_spec(spec: SweepSpec, sid: int, directory: Path, number: int, k: int, dependency: str | None):
    """The JobSpec of one chunk: the ``single`` template (checkpoint → requeue → resume) around
    ``python -m gpuhpc.sweeps.trial DIR CHUNK`` as an array ``0-(k-1)%P``."""
    from gpuhpc.jobs.spec import JobSpec

    env = dict(spec.env)
    env.update({"GPUHPC_SWEEP_ID": str(sid)})
    return JobSpec(
        command=(sys.executable, "-m", "gpuhpc.sweeps.trial", str(directory), str(number)),
        resources=spec.res, name=f"{spec.name}-s{sid}-c{number}", template=spec.template, env=env,
        workdir=spec.workdir or os.getcwd(), log_dir=str(directory / "logs"),
        checkpoint_dir=str(directory / "jobs" / "%j"), grace=spec.grace, max_requeues=spec.max_requeues,
        array=f"0-{k - 1}%{min(spec.parallelism, k)}", dependency=dependency, hold=spec.hold)


def submit_waiting(sid: int, *, client=None, url: str | None = None, limit: int | None = None,
                   numbers: Iterable[int] | None = None) -> list[str]:
    """Submit ``waiting`` trials (those in ``numbers``, else all; at most ``limit``) in chunks.
    Returns the new array job ids.

    Every chunk is recorded (``submitting``, its trials claimed) in one transaction before the
    first sbatch, and every job id is recorded in one transaction after the last, so the
    database costs two round trips, not four per chunk; an interrupted submission is found
    again by name (:func:`recover`). The sbatch calls are chained (``afterany`` on the chunk
    before: the ``%P`` cap across chunks), so they run one after the other."""
    from gpuhpc.jobs.api import submit_spec

    c = _client(client)
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            row = tx.one("SELECT status, spec, directory, name, cluster FROM sweeps WHERE id = ?", (sid,))
            if row is None:
                raise UserInputError(f"no sweep {sid}", field="ID")
            status, spec_text, directory, name, cluster = row
            waiting = [(n, p) for n, p in tx.q("SELECT number, params FROM sweep_trials WHERE sweep_id = ? AND "
                                               "state = ? ORDER BY number", (sid, TrialState.WAITING.value))]
            last = tx.one("SELECT number, job_id FROM sweep_chunks WHERE sweep_id = ? ORDER BY number DESC LIMIT 1",
                          (sid,))
        if status == SweepStatus.CANCELLED.value:
            return []
        spec = spec_from_json(spec_text)
        directory = Path(directory)
        if numbers is not None:
            wanted = set(numbers)
            waiting = [w for w in waiting if w[0] in wanted]
        next_number = (last[0] + 1) if last else 0
        prev_job = last[1] if last else None
        if limit is not None:
            waiting = waiting[:max(0, limit)]
        if not waiting:
            return []
        plan_chunk = min(_limits(c, spec).max_array_size, spec.chunk_size or 10**9)
        dependency = None
        if prev_job:
            active = c.active_job_ids([prev_job])
            if active and prev_job in active:
                dependency = f"afterany:{prev_job}"
        here = _reserves_here(url)
        chunks = _record_chunks(conn, sid, next_number,
                                [waiting[i:i + plan_chunk] for i in range(0, len(waiting), plan_chunk)],
                                spec=spec, name=name, cluster=(cluster or "default") if here else None)
        os.makedirs(directory / "logs", exist_ok=True)
        for number, _, rows, _ in chunks:
            _write_chunk_file(directory, number, rows)
        done: list[tuple[int, str, list, int | None]] = []
        try:
            for number, chunk_id, rows, rid in chunks:
                job = submit_spec(_trial_spec(spec, sid, directory, number, len(rows), dependency), client=c,
                                  reserve=not here)
                done.append((chunk_id, job.job_id, rows, rid))
                dependency = f"afterany:{job.job_id}"
        except BaseException:
            from gpuhpc.ledger import quota

            with conn.transaction() as tx:
                _attach_in(tx, sid, done)
                for _, chunk_id, _, rid in chunks[len(done):]:
                    tx.q("UPDATE sweep_chunks SET state = 'failed' WHERE id = ?", (chunk_id,))
                    tx.q("UPDATE sweep_trials SET state = ? WHERE sweep_id = ? AND chunk_id = ? AND job_id IS NULL",
                         (TrialState.WAITING.value, sid, chunk_id))
                    if rid is not None:             # never submitted: the hold goes back
                        quota.lock_quotas_of(tx, rid)
                        quota.release_holds(tx, rid, "released", now())
            raise
        with conn.transaction() as tx:
            _attach_in(tx, sid, done)
        return [job_id for _, job_id, _, _ in done]
    finally:
        conn.close()


def _record_chunks(conn, sid: int, first: int, groups: list[list], *, spec: SweepSpec, name: str,
                   cluster: str | None) -> list[tuple[int, int, list, int | None]]:
    """Record ``groups`` as chunks ``first``, ``first``+1, ... (``submitting``) and claim their
    trials, in one transaction; with a ``cluster`` each chunk's worst case is also held in the
    ledger there (:func:`gpuhpc.ledger.quota.reserve_in`, the one quota decision; over quota:
    QuotaExceeded and nothing recorded). A chunk whose trials another submitter (the driver, a
    resume) took meanwhile is not recorded, nor any after it.
    Returns [(number, chunk id, rows, reservation id or None)]."""
    out: list[tuple[int, int, list, int | None]] = []
    if cluster is not None:
        from gpuhpc.ledger import quota
    with conn.transaction() as tx:
        t = tx.ts(now())
        at = now()
        for k, rows in enumerate(groups):
            chunk_id = tx.insert("INSERT INTO sweep_chunks (sweep_id, number, job_id, n_tasks, trials, state, "
                                 "created_at) VALUES (?, ?, NULL, ?, ?, 'submitting', ?)",
                                 (sid, first + k, len(rows), json.dumps([n for n, _ in rows]), t))
            tx.q(f"UPDATE sweep_trials SET state = ?, chunk_id = ?, job_id = NULL WHERE sweep_id = ? AND "
                 f"state = ? AND number IN ({', '.join('?' * len(rows))})",
                 (TrialState.PENDING.value, chunk_id, sid, TrialState.WAITING.value, *(n for n, _ in rows)))
            if tx.cur.rowcount != len(rows):
                tx.q("UPDATE sweep_trials SET state = ?, chunk_id = NULL WHERE chunk_id = ?",
                     (TrialState.WAITING.value, chunk_id))
                tx.q("DELETE FROM sweep_chunks WHERE id = ?", (chunk_id,))
                break
            rid = None
            if cluster is not None:
                rid = quota.reserve_in(tx, _request(spec, len(rows), cluster, f"{name}-s{sid}-c{first + k}"),
                                       at, conn.url).id
            out.append((first + k, chunk_id, rows, rid))
    return out


def _attach_in(tx, sid: int, done: Sequence[tuple[int, str, Sequence[tuple[int, Any]], int | None]]) -> None:
    """Record each chunk's array job id, each of its trials' task (one executemany each) and
    the job id of its ledger reservation (when the sweep took it)."""
    from gpuhpc.ledger import quota

    t = tx.ts(now())
    pending = TrialState.PENDING.value
    _many(tx, "UPDATE sweep_chunks SET job_id = ?, state = 'submitted' WHERE id = ?",
          [(job_id, chunk_id) for chunk_id, job_id, _, _ in done])
    _many(tx, "UPDATE sweep_trials SET chunk_id = ?, task_id = ?, job_id = ?, job_id_raw = NULL, state = ?, "
              "raw_state = 'PENDING', attempts = attempts + 1, restarts = 0, exit_code = NULL, updated_at = ? "
              "WHERE sweep_id = ? AND number = ?",
          [(chunk_id, task, f"{job_id}_{task}", pending, t, sid, number)
           for chunk_id, job_id, rows, _ in done for task, (number, _) in enumerate(rows)])
    for _, job_id, _, rid in done:
        if rid is not None:
            quota.attach_job_in(tx, rid, job_id)


def _attach(sid: int, chunk_id: int, job_id: str, rows: Sequence[tuple[int, Any]], url: str | None) -> None:
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            _attach_in(tx, sid, [(chunk_id, job_id, rows, None)])
    finally:
        conn.close()


def _settle_hold(job_name: str, job_id: str | None, url: str | None) -> None:
    """The ledger hold a sweep took for chunk ``job_name`` (:func:`_record_chunks`) and never
    got to record: attached to ``job_id``, or released when the chunk never reached Slurm."""
    if not _reserves_here(url):
        return
    from gpuhpc.ledger import quota

    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            for (rid,) in tx.q("SELECT id FROM reservations WHERE job_name = ? AND status = 'held' AND job_id IS NULL",
                               (job_name,)).fetchall():
                if job_id is not None:
                    quota.attach_job_in(tx, rid, job_id)
                else:
                    quota.lock_quotas_of(tx, rid)
                    quota.release_holds(tx, rid, "released", now())
    finally:
        conn.close()


def recover(sid: int, *, client=None, url: str | None = None) -> None:
    """A chunk left ``submitting`` (the submitter died between sbatch and the database): find
    its job by name in the queue and attach it, else give its trials back to ``waiting``."""
    c = _client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        stuck = [(ch.id, ch.number, json.loads(ch.trials)) for ch in
                 s.query(SweepChunk).filter_by(sweep_id=sid, state="submitting")]
        name = sw.name
    if not stuck:
        return
    rows = c.queue(user=getpass.getuser())
    for chunk_id, number, trials in stuck:
        jname = f"{name}-s{sid}-c{number}"
        ids = sorted({(r.array_job_id or r.job_id).split("_")[0] for r in rows if r.name == jname})
        _settle_hold(jname, ids[0] if ids else None, url)
        if ids:
            _attach(sid, chunk_id, ids[0], [(t, None) for t in trials], url)
        else:                       # never submitted: its trials wait again
            from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
            with _session(url) as s:
                s.get(SweepChunk, chunk_id).state = "failed"
                s.query(SweepTrial).filter_by(sweep_id=sid, chunk_id=chunk_id, job_id=None).update(
                    {"state": TrialState.WAITING.value}, synchronize_session=False)


# ---------------------------------------------------------------- the driver job
def start_driver(sid: int, *, client=None, url: str | None = None) -> str:
    """Submit the sweep driver: a requeueable CPU job running ``python -m gpuhpc.sweeps.driver``."""
    from gpuhpc.jobs.api import submit_spec
    from gpuhpc.jobs.spec import JobSpec, Resources

    c = _client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        spec = spec_from_json(sw.spec)
        directory = Path(sw.directory)
    partition = spec.driver_partition
    if partition is None:
        try:
            names = {p.name for p in c.partitions()}
        except GpuhpcError:
            names = set()
        partition = "cpu" if "cpu" in names else None
    env = {"GPUHPC_DB_URL": db_url(url)}
    if os.environ.get("GPUHPC_SWEEP_ROOT"):
        env["GPUHPC_SWEEP_ROOT"] = os.environ["GPUHPC_SWEEP_ROOT"]
    for k in ("GPUHPC_SWEEP_DRIVER_POLL", "GPUHPC_LEDGER", "GPUHPC_DATA_DIR"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    jspec = JobSpec(command=(sys.executable, "-m", "gpuhpc.sweeps.driver", str(sid)),
                    resources=Resources(partition=partition, account=spec.res.account, time="7-00:00:00",
                                        cpus_per_task=1),
                    name=f"{spec.name}-s{sid}-driver", env=env, log_dir=str(directory / "logs"),
                    checkpoint_dir=str(directory / "driver"), max_requeues=1000, workdir=str(directory))
    job = submit_spec(jspec, client=c)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        s.get(Sweep, sid).driver_job_id = job.job_id
    return job.job_id


# ---------------------------------------------------------------- state from accounting
def _runs_by_task(rows: Iterable[Any]) -> tuple[dict[tuple[str, int], list[Any]], dict[tuple[str, int], Any]]:
    """sacct rows -> ({(array job, task): [runs, oldest first]}, {(array job, task): row of a
    pending/cancelled ``123_[4-50%8]`` range})."""
    from gpuhpc.hostlist import expand_ranges

    runs: dict[tuple[str, int], list[Any]] = {}
    ranges: dict[tuple[str, int], Any] = {}
    for r in rows:
        m = _BRACKET.match(r.job_id)
        if m:
            for task in expand_ranges(m.group(2)):
                ranges[(m.group(1), task)] = r
            continue
        task = r.array_task_id
        if task is None:
            continue
        runs.setdefault((r.array_job_id, int(task)), []).append(r)
    return runs, ranges


def _queue_by_task(c, job_ids: Sequence[str]) -> dict:
    """squeue's view of the arrays ``job_ids``: {(array job, task): row}, and under ``"jobs"``
    the array job ids it still shows at all (pending ranges included)."""
    out: dict[Any, Any] = {"jobs": set()}
    try:
        rows = c.queue(job_ids=job_ids) if job_ids else []
    except GpuhpcError:
        return out
    for r in rows:
        job = (r.array_job_id or r.job_id).split("_")[0]
        out["jobs"].add(job)
        if r.array_task_id.isdigit():
            out[(job, int(r.array_task_id))] = r
    return out


def old_enough(created: dt.datetime | None, seconds: float = 600) -> bool:
    """Long enough ago that Slurm's accounting must know a job submitted then."""
    return created is not None and (now() - created).total_seconds() > seconds


def _read_metrics(path: Path) -> dict[str, float] | None:
    """The last value of each metric in a trial's metrics file (None when there is none)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    out: dict[str, float] = {}
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:          # a torn last line: a trial killed mid-write
            continue
        for k, v in (rec.get("metrics") or {}).items():
            out[k] = v
        if rec.get("step") is not None:
            out["step"] = rec["step"]
    return out or None


def refresh(sid: int, *, client=None, url: str | None = None) -> dict[str, int]:
    """Bring every trial's state, restarts, GPU-hours and metrics up to date from Slurm's
    accounting and the metrics files; returns the counts per state."""
    from sqlalchemy import update

    c = _client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        spec = spec_from_json(sw.spec)
        chunk_rows = [ch for ch in s.query(SweepChunk).filter_by(sweep_id=sid) if ch.job_id]
        chunks = {ch.id: ch.job_id for ch in chunk_rows}
        chunk_created = {ch.id: ch.created_at for ch in chunk_rows}
        trials = [(t.id, t.number, t.state, t.chunk_id, t.task_id, t.metrics, t.objective, t.restarts, t.gpu_hours,
                   t.raw_state) for t in s.query(SweepTrial).filter_by(sweep_id=sid)]
        directory = Path(sw.directory)
        status = sw.status
    terminal = {st.value for st in TrialState if st.is_terminal}
    live_jobs = sorted({chunks[t[3]] for t in trials if t[3] in chunks and t[2] not in terminal})
    acct: list[Any] = []
    for i in range(0, len(live_jobs), 100):
        acct += c.accounting(job_ids=live_jobs[i:i + 100], duplicates=True)
    runs, ranges = _runs_by_task(acct)
    active: set[str] | None = None
    queue: dict | None = None
    updates = []
    counts: dict[str, int] = {}
    for tid, number, state, chunk_id, task, metrics, objective, restarts, gpu_h, raw in trials:
        job = chunks.get(chunk_id) if chunk_id is not None else None
        new = dict(state=state, raw_state=raw, restarts=restarts, gpu_hours=gpu_h, metrics=metrics,
                   objective=objective)
        if job is not None and job in live_jobs and state not in terminal:
            rs = runs.get((job, task))
            if rs:
                last = rs[-1]
                st = _STATE.get(last.state.state.value, TrialState.PENDING)
                new.update(raw_state=last.state.raw[:64], restarts=len(rs) - 1, exit_code=last.exit_code,
                           job_id_raw=last.job_id_raw,
                           gpu_hours=Decimal(sum(r.elapsed_s * sum(r.gpus.values()) for r in rs)) / 3600)
                if st is TrialState.REQUEUED:        # comes back unless Slurm no longer holds it
                    if active is None:
                        active = c.active_job_ids(live_jobs) or set()
                    if job not in active:
                        st = TrialState.FAILED
                new["state"] = st.value
            elif (job, task) in ranges:
                r = ranges[(job, task)]
                new.update(state=_STATE.get(r.state.state.value, TrialState.PENDING).value, raw_state=r.state.raw[:64])
                if new["state"] == TrialState.REQUEUED.value:
                    new["state"] = TrialState.PENDING.value
            else:                                   # not in sacct yet (slurmdbd lags): ask squeue
                if queue is None:
                    queue = _queue_by_task(c, live_jobs)
                q = queue.get((job, task))
                if q is not None:
                    st = _STATE.get(q.state.state.value, TrialState.PENDING)
                    new.update(state=(TrialState.PENDING if st is TrialState.REQUEUED else st).value,
                               raw_state=q.state.raw[:64])
                elif job in queue.get("jobs", ()):   # a pending range squeue prints as one row
                    new["state"] = TrialState.PENDING.value
                elif old_enough(chunk_created.get(chunk_id)):
                    new["state"] = TrialState.CANCELLED.value     # neither sacct nor squeue knows it
                else:
                    new["state"] = TrialState.PENDING.value
        if new["state"] in (TrialState.COMPLETED.value, TrialState.RUNNING.value, TrialState.FAILED.value,
                            TrialState.REQUEUED.value) and (objective is None or new["state"] != state
                                                or new["state"] == TrialState.RUNNING.value):
            m = _read_metrics(directory / "trials" / str(number) / "metrics.jsonl")
            if m is not None:
                new["metrics"] = json.dumps(m, sort_keys=True)
                v = m.get(spec.metric.name)
                new["objective"] = float(v) if isinstance(v, (int, float)) else None
        counts[new["state"]] = counts.get(new["state"], 0) + 1
        if any(new[k] != v for k, v in (("state", state), ("raw_state", raw), ("restarts", restarts),
                                         ("gpu_hours", gpu_h), ("metrics", metrics), ("objective", objective))) \
                or "exit_code" in new:
            updates.append((tid, new))
    all_done = bool(trials) and sum(counts.get(st, 0) for st in terminal) == len(trials)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        t = now()
        for tid, new in updates:
            s.execute(update(SweepTrial).where(SweepTrial.id == tid).values(updated_at=t, **new))
        sw = s.get(Sweep, sid)
        if all_done and len(trials) >= sw.n_trials and status == SweepStatus.RUNNING.value:
            sw.status = SweepStatus.DONE.value
        sw.updated_at = t
    return counts


# ---------------------------------------------------------------- resume / cancel
def resume(sid: int, *, client=None, url: str | None = None) -> list[int]:
    """Resubmit the trials that failed, were cancelled or never started — never a finished
    one, nor one still queued or running. Returns the trial numbers resubmitted."""
    from sqlalchemy import update

    c = _client(client)
    recover(sid, client=c, url=url)
    refresh(sid, client=c, url=url)
    redo = (TrialState.FAILED.value, TrialState.CANCELLED.value, TrialState.WAITING.value)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        spec = spec_from_json(sw.spec)
        numbers = [t.number for t in s.query(SweepTrial).filter(SweepTrial.sweep_id == sid,
                                                                 SweepTrial.state.in_(redo))]
        if numbers:
            s.execute(update(SweepTrial).where(SweepTrial.sweep_id == sid, SweepTrial.number.in_(numbers)).values(
                state=TrialState.WAITING.value, updated_at=now()))
        sw.status = SweepStatus.RUNNING.value
        sw.message = None
        driver = sw.driver_job_id
    if not numbers:
        refresh(sid, client=c, url=url)            # DONE again when every trial is finished
        return []
    queued = sum(1 for r in trial_rows(sid, url=url) if r["state"] in (
        TrialState.PENDING.value, TrialState.RUNNING.value, TrialState.REQUEUED.value))
    plan = plan_submission(spec, c, len_waiting=len(numbers), queued_by_sweep=queued)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        cluster = s.get(Sweep, sid).cluster
    active = c.active_job_ids([driver]) if driver else set()
    if driver and active and driver in active:
        return sorted(numbers)          # the running driver submits them (one submitter at a time)
    check_quota(spec, plan.now, cluster, url)
    submit_waiting(sid, client=c, url=url, limit=plan.now)
    if plan.now < len(numbers):
        start_driver(sid, client=c, url=url)
    return sorted(numbers)


def cancel(sid: int, *, client=None, url: str | None = None) -> list[str]:
    """Cancel the sweep: its driver first (so nothing new is submitted), then every chunk."""
    c = _client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        sw.status = SweepStatus.CANCELLED.value
        sw.updated_at = now()
        ids = ([sw.driver_job_id] if sw.driver_job_id else []) + [
            ch.job_id for ch in s.query(SweepChunk).filter_by(sweep_id=sid) if ch.job_id]
    active = c.active_job_ids(ids) or set()
    done = []
    for job in ids:
        if job in active:
            try:
                c.cancel(job)
                done.append(job)
            except GpuhpcError:
                pass
    return done


# ---------------------------------------------------------------- reading
def trial_rows(sid: int, *, url: str | None = None) -> list[dict[str, Any]]:
    """One row per trial, in trial order: trial, params, state, metrics, job_id, restarts, gpu_hours."""
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        return [dict(trial=t.number, params=json.loads(t.params), state=t.state,
                     metrics=json.loads(t.metrics) if t.metrics else {}, job_id=t.job_id, restarts=t.restarts,
                     gpu_hours=round(float(t.gpu_hours or 0), 6), objective=t.objective, raw_state=t.raw_state,
                     attempts=t.attempts)
                for t in s.query(SweepTrial).filter_by(sweep_id=sid).order_by(SweepTrial.number)]


def sweep_info(sid: int, *, url: str | None = None) -> dict[str, Any]:
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with _session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        return dict(sweep_id=sw.id, name=sw.name, status=sw.status, message=sw.message, directory=sw.directory,
                    n_trials=sw.n_trials, driver_job_id=sw.driver_job_id, kind=sw.kind,
                    spec=spec_from_json(sw.spec),
                    chunks=[dict(number=ch.number, job_id=ch.job_id, n_tasks=ch.n_tasks, state=ch.state)
                            for ch in s.query(SweepChunk).filter_by(sweep_id=sid).order_by(SweepChunk.number)])


def best(rows: Sequence[dict[str, Any]], goal: str) -> dict[str, Any] | None:
    """The completed trial with the best objective (the lowest trial number on a tie)."""
    done = [r for r in rows if r["state"] == TrialState.COMPLETED.value and r["objective"] is not None]
    if not done:
        return None
    sign = 1 if goal == "minimize" else -1
    return min(done, key=lambda r: (sign * r["objective"], r["trial"]))

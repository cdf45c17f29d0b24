"""Submitting a sweep: :func:`create` records it and its trials and submits what the cluster
allows now; :func:`submit_waiting` sends waiting trials out in chunks that get the sweep's free
slots; :func:`balance` hands slots older arrays no longer use to newer ones
(``scontrol update ArrayTaskThrottle``); :func:`recover` finds a chunk whose submitter died
between sbatch and the database; :func:`start_driver` submits the **sweep driver**, a small
requeueable job on the CPU partition (:mod:`gpuhpc.sweeps.driver`) that submits further chunks
as earlier ones drain. Its state is the database, so it resumes after its own requeue.

- each chunk is reserved in the ledger with its real array size before its sbatch
  (:mod:`gpuhpc.sweeps.holds`); the whole first batch is checked first, and an over-quota sweep
  is refused (exit 3) saying how many trials would fit;
- no chunk waits for another (no ``afterany`` chain).
"""
from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.jobs.spec import after_dependency
from gpuhpc.sweeps.environment import submit_client
from gpuhpc.sweeps.holds import charge_request, check_quota, reserves_here, settle_hold, share_of
from gpuhpc.sweeps.planner import (
    check_shapes, concurrently, needs_driver, needs_records, plan_submission, shape_groups, slots_in_use,
    submit_limits, trial_container, trial_spec,
)
from gpuhpc.sweeps import queries
from gpuhpc.sweeps.spec import SweepSpec, spec_from_json, spec_json
from gpuhpc.sweeps.state import ChunkState, SweepStatus
from gpuhpc.sweeps.store import (
    connect, db_url, forget, live_chunks, n_waiting, now, read_throttles, save_throttles, set_sweep, slurm_client,
    sweep_record, sweep_root, transaction, utc, write_chunk_file, write_json,
)


def create(spec: SweepSpec, *, kind: str = "command", client=None, url: str | None = None,
           payload: bytes | None = None, submit: bool = True) -> int:
    """Record a sweep and its trials, then submit what the cluster allows now (and the driver
    when something is left). Returns the sweep id. Nothing is written or submitted when the
    resources cannot fit (exit 2) or the quota is exceeded (exit 3)."""
    c = slurm_client(client)
    from gpuhpc.jobs.spec import check_container_policy, check_fits_on

    check_container_policy(spec.res)        # the site's registries and pins (exit 2), as for a job
    if spec.after:                          # a mistyped id would start the sweep at once (exit 1)
        from gpuhpc.jobs.api import check_after

        check_after(c, spec.after)

    # trials run where the user ran `sweep run`, whoever submits them later (the driver's own
    # working directory is the sweep directory): recorded in the sweep's spec
    if spec.workdir is None or not os.path.isabs(spec.workdir):
        import dataclasses

        spec = dataclasses.replace(spec, workdir=os.path.abspath(spec.workdir or os.getcwd()))
    n_first = spec.n_trials if spec.method != "tpe" else min(spec.parallelism, spec.n_trials)
    # the questions to slurmctld are independent: ask them at once (each is a process and a
    # round trip; MaxJobCount's count is only needed for a large first batch)
    asks = {"limits": lambda: submit_limits(c, spec), "fits": lambda: check_fits_on(spec.res, c)}
    if needs_records(n_first, None):
        asks["records"] = c.job_records
    got = concurrently(asks)
    try:
        cluster = c.cluster_name() or "default"
    except GpuhpcError:
        cluster = "default"
    plan = plan_submission(spec, c, len_waiting=n_first, records=got.get("records"))
    check_quota(spec, plan.now, cluster, url, share_of(spec, c))
    n = spec.n_trials
    first = spec.generate(0, n) if spec.method != "tpe" else []
    root = sweep_root()
    if needs_driver(spec) or n > min(plan.now, plan.chunk):
        check_state_db(db_url(url), lambda: c.node_addresses(driver_partition(spec, c)))
    # every check a chunk's job spec makes (grace, env names, the template's options) before
    # the first row is written: a bad one exits 2 leaving nothing behind
    trial_spec(spec, 0, root / "0", 0, 1, 1)
    trial_container(spec, root / "0", kind)
    if spec.resources_by:       # per-trial resources: every shape fits and makes a valid job
        check_shapes(spec, [(spec.resources_for(p), spec.template_for(p)) for p in first], c, root)
    with transaction(url) as tx:
        at = now()
        sid = queries.insert_sweep(tx, name=spec.name, user_name=getpass.getuser(), cluster=cluster,
                                   spec=spec_json(spec), kind=kind, n_trials=n,
                                   directory_of=lambda i: root / str(i), at=at)
        queries.add_trials(tx, sid, 0, first, at)
    directory = root / str(sid)
    (directory / "chunks").mkdir(parents=True, exist_ok=True)
    (directory / "trials").mkdir(exist_ok=True)
    write_json(directory / "sweep.json", {"sweep_id": sid, "name": spec.name, "command": spec.command,
                                           "kind": kind, "metric": spec.metric.name,
                                           "container": trial_container(spec, directory, kind),
                                           "python": "%d.%d" % sys.version_info[:2]})
    if payload is not None:
        from gpuhpc.fsutil import write_atomic

        write_atomic(directory / "fn.pkl", payload)
    if submit:
        try:        # `after:` holds the first arrays and the driver; the driver's arrays come later
            ids = submit_waiting(sid, client=c, url=url, limit=plan.now, dependency=after_dependency(spec.after))
        except BaseException:
            forget(sid, url, directory)    # Slurm refused the first chunk: no sweep left behind
            raise
        if needs_driver(spec) or n_waiting(sid, url):
            start_driver(sid, client=c, url=url, dependency=after_dependency(spec.after))
    return sid


def balance(sid: int, *, client=None, url: str | None = None) -> int:
    """Hold the sweep at ``parallelism`` trials at once, whatever the chunking: the slots older
    arrays no longer use (fewer trials left than their ``%N``) go to arrays with trials
    waiting behind their throttle, oldest first (``scontrol update ArrayTaskThrottle``; a
    throttle is only ever raised, and the sum stays at most P). Returns the slots still free,
    for a new chunk (:func:`submit_waiting`)."""
    c = slurm_client(client)
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        live = live_chunks(tx, sid, slots=True)
    spec, directory = spec_from_json(sw.spec), Path(sw.directory)
    throttles = read_throttles(directory)
    free = spec.parallelism - slots_in_use(live, throttles)
    changed = False
    for cid, job, left in live:
        t = throttles.get(cid, left)
        if free <= 0:
            break
        if job and left > t:
            more = min(free, left - t)
            if c.set_array_throttle(job, t + more):
                throttles[cid] = t + more
                free -= more
                changed = True
    if changed:
        save_throttles(directory, throttles)
    return max(0, free)


def submit_waiting(sid: int, *, client=None, url: str | None = None, limit: int | None = None,
                   numbers: Iterable[int] | None = None, dependency: str | None = None) -> list[str]:
    """Submit ``waiting`` trials (those in ``numbers``, else all; at most ``limit``) in chunks
    that get the sweep's free slots: each array ``0-(k-1)%T`` with ``T`` the slots its older
    arrays leave (P at most in all, :func:`balance` raises ``T`` as they drain); what no slot
    is free for stays ``waiting`` for the driver. Returns the new array job ids.

    Every chunk is recorded (``submitting``, its trials claimed) in one transaction before the
    first sbatch, and every job id is recorded in one transaction after the last, so the
    database costs two round trips, not four per chunk; an interrupted submission is found
    again by name (:func:`recover`). No chunk waits for another (no ``afterany`` chain)."""
    from gpuhpc.jobs.api import submit_spec

    c = slurm_client(client)
    conn = connect(url)
    try:
        with conn.transaction() as tx:
            sw = queries.sweep(tx, sid)
            if sw is None:
                raise UserInputError(f"no sweep {sid}", field="ID")
            status, spec_text, directory, name, cluster = sw.status, sw.spec, sw.directory, sw.name, sw.cluster
            waiting = [(t.number, t.params) for t in queries.waiting_trials(tx, sid)]
            last = queries.last_chunk_number(tx, sid)
            live = live_chunks(tx, sid, slots=True)
        if status in (SweepStatus.CANCELLED.value, SweepStatus.FAILED.value):
            return []
        spec = spec_from_json(spec_text)
        directory = Path(directory)
        throttles = read_throttles(directory)
        free = spec.parallelism - slots_in_use(live, throttles)
        if numbers is not None:
            wanted = set(numbers)
            waiting = [w for w in waiting if w[0] in wanted]
        next_number = (last + 1) if last is not None else 0
        if limit is not None:
            waiting = waiting[:max(0, limit)]
        plan_chunk = min(submit_limits(c, spec).max_array_size, spec.chunk_size or 10**9)
        groups, throttle_of = [], []
        shaped, shape_of = shape_groups(spec, waiting, plan_chunk)
        res_of = [s[0] if s else None for s in shape_of]
        for group in shaped:
            if free <= 0:
                break
            groups.append(group)
            throttle_of.append(min(free, len(group)))
            free -= throttle_of[-1]
        if not groups:
            return []
        here = reserves_here(url)
        shares = [share_of(spec, c, res_of[k] if k < len(res_of) else None) for k in range(len(groups))] if here else []
        chunks = _record_chunks(conn, sid, next_number, groups, res_of=res_of, shares=shares,
                                spec=spec, name=name, cluster=(cluster or "default") if here else None)
        os.makedirs(directory / "logs", exist_ok=True)
        for number, _, rows, _ in chunks:
            write_chunk_file(directory, number, rows)
        done: list[tuple[int, str, list, int | None]] = []
        sub = submit_client(c, url)         # the driver's own job environment stays behind
        try:
            for k, (number, chunk_id, rows, rid) in enumerate(chunks):
                job = submit_spec(trial_spec(spec, sid, directory, number, len(rows), throttle_of[k],
                                              res=res_of[k], template=shape_of[k][1] if shape_of[k] else None,
                                              dependency=dependency),
                                  client=sub, reserve=not here)
                done.append((chunk_id, job.job_id, rows, rid))
                throttles[chunk_id] = min(throttle_of[k], len(rows))
        except BaseException:
            from gpuhpc.ledger import quota

            with conn.transaction() as tx:
                _attach_in(tx, sid, done)
                for _, chunk_id, _, rid in chunks[len(done):]:
                    queries.fail_chunk(tx, sid, chunk_id)
                    if rid is not None:             # never submitted: the hold goes back
                        quota.lock_quotas_of(tx, rid)
                        quota.release_holds(tx, rid, "released", now())
            if done:
                save_throttles(directory, throttles)
            raise
        save_throttles(directory, throttles)
        with conn.transaction() as tx:
            _attach_in(tx, sid, done)
        return [job_id for _, job_id, _, _ in done]
    finally:
        conn.close()


def _record_chunks(conn, sid: int, first: int, groups: list[list], *, spec: SweepSpec, name: str,
                   cluster: str | None, res_of: Sequence[Any] = (),
                   shares: Sequence[dict[str, Any]] = ()) -> list[tuple[int, int, list, int | None]]:
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
        at = now()
        for k, rows in enumerate(groups):
            numbers = [n for n, _ in rows]
            chunk_id = queries.insert_chunk(tx, sid, first + k, numbers, at)
            if not queries.claim_trials(tx, sid, chunk_id, numbers):
                break
            rid = None
            if cluster is not None:
                rid = quota.reserve_in(tx, charge_request(spec, len(rows), cluster, f"{name}-s{sid}-c{first + k}",
                                                    res_of[k] if k < len(res_of) else None,
                                                    shares[k] if k < len(shares) else None), at, conn.url).id
            out.append((first + k, chunk_id, rows, rid))
    return out


def _attach_in(tx, sid: int, done: Sequence[tuple[int, str, Sequence[tuple[int, Any]], int | None]]) -> None:
    """Record each chunk's array job id, each of its trials' task (one executemany each) and
    the job id of its ledger reservation (when the sweep took it)."""
    from gpuhpc.ledger import quota

    queries.attach_jobs(tx, sid, [(chunk_id, job_id, [number for number, _ in rows])
                                  for chunk_id, job_id, rows, _ in done], now())
    for _, job_id, _, rid in done:
        if rid is not None:
            quota.attach_job_in(tx, rid, job_id)


def _attach(sid: int, chunk_id: int, job_id: str, rows: Sequence[tuple[int, Any]], url: str | None) -> None:
    with transaction(url) as tx:
        _attach_in(tx, sid, [(chunk_id, job_id, rows, None)])


def recover(sid: int, *, client=None, url: str | None = None) -> None:
    """A chunk left ``submitting`` (the submitter died between sbatch and the database): find
    its job by name in the queue and attach it, else give its trials back to ``waiting``."""
    c = slurm_client(client)
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        stuck = [(ch.id, ch.number, json.loads(ch.trials), ch.created_at)
                 for ch in queries.chunks(tx, sid, state=ChunkState.SUBMITTING)]
    name = sw.name
    if not stuck:
        return
    for chunk_id, number, trials, created in stuck:
        jname = f"{name}-s{sid}-c{number}"
        # by name in the queue, else in accounting (a short chunk may have finished already):
        # a query that fails raises, and the chunk stays `submitting` for the next try
        ids = c.jobs_by_name(jname, utc(created or now()) - dt.timedelta(minutes=5), getpass.getuser())
        settle_hold(jname, ids[0] if ids else None, url)
        if ids:
            _attach(sid, chunk_id, ids[0], [(t, None) for t in trials], url)
        else:                       # never submitted: its trials wait again
            with transaction(url) as tx:
                queries.fail_chunk(tx, sid, chunk_id)


def cluster_partitions(c) -> list[Any]:
    """``scontrol show partition``, asked once per client (``sweep run`` asks for the driver's
    partition, then for its MaxTime); [] when Slurm cannot say."""
    cached = getattr(c, "_gpuhpc_sweep_partitions", None)
    if cached is None:
        try:
            cached = list(c.partitions())
        except GpuhpcError:
            return []
        try:
            c._gpuhpc_sweep_partitions = cached
        except AttributeError:
            pass
    return cached


def driver_partition(spec: SweepSpec, c) -> str | None:
    if spec.driver_partition is not None:
        return spec.driver_partition
    return "cpu" if any(p.name == "cpu" for p in cluster_partitions(c)) else None


def _is_this_host(addr: str) -> bool:
    import socket

    try:
        ip = socket.gethostbyname(addr)
    except OSError:
        return False
    if ip.startswith("127.") or addr in (socket.gethostname(), socket.getfqdn()):
        return True
    try:
        return ip in socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        return False


def check_state_db(url: str, driver_nodes) -> None:
    """Sweep state must be written by one host, or live in a server database: a driver job on
    another host writing the same SQLite file as this one (WAL over NFS/Lustre: locks and
    shared memory do not work there) could corrupt it, and it holds the ledger too. So a
    sweep whose driver may run on a node other than this host needs PostgreSQL; refused
    (exit 2) before anything is written. ``driver_nodes``: a callable giving the addresses of
    the nodes the driver may run on (asked only for SQLite)."""
    if not url.startswith("sqlite"):
        return
    try:
        others = [a for a in driver_nodes() if not _is_this_host(a)]
    except GpuhpcError:
        return                              # Slurm cannot say: sbatch will
    if others:
        raise UserInputError(f"this sweep needs its driver job, which may run on {others[0]}, but its state is in "
                             f"SQLite ({url}), which only one host may write",
                             field="GPUHPC_DB_URL", hint="use PostgreSQL (gpuhpc db upgrade), or fewer trials than "
                                                         "parallelism and MaxArraySize allow at once")


#: the driver's time limit where its partition sets none (the job template requeues it before)
DRIVER_TIME = "7-00:00:00"


def driver_time(partitions: Iterable[Any], partition: str | None) -> str:
    """The driver's ``--time``: its partition's MaxTime (``partition``, else the default one)
    when that is shorter than :data:`DRIVER_TIME`, which it is otherwise (no limit, an unknown
    partition, a value that does not parse). Under ``EnforcePartLimits=NO`` a longer limit
    would leave the driver pending (PartitionTimeLimit) for ever; the job template requeues
    the driver before its limit, and the new run carries on from the database."""
    from gpuhpc.slurm.durations import parse_duration

    part = next((p for p in partitions if (p.name == partition if partition else p.default)), None)
    if part is None:
        return DRIVER_TIME
    try:
        limit = parse_duration(part.max_time)
    except UserInputError:
        return DRIVER_TIME
    return part.max_time if limit is not None and 0 < limit < parse_duration(DRIVER_TIME) else DRIVER_TIME


def start_driver(sid: int, *, client=None, url: str | None = None, dependency: str | None = None) -> str:
    """Submit the sweep driver: a requeueable CPU job running ``python -m gpuhpc.sweeps.driver``
    for its partition's MaxTime at most (:func:`driver_time`)."""
    from gpuhpc.jobs.api import submit_spec
    from gpuhpc.jobs.spec import JobSpec, Resources

    c = slurm_client(client)
    sw = sweep_record(sid, url)
    spec = spec_from_json(sw.spec)
    directory = Path(sw.directory)
    partitions = cluster_partitions(c)
    partition = driver_partition(spec, c)
    env = {"GPUHPC_DB_URL": db_url(url)}
    if os.environ.get("GPUHPC_SWEEP_ROOT"):
        env["GPUHPC_SWEEP_ROOT"] = os.environ["GPUHPC_SWEEP_ROOT"]
    for k in ("GPUHPC_SWEEP_DRIVER_POLL", "GPUHPC_LEDGER", "GPUHPC_DATA_DIR"):
        if os.environ.get(k):
            env[k] = os.environ[k]
    jspec = JobSpec(command=(sys.executable, "-m", "gpuhpc.sweeps.driver", str(sid)),
                    resources=Resources(partition=partition, account=spec.res.account,
                                        time=driver_time(partitions, partition), cpus_per_task=1),
                    name=f"{spec.name}-s{sid}-driver", env=env, log_dir=str(directory / "logs"),
                    checkpoint_dir=str(directory / "driver"), max_requeues=1000, workdir=str(directory),
                    dependency=dependency)
    job = submit_spec(jspec, client=submit_client(c, url))
    set_sweep(sid, url, driver_job_id=job.job_id)
    return job.job_id

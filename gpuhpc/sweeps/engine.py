"""Sweeps on Slurm: chunked arrays that fit the cluster, state from accounting, resume, cancel.

Submitting (:func:`create` then :func:`submit_waiting`):

- the limits come from the controller (``MaxArraySize``, ``MaxJobCount``) and the user's
  association/QOS (``MaxSubmitJobs``) through :meth:`SlurmClient.submit_limits`;
- trials go out in chunks of at most ``MaxArraySize`` tasks, each ``--array=0-(k-1)%P`` with a
  parameter file (``<sweep dir>/chunks/<n>.jsonl``: line *i* is task *i*'s trial) — never
  ``--array=1000-1999``;
- parallelism P holds whatever the chunking: a new chunk gets the sweep's free slots as its
  ``%T``, and as older chunks drain their slots go to the newer ones (``scontrol update
  ArrayTaskThrottle``, :func:`balance`); no chunk waits for another (no ``afterany`` chain);
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
from gpuhpc.jobs.spec import after_dependency
from gpuhpc.sweeps.trial import PRUNED, STOP_DIR

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


def slurm_client(client=None):
    """``client``, else a :class:`~gpuhpc.slurm.client.SlurmClient` of the default runner."""
    if client is not None:
        return client
    from gpuhpc.slurm.client import SlurmClient

    return SlurmClient()


# ---------------------------------------------------------------- what the arrays inherit
#: Never handed from the submitting process to a sweep's arrays: what Slurm sets for a job
#: (``SLURM_*`` but ``SLURM_CONF``, ``SRUN_*``, ``SBATCH_*``: in the driver job
#: ``SLURM_CPUS_PER_TASK=1`` would reach every later chunk's torchrun/deepspeed/mpi steps), the
#: node's NCCL profile (``NCCL_*``: the driver's CPU node, not the trial's GPU node), and the
#: ``GPUHPC_*`` that the job template, the trial runner or the node's settings files set per
#: job (:data:`JOB_GPUHPC`). Every other ``GPUHPC_*`` is a user's setting and passes.
JOB_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "NCCL_")
JOB_GPUHPC = frozenset({
    # job-templates/_base.sbatch.j2 and its per-launcher blocks
    "GPUHPC_JOB_ID", "GPUHPC_RUN_ID", "GPUHPC_RESTART_COUNT", "GPUHPC_CHECKPOINT_DIR", "GPUHPC_STOP_DIR", "GPUHPC_SCRATCH",
    "GPUHPC_LATEST_CHECKPOINT", "GPUHPC_COLLECTIVE_TIMEOUT_S", "GPUHPC_GRACE_S", "GPUHPC_MAX_REQUEUES",
    "GPUHPC_NPROC_PER_NODE", "GPUHPC_LOCAL_RANK", "GPUHPC_SNAPSHOT", "GPUHPC_PROFILE", "GPUHPC_PROFILE_STEPS",
    "GPUHPC_PROFILE_OUTPUT",
    # the node's /etc/gpuhpc/scratch.env (the driver's node, not the trial's)
    "GPUHPC_SCRATCH_ROOT", "GPUHPC_NODE_CACHE_ROOT",
    # gpuhpc.sweeps.trial, per trial (GPUHPC_SWEEP_ID: the chunk's script sets it)
    "GPUHPC_SWEEP_ID", "GPUHPC_TRIAL_ID", "GPUHPC_PARAMS_JSON", "GPUHPC_TRIAL_DIR", "GPUHPC_METRICS_FILE",
    "GPUHPC_TRIAL_IN_IMAGE",
})


def job_only(name: str) -> bool:
    """Is ``name`` set for one job (by Slurm, the job template, the node), never a user's
    setting that a sweep's arrays should inherit?"""
    return name != "SLURM_CONF" and (name.startswith(JOB_PREFIXES) or name in JOB_GPUHPC)


def arrays_environment(environ: Any, sweep_db: str | None = None) -> dict[str, str]:
    """The environment sbatch gets for a sweep's arrays and its driver, whoever submits them (a
    login shell, the driver job, a job that runs ``sweep run``): ``environ`` less what
    :func:`job_only` names, with ``GPUHPC_DB_URL`` the sweep's database (the driver job has it
    set; so every chunk has, chunk 0 included). The sweep's own ``env:`` goes into each chunk's
    script and wins over all of this."""
    out = {k: v for k, v in environ.items() if not job_only(k)}
    if sweep_db:
        out["GPUHPC_DB_URL"] = sweep_db
    return out


def submit_client(c, url: str | None = None):
    """``c`` for a sweep's sbatch calls: over a local runner, one whose commands get
    :func:`arrays_environment` instead of this process's (over SSH the login node's own
    environment applies already); ``c`` itself for any other client."""
    runner = getattr(c, "runner", None)
    if runner is None or not getattr(runner, "is_local", False) or not hasattr(runner, "with_environment"):
        return c
    import copy

    out = copy.copy(c)
    out.runner = runner.with_environment(arrays_environment(runner.environment(), db_url(url)))
    return out


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


def session(url: str | None):
    """An ORM session (the readers: refresh, resume, cancel, results). The submit path uses
    :func:`_conn` (DB-API, no SQLAlchemy import: ``gpuhpc sweep run`` stays close to sbatch)."""
    from gpuhpc.ledger.db import session_scope

    return session_scope(db_url(url))


def _conn(url: str | None):
    """A DB-API connection to the sweep database (:class:`gpuhpc.ledger.quota.Connection`)."""
    from gpuhpc.ledger import quota

    return quota.Connection(db_url(url))


def _ledger_url(url: str | None) -> str | None:
    """The ledger for reservations: the sweep database when the ledger is not switched off."""
    from gpuhpc.ledger import hooks

    if hooks.ledger_in_use() is None and not url:
        return None
    if os.environ.get("GPUHPC_LEDGER", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    return db_url(url)


# ---------------------------------------------------------------- quota
def _request(spec: SweepSpec, n: int, cluster: str, name: str | None = None, res=None):
    from gpuhpc.ledger import hooks

    r = res or spec.res
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
    if needs_driver(spec) or n > min(plan.now, plan.chunk):
        check_state_db(db_url(url), lambda: c.node_addresses(_driver_partition(spec, c)))
    # every check a chunk's job spec makes (grace, env names, the template's options) before
    # the first row is written: a bad one exits 2 leaving nothing behind
    _trial_spec(spec, 0, root / "0", 0, 1, 1)
    _trial_container(spec, root / "0", kind)
    if spec.resources_by:       # per-trial resources: every shape fits and makes a valid job
        check_shapes(spec, [(spec.resources_for(p), spec.template_for(p)) for p in first], c, root)
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            t = tx.ts(now())
            sid = tx.insert("INSERT INTO sweeps (name, user_name, cluster, spec, kind, status, message, directory, "
                            "n_trials, driver_job_id, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, NULL, '', ?, "
                            "NULL, ?, ?)", (spec.name, getpass.getuser(), cluster, spec_json(spec), kind,
                                            SweepStatus.RUNNING.value, n, t, t))
            tx.execute("UPDATE sweeps SET directory = ? WHERE id = ?", (str(root / str(sid)), sid))
            zero, waiting = tx.num(Decimal(0)), TrialState.WAITING.value
            tx.execute_many("INSERT INTO sweep_trials (sweep_id, number, params, state, attempts, restarts, gpu_hours, "
                      "updated_at) VALUES (?, ?, ?, ?, 0, 0, ?, ?)",
                  [(sid, i, json.dumps(p, sort_keys=True), waiting, zero, t) for i, p in enumerate(first)])
    finally:
        conn.close()
    directory = root / str(sid)
    (directory / "chunks").mkdir(parents=True, exist_ok=True)
    (directory / "trials").mkdir(exist_ok=True)
    _write_json(directory / "sweep.json", {"sweep_id": sid, "name": spec.name, "command": spec.command,
                                           "kind": kind, "metric": spec.metric.name,
                                           "container": _trial_container(spec, directory, kind),
                                           "python": "%d.%d" % sys.version_info[:2]})
    if payload is not None:
        from gpuhpc.fsutil import write_atomic

        write_atomic(directory / "fn.pkl", payload)
    if submit:
        try:        # `after:` holds the first arrays and the driver; the driver's arrays come later
            ids = submit_waiting(sid, client=c, url=url, limit=plan.now, dependency=after_dependency(spec.after))
        except BaseException:
            _forget(sid, url, directory)    # Slurm refused the first chunk: no sweep left behind
            raise
        if needs_driver(spec) or _n_waiting(sid, url):
            start_driver(sid, client=c, url=url, dependency=after_dependency(spec.after))
    return sid


def needs_driver(spec: SweepSpec) -> bool:
    """Does the sweep need its driver whatever fits at once: tpe asks for trials as others
    finish, a pruner and ``fail_fast`` decide from the trials' progress each round."""
    return spec.method == "tpe" or spec.pruner is not None or spec.fail_fast is not None


def _trial_container(spec: SweepSpec, directory: Path, kind: str) -> list[str]:
    """pyxis' options for trials in the sweep's image (trial.py starts each in an srun step there;
    ``[]`` without an image), with the sweep directory mounted at its own path: the trials'
    checkpoints and metrics files, a Python sweep's function, marks and results. A Python sweep
    whose directory pyxis cannot mount is refused (exit 2); a command sweep's trials then go without."""
    import dataclasses

    from gpuhpc.containers.image import check_mount
    from gpuhpc.jobs.spec import container_srun_args

    if spec.res.image is None:
        return []
    try:
        mount: tuple[str, ...] = (check_mount(f"{directory}:{directory}", "sweep directory"),)
    except UserInputError:
        if kind == "python":
            raise UserInputError(f"the sweep directory {directory} cannot be mounted into the image (pyxis takes "
                                 "no commas, colons or blanks in a path)", field="GPUHPC_DATA_DIR",
                                 hint="a data directory without those") from None
        mount = ()
    return container_srun_args(dataclasses.replace(spec.res, mounts=(*spec.res.mounts, *mount)))


def _forget(sid: int, url: str | None, directory: Path) -> None:
    """Remove a sweep none of whose chunks reached Slurm (its rows, its directory)."""
    import shutil

    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            if tx.one("SELECT count(*) FROM sweep_chunks WHERE sweep_id = ? AND job_id IS NOT NULL", (sid,))[0]:
                return
            tx.execute("DELETE FROM sweep_trials WHERE sweep_id = ?", (sid,))
            tx.execute("DELETE FROM sweep_chunks WHERE sweep_id = ?", (sid,))
            tx.execute("DELETE FROM sweeps WHERE id = ?", (sid,))
    finally:
        conn.close()
    shutil.rmtree(directory, ignore_errors=True)


def _n_waiting(sid: int, url: str | None) -> int:
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            return tx.one("SELECT count(*) FROM sweep_trials WHERE sweep_id = ? AND state = ?",
                          (sid, TrialState.WAITING.value))[0]
    finally:
        conn.close()


def _limits(client, spec: SweepSpec, fresh: bool = False):
    """The submission limits, asked once per client (the driver asks afresh each round)."""
    cached = None if fresh else getattr(client, "_gpuhpc_sweep_limits", None)
    if cached is None:
        r = spec.res
        cached = client.submit_limits(getpass.getuser(), r.account, r.qos)
        if cached.max_submit_jobs is None and r.qos:
            # slurmctld lists a QOS's per-user limit only once the user has a job in it (then
            # with the count); before, the count is 0 and the limit is in slurmdbd's record
            try:
                got = client.sacctmgr_list("qos", f"name={r.qos}", fields=("MaxSubmitJobsPerUser",))
            except GpuhpcError:
                got = []
            if got and got[0].get("MaxSubmitJobsPerUser", "").isdigit():
                import dataclasses

                cached = dataclasses.replace(cached, max_submit_jobs=int(got[0]["MaxSubmitJobsPerUser"]))
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
    # between fresh answers (the driver asks at most once a minute) the user's count and the
    # record count move with the sweep's own queued trials
    cache = getattr(client, "_gpuhpc_sweep_counts", None)
    if fresh or cache is None:
        cache = {"queued": queued_by_sweep, "records": records}
        try:
            client._gpuhpc_sweep_counts = cache
        except AttributeError:
            pass
    delta = queued_by_sweep - cache["queued"]
    chunk = min(limits.max_array_size, spec.chunk_size or limits.max_array_size)
    room = len_waiting
    if spec.max_queued is not None:
        room = min(room, spec.max_queued - queued_by_sweep)
    if limits.max_submit_jobs is not None:
        room = min(room, limits.max_submit_jobs - (limits.submitted + delta) - 1)     # one left for the driver
    if _needs_records(len_waiting, limits):
        # slurmctld refuses ("temporarily unable to accept job") an array whose tasks would
        # take it past MaxJobCount; finished and cancelled tasks count until MinJobAge
        if records is None and cache.get("records") is None:
            cache["records"], cache["queued"], delta = client.job_records(), queued_by_sweep, 0
        held = records if records is not None else cache["records"] + max(0, delta)
        room = min(room, limits.max_job_count - held - max(10, limits.max_job_count // 100))
    return Plan(max(0, room), max(1, chunk), limits)


def check_shapes(spec: SweepSpec, shapes: Sequence[tuple[dict[str, Any], str]], client, root: Path) -> None:
    """Each distinct per-trial (resources, template) (``resources_by``) fits the cluster's nodes
    (one ``scontrol show node``) and makes a valid chunk job; else exit 2, nothing written."""
    from gpuhpc.jobs.spec import Resources, check_fits

    distinct = {json.dumps(s, sort_keys=True): s for s in shapes}
    res = [(Resources.from_mapping(r), t) for r, t in distinct.values()]
    if any(r.gpus for r, _ in res):
        try:
            nodes = client.nodes()
        except GpuhpcError:
            nodes = None
        for r, _ in res:
            if nodes is not None and r.gpus:
                check_fits(r, nodes)
    for r, t in res:
        _trial_spec(spec, 0, root / "0", 0, 1, 1, res=r, template=t)


def _shape_groups(spec: SweepSpec, waiting: list, size: int) -> tuple[list[list], list]:
    """``waiting`` [(number, params json)] in groups of at most ``size`` trials of one shape
    (:meth:`SweepSpec.resources_for`, :meth:`SweepSpec.template_for`), and each group's
    (Resources, template) (None: the sweep's own)."""
    if not spec.resources_by:
        plain = [waiting[i:i + size] for i in range(0, len(waiting), size)]
        return plain, [None] * len(plain)
    from gpuhpc.jobs.spec import Resources

    by: dict[str, list] = {}
    for row in waiting:
        p = row[1] if isinstance(row[1], dict) else json.loads(row[1])
        by.setdefault(json.dumps([spec.resources_for(p), spec.template_for(p)], sort_keys=True), []).append(row)
    groups, shapes = [], []
    for key, rows in by.items():
        res, template = json.loads(key)
        for i in range(0, len(rows), size):
            groups.append(rows[i:i + size])
            shapes.append((Resources.from_mapping(res), template))
    return groups, shapes


def _trial_spec(spec: SweepSpec, sid: int, directory: Path, number: int, k: int, throttle: int, res=None,
                template: str | None = None, dependency: str | None = None):
    """The JobSpec of one chunk: the ``single`` template (checkpoint → requeue → resume) around
    ``python -m gpuhpc.sweeps.trial DIR CHUNK`` as an array ``0-(k-1)%T`` (``T``: the sweep's
    free slots when it was submitted; raised later by :func:`balance`)."""
    import dataclasses

    from gpuhpc.jobs.spec import JobSpec

    env = dict(spec.env)
    env.update({"GPUHPC_SWEEP_ID": str(sid)})
    return JobSpec(
        command=(sys.executable, "-m", "gpuhpc.sweeps.trial", str(directory), str(number)),
        # the trial runner is gpuhpc's Python on the host; it runs the trial in the image (trial.py)
        resources=dataclasses.replace(res or spec.res, image=None, mounts=(), container_workdir=None,
                                      image_python=False),
        name=f"{spec.name}-s{sid}-c{number}", template=template or spec.template,
        env=env,
        workdir=spec.workdir or os.getcwd(), log_dir=str(directory / "logs"),
        checkpoint_dir=str(directory / "jobs" / "%j"), grace=spec.grace, max_requeues=spec.max_requeues,
        array=f"0-{k - 1}%{max(1, min(throttle, k))}", hold=spec.hold, dependency=dependency)


def _throttles(directory: Path) -> dict[int, int]:
    """``<sweep dir>/throttles.json``: {chunk id: its array's ``%N`` now}."""
    try:
        return {int(k): int(v) for k, v in json.loads((directory / "throttles.json").read_text()).items()}
    except (OSError, ValueError):
        return {}


def _save_throttles(directory: Path, throttles: dict[int, int]) -> None:
    _write_json(directory / "throttles.json", {str(k): v for k, v in sorted(throttles.items())})


def _ended(raw: str | None) -> bool:
    """Has slurmctld shown this task finished (its raw state), even if accounting has not
    confirmed it yet (the trial keeps its state until then, but no longer holds a slot)?"""
    word = (raw or "").split(" ", 1)[0]
    return word in _STATE and _STATE[word].is_terminal


def _trial_over(raw: str | None) -> bool:
    """Has this task's trial stopped running (:func:`_ended`, or COMPLETING: the batch script
    has exited and only Slurm's epilog runs on)? Its parallelism slot is free: a sweep runs P
    trials at once, not P epilogs, and a busy node's epilog can take seconds per task."""
    return _ended(raw) or (raw or "").split(" ", 1)[0] == "COMPLETING"


def _live_chunks(tx, sid: int, *, slots: bool = False) -> list[tuple[int, str | None, int]]:
    """[(chunk id, array job id, trials of it still queued or running)], oldest first. With
    ``slots``, a task in COMPLETING no longer counts (:func:`_trial_over`: the parallelism
    slots); without, it does (slurmctld counts it against MaxSubmitJobs until it is gone)."""
    live = (TrialState.PENDING.value, TrialState.RUNNING.value, TrialState.REQUEUED.value)
    over = _trial_over if slots else _ended
    counts: dict[int, int] = {}
    for cid, raw in tx.execute("SELECT chunk_id, raw_state FROM sweep_trials WHERE sweep_id = ? AND state IN (?, ?, ?) "
                         "AND chunk_id IS NOT NULL", (sid, *live)):
        if not over(raw):
            counts[cid] = counts.get(cid, 0) + 1
    return [(cid, job, counts[cid]) for cid, job in tx.execute("SELECT id, job_id FROM sweep_chunks WHERE sweep_id = ? "
                                                         "AND state != 'failed' ORDER BY number", (sid,))
            if counts.get(cid)]


def queued_now(sid: int, url: str | None = None) -> int:
    """The sweep's trials queued or running in Slurm now (slurmctld's view, as last refreshed)."""
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            return sum(left for _, _, left in _live_chunks(tx, sid))
    finally:
        conn.close()


def draining(sid: int, url: str | None = None) -> bool:
    """Trials wait while an array of the sweep runs its last wave (no task of it pending): its
    slots free up one by one, and each should go to a waiting trial soon."""
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            if not tx.one("SELECT count(*) FROM sweep_trials WHERE sweep_id = ? AND state = ?",
                          (sid, TrialState.WAITING.value))[0]:
                return False
            states: dict[int, set[str]] = {}
            for cid, state, raw in tx.execute("SELECT chunk_id, state, raw_state FROM sweep_trials WHERE sweep_id = ? AND "
                                        "state IN (?, ?, ?) AND chunk_id IS NOT NULL",
                                        (sid, TrialState.PENDING.value, TrialState.RUNNING.value,
                                         TrialState.REQUEUED.value)):
                if not _ended(raw):
                    states.setdefault(cid, set()).add(state)
            return any(st == {TrialState.RUNNING.value} for st in states.values())
    finally:
        conn.close()


def slots_in_use(live: Sequence[tuple[int, str | None, int]], throttles: dict[int, int]) -> int:
    """How many trials the sweep's arrays may run now: each array's ``%N``, or fewer when it
    has fewer trials left (a chunk whose throttle is unknown counts all its trials)."""
    return sum(min(throttles.get(cid, left), left) for cid, _, left in live)


def balance(sid: int, *, client=None, url: str | None = None) -> int:
    """Hold the sweep at ``parallelism`` trials at once, whatever the chunking: the slots older
    arrays no longer use (fewer trials left than their ``%N``) go to arrays with trials
    waiting behind their throttle, oldest first (``scontrol update ArrayTaskThrottle``; a
    throttle is only ever raised, and the sum stays at most P). Returns the slots still free,
    for a new chunk (:func:`submit_waiting`)."""
    c = slurm_client(client)
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            spec_text, directory = tx.one("SELECT spec, directory FROM sweeps WHERE id = ?", (sid,))
            live = _live_chunks(tx, sid, slots=True)
    finally:
        conn.close()
    spec, directory = spec_from_json(spec_text), Path(directory)
    throttles = _throttles(directory)
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
        _save_throttles(directory, throttles)
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
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            row = tx.one("SELECT status, spec, directory, name, cluster FROM sweeps WHERE id = ?", (sid,))
            if row is None:
                raise UserInputError(f"no sweep {sid}", field="ID")
            status, spec_text, directory, name, cluster = row
            waiting = [(n, p) for n, p in tx.execute("SELECT number, params FROM sweep_trials WHERE sweep_id = ? AND "
                                               "state = ? ORDER BY number", (sid, TrialState.WAITING.value))]
            last = tx.one("SELECT number, job_id FROM sweep_chunks WHERE sweep_id = ? ORDER BY number DESC LIMIT 1",
                          (sid,))
            live = _live_chunks(tx, sid, slots=True)
        if status in (SweepStatus.CANCELLED.value, SweepStatus.FAILED.value):
            return []
        spec = spec_from_json(spec_text)
        directory = Path(directory)
        throttles = _throttles(directory)
        free = spec.parallelism - slots_in_use(live, throttles)
        if numbers is not None:
            wanted = set(numbers)
            waiting = [w for w in waiting if w[0] in wanted]
        next_number = (last[0] + 1) if last else 0
        if limit is not None:
            waiting = waiting[:max(0, limit)]
        plan_chunk = min(_limits(c, spec).max_array_size, spec.chunk_size or 10**9)
        groups, throttle_of = [], []
        shaped, shape_of = _shape_groups(spec, waiting, plan_chunk)
        res_of = [s[0] if s else None for s in shape_of]
        for group in shaped:
            if free <= 0:
                break
            groups.append(group)
            throttle_of.append(min(free, len(group)))
            free -= throttle_of[-1]
        if not groups:
            return []
        here = _reserves_here(url)
        chunks = _record_chunks(conn, sid, next_number, groups, res_of=res_of,
                                spec=spec, name=name, cluster=(cluster or "default") if here else None)
        os.makedirs(directory / "logs", exist_ok=True)
        for number, _, rows, _ in chunks:
            _write_chunk_file(directory, number, rows)
        done: list[tuple[int, str, list, int | None]] = []
        sub = submit_client(c, url)         # the driver's own job environment stays behind
        try:
            for k, (number, chunk_id, rows, rid) in enumerate(chunks):
                job = submit_spec(_trial_spec(spec, sid, directory, number, len(rows), throttle_of[k],
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
                    tx.execute("UPDATE sweep_chunks SET state = 'failed' WHERE id = ?", (chunk_id,))
                    tx.execute("UPDATE sweep_trials SET state = ? WHERE sweep_id = ? AND chunk_id = ? AND job_id IS NULL",
                         (TrialState.WAITING.value, sid, chunk_id))
                    if rid is not None:             # never submitted: the hold goes back
                        quota.lock_quotas_of(tx, rid)
                        quota.release_holds(tx, rid, "released", now())
            if done:
                _save_throttles(directory, throttles)
            raise
        _save_throttles(directory, throttles)
        with conn.transaction() as tx:
            _attach_in(tx, sid, done)
        return [job_id for _, job_id, _, _ in done]
    finally:
        conn.close()


def _record_chunks(conn, sid: int, first: int, groups: list[list], *, spec: SweepSpec, name: str,
                   cluster: str | None, res_of: Sequence[Any] = ()) -> list[tuple[int, int, list, int | None]]:
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
            tx.execute(f"UPDATE sweep_trials SET state = ?, chunk_id = ?, job_id = NULL WHERE sweep_id = ? AND "
                 f"state = ? AND number IN ({', '.join('?' * len(rows))})",
                 (TrialState.PENDING.value, chunk_id, sid, TrialState.WAITING.value, *(n for n, _ in rows)))
            if tx.cur.rowcount != len(rows):
                tx.execute("UPDATE sweep_trials SET state = ?, chunk_id = NULL WHERE chunk_id = ?",
                     (TrialState.WAITING.value, chunk_id))
                tx.execute("DELETE FROM sweep_chunks WHERE id = ?", (chunk_id,))
                break
            rid = None
            if cluster is not None:
                rid = quota.reserve_in(tx, _request(spec, len(rows), cluster, f"{name}-s{sid}-c{first + k}",
                                                    res_of[k] if k < len(res_of) else None), at, conn.url).id
            out.append((first + k, chunk_id, rows, rid))
    return out


def _attach_in(tx, sid: int, done: Sequence[tuple[int, str, Sequence[tuple[int, Any]], int | None]]) -> None:
    """Record each chunk's array job id, each of its trials' task (one executemany each) and
    the job id of its ledger reservation (when the sweep took it)."""
    from gpuhpc.ledger import quota

    t = tx.ts(now())
    pending = TrialState.PENDING.value
    tx.execute_many("UPDATE sweep_chunks SET job_id = ?, state = 'submitted' WHERE id = ?",
          [(job_id, chunk_id) for chunk_id, job_id, _, _ in done])
    tx.execute_many("UPDATE sweep_trials SET chunk_id = ?, task_id = ?, job_id = ?, job_id_raw = NULL, state = ?, "
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
            for (rid,) in tx.execute("SELECT id FROM reservations WHERE job_name = ? AND status = 'held' AND job_id IS NULL",
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
    c = slurm_client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        stuck = [(ch.id, ch.number, json.loads(ch.trials), ch.created_at) for ch in
                 s.query(SweepChunk).filter_by(sweep_id=sid, state="submitting")]
        name = sw.name
    if not stuck:
        return
    for chunk_id, number, trials, created in stuck:
        jname = f"{name}-s{sid}-c{number}"
        # by name in the queue, else in accounting (a short chunk may have finished already):
        # a query that fails raises, and the chunk stays `submitting` for the next try
        ids = c.jobs_by_name(jname, _utc(created or now()) - dt.timedelta(minutes=5), getpass.getuser())
        _settle_hold(jname, ids[0] if ids else None, url)
        if ids:
            _attach(sid, chunk_id, ids[0], [(t, None) for t in trials], url)
        else:                       # never submitted: its trials wait again
            from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
            with session(url) as s:
                s.get(SweepChunk, chunk_id).state = "failed"
                s.query(SweepTrial).filter_by(sweep_id=sid, chunk_id=chunk_id, job_id=None).update(
                    {"state": TrialState.WAITING.value}, synchronize_session=False)


# ---------------------------------------------------------------- the driver job
def _partitions(c) -> list[Any]:
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


def _driver_partition(spec: SweepSpec, c) -> str | None:
    if spec.driver_partition is not None:
        return spec.driver_partition
    return "cpu" if any(p.name == "cpu" for p in _partitions(c)) else None


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
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        spec = spec_from_json(sw.spec)
        directory = Path(sw.directory)
    partitions = _partitions(c)
    partition = _driver_partition(spec, c)
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
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
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


def _queue_by_task(c, job_ids: Sequence[str]) -> dict | None:
    """squeue's view of the arrays ``job_ids`` (one call: every task, finished ones slurmctld
    still holds too): {(array job, task): row}; None when squeue could not say (a failed or
    timed-out call is not an empty queue)."""
    from gpuhpc.hostlist import expand_ranges

    out: dict[Any, Any] = {}
    try:
        rows = c.queue(job_ids=job_ids) if job_ids else []
    except GpuhpcError:
        return None
    for r in rows:
        job = (r.array_job_id or r.job_id).split("_")[0]
        if r.array_task_id.isdigit():
            out[(job, int(r.array_task_id))] = r
        else:                                   # a pending range printed as one row: 4-50%8
            m = re.match(r"^\[?([0-9,\-]+)(%\d+)?\]?$", r.array_task_id)
            if m:
                for task in expand_ranges(m.group(1)):
                    out[(job, task)] = r
    return out


def old_enough(created: dt.datetime | None, seconds: float = 600) -> bool:
    """Long enough ago that Slurm's accounting must know a job submitted then."""
    return created is not None and (now() - created).total_seconds() > seconds


#: raw_state of a trial that neither the queue nor accounting shows finished: it stays what it
#: was until this mark is older than _GONE_AFTER (accounting confirms a state, or it never will)
_GONE = "gone from the queue"
_GONE_AFTER = 300.0
#: raw_state of a trial accounting lost whose metrics file says it finished (:func:`gone_verdict`)
FINISHED_BY_METRICS = "COMPLETED (its metrics file; no accounting record)"


def gone_verdict(runs: Sequence[Any], rng: Any | None, finished: bool, had_runs: bool) -> tuple[TrialState, str]:
    """The state of a trial neither squeue nor sacct has shown for :data:`_GONE_AFTER` (a
    lagging slurmdbd, a lost record), and its raw state, from one direct ``sacct -j ARRAY`` of
    its array: ``runs`` (its task's rows there, oldest first) and ``rng`` (a pending range row
    holding it). A terminal state there is the answer; else a trial whose metrics file says it
    finished (``finished``: the sweep's metric in it, or a Python trial's result) is completed,
    never failed; else it failed (``had_runs``: accounting knew runs of it) or was cancelled."""
    for row in ((runs[-1],) if runs else ()) + ((rng,) if rng is not None else ()):
        st = _STATE.get(row.state.state.value, TrialState.PENDING)
        if st.is_terminal:
            return st, row.state.raw[:64]
    if finished:
        return TrialState.COMPLETED, FINISHED_BY_METRICS
    st = TrialState.FAILED if (had_runs or runs) else TrialState.CANCELLED
    return st, (runs[-1].state.raw[:64] if runs else _GONE)


def _finished_by_files(trial_dir: Path, metric: str) -> bool:
    """Does a trial's directory say it finished: its metrics file holds the sweep's metric, or
    (a Python sweep) its result was kept?"""
    m = _read_metrics(trial_dir / "metrics.jsonl")
    return (m is not None and metric in m) or (trial_dir / "result.pkl").exists()
_CONFIRM_AFTER = 15.0
_metric_cache: dict[str, tuple[int, dict[str, float]]] = {}


def _read_metrics(path: Path) -> dict[str, float] | None:
    """The last value of each metric in a trial's metrics file (None when there is none). A
    long-lived reader (the driver) reads each file from where it stopped (its offset), so a
    running trial's file is not read again from the start on every poll."""
    key = str(path)
    offset, out = _metric_cache.get(key, (0, {}))
    out = dict(out)
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) < offset:          # replaced or truncated: start again
                offset, out = 0, {}
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return None
    end = data.rfind(b"\n") + 1                # a torn last line is read again next time
    for line in data[:end].decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:                      # a torn line in the middle: a trial killed mid-write
            continue
        if not isinstance(rec, dict):
            continue
        for k, v in (rec.get("metrics") or {}).items():
            out[k] = v
        if rec.get("step") is not None:
            out["step"] = rec["step"]
    _metric_cache[key] = (offset + end, out)
    return out or None


def refresh(sid: int, *, client=None, url: str | None = None) -> dict[str, int]:
    """Bring every trial's state, restarts, GPU-hours and metrics up to date; returns the
    counts per state.

    One ``squeue`` of the sweep's own live arrays gives the live states; ``sacct --duplicates``
    is asked only about the tasks that left the queue (or that slurmctld shows finished), for
    their final state, restarts and GPU-hours. Missing information never ends a trial: when
    ``squeue`` or ``sacct`` fails (an error, a timeout) every trial keeps its state, and a
    terminal state is only ever taken from Slurm's own record of the task, never inferred
    from its absence (unless neither the queue nor accounting has known it for minutes)."""
    from sqlalchemy import func, update

    c = slurm_client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        spec = spec_from_json(sw.spec)
        chunk_rows = [ch for ch in s.query(SweepChunk).filter_by(sweep_id=sid) if ch.job_id]
        chunks = {ch.id: ch.job_id for ch in chunk_rows}
        chunk_created = {ch.id: ch.created_at for ch in chunk_rows}
        terminal = {st.value for st in TrialState if st.is_terminal}
        # only the live trials: a finished one never changes again (its metrics were read in the
        # round it finished), so a driver's round costs what is queued, not the sweep's size
        trials = [(t.id, t.number, t.state, t.chunk_id, t.task_id, t.metrics, t.objective, t.restarts, t.gpu_hours,
                   t.raw_state, t.updated_at) for t in s.query(SweepTrial).filter(
                       SweepTrial.sweep_id == sid, SweepTrial.state.notin_(sorted(terminal)))]
        finished = {st: n for st, n in s.query(SweepTrial.state, func.count(SweepTrial.id)).filter(
            SweepTrial.sweep_id == sid, SweepTrial.state.in_(sorted(terminal))).group_by(SweepTrial.state)}
        directory = Path(sw.directory)
        status = sw.status

    def live(t) -> str | None:
        # a waiting trial has no task now, whatever array it ran in before (a resume gives it back):
        # that array's record (cancelled, failed) is not this trial's
        job = chunks.get(t[3]) if t[3] is not None else None
        return job if job is not None and t[2] not in terminal and t[2] != TrialState.WAITING.value \
            and t[4] is not None else None

    live_jobs = sorted({j for j in map(live, trials) if j})
    queue = _queue_by_task(c, live_jobs) if live_jobs else {}
    acct: list[Any] | None = []
    if queue is not None:
        # sacct (slurmdbd) is asked about the tasks that left the queue at once, and about those
        # slurmctld shows finished in one batch once the first of them has waited _CONFIRM_AFTER
        # (or nothing is left running): their slots are free already (raw_state), only the
        # confirmation, restarts and GPU-hours wait
        asked, urgent, running = [], False, False
        for t in trials:
            job = live(t)
            if not job:
                continue
            q = queue.get((job, t[4]))
            if q is None:
                asked.append(f"{job}_{t[4]}")
                urgent = True
            elif _STATE.get(q.state.state.value, TrialState.PENDING).is_terminal:
                asked.append(f"{job}_{t[4]}")
                urgent = urgent or (_ended(t[9]) and t[10] is not None
                                    and (now() - _utc(t[10])).total_seconds() >= _CONFIRM_AFTER)
            else:
                running = True
        if asked and (urgent or not running):
            try:
                for i in range(0, len(asked), 200):
                    acct += c.accounting(job_ids=asked[i:i + 200], duplicates=True)
            except GpuhpcError:
                acct = None
        elif asked:
            acct = None                         # not asked this round
    runs, ranges = _runs_by_task(acct or [])
    direct: dict[str, Any] = {}

    def confirm(job: str):
        """One direct ``sacct -j ARRAY`` per array (and refresh) before a gone trial is decided;
        None when it failed (decided another round)."""
        if job not in direct:
            try:
                direct[job] = _runs_by_task(c.accounting(job_ids=[job], duplicates=True))
            except GpuhpcError:
                direct[job] = None
        return direct[job]

    updates = []
    counts: dict[str, int] = dict(finished)
    for tid, number, state, chunk_id, task, metrics, objective, restarts, gpu_h, raw, changed in trials:
        job = live((tid, number, state, chunk_id, task))
        new = dict(state=state, raw_state=raw, restarts=restarts, gpu_hours=gpu_h, metrics=metrics,
                   objective=objective)
        if job is not None and queue is not None:
            q = queue.get((job, task))
            qst = _STATE.get(q.state.state.value, TrialState.PENDING) if q is not None else None
            if q is not None and not qst.is_terminal:
                new.update(state=(TrialState.PENDING if qst is TrialState.REQUEUED else qst).value,
                           raw_state=q.state.raw[:64])
            elif acct is None:                  # accounting not asked (or failed): slurmctld's view
                if q is not None:
                    new["raw_state"] = q.state.raw[:64]
            else:
                rs = runs.get((job, task))
                rng = ranges.get((job, task))
                st = None
                if rs:
                    last = rs[-1]
                    st = _STATE.get(last.state.state.value, TrialState.PENDING)
                    new.update(restarts=len(rs) - 1, exit_code=last.exit_code, job_id_raw=last.job_id_raw,
                               gpu_hours=Decimal(sum(r.elapsed_s * sum(r.gpus.values()) for r in rs)) / 3600)
                elif rng is not None:
                    st = _STATE.get(rng.state.state.value, TrialState.PENDING)
                elif qst is TrialState.CANCELLED:       # cancelled while pending: slurmctld's own word
                    st = qst
                if st is not None and st.is_terminal:
                    new.update(state=st.value, raw_state=(rs[-1].state.raw if rs else (rng or q).state.raw)[:64])
                elif q is not None:                     # ended for slurmctld; accounting will confirm
                    new["raw_state"] = q.state.raw[:64]
                elif q is None:
                    # neither squeue nor sacct shows it finished: keep its state until that has
                    # held for minutes (accounting lags; a failed query never gets here)
                    if raw != _GONE:
                        new["raw_state"] = _GONE
                    elif changed is not None and (now() - _utc(changed)).total_seconds() > _GONE_AFTER \
                            and old_enough(chunk_created.get(chunk_id), _GONE_AFTER) \
                            and confirm(job) is not None:
                        druns, dranges = confirm(job)
                        drs = druns.get((job, task)) or []
                        st, why = gone_verdict(drs, dranges.get((job, task)), _finished_by_files(
                            directory / "trials" / str(number), spec.metric.name), bool(rs))
                        new.update(state=st.value, raw_state=why)
                        if drs:
                            new.update(restarts=len(drs) - 1, exit_code=drs[-1].exit_code,
                                       job_id_raw=drs[-1].job_id_raw,
                                       gpu_hours=Decimal(sum(r.elapsed_s * sum(r.gpus.values()) for r in drs)) / 3600)
        if new["state"] != state and TrialState(new["state"]).is_terminal and \
                (directory / "trials" / str(number) / PRUNED).exists():
            new["state"] = TrialState.PRUNED.value      # stopped by the pruner: however Slurm ended it
        if new["state"] in (TrialState.COMPLETED.value, TrialState.RUNNING.value, TrialState.FAILED.value,
                            TrialState.REQUEUED.value, TrialState.PRUNED.value) and (objective is None or new["state"] != state
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
    total = sum(counts.values())
    all_done = total > 0 and sum(counts.get(st, 0) for st in terminal) == total
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        t = now()
        for tid, new in updates:
            s.execute(update(SweepTrial).where(SweepTrial.id == tid).values(updated_at=t, **new))
        sw = s.get(Sweep, sid)
        if all_done and total >= sw.n_trials and status == SweepStatus.RUNNING.value:
            sw.status = SweepStatus.DONE.value
        sw.updated_at = t
    return counts


def _utc(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


# ---------------------------------------------------------------- early stopping
_history_cache: dict[str, tuple[int, int, list[tuple[int, float, float]]]] = {}


def read_history(path: Path, metric: str) -> list[tuple[int, float, float]]:
    """A trial's reports of ``metric`` from its metrics file, in the order written: [(step,
    value, time)]; a report without a step counts as the next step after the last. A long-lived
    reader (the driver) reads each file on from where it stopped, as :func:`_read_metrics`."""
    key = f"{path}\0{metric}"
    offset, count, out = _history_cache.get(key, (0, 0, []))
    out = list(out)
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) < offset:
                offset, count, out = 0, 0, []
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        v = (rec.get("metrics") or {}).get(metric)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = out[-1][0] + 1 if out else count
        ts = rec.get("ts")
        out.append((step, float(v), float(ts) if isinstance(ts, (int, float)) else float(offset + len(out))))
        count += 1
    _history_cache[key] = (offset + end, count, out)
    return out


def histories(sid: int, *, url: str | None = None) -> tuple[SweepSpec, Path, list[Any]]:
    """(spec, directory, [TrialHistory]) of every trial that has run: what a pruner reads."""
    from gpuhpc.sweeps.pruners import TrialHistory

    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            spec_text, directory = tx.one("SELECT spec, directory FROM sweeps WHERE id = ?", (sid,))
            rows = list(tx.execute("SELECT number, state FROM sweep_trials WHERE sweep_id = ? AND state != ? "
                             "ORDER BY number", (sid, TrialState.WAITING.value)))
    finally:
        conn.close()
    spec, directory = spec_from_json(spec_text), Path(directory)
    return spec, directory, [TrialHistory(n, st, read_history(directory / "trials" / str(n) / "metrics.jsonl",
                                                              spec.metric.name)) for n, st in rows]


def prune(sid: int, *, client=None, url: str | None = None) -> list[int]:
    """The sweep pruner's round (the driver calls it after :func:`refresh`): each running trial
    it stops gets ``pruned`` in its directory (:func:`gpuhpc.should_prune`) and a stop request
    in its run's stop directory (the checkpoint path's, :func:`gpuhpc.jobs.coord.request_stop`);
    a pruned trial still queued, or still running ``grace`` seconds after, has its array task
    cancelled, so its slot goes to the next trial. :func:`refresh` records it ``pruned`` once
    Slurm shows it ended. Returns the trials pruned in this round."""
    import time

    from gpuhpc.fsutil import write_atomic
    from gpuhpc.sweeps import pruners

    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            status, spec_text = tx.one("SELECT status, spec FROM sweeps WHERE id = ?", (sid,))
            live = list(tx.execute("SELECT number, state, raw_state, job_id FROM sweep_trials WHERE sweep_id = ? AND "
                             "state IN (?, ?, ?)", (sid, TrialState.PENDING.value, TrialState.RUNNING.value,
                                                    TrialState.REQUEUED.value)))
    finally:
        conn.close()
    spec = spec_from_json(spec_text)
    if spec.pruner is None or status != SweepStatus.RUNNING.value or not live:
        return []
    spec, directory, trials = histories(sid, url=url)
    marked = {n for n, _, _, _ in live if (directory / "trials" / str(n) / PRUNED).exists()}
    running = [n for n, st, raw, _ in live if st == TrialState.RUNNING.value and not _trial_over(raw)
               and n not in marked]
    verdicts = pruners.decide(spec.pruner, spec.metric.goal, trials, running)
    c = None
    for n, why in sorted(verdicts.items()):
        tdir = directory / "trials" / str(n)
        step = next((t.last_step for t in trials if t.number == n), None)
        write_atomic(tdir / PRUNED, json.dumps({"step": step, "why": why, "ts": time.time()}) + "\n", 0o644)
        try:
            stop_dir = (tdir / STOP_DIR).read_text().strip()
        except OSError:
            stop_dir = ""
        if stop_dir:        # the checkpoint path's stop request: should_stop() and gpuhpc_should_stop say stop too
            from gpuhpc.jobs.coord import request_stop

            try:
                request_stop(stop_dir, "pruned by the sweep driver")
            except OSError:
                pass
    grace = float(spec.pruner.get("grace", 30))
    for n, st, raw, job in live:
        if n not in marked or not job or _trial_over(raw):
            continue
        try:
            info = json.loads((directory / "trials" / str(n) / PRUNED).read_text())
            since = time.time() - float(info.get("ts", 0))
        except (OSError, ValueError, TypeError):
            since = grace
        if st != TrialState.RUNNING.value or since >= grace:     # queued again, or not stopping: its slot back
            c = c or slurm_client(client)
            try:
                c.cancel(job)
            except GpuhpcError:
                pass
    return sorted(verdicts)


def check_fail_fast(sid: int, *, client=None, url: str | None = None) -> str | None:
    """``fail_fast: N``: once N trials have failed, the sweep is ``failed`` (its message says
    why), nothing more is submitted and every array of it still queued or running is cancelled.
    Returns the message when that happened now, else None."""
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            status, spec_text = tx.one("SELECT status, spec FROM sweeps WHERE id = ?", (sid,))
            spec = spec_from_json(spec_text)
            if spec.fail_fast is None or status != SweepStatus.RUNNING.value:
                return None
            # failed for good, or shown failed by slurmctld already (accounting confirms it later): the
            # same word that frees its slot (_trial_over) counts here, so no trial goes out on that slot first
            failed = [n for n, st, raw in tx.execute("SELECT number, state, raw_state FROM sweep_trials WHERE sweep_id = ? "
                                               "AND state IN (?, ?, ?, ?) ORDER BY number",
                                               (sid, TrialState.FAILED.value, TrialState.PENDING.value,
                                                TrialState.RUNNING.value, TrialState.REQUEUED.value))
                      if st == TrialState.FAILED.value or _STATE.get((raw or "").split(" ", 1)[0]) is TrialState.FAILED]
            if len(failed) < spec.fail_fast:
                return None
            msg = (f"fail_fast: {len(failed)} trials failed ({', '.join(map(str, failed[:10]))}"
                   f"{', ...' if len(failed) > 10 else ''}), at most {spec.fail_fast - 1} allowed; "
                   "the rest were cancelled or never submitted")
            tx.execute("UPDATE sweeps SET status = ?, message = ?, updated_at = ? WHERE id = ? AND status = ?",
                 (SweepStatus.FAILED.value, msg, tx.ts(now()), sid, SweepStatus.RUNNING.value))
            jobs = [j for (j,) in tx.execute("SELECT job_id FROM sweep_chunks WHERE sweep_id = ? AND job_id IS NOT NULL",
                                       (sid,))]
    finally:
        conn.close()
    c = slurm_client(client)
    active = c.active_job_ids(jobs)
    for job in jobs:
        if active is None or job in active:
            try:
                c.cancel(job)
            except GpuhpcError:
                pass
    return msg


# ---------------------------------------------------------------- resume / cancel
def resume(sid: int, *, client=None, url: str | None = None) -> list[int]:
    """Resubmit the trials that failed, were cancelled or never started — never a finished
    one, nor one still queued or running — and start the driver again when it is gone while
    the sweep still needs it. Returns the trial numbers resubmitted."""
    from sqlalchemy import update

    c = slurm_client(client)
    recover(sid, client=c, url=url)
    refresh(sid, client=c, url=url)
    redo = (TrialState.FAILED.value, TrialState.CANCELLED.value, TrialState.WAITING.value)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        spec = spec_from_json(sw.spec)
        numbers = [t.number for t in s.query(SweepTrial).filter(SweepTrial.sweep_id == sid,
                                                                 SweepTrial.state.in_(redo))]
        created = s.query(SweepTrial).filter(SweepTrial.sweep_id == sid).count()
        if numbers:
            s.execute(update(SweepTrial).where(SweepTrial.sweep_id == sid, SweepTrial.number.in_(numbers)).values(
                state=TrialState.WAITING.value, chunk_id=None, task_id=None, raw_state=None, updated_at=now()))
        sw.status = SweepStatus.RUNNING.value
        sw.message = None
        driver = sw.driver_job_id
        n_trials, cluster = sw.n_trials, sw.cluster
    if driver:
        active = c.active_job_ids([driver])
        if active is None:      # never a second submitter because squeue could not answer
            raise GpuhpcError(f"squeue could not say whether the driver (job {driver}) runs; try again")
        if driver in active:
            return sorted(numbers)      # the running driver submits them (one submitter at a time)
    if numbers:
        queued = sum(1 for r in trial_rows(sid, url=url) if r["state"] in (
            TrialState.PENDING.value, TrialState.RUNNING.value, TrialState.REQUEUED.value))
        plan = plan_submission(spec, c, len_waiting=len(numbers), queued_by_sweep=queued)
        check_quota(spec, plan.now, cluster, url)
        submit_waiting(sid, client=c, url=url, limit=plan.now)
    live = any(r["state"] in (TrialState.PENDING.value, TrialState.RUNNING.value, TrialState.REQUEUED.value)
               for r in trial_rows(sid, url=url)) if needs_driver(spec) else False
    if _n_waiting(sid, url) or (spec.method == "tpe" and created < n_trials) or live:
        start_driver(sid, client=c, url=url)
        return sorted(numbers)
    if driver:                  # nothing left for a driver: `wait` and `status` refresh themselves
        from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
        with session(url) as s:
            s.get(Sweep, sid).driver_job_id = None
    if not numbers:
        refresh(sid, client=c, url=url)            # DONE again when every trial is finished
    return sorted(numbers)


def cancel(sid: int, *, client=None, url: str | None = None) -> list[str]:
    """Cancel the sweep: its driver first (so nothing new is submitted), then every chunk."""
    c = slurm_client(client)
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        sw.status = SweepStatus.CANCELLED.value
        sw.updated_at = now()
        ids = ([sw.driver_job_id] if sw.driver_job_id else []) + [
            ch.job_id for ch in s.query(SweepChunk).filter_by(sweep_id=sid) if ch.job_id]
        # a chunk whose submitter stopped between its sbatch and the database: found by name
        unnamed = [(f"{sw.name}-s{sid}-c{ch.number}", ch.created_at)
                   for ch in s.query(SweepChunk).filter_by(sweep_id=sid, state="submitting")]
    for jname, created in unnamed:
        try:
            found = c.jobs_by_name(jname, _utc(created or now()) - dt.timedelta(minutes=5), getpass.getuser())
            ids += [j for j in found if j not in ids]
        except GpuhpcError:
            pass
    active = c.active_job_ids(ids)
    done = []
    for job in ids:
        if active is None or job in active:         # squeue could not say: cancel it anyway
            try:
                c.cancel(job)
                done.append(job)
            except GpuhpcError:
                pass
    return done


# ---------------------------------------------------------------- the driver's heartbeat
def driver_poll_s() -> float:
    return float(os.environ.get("GPUHPC_SWEEP_DRIVER_POLL", "10"))


#: squeue reasons a pending job does not leave by itself: the partition, account or QOS refuses
#: it as it is, or someone must release it
NEVER_CLEARS = frozenset({
    "PartitionTimeLimit", "PartitionNodeLimit", "PartitionConfig", "AccountNotAllowed", "QOSNotAllowed",
    "InvalidAccount", "InvalidQOS", "QOSMaxWallDurationPerJobLimit", "BadConstraints", "DependencyNeverSatisfied",
    "JobHeldUser", "JobHeldAdmin",
})


def driver_check(sid: int, *, client=None, url: str | None = None) -> tuple[str | None, str | None]:
    """(gone, stuck): ``gone`` is None while the sweep's driver follows it (or it has none),
    else what to tell the user, with the command that restarts it; ``stuck`` names why a
    pending driver does not start when squeue's Reason is one it never leaves by itself
    (:data:`NEVER_CLEARS`, e.g. PartitionTimeLimit), else None. Dead: no heartbeat (the
    driver writes the sweep's ``updated_at`` every round) for 6 rounds, and squeue, asked only
    then, does not show its job (pending or running). When squeue cannot say, it is taken for
    alive."""
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        sw = s.get(Sweep, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        status, driver, beat = sw.status, sw.driver_job_id, sw.updated_at
    if status != SweepStatus.RUNNING.value or not driver:
        return None, None
    if beat is not None and (now() - _utc(beat)).total_seconds() < max(15.0, 6 * driver_poll_s()):
        return None, None
    try:
        rows = [r for r in slurm_client(client).queue(job_ids=[driver]) if not r.state.state.is_finished]
    except GpuhpcError:
        return None, None
    if not rows:
        return (f"sweep {sid}: its driver (job {driver}) is gone and nothing submits or follows its trials; "
                f"restart it with: gpuhpc sweep resume {sid}"), None
    reason = rows[0].reason.strip("()") if rows[0].state.state.value == "PENDING" else ""
    if reason in NEVER_CLEARS:
        return None, (f"sweep {sid}: its driver (job {driver}) is pending ({reason}) and will not start as it is: "
                      f"nothing submits the trials still waiting; see scontrol show job {driver}, or "
                      f"gpuhpc sweep cancel {sid}")
    return None, None


def driver_gone(sid: int, *, client=None, url: str | None = None) -> str | None:
    """:func:`driver_check`'s ``gone``."""
    return driver_check(sid, client=client, url=url)[0]


def counts_of(sid: int, *, url: str | None = None) -> dict[str, int]:
    """Trials per state as the database holds them (what the driver last wrote)."""
    conn = _conn(url)
    try:
        with conn.transaction() as tx:
            return {st: n for st, n in tx.execute("SELECT state, count(*) FROM sweep_trials WHERE sweep_id = ? "
                                             "GROUP BY state", (sid,))}
    finally:
        conn.close()


# ---------------------------------------------------------------- reading
def trial_rows(sid: int, *, url: str | None = None) -> list[dict[str, Any]]:
    """One row per trial, in trial order: trial, params, state, metrics, job_id, restarts, gpu_hours."""
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
        return [dict(trial=t.number, params=json.loads(t.params), state=t.state,
                     metrics=json.loads(t.metrics) if t.metrics else {}, job_id=t.job_id, restarts=t.restarts,
                     gpu_hours=round(float(t.gpu_hours or 0), 6), objective=t.objective, raw_state=t.raw_state,
                     attempts=t.attempts)
                for t in s.query(SweepTrial).filter_by(sweep_id=sid).order_by(SweepTrial.number)]


def sweep_info(sid: int, *, url: str | None = None) -> dict[str, Any]:
    from gpuhpc.sweeps.models import Sweep, SweepChunk, SweepTrial  # noqa: F401
    with session(url) as s:
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

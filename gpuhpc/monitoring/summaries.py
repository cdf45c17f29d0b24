"""Per-run GPU utilisation summaries in the ledger (table ``run_utilisation``, migration 0005),
next to each run's charge, so that ``gpuhpc report efficiency`` keeps working after
Prometheus' retention has ended.

``gpuhpc ledger ingest`` calls :func:`store_settled` after it settled the runs: every run that
ended (at least :data:`SETTLE_LAG` ago, at most :data:`MAX_AGE` ago), held GPUs and has no
summary yet gets one (ended two scrape intervals ago: the exporter's last scrape of the run's
GPUs lands after Slurm's End), from one set of Prometheus range queries over the run (per GPU or MIG
instance: mean and peak utilisation, peak memory, idle and held GPU-hours under the site's
threshold; the job's CPU time and peak RSS from the Slurm exporter's sstat series). A run
Prometheus has no samples for is stored with ``samples = 0`` and not asked about again.
Prometheus unreachable: nothing is stored and the next ingest tries again. The database is
read, then Prometheus asked, then the database written: no network call inside a transaction.

The reports read these rows first (:func:`load_run`, :func:`idle_by_job`) and Prometheus only
for what is not settled yet and for a recent job's time series.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal

from gpuhpc.errors import GpuhpcError

SETTLE_LAG = dt.timedelta(seconds=60)     # when Prometheus does not say its scrape interval
MAX_AGE = dt.timedelta(days=14)           # Prometheus keeps 15 days by default: older runs are not asked about
HOURS_Q = Decimal("0.000001")


@dataclass(frozen=True)
class PendingRun:
    usage_id: int
    job_id: str               # the array job id, or the job id
    array_task_id: int
    start: dt.datetime
    end: dt.datetime


@dataclass(frozen=True)
class StoredRun:
    """A settled run's summary as the reports use it."""

    usage_id: int
    job_id: str
    array_task_id: int
    slurm_job_id: str
    user: str
    account: str
    gpu_type: str
    gpus: int
    run_start: dt.datetime
    rate: Decimal | None      # the run's latest charge's effective rate per GPU-hour (multipliers applied)
    threshold: float
    step_s: int
    samples: int
    idle_gpu_hours: Decimal
    cpu_used_seconds: float | None
    peak_rss_bytes: float | None
    devices: list[dict]


def _ledger(url: str | None) -> str | None:
    if url:
        return url
    from gpuhpc.ledger.hooks import ledger_in_use

    return ledger_in_use()


def _split(job_id: str) -> tuple[str, int]:
    head, _, task = str(job_id).partition("_")
    return head, int(task) if task.isdigit() else -1


# ------------------------------------------------------------------ writing (ledger ingest)
def settle_lag(prom) -> dt.timedelta:
    """Two of Prometheus' global scrape intervals (from its running config), else SETTLE_LAG."""
    import yaml

    from gpuhpc.errors import UserInputError
    from gpuhpc.slurm.durations import parse_duration

    try:
        interval = (yaml.safe_load(prom.config()) or {}).get("global", {}).get("scrape_interval")
        seconds = parse_duration(str(interval), shorthand=True) if interval else None
    except (GpuhpcError, UserInputError, yaml.YAMLError, AttributeError):
        return SETTLE_LAG
    return 2 * dt.timedelta(seconds=seconds) if seconds else SETTLE_LAG


def pending(*, url: str | None = None, now: dt.datetime | None = None, limit: int = 2000,
            lag: dt.timedelta = SETTLE_LAG) -> list[PendingRun]:
    """Runs that ended, held GPUs and have no summary yet (the oldest ``limit``: the next
    ingest takes the rest)."""
    from sqlalchemy import select

    from gpuhpc.ledger import db
    from gpuhpc.ledger.orm import RunUtilisation, UsageRecord

    now = now or dt.datetime.now(dt.timezone.utc)
    with db.session_scope(url) as s:
        q = (select(UsageRecord.id, UsageRecord.job_id, UsageRecord.array_task_id, UsageRecord.run_start,
                    UsageRecord.run_end)
             .outerjoin(RunUtilisation, RunUtilisation.usage_id == UsageRecord.id)
             .where(RunUtilisation.id.is_(None), UsageRecord.run_end.is_not(None), UsageRecord.gpus > 0,
                    UsageRecord.run_end <= now - lag, UsageRecord.run_end >= now - MAX_AGE)
             .order_by(UsageRecord.id).limit(limit))
        return [PendingRun(*row) for row in s.execute(q)]


def summary_row(rep, run: PendingRun, label: str) -> dict:
    """A filled :class:`~gpuhpc.monitoring.usage.JobEfficiency` -> a ``run_utilisation`` row."""
    devs = rep.devices
    samples = sum(len(d.util) for d in devs)
    busy = [d for d in devs if d.util]
    held = sum(d.held_hours for d in devs)
    return dict(usage_id=run.usage_id, slurm_job_id=label, threshold=rep.threshold, step_s=rep.step_s,
                samples=samples,
                mean_util=(sum(u for d in busy for u in d.util) / samples) if samples else None,
                peak_util=max((d.peak_util for d in busy), default=None),
                peak_memory_bytes=max((d.peak_mem_bytes for d in devs), default=None),
                idle_gpu_hours=Decimal(str(round(rep.idle_gpu_hours, 6))), held_gpu_hours=Decimal(str(round(held, 6))),
                cpu_used_seconds=rep.cpu_used_seconds, peak_rss_bytes=rep.peak_rss_bytes,
                devices=json.dumps([d.to_dict() for d in devs], sort_keys=True))


def store_settled(*, url: str | None = None, prom=None, client=None, threshold: float | None = None,
                  now: dt.datetime | None = None) -> int:
    """Summarise every settled run that has no summary yet; returns how many were stored.
    Raises :class:`GpuhpcError` when Prometheus cannot be reached (nothing stored then)."""
    from gpuhpc.monitoring.usage import JobEfficiency, Prometheus, fetch_series, idle_threshold

    now = now or dt.datetime.now(dt.timezone.utc)
    prom = prom or Prometheus()
    runs = pending(url=url, now=now, lag=settle_lag(prom))
    if not runs:
        return 0
    th = idle_threshold(threshold)
    labels = _task_ids([r for r in runs if r.array_task_id >= 0], client)
    rows = []
    for run in runs:
        label = run.job_id if run.array_task_id < 0 else labels.get((run.job_id, run.array_task_id))
        if label is None:            # sacct no longer knows the task's own id
            continue
        rep = JobEfficiency(job_id=label, threshold=th)
        fetch_series(rep, prom, run.start, run.end, now)
        rows.append(summary_row(rep, run, label))
    return write(rows, url=url, now=now)


def write(rows: list[dict], *, url: str | None = None, now: dt.datetime | None = None) -> int:
    """Store ``run_utilisation`` rows (:func:`summary_row`), skipping runs that already have one
    (a concurrent ingest); returns how many were written."""
    from sqlalchemy import select

    from gpuhpc.ledger import db
    from gpuhpc.ledger.orm import RunUtilisation

    if not rows:
        return 0
    now = now or dt.datetime.now(dt.timezone.utc)
    with db.session_scope(url) as s:
        done = set(s.scalars(select(RunUtilisation.usage_id).where(
            RunUtilisation.usage_id.in_([r["usage_id"] for r in rows]))))
        fresh = [r for r in rows if r["usage_id"] not in done]
        s.add_all(RunUtilisation(**r, created_at=now) for r in fresh)
    return len(fresh)


def _task_ids(runs: list[PendingRun], client) -> dict[tuple[str, int], str]:
    """(array job id, task id) -> the task's own job id (the ``job_id`` label the Prolog wrote)."""
    if not runs:
        return {}
    from gpuhpc.slurm.client import SlurmClient

    client = client or SlurmClient()
    out = {}
    for r in client.accounting(job_ids=sorted({r.job_id for r in runs})):
        head, task = _split(r.job_id)
        if task >= 0 and r.job_id_raw:
            out[(head, task)] = r.job_id_raw
    return out


# ------------------------------------------------------------------ reading (the reports)
def _stored(url: str | None, where) -> list[StoredRun]:
    from sqlalchemy import select

    from gpuhpc.ledger import db
    from gpuhpc.ledger.orm import Charge, RunUtilisation, UsageRecord

    url = _ledger(url)
    if url is None:
        return []
    U, R = UsageRecord, RunUtilisation
    rate = select(Charge.rate).where(Charge.usage_id == U.id).order_by(Charge.id.desc()).limit(1).scalar_subquery()
    try:
        with db.session_scope(url) as s:
            rows = s.execute(select(U.id, U.job_id, U.array_task_id, R.slurm_job_id, U.user_name, U.account_name,
                                    U.gpu_type, U.gpus, U.run_start, rate, R.threshold, R.step_s,
                                    R.samples, R.idle_gpu_hours, R.cpu_used_seconds, R.peak_rss_bytes, R.devices)
                             .join(R, R.usage_id == U.id).where(*where(U)).order_by(U.run_start)).all()
    except GpuhpcError:                  # no ledger, or one behind this gpuhpc: the reports use Prometheus
        return []
    return [StoredRun(*row[:9], Decimal(row[9]) if row[9] is not None else None, *row[10:-1], json.loads(row[-1]))
            for row in rows]


def load_run(job_id: str, *, url: str | None = None) -> StoredRun | None:
    """The summary of the latest run of ``job_id`` (``123`` or an array task ``123_4``)."""
    head, task = _split(job_id)
    runs = _stored(url, lambda U: (U.job_id == head, U.array_task_id == task))
    return runs[-1] if runs else None


def apply(rep, stored: StoredRun) -> None:
    """Fill a :class:`~gpuhpc.monitoring.usage.JobEfficiency` from a stored summary."""
    from gpuhpc.monitoring.usage import Device

    rep.source = "ledger"
    rep.threshold = stored.threshold
    rep.step_s = stored.step_s
    rep.devices = [Device(node=d["node"], gpu=d["gpu"], mig=d.get("mig", ""), mean_util=d["mean_util_percent"],
                          peak_util=d.get("peak_util_percent", 0.0), peak_mem_bytes=d["peak_memory_bytes"],
                          idle_hours=d["idle_gpu_hours"], held_hours=d["held_gpu_hours"], idle=d["idle"])
                   for d in stored.devices]
    rep.cpu_used = [stored.cpu_used_seconds] if stored.cpu_used_seconds is not None else []
    rep.rss = [stored.peak_rss_bytes] if stored.peak_rss_bytes is not None else []
    rep.rate = stored.rate


def idle_by_job(account: str, since: dt.datetime, until: dt.datetime, *, url: str | None = None) -> list:
    """The account's settled runs that started in ``[since, until)``, summed per job (array
    tasks apart), as :class:`~gpuhpc.monitoring.usage.RankRow`: idle GPU-hours priced at
    each run's charge rate."""
    from gpuhpc.monitoring.usage import RankRow

    out: dict[str, RankRow] = {}
    cost: dict[str, Decimal] = {}
    for r in _stored(url, lambda U: (U.account_name == account, U.run_start >= since, U.run_start < until)):
        if not r.samples:
            continue
        key = r.job_id if r.array_task_id < 0 else f"{r.job_id}_{r.array_task_id}"
        row = out.get(key)
        if row is None:
            row = out[key] = RankRow(key, r.user, r.account, r.gpu_type, r.gpus, 0.0, None, "ledger", r.slurm_job_id)
        row.idle_gpu_hours += float(r.idle_gpu_hours)
        if r.rate is not None:
            cost[key] = cost.get(key, Decimal(0)) + r.idle_gpu_hours * r.rate
    for key, row in out.items():       # one rate per job: its idle cost over its idle hours
        if key in cost and row.idle_gpu_hours:
            row.rate = (cost[key] / Decimal(str(round(row.idle_gpu_hours, 6)))).quantize(HOURS_Q)
    return [r for r in out.values() if r.idle_gpu_hours > 0]

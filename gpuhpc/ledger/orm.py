"""Ledger tables: SQLAlchemy 2 typed models (``Mapped[...]``), money as ``Numeric``.

Entities: accounts, users, memberships; the price book (GPU-type / MIG-profile rates and
partition / QOS multipliers, all effective-dated); quotas (per account, optionally per user;
GPU-hours and/or money per period) with one counter row per quota period; reservations
(pre-submit holds) and their per-quota holds; usage records (one per sacct run) and charges
(append-only money entries); ingested job metrics.
"""
from __future__ import annotations

import datetime as dt
import enum
from decimal import Decimal

from sqlalchemy import (BigInteger, DateTime, Enum, Float, ForeignKey, Index, Integer, MetaData, Numeric,
                        String, Text, TypeDecorator, UniqueConstraint, true)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from gpuhpc.ledger import periods

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

MONEY = Numeric(20, 6)          # currency units, 6 decimals
HOURS = Numeric(20, 6)          # GPU-hours
FACTOR = Numeric(12, 6)         # multipliers


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive UTC)."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect):
        return dialect.type_descriptor(DateTime(timezone=dialect.name != "sqlite"))

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.timezone.utc)
        return value.astimezone(dt.timezone.utc)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Period(str, enum.Enum):
    day = "day"
    week = "week"
    month = "month"
    total = "total"


class MultiplierKind(str, enum.Enum):
    partition = "partition"
    qos = "qos"


class ReservationStatus(str, enum.Enum):
    held = "held"            # reserved, sbatch not yet confirmed
    submitted = "submitted"  # job id attached
    settled = "settled"      # job finished, leftover hold released
    released = "released"    # sbatch failed / cancelled before running


def _enum(cls):
    return Enum(cls, native_enum=False, length=16, validate_strings=True,
                values_callable=lambda e: [m.value for m in e])


class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # what finance books the account's cost to (migration 0009)
    grant_code: Mapped[str | None] = mapped_column(String(64))
    cost_centre: Mapped[str | None] = mapped_column(String(64))
    memberships: Mapped[list[Membership]] = relationship(back_populates="account")


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    memberships: Mapped[list[Membership]] = relationship(back_populates="user")


class Membership(Base):
    __tablename__ = "memberships"
    __table_args__ = (UniqueConstraint("account_id", "user_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    is_default: Mapped[bool] = mapped_column(default=False)
    account: Mapped[Account] = relationship(back_populates="memberships")
    user: Mapped[User] = relationship(back_populates="memberships")


class GpuPrice(Base):
    """Rate per GPU-hour for a GPU type or MIG profile, from ``effective_from`` on.

    Either ``rate`` is set, or ``base_gpu_type`` + ``fraction_num/fraction_den`` (a MIG
    slice priced as an exact fraction of its parent GPU, e.g. 3g.40gb = 3/7 of h100).
    """

    __tablename__ = "gpu_prices"
    __table_args__ = (UniqueConstraint("gpu_type", "effective_from"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(64))
    rate: Mapped[Decimal | None] = mapped_column(MONEY)
    base_gpu_type: Mapped[str | None] = mapped_column(String(64))
    fraction_num: Mapped[int | None] = mapped_column(Integer)
    fraction_den: Mapped[int | None] = mapped_column(Integer)
    currency: Mapped[str] = mapped_column(String(8), default="USD")
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class PriceMultiplier(Base):
    """Partition or QOS multiplier (preemptible capacity is cheaper), effective-dated."""

    __tablename__ = "price_multipliers"
    __table_args__ = (UniqueConstraint("kind", "name", "effective_from"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[MultiplierKind] = mapped_column(_enum(MultiplierKind))
    name: Mapped[str] = mapped_column(String(64))
    multiplier: Mapped[Decimal] = mapped_column(FACTOR)
    effective_from: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class QuotaPeriod(TypeDecorator):
    """A quota's period (VARCHAR(16)): a :class:`Period`, or an allocation window's text
    (``2026-07-01/P12M``, :mod:`gpuhpc.ledger.periods`, migration 0010) read back as a
    :class:`~gpuhpc.ledger.periods.WindowName` (a str with ``.value``, as a member has)."""

    impl = String(16)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        return periods.check_period(value.value if isinstance(value, enum.Enum) else str(value))

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return Period(value) if value in Period._value2member_map_ else periods.WindowName(value)


class Quota(Base):
    """A budget per period for an account (``user_id`` NULL) or one user in an account, on every
    cluster of the ledger (``cluster`` NULL: usage on all of them counts) or on one cluster only
    (migration 0011)."""

    __tablename__ = "quotas"
    __table_args__ = (UniqueConstraint("account_id", "user_key", "cluster_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"))
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    user_key: Mapped[int] = mapped_column(Integer, default=0)   # user_id or 0: unique even without a user
    # the one cluster whose usage counts (ClusterName, lower case); NULL: every cluster (migration 0011)
    cluster: Mapped[str | None] = mapped_column(String(64))
    cluster_key: Mapped[str] = mapped_column(String(64), default="", server_default="")   # cluster or ""
    period: Mapped[Period] = mapped_column(QuotaPeriod)   # or an allocation window (migration 0010)
    gpu_hours: Mapped[Decimal | None] = mapped_column(HOURS)
    money: Mapped[Decimal | None] = mapped_column(MONEY)
    # alert thresholds, % of the budget, "80,100"; NULL: the default; "": none (migration 0010)
    alert_at: Mapped[str | None] = mapped_column(String(64))
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    account: Mapped[Account] = relationship()
    user: Mapped[User | None] = relationship()


class QuotaUsage(Base):
    """Running totals for one quota period: settled charges and open holds."""

    __tablename__ = "quota_usage"
    __table_args__ = (UniqueConstraint("quota_id", "period_start"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    quota_id: Mapped[int] = mapped_column(ForeignKey("quotas.id", ondelete="CASCADE"))
    period_start: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    used_gpu_hours: Mapped[Decimal] = mapped_column(HOURS, default=Decimal(0))
    used_money: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    held_gpu_hours: Mapped[Decimal] = mapped_column(HOURS, default=Decimal(0))
    held_money: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))


class Reservation(Base):
    __tablename__ = "reservations"
    __table_args__ = (Index("ix_reservations_cluster_job", "cluster", "job_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(64))
    account_name: Mapped[str | None] = mapped_column(String(64))
    partition: Mapped[str | None] = mapped_column(String(64))
    qos: Mapped[str | None] = mapped_column(String(64))
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    time_limit_s: Mapped[int] = mapped_column(Integer)
    array_size: Mapped[int] = mapped_column(Integer, default=1)
    job_name: Mapped[str] = mapped_column(String(255), default="")
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    status: Mapped[ReservationStatus] = mapped_column(_enum(ReservationStatus), index=True)
    job_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    closed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    holds: Mapped[list[ReservationHold]] = relationship(back_populates="reservation")


class ReservationHold(Base):
    """What one reservation still holds in one quota period."""

    __tablename__ = "reservation_holds"
    __table_args__ = (UniqueConstraint("reservation_id", "quota_usage_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reservation_id: Mapped[int] = mapped_column(ForeignKey("reservations.id", ondelete="CASCADE"))
    quota_usage_id: Mapped[int] = mapped_column(ForeignKey("quota_usage.id", ondelete="CASCADE"))
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    money: Mapped[Decimal] = mapped_column(MONEY)
    reservation: Mapped[Reservation] = relationship(back_populates="holds")


class UsageRecord(Base):
    """One run of one job (array task) from sacct. A requeued job has one record per run;
    the key includes the run's start time so a re-ingest never counts a run twice."""

    __tablename__ = "usage_records"
    __table_args__ = (UniqueConstraint("cluster", "job_id", "array_task_id", "run_start"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32))        # array job id, or the job id
    array_task_id: Mapped[int] = mapped_column(Integer)    # -1 when not an array task
    run_start: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    run_end: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    state: Mapped[str] = mapped_column(String(32))
    elapsed_s: Mapped[int] = mapped_column(Integer)
    user_name: Mapped[str] = mapped_column(String(64))
    account_name: Mapped[str] = mapped_column(String(64))
    partition: Mapped[str] = mapped_column(String(64))
    qos: Mapped[str] = mapped_column(String(64))
    gpu_type: Mapped[str] = mapped_column(String(64))       # "" = CPU-only
    gpus: Mapped[int] = mapped_column(Integer)
    job_name: Mapped[str] = mapped_column(String(255))
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS)       # priced totals of this run so far
    amount: Mapped[Decimal] = mapped_column(MONEY)
    # False: the price book had no rate for the GPU type (charged 0); `ledger ingest --reprice`
    priced: Mapped[bool] = mapped_column(default=True, server_default=true())


class Charge(Base):
    """Append-only money entries (a trigger refuses UPDATE and DELETE, migration 0009): a run's
    first charge, then top-ups (a running job settled again once it ended) and adjustments.
    ``bucket_at`` decides which quota period it counts in. ``kind``: usage, reprice (a run
    charged 0 for want of a price, charged now), adjust (a credit or debit), refund (a NODE_FAIL
    run, by policy), correction (``gpuhpc ledger reprice``); the last three point at their
    :class:`Adjustment`."""

    __tablename__ = "charges"
    __table_args__ = (Index("ix_charges_account_bucket", "account_name", "bucket_at"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    # NULL for an adjustment of an account rather than of a run (migration 0009)
    usage_id: Mapped[int | None] = mapped_column(ForeignKey("usage_records.id", ondelete="CASCADE"))
    reservation_id: Mapped[int | None] = mapped_column(ForeignKey("reservations.id", ondelete="SET NULL"))
    adjustment_id: Mapped[int | None] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("adjustments.id"))
    account_name: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(64))
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    rate: Mapped[Decimal] = mapped_column(MONEY)            # effective rate per GPU-hour (× multipliers)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    bucket_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(16), default="usage", server_default="usage")


class Adjustment(Base):
    """Why some charges were booked (migration 0009): a credit or debit with its reason, an
    automatic NODE_FAIL refund, or a rate correction over a period; its money is in the charges
    that point at it (``Charge.adjustment_id``). Signed: a credit is negative. Append-only."""

    __tablename__ = "adjustments"
    __table_args__ = (Index("ix_adjustments_account_bucket", "account_name", "bucket_at"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))                  # credit | debit | refund | correction
    account_name: Mapped[str] = mapped_column(String(64))
    user_name: Mapped[str] = mapped_column(String(64), default="")  # "" = the account as a whole
    cluster: Mapped[str | None] = mapped_column(String(64))
    job_id: Mapped[str | None] = mapped_column(String(32))
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    reason: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text, default="")         # JSON (a correction's rate, window, type)
    bucket_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class LedgerAudit(Base):
    """Who changed prices, multipliers, quotas, policies and adjustments, when, from what to
    what (JSON). Append-only; admins only (migration 0009)."""

    __tablename__ = "ledger_audit"
    __table_args__ = (Index("ix_ledger_audit_at", "at"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(255))
    before: Mapped[str | None] = mapped_column(Text)
    after: Mapped[str | None] = mapped_column(Text)


class LedgerPolicy(Base):
    """A named ledger switch (``node_fail_refund``); admins only (migration 0009)."""

    __tablename__ = "ledger_policies"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class JobMetric(Base):
    """Throughput a job reported with ``gpuhpc.report(...)`` (mean over its reports)."""

    __tablename__ = "job_metrics"
    __table_args__ = (UniqueConstraint("cluster", "job_id", "array_task_id", "name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(32))
    array_task_id: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column()                  # a measurement, not money
    samples: Mapped[int] = mapped_column(Integer)


class IngestState(Base):
    """One row per ingest source; locked for the duration of an ingest batch. ``sacct`` is the
    lock every ingest takes; ``sacct:CLUSTER`` holds one cluster's watermark (migration 0011)."""

    __tablename__ = "ingest_state"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    last_since: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_run_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_detail: Mapped[str] = mapped_column(Text, default="")


# ------------------------------------------------------------------ sweeps (gpuhpc.sweeps; migration 0003)
class Sweep(Base):
    """A hyper-parameter sweep (gpuhpc.sweeps): its spec, status and directory."""

    __tablename__ = "sweeps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    user_name: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(64))
    spec: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(16), default="command")      # command | python
    status: Mapped[str] = mapped_column(String(16), default="running")
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    directory: Mapped[str] = mapped_column(Text)
    n_trials: Mapped[int] = mapped_column(Integer)
    driver_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class SweepChunk(Base):
    """One submitted array of a sweep: task id -> trial number."""

    __tablename__ = "sweep_chunks"
    __table_args__ = (UniqueConstraint("sweep_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(32), nullable=True)    # the array job id
    n_tasks: Mapped[int] = mapped_column(Integer)
    trials: Mapped[str] = mapped_column(Text)            # JSON list: task id -> trial number
    state: Mapped[str] = mapped_column(String(16), default="submitting")     # submitting | submitted | failed
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class SweepTrial(Base):
    """One trial: its parameters, current array task, state from sacct, metrics."""

    __tablename__ = "sweep_trials"
    __table_args__ = (UniqueConstraint("sweep_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    params: Mapped[str] = mapped_column(Text)            # JSON object
    state: Mapped[str] = mapped_column(String(16), default="waiting")
    raw_state: Mapped[str | None] = mapped_column(String(64), nullable=True)
    chunk_id: Mapped[int | None] = mapped_column(ForeignKey("sweep_chunks.id"), nullable=True)
    task_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    job_id: Mapped[str | None] = mapped_column(String(48), nullable=True)    # "<array job>_<task>"
    job_id_raw: Mapped[str | None] = mapped_column(String(32), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)                # submissions (resume adds one)
    restarts: Mapped[int] = mapped_column(Integer, default=0)                # requeues of the current job
    gpu_hours: Mapped[Decimal] = mapped_column(HOURS, default=0)
    exit_code: Mapped[str | None] = mapped_column(String(16), nullable=True)
    metrics: Mapped[str | None] = mapped_column(Text, nullable=True)         # JSON: last value per name
    objective: Mapped[float | None] = mapped_column(Float, nullable=True)   # a measurement, not money
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


# ------------------------------------------------------------------ monitoring (gpuhpc.monitoring; migration 0005)
class RunUtilisation(Base):
    """What a settled run did with its GPUs (from Prometheus, once, when the run is ingested),
    next to its charge: the efficiency reports read it after Prometheus' retention has ended."""

    __tablename__ = "run_utilisation"
    __table_args__ = (UniqueConstraint("usage_id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    usage_id: Mapped[int] = mapped_column(ForeignKey("usage_records.id", ondelete="CASCADE"))
    slurm_job_id: Mapped[str] = mapped_column(String(32))   # the job_id label queried (an array task's own id)
    threshold: Mapped[float] = mapped_column(Float)          # idle under this GPU utilisation, %
    step_s: Mapped[int] = mapped_column(Integer)
    samples: Mapped[int] = mapped_column(Integer)            # utilisation samples over all devices (0: none)
    mean_util: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_util: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_memory_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    idle_gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    held_gpu_hours: Mapped[Decimal] = mapped_column(HOURS)
    cpu_used_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_rss_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    devices: Mapped[str] = mapped_column(Text)               # JSON: one object per GPU or MIG instance
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class NodeBaseline(Base):
    """A node's reference figure for a deep health check (nccl all-reduce bus bandwidth, GB/s):
    the first passing measurement, or what an admin set."""

    __tablename__ = "node_baselines"
    __table_args__ = (UniqueConstraint("node", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(32))            # "nccl_allreduce_busbw"
    value: Mapped[float] = mapped_column(Float)              # a measurement, not money
    unit: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))          # measured | admin
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class InstanceUsage(Base):
    """One cloud instance of elastic capacity (gpuhpc.elastic's journal, ``gpuhpc power ingest``):
    its life from launch to end with the tails, priced per hour at launch. Instance-hours are
    the cluster's cost, not a user's: admins only (migration 0007 grants no reader)."""

    __tablename__ = "instance_usage"
    __table_args__ = (UniqueConstraint("cluster", "instance_id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(64))
    instance_id: Mapped[str] = mapped_column(String(128))
    node: Mapped[str] = mapped_column(String(64))
    pool: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    market: Mapped[str] = mapped_column(String(16))            # on_demand | spot
    launched_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    registered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)   # slurmd registered: boot ends
    last_busy_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)    # its last job ended: idle starts
    suspend_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)      # Slurm powered it down
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str] = mapped_column(String(16), default="")  # suspend | boot-failed | gone | reclaim | orphan
    orphan: Mapped[bool] = mapped_column(default=False)
    price_per_hour: Mapped[Decimal] = mapped_column(MONEY)
    on_demand_price_per_hour: Mapped[Decimal] = mapped_column(MONEY)


# ------------------------------------------------------------------ budget alerts (gpuhpc.ledger.alerts; migration 0010)
class AlertContact(Base):
    """Where an account's budget alerts go: ``mailto:`` or an ``https://`` webhook. Admins only (a
    webhook URL may hold a secret)."""

    __tablename__ = "alert_contacts"
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id", ondelete="CASCADE"), primary_key=True)
    contact: Mapped[str] = mapped_column(String(1024))
    updated_by: Mapped[str] = mapped_column(String(128))
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class QuotaAlert(Base):
    """One threshold of one quota's budget reached in one period: claimed (``sending``) before the
    mail or POST, then ``sent`` or ``failed`` (tried again on the next run). Admins only."""

    __tablename__ = "quota_alerts"
    __table_args__ = (UniqueConstraint("quota_id", "period_start", "measure", "threshold"),)
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    quota_id: Mapped[int] = mapped_column(ForeignKey("quotas.id", ondelete="CASCADE"))
    period_start: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    measure: Mapped[str] = mapped_column(String(16))            # money | gpu_hours
    threshold: Mapped[int] = mapped_column(Integer)             # percent of the budget
    used: Mapped[Decimal] = mapped_column(HOURS)
    budget: Mapped[Decimal] = mapped_column(HOURS)
    contact: Mapped[str] = mapped_column(String(1024))
    status: Mapped[str] = mapped_column(String(16))             # sending | sent | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    detail: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

"""The reservation API the submit path calls (``gpuhpc submit`` → reserve → sbatch → attach/release).

Importing this module is cheap (stdlib only). The reservation, attach and release are
:mod:`gpuhpc.ledger.quota` (DB-API SQL: ``sqlite3`` or ``psycopg``, never SQLAlchemy).

    req = ChargeRequest(cluster="local", user="alice", account="research", partition="gpu",
                        qos=None, gpu_type="h100", gpus=8, time_limit_s=3600, array_size=4)
    res = reserve(req)            # committed hold, or None when the ledger is off
    try:
        job_id = sbatch(...)
    except Exception:
        if res: res.release()     # give the hold back
        raise
    if res: res.attach_job(job_id)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from decimal import Decimal


@dataclass(frozen=True)
class ChargeRequest:
    cluster: str
    user: str
    account: str | None
    partition: str | None
    qos: str | None
    gpu_type: str | None        # "h100" or a MIG profile "1g.10gb"; None = CPU-only
    gpus: int                   # total GPUs per array task (nodes × gpus per node)
    time_limit_s: int
    array_size: int = 1
    job_name: str = ""


@dataclass
class Reservation:
    """A committed pre-submit hold. ``gpu_hours``/``amount`` are the worst case held."""

    id: int
    gpu_hours: Decimal = Decimal(0)
    amount: Decimal = Decimal(0)
    account: str | None = None
    _url: str | None = None
    # the reservation's open connection (reserve(keep_open=True)), used and closed by the next call
    _conn: object = field(default=None, repr=False, compare=False)

    def _take_conn(self):
        conn, self._conn = self._conn, None
        return conn

    def attach_job(self, job_id: str) -> None:
        """Record the Slurm job id (new transaction, after sbatch succeeded)."""
        from gpuhpc.ledger import quota

        quota.attach_job(self.id, str(job_id), url=self._url, conn=self._take_conn())

    def release(self) -> None:
        """sbatch failed: give the whole hold back (idempotent)."""
        from gpuhpc.ledger import quota

        quota.release(self.id, url=self._url, conn=self._take_conn())


def ledger_in_use() -> str | None:
    """The database URL when the ledger is in use, else None (no SQLAlchemy import)."""
    if os.environ.get("GPUHPC_LEDGER", "").strip().lower() in ("off", "0", "false", "no"):
        return None
    from gpuhpc.ledger.paths import configured_db_url, default_db_path

    if url := configured_db_url():
        return url
    path = default_db_path()
    if not path.exists():
        return None
    return f"sqlite:///{path}"


def writable(url: str) -> bool:
    """May this process write the ledger at ``url``? (SQLite: the file and its directory, where
    the WAL lives. PostgreSQL: decided by the server's grants, so True here.)"""
    if not url.startswith("sqlite:"):
        return True
    path = url.split("://", 1)[1].split("?", 1)[0]
    path = path[1:] if path.startswith("/") else path
    d = os.path.dirname(path) or "."
    try:
        os.stat(path)
    except PermissionError:             # a directory on the way is the admin's only
        return False
    except OSError:
        pass
    if os.path.isdir(d) and not os.access(d, os.X_OK):
        return False
    if not os.path.exists(path):        # no ledger yet: whoever creates it (gpuhpc db upgrade) owns it
        return True
    return os.access(path, os.R_OK | os.W_OK) and os.access(d, os.W_OK)


def submit_budget(req: ChargeRequest, account: str | None) -> list[str]:
    """For a user who cannot write the ledger: the budgets of ``account`` from the snapshot the
    ledger publishes (the file job_submit.lua reads), one line each; QuotaExceeded (exit 3) when
    the job alone needs more than is left. Slurm's own limits are what bind."""
    if not account:
        return []
    from gpuhpc.errors import QuotaExceeded
    from gpuhpc.ledger import budget

    snap = budget.read_snapshot()
    if snap is None:
        return []
    lines, refusal = budget.check_job(snap, account=account, user=req.user, partition=req.partition,
                                      gpu_type=req.gpu_type, gpus=req.gpus, time_limit_s=req.time_limit_s,
                                      array_size=req.array_size)
    if refusal:
        raise QuotaExceeded(refusal)
    return lines


def reserve(req: ChargeRequest) -> Reservation | None:
    """Worst case = gpus × time limit × rate × array_size. Reserves atomically against the
    account's (and user's) quota in its own committed transaction BEFORE sbatch.

    Returns None when the ledger is not in use (GPUHPC_LEDGER=off, or no GPUHPC_DB_URL and
    no ledger database file exists yet). Raises :class:`gpuhpc.errors.QuotaExceeded` (exit 3)
    with a one-line message showing budget, committed and remaining; :class:`LedgerError` if
    the schema is behind head (the message names ``gpuhpc db upgrade``)."""
    url = ledger_in_use()
    if url is None:
        return None
    from gpuhpc.ledger import quota

    # one connection for the reservation and its attach/release (one SQLite checkpoint, not two)
    return quota.reserve(req, url=url, keep_open=True)

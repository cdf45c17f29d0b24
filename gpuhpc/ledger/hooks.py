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
from typing import TYPE_CHECKING

from gpuhpc.config import getenv
from gpuhpc.ledger.types import ChargeRequest

if TYPE_CHECKING:
    from gpuhpc.ledger.quota import Reservation

__all__ = ["ChargeRequest", "ledger_in_use", "reserve", "reserve_or_snapshot", "submit_budget", "writable"]


def ledger_in_use() -> str | None:
    """The database URL when the ledger is in use, else None (no SQLAlchemy import)."""
    if (getenv("GPUHPC_LEDGER") or "").strip().lower() in ("off", "0", "false", "no"):
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


def reserve_or_snapshot(req: ChargeRequest, account: str | None) -> tuple[Reservation | None, list[str]]:
    """The submit path's budget decision: a committed hold (:func:`reserve`) where this process
    may write the ledger; else the budget snapshot's decision (:func:`submit_budget`, as
    job_submit.lua decides for plain sbatch), with a first line saying why: the ledger is off or
    not set up, it is read-only for this user (a reader's database role, a file the admin owns),
    or its database cannot be reached. Returns the hold (or None) and the lines to show."""
    url = ledger_in_use()
    if url is None:
        return None, submit_budget(req, account)
    if not writable(url):
        why = "the ledger is read-only for this user"
    else:
        from gpuhpc.ledger import quota

        try:
            return reserve(req), []
        except quota.LedgerUnwritable as exc:
            why = str(exc)
    lines = submit_budget(req, account)
    from gpuhpc.ledger import budget

    source = "the budget snapshot" if budget.read_snapshot() is not None else \
        f"Slurm's own limits (no budget snapshot at {budget.snapshot_path()})"
    return None, [f"{why}: deciding from {source}", *lines]


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

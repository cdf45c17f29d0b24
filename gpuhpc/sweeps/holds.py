"""Quota holds for a sweep's arrays: the worst case of a batch of trials (trials x GPUs x time
limit, priced) checked against the ledger's quotas before anything is submitted
(:func:`check_quota`), and the hold a chunk takes in the transaction that records it
(:func:`reserves_here`, :func:`charge_request`; the decision itself is
:func:`gpuhpc.ledger.quota.reserve_in`)."""
from __future__ import annotations

import getpass
from typing import Any

from gpuhpc.errors import QuotaExceeded
from gpuhpc.sweeps.spec import SweepSpec
from gpuhpc.sweeps.store import db_url, now, transaction


def ledger_url(url: str | None) -> str | None:
    """The ledger for reservations: the sweep database when the ledger is not switched off."""
    from gpuhpc.ledger import hooks

    if hooks.ledger_in_use() is None and not url:
        return None
    from gpuhpc.config import getenv

    if (getenv("GPUHPC_LEDGER") or "").strip().lower() in ("off", "0", "false", "no"):
        return None
    return db_url(url)


def charge_request(spec: SweepSpec, n: int, cluster: str, name: str | None = None, res=None,
                   share: dict[str, Any] | None = None):
    """The ledger's request for ``n`` trials of ``res`` (else the sweep's resources); ``share``:
    the CPUs, memory and node shapes a trial names (:func:`share_of`), which the ``max_share``
    pricing policy holds as ingest will charge them."""
    from gpuhpc.ledger import hooks

    r = res or spec.res
    return hooks.ChargeRequest(cluster=cluster, user=getpass.getuser(), account=r.account, partition=r.partition,
                               qos=r.qos, gpu_type=r.gpu_type, gpus=r.total_gpus, time_limit_s=r.time_s,
                               array_size=n, job_name=name or spec.name, **(share or {}))


def share_of(spec: SweepSpec, client, res=None) -> dict[str, Any]:
    """What a trial of ``res`` (else the sweep's resources) names of its nodes, for the hold
    (:func:`gpuhpc.jobs.admission.share_request`: one ``scontrol show node`` when it names CPUs,
    memory or whole nodes, nothing otherwise). Asked before a transaction, never inside one."""
    from gpuhpc.jobs.admission import share_request

    return share_request(res or spec.res, client)


def reserves_here(url: str | None) -> bool:
    """Does the ledger reserve in the sweep database itself (the usual case), so that a chunk's
    hold can be taken in the transaction that records the chunk? Otherwise (the ledger off, a
    ledger this user may not write, or one elsewhere) each sbatch reserves on its own
    (:func:`gpuhpc.jobs.api.submit_spec`)."""
    from gpuhpc.ledger import hooks

    lurl = hooks.ledger_in_use()
    return lurl is not None and lurl == db_url(url) and hooks.writable(lurl)


class _Rollback(Exception):
    pass


def fits_quota(url: str, spec: SweepSpec, n: int, cluster: str,
               share: dict[str, Any] | None = None) -> QuotaExceeded | None:
    """Would a hold of ``n`` trials' worst case fit? (a transaction that is always rolled back)"""
    from gpuhpc.ledger import quota

    conn = quota.Connection(url)
    try:
        try:
            with conn.transaction() as tx:
                quota.reserve_in(tx, charge_request(spec, n, cluster, share=share), now(), url)
                raise _Rollback
        except _Rollback:
            return None
        except QuotaExceeded as exc:
            return exc
    finally:
        conn.close()


def check_quota(spec: SweepSpec, n: int, cluster: str, url: str | None,
                share: dict[str, Any] | None = None) -> None:
    """Refuse (exit 3) a batch of ``n`` trials whose worst case (trials × GPUs × time limit,
    priced; ``share``: :func:`share_of`) does not fit the quotas, saying how many would."""
    lurl = ledger_url(url)
    if lurl is None or n < 1:
        return
    exc = fits_quota(lurl, spec, n, cluster, share)
    if exc is None:
        return
    lo, hi = 0, n - 1                 # the largest m < n that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits_quota(lurl, spec, mid, cluster, share) is None:
            lo = mid
        else:
            hi = mid - 1
    raise QuotaExceeded(f"{exc.message}; {lo} of the sweep's {n} trials would fit",
                        hint="lower trials, GPUs per trial or the time limit")


def settle_hold(job_name: str, job_id: str | None, url: str | None) -> None:
    """The ledger hold a sweep took for chunk ``job_name`` (:func:`_record_chunks`) and never
    got to record: attached to ``job_id``, or released when the chunk never reached Slurm."""
    if not reserves_here(url):
        return
    from gpuhpc.ledger import quota

    with transaction(url) as tx:
        for (rid,) in tx.execute("SELECT id FROM reservations WHERE job_name = ? AND status = 'held' AND job_id IS NULL",
                           (job_name,)).fetchall():
            if job_id is not None:
                quota.attach_job_in(tx, rid, job_id)
            else:
                quota.lock_quotas_of(tx, rid)
                quota.release_holds(tx, rid, "released", now())

"""Throughput metrics from ``gpuhpc.report()`` files into ``job_metrics`` (the cost report's
cost per work): the second half of ``gpuhpc ledger ingest``, after the runs
(:mod:`gpuhpc.ledger.ingest`), since a file counts only for a job that accounting knows.

The metrics directory may be shared and writable by every user: a file is read only when it is
a regular file (no symlink, FIFO or device) owned by the job's user, named after the job, and
at most :data:`METRICS_FILE_MAX_BYTES`; anything else is skipped and logged.
"""
from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import delete, insert, select, tuple_

from gpuhpc.ledger import db
from gpuhpc.ledger.orm import JobMetric, UsageRecord

log = logging.getLogger(__name__)

METRICS_FILE_MAX_BYTES = 4 << 20        # a job's report() lines; a bigger file is skipped, not read
_METRICS_NAME = re.compile(r"^(\d+)(?:_(\d+))?\.jsonl$")


def _open_metrics_file(dir_fd: int, name: str, uid: int, where: str) -> bytes | None:
    """The content of ``name`` (in the directory ``dir_fd``) when it is a regular file owned by
    ``uid`` and at most METRICS_FILE_MAX_BYTES; else None, logged. Opened with O_NOFOLLOW and
    O_NONBLOCK (a symlink or a FIFO never blocks nor redirects the read) and checked on the
    descriptor (fstat), so nothing can be swapped in between."""
    import os
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        log.warning("metrics: skipped %s: %s", where, exc.strerror)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            log.warning("metrics: skipped %s: not a regular file", where)
            return None
        if st.st_uid != uid:
            log.warning("metrics: skipped %s: owned by uid %d, not by the job's user (uid %d)", where, st.st_uid, uid)
            return None
        if st.st_size > METRICS_FILE_MAX_BYTES:
            log.warning("metrics: skipped %s: %d bytes, more than %d", where, st.st_size, METRICS_FILE_MAX_BYTES)
            return None
        chunks, total = [], 0
        while total <= METRICS_FILE_MAX_BYTES:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
            total += len(b)
        if total > METRICS_FILE_MAX_BYTES:
            log.warning("metrics: skipped %s: grew past %d bytes", where, METRICS_FILE_MAX_BYTES)
            return None
        return b"".join(chunks)
    except OSError as exc:
        log.warning("metrics: skipped %s: %s", where, exc.strerror)
        return None
    finally:
        os.close(fd)


def _metrics_files(folder: Path) -> Iterator[tuple[int, str, str, str, int]]:
    """(directory fd, file name, cluster, job id, array task or -1) for ``<cluster>/<job>[_<task>].jsonl``
    under ``folder``; cluster directories opened with O_NOFOLLOW (a symlinked one is skipped).
    The fd is open while the caller handles that entry."""
    import os

    for cluster in sorted(os.listdir(folder)):
        try:
            dfd = os.open(folder / cluster, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            log.warning("metrics: skipped %s: not a directory (or a symlink)", folder / cluster)
            continue
        try:
            for name in sorted(os.listdir(dfd)):
                m = _METRICS_NAME.match(name)
                if m:
                    yield dfd, name, cluster, m.group(1), int(m.group(2)) if m.group(2) is not None else -1
        finally:
            os.close(dfd)


def _job_owners(keys: set[tuple[str, str, int]], url: str | None) -> dict[tuple[str, str, int], str]:
    """{(cluster, job id, array task): user name} from the ingested accounting (usage_records)."""
    out: dict[tuple[str, str, int], str] = {}
    ks = sorted(keys)
    with db.session_scope(url) as s:
        for i in range(0, len(ks), 200):
            chunk = ks[i:i + 200]
            for c, j, t, u in s.execute(select(UsageRecord.cluster, UsageRecord.job_id, UsageRecord.array_task_id,
                                               UsageRecord.user_name)
                                        .where(tuple_(UsageRecord.cluster, UsageRecord.job_id,
                                                      UsageRecord.array_task_id).in_(chunk))):
                out[(c, j, t)] = u
    return out


def ingest_metrics(folder: Path, *, url: str | None = None) -> int:
    """Read ``gpuhpc.report()`` files (``<cluster>/<job>[_<task>].jsonl``) into job_metrics.

    The directory may be shared and writable by every user, so a file counts only when its name
    is a job that accounting knows (ingested first), it is a regular file (no symlink, FIFO or
    device: opened O_NOFOLLOW|O_NONBLOCK, checked with fstat) owned by that job's user, at most
    METRICS_FILE_MAX_BYTES; the job is the file's name, and a line naming another job is
    ignored. Anything else is skipped and logged, never read nor waited for."""
    import pwd

    if not folder.is_dir() or folder.is_symlink():
        return 0
    entries = []
    for dfd, name, cluster, job, task in _metrics_files(folder):
        entries.append((cluster, name, job, task))
    owners = _job_owners({(c, j, t) for c, _, j, t in entries}, url) if entries else {}
    uids: dict[str, int | None] = {}
    agg: dict[tuple[str, str, int, str], list[float]] = defaultdict(list)
    import os

    for cluster in sorted({e[0] for e in entries}):
        try:
            dfd = os.open(folder / cluster, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            for c, name, job, task in (e for e in entries if e[0] == cluster):
                where = f"{folder / cluster / name}"
                user = owners.get((c, job, task))
                if user is None:
                    log.warning("metrics: skipped %s: accounting has no such job", where)
                    continue
                if user not in uids:
                    try:
                        uids[user] = pwd.getpwnam(user).pw_uid
                    except KeyError:
                        uids[user] = None
                if uids[user] is None:
                    log.warning("metrics: skipped %s: the job's user %s has no local account", where, user)
                    continue
                data = _open_metrics_file(dfd, name, uids[user], where)
                if data is None:
                    continue
                for line in data.decode("utf-8", "replace").split("\n"):
                    try:
                        rec = json.loads(line)
                        rtask = rec.get("array_task_id")
                        if str(rec["job_id"]) != job or (int(rtask) if rtask is not None else -1) != task:
                            continue      # a line about another job: ignored
                        for mname, value in rec["metrics"].items():
                            v = float(value)
                            if v == v and abs(v) != float("inf"):
                                agg[(c, job, task, str(mname)[:64])].append(v)
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue          # a torn last line of a job still writing
        finally:
            os.close(dfd)
    if not agg:
        return 0
    with db.session_scope(url) as s:
        keys = list(agg)
        for i in range(0, len(keys), 200):
            chunk = keys[i:i + 200]
            s.execute(delete(JobMetric).where(tuple_(JobMetric.cluster, JobMetric.job_id, JobMetric.array_task_id,
                                                     JobMetric.name).in_(chunk)))
        s.execute(insert(JobMetric), [dict(cluster=k[0], job_id=k[1], array_task_id=k[2], name=k[3],
                                           value=sum(v) / len(v), samples=len(v)) for k, v in agg.items()])
    return len(agg)

"""One watcher for many jobs: :func:`as_completed` and :class:`Watcher`.

``Job.wait`` asks Slurm about its own job; a program following a hundred jobs that way asks a
hundred questions per interval. A :class:`Watcher` asks ONE per interval for all of them, as
submitit's ``SlurmInfoWatcher`` does: a single ``sacct`` for every job still unfinished (array
tasks through their array's id, so a 1000-task array is one short argv), read by
:meth:`gpuhpc.slurm.SlurmClient.accounting`. A job that ``sacct`` does not show yet (slurmdbd a
moment behind a fresh submission) is simply not finished.

Jobs are duck-typed (``job_id``, ``client``, ``done()``): anything :func:`gpuhpc.submit`,
:func:`gpuhpc.map_array` or ``gpuhpc.batch()`` returned.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.slurm.state import JobState

#: states a requeueable job comes back from: not an end unless the job says so itself
_MAY_RETURN = (JobState.PREEMPTED, JobState.NODE_FAIL)


class Watcher:
    """Job states for many jobs, one ``sacct`` per :meth:`states` call (``polls`` counts them)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.polls = 0

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """{job id: state} for ``job_ids`` (UNKNOWN for one sacct does not show yet): one query."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        asked = sorted({j.split("_", 1)[0] for j in ids}, key=lambda j: (len(j), j))
        self.polls += 1
        seen: dict[str, JobState] = {}
        for row in self.client.accounting(job_ids=asked):
            seen[row.job_id] = row.state.state          # without --duplicates: the latest run
        return {j: seen.get(j, JobState.UNKNOWN) for j in ids}


def as_completed(jobs: Iterable[Any], *, timeout: float | None = None, poll: float = 2.0,
                 watcher: Watcher | None = None) -> Iterator[Any]:
    """Yield each job of ``jobs`` as it finishes (COMPLETED, FAILED, CANCELLED, TIMEOUT ...),
    first finished first; ``job.result()`` then returns without waiting. One Slurm query per
    ``poll`` seconds for all the jobs still running (:class:`Watcher`; pass one to share it or
    to count its polls). Raises TimeoutError after ``timeout`` seconds with jobs left."""
    jobs = list(jobs)
    if poll <= 0:
        raise UserInputError(f"poll must be positive, got {poll!r}", field="poll")
    if any(getattr(j, "job_id", None) is None for j in jobs):
        raise UserInputError("a job has no id yet (a handle from a gpuhpc.batch() block that has not ended)",
                             field="jobs", hint="call as_completed after the with block")
    if not jobs:
        return
    watcher = watcher or Watcher(jobs[0].client)
    left = list(jobs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        states = watcher.states([j.job_id for j in left])
        still = []
        for job in left:
            st = states[job.job_id]
            if st.is_finished or (st in _MAY_RETURN and job.done()):    # a requeue cap: its own check
                yield job
            else:
                still.append(job)
        left = still
        if not left:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} of {len(jobs)} jobs not finished after {timeout}s "
                               f"(first: {left[0].job_id})")
        time.sleep(poll)

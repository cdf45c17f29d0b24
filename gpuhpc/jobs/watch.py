"""One watcher for many jobs: :func:`as_completed`, :func:`wait` (``Job.wait``) and :class:`Watcher`.

A program following a hundred jobs one by one would ask Slurm a hundred questions per
interval. A :class:`Watcher` asks ONE per round for all of them, as submitit's
``SlurmInfoWatcher`` does: a single ``sacct`` for every job still unfinished (array tasks
through their array's id, so a 1000-task array is one short argv), read by
:meth:`gpuhpc.slurm.SlurmClient.accounting`. A job that ``sacct`` does not show yet (slurmdbd a
moment behind a fresh submission) is simply not finished.

``Job.wait`` (:func:`wait`) shares one watcher per cluster among every wait in the process:
threads waiting on N jobs cause one query per round, not N: one ``squeue`` for all of them
(:meth:`Watcher.live_states`; a ``sacct`` only for the jobs slurmctld has forgotten, so a
cluster without accounting still answers while it knows the job). Rounds start ``poll`` seconds apart
and the interval grows (x1.5, up to ``max_poll``) while no watched job changes state; a change,
or a job the watcher has not seen yet, brings the next round back to ``poll``. The shared
watcher lives only while someone waits (nothing is left behind in the process).

Jobs are duck-typed (``job_id``, ``client``, ``done()``): anything :func:`gpuhpc.submit`,
:func:`gpuhpc.map_array` or ``gpuhpc.batch()`` returned.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.slurm.state import JobState

#: states a requeueable job comes back from: not an end unless the job says so itself
_MAY_RETURN = (JobState.PREEMPTED, JobState.NODE_FAIL)


#: how much longer the next round waits after a round in which no watched job changed state
GROWTH = 1.5


def next_interval(interval: float, changed: bool, poll: float, max_poll: float) -> float:
    """The wait before the next round: ``poll`` after a change, else ``interval`` x :data:`GROWTH`,
    never more than ``max_poll`` (nor less than ``poll``)."""
    if changed:
        return poll
    return max(poll, min(max_poll, interval * GROWTH))


class Watcher:
    """Job states for many jobs, one ``sacct`` per :meth:`states` call (``polls`` counts them).
    :meth:`wait` asks :meth:`live_states` in rounds (``rounds`` counts them) shared by every
    thread waiting through this watcher."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.polls = 0
        self.interval = 0.0             # the wait before the next round (0: none run yet)
        self._cond = threading.Condition()
        self._waits: dict[int, tuple[str, float, float]] = {}    # one per wait: (job id, poll, max_poll)
        self._known: dict[str, JobState] = {}                     # the last state seen of each job
        self.rounds = 0                 # the rounds :meth:`wait` has run
        self._in_flight = False
        self._due = float("-inf")       # time.monotonic() of the next round

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

    def live_states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """{job id: state} for ``job_ids``: ONE ``squeue`` for all of them (slurmctld knows a job
        until MinJobAge after its end) and, for the ids it no longer knows, one :meth:`states`
        (``sacct``); UNKNOWN where neither shows one. What ``Job.wait`` asks per round: a
        cluster without accounting still answers while slurmctld knows the job."""
        ids = [str(j) for j in job_ids]
        if not ids:
            return {}
        seen = {row.job_id: row.state.state for row in self.client.queue(job_ids=ids)}
        gone = [j for j in ids if j not in seen]
        if gone:
            seen.update(self.states(gone))
        return {j: seen.get(j, JobState.UNKNOWN) for j in ids}

    def watched(self) -> int:
        """How many waits are following jobs through this watcher now."""
        with self._cond:
            return len(self._waits)

    def wait(self, job: Any, *, timeout: float | None = None, poll: float = 2.0,
             max_poll: float = 30.0) -> JobState:
        """Block until ``job`` is finished (its final state), sharing rounds with every other
        :meth:`wait` on this watcher: one :meth:`states` call per round for all their jobs,
        run by whichever waiter finds the round due. TimeoutError after ``timeout`` seconds."""
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or poll <= 0:
            raise UserInputError(f"poll must be a positive number of seconds, got {poll!r}", field="poll")
        if job.job_id is None:
            raise UserInputError("the job has no id yet (a handle from a gpuhpc.batch() block that has not "
                                 "ended)", field="job", hint="wait after the with block")
        job_id = str(job.job_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        token = object()
        with self._cond:
            self._waits[id(token)] = (job_id, float(poll), float(max(poll, max_poll)))
            if job_id not in self._known:         # not seen yet: a round as soon as none is running
                self._due = min(self._due, time.monotonic())
        try:
            return self._wait(job, job_id, deadline, timeout)
        finally:
            with self._cond:
                del self._waits[id(token)]

    def _wait(self, job: Any, job_id: str, deadline: float | None, timeout: float | None) -> JobState:
        looked_at = -1                              # the round whose state this wait last judged
        while True:
            with self._cond:
                state, rounds = self._known.get(job_id), self.rounds
            if state is not None and rounds != looked_at:
                looked_at = rounds
                if state.is_finished or (state in _MAY_RETURN and job.done()):    # a requeue cap: its own check
                    return state
            with self._cond:
                if self.rounds != rounds:                  # a round ended meanwhile: judge it first
                    continue
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    seen = self._known.get(job_id, JobState.UNKNOWN).value
                    raise TimeoutError(f"job {job_id} still {seen} after {timeout}s")
                if self._in_flight or now < self._due:
                    limit = None if self._in_flight else self._due - now
                    if deadline is not None:
                        limit = deadline - now if limit is None else min(limit, deadline - now)
                    self._cond.wait(limit)
                    continue
                self._in_flight = True                      # this wait runs the round, for all
                ids = sorted({j for j, _, _ in self._waits.values()
                              if not (j in self._known and self._known[j].is_finished)})
            self._round(ids)

    def _round(self, ids: list[str]) -> None:
        try:
            new = self.live_states(ids)
        except BaseException:
            with self._cond:
                self._in_flight = False
                self._due = time.monotonic() + (self.interval or min(p for _, p, _ in self._waits.values()))
                self._cond.notify_all()
            raise
        with self._cond:
            changed = any(self._known.get(j) is not s for j, s in new.items())
            self._known.update(new)
            poll = min(p for _, p, _ in self._waits.values())
            max_poll = max(poll, min(m for _, _, m in self._waits.values()))
            self.interval = next_interval(self.interval or poll, changed, poll, max_poll)
            unseen = any(j not in self._known for j, _, _ in self._waits.values())    # joined during the round
            self._due = time.monotonic() + (0.0 if unseen else self.interval)
            self.rounds += 1
            self._in_flight = False
            self._cond.notify_all()


#: the watchers :func:`wait` shares, one per cluster (see :func:`cluster_key`), while in use
_SHARED: dict[tuple, tuple[Watcher, int]] = {}
_SHARED_LOCK = threading.Lock()


def cluster_key(client: Any) -> tuple:
    """Which clients ask the same Slurm: every local :class:`~gpuhpc.slurm.SlurmClient` with the
    same ``SLURM_CONF`` (``Job("5")`` makes a client of its own), one SSH runner, else the
    client object itself."""
    from gpuhpc.slurm.client import SlurmClient

    runner = getattr(client, "runner", None)
    if isinstance(client, SlurmClient) and runner is not None:
        if runner.is_local:
            return ("local", type(runner), runner.getenv("SLURM_CONF") or "")
        return ("runner", id(runner))
    return ("client", id(client))


@contextlib.contextmanager
def shared(client: Any) -> Iterator[Watcher]:
    """The process's watcher for ``client``'s cluster, kept while the block runs (made on first
    use, dropped when its last user leaves)."""
    key = cluster_key(client)
    with _SHARED_LOCK:
        watcher, users = _SHARED.get(key, (None, 0))
        watcher = watcher or Watcher(client)
        _SHARED[key] = (watcher, users + 1)
    try:
        yield watcher
    finally:
        with _SHARED_LOCK:
            watcher, users = _SHARED[key]
            if users == 1:
                del _SHARED[key]
            else:
                _SHARED[key] = (watcher, users - 1)


def wait(job: Any, *, timeout: float | None = None, poll: float = 2.0, max_poll: float = 30.0) -> JobState:
    """``job.wait()``: block until ``job`` is finished through the watcher shared by every wait on
    its cluster (:func:`shared`); returns the final state."""
    with shared(job.client) as watcher:
        return watcher.wait(job, timeout=timeout, poll=poll, max_poll=max_poll)


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

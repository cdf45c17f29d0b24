"""Following a sweep: each trial's state from Slurm (:func:`refresh`).

A trial's state is what ``squeue`` and ``sacct --duplicates`` say about its array task (each
requeued run is a row: restarts = rows - 1), never a heartbeat; its metrics are the lines it
appended to its metrics file. The decision for one trial is the pure :func:`next_state` over a
:class:`TrialRow` (what the database holds) and :class:`Observations` (what Slurm and the
trial's files said this round); :func:`refresh` gathers the observations, asks, and writes.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.sweeps.metrics import finished_by_files, read_metrics
from gpuhpc.sweeps.pacing import Pace
from gpuhpc.sweeps.spec import spec_from_json
from gpuhpc.sweeps.state import SLURM_STATES, SweepStatus, TrialState, ended
from gpuhpc.sweeps import queries
from gpuhpc.sweeps.store import connect, now, slurm_client, utc
from gpuhpc.sweeps.trial import PRUNED


_BRACKET = re.compile(r"^(\d+)_\[([0-9,\-]+)(%\d+)?\]$")


def runs_by_task(rows: Iterable[Any]) -> tuple[dict[tuple[str, int], list[Any]], dict[tuple[str, int], Any]]:
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


def queue_by_task(c, job_ids: Sequence[str]) -> dict | None:
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


def old_enough(created: dt.datetime | None, seconds: float = 600, at: dt.datetime | None = None) -> bool:
    """Long enough before ``at`` (now) that Slurm's accounting must know a job submitted then."""
    return created is not None and ((at or now()) - utc(created)).total_seconds() > seconds


#: raw_state of a trial that neither the queue nor accounting shows finished: it stays what it
#: was until this mark is older than GONE_AFTER (accounting confirms a state, or it never will)
GONE = "gone from the queue"
GONE_AFTER = 300.0
#: raw_state of a trial accounting lost whose metrics file says it finished (:func:`gone_verdict`)
FINISHED_BY_METRICS = "COMPLETED (its metrics file; no accounting record)"


def gone_verdict(runs: Sequence[Any], rng: Any | None, finished: bool, had_runs: bool) -> tuple[TrialState, str]:
    """The state of a trial neither squeue nor sacct has shown for :data:`GONE_AFTER` (a
    lagging slurmdbd, a lost record), and its raw state, from one direct ``sacct -j ARRAY`` of
    its array: ``runs`` (its task's rows there, oldest first) and ``rng`` (a pending range row
    holding it). A terminal state there is the answer; else a trial whose metrics file says it
    finished (``finished``: the sweep's metric in it, or a Python trial's result) is completed,
    never failed; else it failed (``had_runs``: accounting knew runs of it) or was cancelled."""
    for row in ((runs[-1],) if runs else ()) + ((rng,) if rng is not None else ()):
        st = SLURM_STATES.get(row.state.state.value, TrialState.PENDING)
        if st.is_terminal:
            return st, row.state.raw[:64]
    if finished:
        return TrialState.COMPLETED, FINISHED_BY_METRICS
    st = TrialState.FAILED if (had_runs or runs) else TrialState.CANCELLED
    return st, (runs[-1].state.raw[:64] if runs else GONE)


#: slurmctld shows a task finished: accounting is asked to confirm it once the first such
#: task has waited this long (or nothing of the sweep is left running)
CONFIRM_AFTER = 15.0


# ---------------------------------------------------------------- one trial's next state
@dataclass(frozen=True)
class TrialRow:
    """A trial not yet finished, as the database holds it (what a refresh round starts from)."""

    id: int
    number: int
    state: TrialState
    chunk_id: int | None = None
    task: int | None = None
    array_job: str | None = None            # its chunk's array job id (None: not submitted)
    chunk_created: dt.datetime | None = None
    raw_state: str | None = None            # Slurm's last word on its task (or GONE)
    restarts: int = 0
    gpu_hours: Decimal | None = None
    metrics: str | None = None              # JSON of the last metrics read
    objective: float | None = None
    updated_at: dt.datetime | None = None

    @property
    def followed_in(self) -> str | None:
        """The array job whose task this trial is now (None: nothing to ask Slurm). A waiting
        trial has no task, whatever array it ran in before (a resume gave it back): that
        array's record (cancelled, failed) is not this trial's."""
        if self.array_job is None or self.task is None or self.state.is_terminal or self.state is TrialState.WAITING:
            return None
        return self.array_job


#: what :func:`next_state` may ask the caller to look at before it decides
DIRECT = "direct"           # one direct ``sacct -j ARRAY`` of the trial's array, and its files
PRUNED_MARK = "pruned"      # whether the pruner marked the trial (its directory's PRUNED file)


@dataclass(frozen=True)
class Observations:
    """What this round saw of one trial. ``queue_answered`` False: squeue failed (every trial
    keeps its state). ``accounting_answered`` False: sacct was not asked this round (or failed):
    slurmctld's view alone. ``direct``/``pruned_mark``: None until :func:`next_state` asks."""

    at: dt.datetime
    queue_answered: bool = True
    queued: Any | None = None               # squeue's row of its task (None: not in the queue)
    accounting_answered: bool = False
    runs: Sequence[Any] = ()                # sacct --duplicates rows of its task, oldest first
    range_row: Any | None = None            # a pending/cancelled range row holding its task
    direct: tuple[Sequence[Any], Any | None] | None = None   # (runs, range row) of the direct sacct
    direct_asked: bool = False              # asked (direct None then: the query failed)
    finished_by_files: bool = False         # its metrics file (or result) says it finished
    pruned_mark: bool | None = None


@dataclass(frozen=True)
class Decision:
    """The trial's next state (``wants`` non-empty: nothing decided yet; look at those and ask
    again). ``accounting``: restarts, exit code, job id and GPU-hours from its sacct runs."""

    state: TrialState
    raw_state: str | None
    restarts: int
    gpu_hours: Decimal | None
    exit_code: str | None = None
    job_id_raw: str | None = None
    accounting: bool = False                # exit_code and job_id_raw are accounting's
    read_metrics: bool = False              # read its metrics file (objective, metrics)
    wants: frozenset[str] = frozenset()


def _from_slurm(row: Any) -> TrialState:
    return SLURM_STATES.get(row.state.state.value, TrialState.PENDING)


def _of_runs(runs: Sequence[Any]) -> dict[str, Any]:
    last = runs[-1]
    return dict(restarts=len(runs) - 1, exit_code=last.exit_code, job_id_raw=last.job_id_raw, accounting=True,
                gpu_hours=Decimal(sum(r.elapsed_s * sum(r.gpus.values()) for r in runs)) / 3600)


def next_state(row: TrialRow, obs: Observations) -> Decision:
    """A trial's next state from what this round saw (pure: no Slurm, no files, no database).

    - in the queue and not finished there: its queue state (REQUEUED shows as pending);
    - out of the queue, or finished there, with accounting asked: accounting's terminal state
      of its last run (restarts = runs - 1), or of a pending range that held it, or slurmctld's
      CANCELLED of a pending task; not terminal there: it keeps its state (slurmctld's raw word);
    - neither the queue nor accounting shows it: marked :data:`GONE`, and decided only once
      that has held for :data:`GONE_AFTER` (and its chunk is that old) by one direct ``sacct
      -j ARRAY`` (:func:`gone_verdict`; wants :data:`DIRECT`);
    - squeue failed, or accounting was not asked: it keeps its state;
    - a state that becomes terminal is ``pruned`` when the pruner marked it (wants :data:`PRUNED_MARK`).
    """
    state, raw = row.state, row.raw_state
    acct: dict[str, Any] = {}
    wants: set[str] = set()
    if row.followed_in is not None and obs.queue_answered:
        q = obs.queued
        qst = _from_slurm(q) if q is not None else None
        if q is not None and not qst.is_terminal:
            state = TrialState.PENDING if qst is TrialState.REQUEUED else qst
            raw = q.state.raw[:64]
        elif not obs.accounting_answered:           # slurmctld's view only
            if q is not None:
                raw = q.state.raw[:64]
        else:
            rs, rng = obs.runs, obs.range_row
            st = None
            if rs:
                st = _from_slurm(rs[-1])
                acct = _of_runs(rs)
            elif rng is not None:
                st = _from_slurm(rng)
            elif qst is TrialState.CANCELLED:       # cancelled while pending: slurmctld's own word
                st = qst
            if st is not None and st.is_terminal:
                state, raw = st, (rs[-1].state.raw if rs else (rng or q).state.raw)[:64]
            elif q is not None:                     # ended for slurmctld; accounting will confirm
                raw = q.state.raw[:64]
            elif raw != GONE:
                # neither squeue nor sacct shows it finished: keep its state until that has held
                # for minutes (accounting lags; a failed query never gets here)
                raw = GONE
            elif row.updated_at is not None and (obs.at - utc(row.updated_at)).total_seconds() > GONE_AFTER \
                    and old_enough(row.chunk_created, GONE_AFTER, obs.at):
                if not obs.direct_asked:
                    wants.add(DIRECT)
                elif obs.direct is not None:        # a failed direct query: decided another round
                    druns, drange = obs.direct
                    state, raw = gone_verdict(druns, drange, obs.finished_by_files, bool(rs))
                    if druns:
                        acct = _of_runs(druns)
    if state is not row.state and state.is_terminal and not wants:
        if obs.pruned_mark is None:
            wants.add(PRUNED_MARK)
        elif obs.pruned_mark:
            state = TrialState.PRUNED               # stopped by the pruner: however Slurm ended it
    metrics = state in (TrialState.COMPLETED, TrialState.RUNNING, TrialState.FAILED, TrialState.REQUEUED,
                        TrialState.PRUNED) and (row.objective is None or state is not row.state
                                                or state is TrialState.RUNNING)
    return Decision(state=state, raw_state=raw, restarts=acct.pop("restarts", row.restarts),
                    gpu_hours=acct.pop("gpu_hours", row.gpu_hours), read_metrics=metrics, wants=frozenset(wants),
                    **acct)


# ---------------------------------------------------------------- a round
#: per sweep, what this process's refreshes saw of its trials' run times: when its follower asks
#: again (:func:`gpuhpc.sweeps.pacing.pause`)
PACES: dict[int, Pace] = {}


def pace_of(sid: int) -> Pace | None:
    """What the last refresh of sweep ``sid`` in this process saw of its trials' run times."""
    return PACES.get(sid)


def _seconds(elapsed: str | None) -> float | None:
    """squeue's elapsed time (``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``) in seconds; None when unreadable."""
    from gpuhpc.slurm.durations import parse_duration

    try:
        s = parse_duration(elapsed or "")
    except UserInputError:
        return None
    return float(s) if s is not None else None


def _ask_accounting(c, rows: Sequence[TrialRow], queue: dict) -> list[Any] | None:
    """sacct (slurmdbd) is asked about the tasks that left the queue at once, and about those
    slurmctld shows finished in one batch once the first of them has waited
    :data:`CONFIRM_AFTER` (or nothing is left running): their slots are free already
    (raw_state), only the confirmation, restarts and GPU-hours wait. None: not asked this
    round, or the query failed."""
    asked, urgent, running = [], False, False
    for t in rows:
        job = t.followed_in
        if not job:
            continue
        q = queue.get((job, t.task))
        if q is None:
            asked.append(f"{job}_{t.task}")
            urgent = True
        elif _from_slurm(q).is_terminal:
            asked.append(f"{job}_{t.task}")
            urgent = urgent or (ended(t.raw_state) and t.updated_at is not None
                                and (now() - utc(t.updated_at)).total_seconds() >= CONFIRM_AFTER)
        else:
            running = True
    if not asked:
        return []
    if not (urgent or not running):
        return None
    acct: list[Any] = []
    try:
        for i in range(0, len(asked), 200):
            acct += c.accounting(job_ids=asked[i:i + 200], duplicates=True)
    except GpuhpcError:
        return None
    return acct


def refresh(sid: int, *, client=None, url: str | None = None) -> dict[str, int]:
    """Bring every trial's state, restarts, GPU-hours and metrics up to date; returns the
    counts per state.

    One ``squeue`` of the sweep's own live arrays gives the live states; ``sacct --duplicates``
    is asked only about the tasks that left the queue (or that slurmctld shows finished), for
    their final state, restarts and GPU-hours. Missing information never ends a trial: when
    ``squeue`` or ``sacct`` fails (an error, a timeout) every trial keeps its state, and a
    terminal state is only ever taken from Slurm's own record of the task, never inferred
    from its absence (unless neither the queue nor accounting has known it for minutes).
    Each trial's decision is :func:`next_state`'s."""
    c = slurm_client(client)
    terminal = [st for st in TrialState if st.is_terminal]
    conn = connect(url)
    try:
        with conn.transaction() as tx:
            sw = queries.sweep(tx, sid)
            if sw is None:
                raise UserInputError(f"no sweep {sid}", field="ID")
            spec = spec_from_json(sw.spec)
            chunks = {ch.id: (ch.job_id, ch.created_at) for ch in queries.chunks(tx, sid) if ch.job_id}
            # only the live trials: a finished one never changes again (its metrics were read in the
            # round it finished), so a driver's round costs what is queued, not the sweep's size
            rows = [TrialRow(id=t.id, number=t.number, state=TrialState(t.state), chunk_id=t.chunk_id,
                             task=t.task_id, array_job=chunks.get(t.chunk_id, (None, None))[0],
                             chunk_created=chunks.get(t.chunk_id, (None, None))[1], raw_state=t.raw_state,
                             restarts=t.restarts, gpu_hours=t.gpu_hours, metrics=t.metrics, objective=t.objective,
                             updated_at=t.updated_at)
                    for t in queries.trials(tx, sid, not_in=terminal)]
            finished = {TrialState(st): n for st, n in queries.state_counts(tx, sid, states=terminal).items()}
        directory = Path(sw.directory)
        status = SweepStatus(sw.status)
        return _round(sid, c, conn, spec, directory, status, rows, finished)
    finally:
        conn.close()


def _round(sid: int, c, conn, spec, directory: Path, status: SweepStatus, rows: Sequence[TrialRow],
           finished: dict[TrialState, int]) -> dict[str, int]:
    """:func:`refresh` past its read: ask Slurm, decide each trial, write what changed on ``conn``."""
    live_jobs = sorted({t.followed_in for t in rows if t.followed_in})
    queue = queue_by_task(c, live_jobs) if live_jobs else {}
    acct = _ask_accounting(c, rows, queue) if queue is not None else []
    runs, ranges = runs_by_task(acct or [])
    direct: dict[str, Any] = {}

    def look(t: TrialRow, obs: Observations, wants: frozenset[str]) -> Observations:
        """What :func:`next_state` wants: one direct ``sacct -j ARRAY`` per array and round
        (None when it failed), the trial's files."""
        more: dict[str, Any] = {}
        tdir = directory / "trials" / str(t.number)
        if DIRECT in wants:
            job = t.followed_in
            if job not in direct:
                try:
                    direct[job] = runs_by_task(c.accounting(job_ids=[job], duplicates=True))
                except GpuhpcError:
                    direct[job] = None
            got = direct[job]
            more.update(direct_asked=True, direct=None if got is None else (
                got[0].get((job, t.task)) or [], got[1].get((job, t.task))))
            if got is not None:
                more["finished_by_files"] = finished_by_files(tdir, spec.metric.name)
        if PRUNED_MARK in wants:
            more["pruned_mark"] = (tdir / PRUNED).exists()
        return dataclasses.replace(obs, **more)

    updates = []
    counts: dict[TrialState, int] = dict(finished)
    at = now()
    ran: list[float] = []                   # run times of trials that ended this round
    running: list[float] = []               # how long each running trial has run
    pending = 0
    for t in rows:
        key = (t.followed_in, t.task)
        obs = Observations(at=at, queue_answered=queue is not None, queued=(queue or {}).get(key),
                           accounting_answered=acct is not None, runs=runs.get(key) or (),
                           range_row=ranges.get(key))
        d = next_state(t, obs)
        while d.wants:
            obs = look(t, obs, d.wants)
            d = next_state(t, obs)
        q = obs.queued if obs.queue_answered else None
        if q is not None and q.state.state.value == "RUNNING":
            running.append(_seconds(getattr(q, "elapsed", None)) or 0.0)
        elif q is not None and d.state is TrialState.PENDING:
            pending += 1
        if ended(d.raw_state) and not ended(t.raw_state):      # it ended this round
            took = _seconds(getattr(q, "elapsed", None)) if q is not None else (float(obs.runs[-1].elapsed_s) if obs.runs else None)
            if took is not None:
                ran.append(took)
        new: dict[str, Any] = dict(state=d.state.value, raw_state=d.raw_state, restarts=d.restarts,
                                   gpu_hours=d.gpu_hours, metrics=t.metrics, objective=t.objective)
        if d.accounting:
            new.update(exit_code=d.exit_code, job_id_raw=d.job_id_raw)
        if d.read_metrics:
            m = read_metrics(directory / "trials" / str(t.number) / "metrics.jsonl")
            if m is not None:
                new["metrics"] = json.dumps(m, sort_keys=True)
                v = m.get(spec.metric.name)
                new["objective"] = float(v) if isinstance(v, (int, float)) else None
        counts[d.state] = counts.get(d.state, 0) + 1
        if d.accounting or d.state is not t.state or any(new[k] != v for k, v in (
                ("raw_state", t.raw_state), ("restarts", t.restarts), ("gpu_hours", t.gpu_hours),
                ("metrics", t.metrics), ("objective", t.objective))):
            updates.append((t.id, new))
    if queue is not None:
        PACES.setdefault(sid, Pace()).saw(ended=ran, running=running, pending=pending)
    total = sum(counts.values())
    all_done = total > 0 and sum(n for st, n in counts.items() if st.is_terminal) == total
    with conn.transaction() as tx:
        t_now = now()
        for tid, new in updates:
            queries.update_trial(tx, tid, updated_at=t_now, **new)
        sw = queries.sweep(tx, sid)
        if sw is not None:
            done = all_done and total >= sw.n_trials and status is SweepStatus.RUNNING
            queries.update_sweep(tx, sid, **({"status": SweepStatus.DONE.value} if done else {}), updated_at=t_now)
    return {st.value: n for st, n in counts.items()}

"""Controlling a running sweep: the pruner's round (:func:`prune`), ``fail_fast``
(:func:`check_fail_fast`), :func:`resume`, :func:`cancel`, and whether its driver still follows
it (:func:`driver_check`)."""
from __future__ import annotations

import datetime as dt
import getpass
import json
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.sweeps.holds import check_quota, share_of
from gpuhpc.sweeps.metrics import read_history
from gpuhpc.sweeps.planner import needs_driver, plan_submission
from gpuhpc.sweeps.refresh import refresh
from gpuhpc.sweeps.spec import SweepSpec, spec_from_json
from gpuhpc.sweeps.state import ChunkState, SLURM_STATES, SweepStatus, TrialState, trial_over
from gpuhpc.sweeps import queries
from gpuhpc.sweeps.store import (
    n_waiting, now, set_sweep, slurm_client, sweep_record, transaction, trial_rows, utc,
)
from gpuhpc.sweeps.submission import recover, start_driver, submit_waiting
from gpuhpc.sweeps.trial import PRUNED, STOP_DIR


def histories(sid: int, *, url: str | None = None) -> tuple[SweepSpec, Path, list[Any]]:
    """(spec, directory, [TrialHistory]) of every trial that has run: what a pruner reads."""
    from gpuhpc.sweeps.pruners import TrialHistory

    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        rows = [(t.number, t.state) for t in queries.trial_statuses(tx, sid, not_in=[TrialState.WAITING])]
    spec, directory = spec_from_json(sw.spec), Path(sw.directory)
    return spec, directory, [TrialHistory(n, TrialState(st), read_history(directory / "trials" / str(n) / "metrics.jsonl",
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

    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        live = queries.trial_statuses(tx, sid, states=queries.LIVE)
    status, spec = sw.status, spec_from_json(sw.spec)
    if spec.pruner is None or status != SweepStatus.RUNNING.value or not live:
        return []
    spec, directory, trials = histories(sid, url=url)
    marked = {n for n, _, _, _ in live if (directory / "trials" / str(n) / PRUNED).exists()}
    running = [n for n, st, raw, _ in live if st == TrialState.RUNNING.value and not trial_over(raw)
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
        if n not in marked or not job or trial_over(raw):
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
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        status, spec = sw.status, spec_from_json(sw.spec)
        if spec.fail_fast is None or status != SweepStatus.RUNNING.value:
            return None
        # failed for good, or shown failed by slurmctld already (accounting confirms it later): the
        # same word that frees its slot (trial_over) counts here, so no trial goes out on that slot first
        failed = [t.number for t in queries.trial_statuses(tx, sid, states=(TrialState.FAILED, *queries.LIVE))
                  if t.state == TrialState.FAILED.value
                  or SLURM_STATES.get((t.raw_state or "").split(" ", 1)[0]) is TrialState.FAILED]
        if len(failed) < spec.fail_fast:
            return None
        msg = (f"fail_fast: {len(failed)} trials failed ({', '.join(map(str, failed[:10]))}"
               f"{', ...' if len(failed) > 10 else ''}), at most {spec.fail_fast - 1} allowed; "
               "the rest were cancelled or never submitted")
        queries.update_sweep(tx, sid, status=SweepStatus.FAILED.value, message=msg, updated_at=now(),
                             when_status=SweepStatus.RUNNING.value)
        jobs = queries.submitted_jobs(tx, sid)
    c = slurm_client(client)
    active = c.active_job_ids(jobs)
    for job in jobs:
        if active is None or job in active:
            try:
                c.cancel(job)
            except GpuhpcError:
                pass
    return msg


def resume(sid: int, *, client=None, url: str | None = None) -> list[int]:
    """Resubmit the trials that failed, were cancelled or never started — never a finished
    one, nor one still queued or running — and start the driver again when it is gone while
    the sweep still needs it. Returns the trial numbers resubmitted."""
    c = slurm_client(client)
    recover(sid, client=c, url=url)
    refresh(sid, client=c, url=url)
    redo = (TrialState.FAILED, TrialState.CANCELLED, TrialState.WAITING)
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        spec = spec_from_json(sw.spec)
        numbers = [t.number for t in queries.trial_statuses(tx, sid, states=redo)]
        created = queries.trial_count(tx, sid)
        queries.wait_again(tx, sid, numbers, now())
        queries.update_sweep(tx, sid, status=SweepStatus.RUNNING.value, message=None)
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
        check_quota(spec, plan.now, cluster, url, share_of(spec, c))
        submit_waiting(sid, client=c, url=url, limit=plan.now)
    live = any(r["state"] in (TrialState.PENDING.value, TrialState.RUNNING.value, TrialState.REQUEUED.value)
               for r in trial_rows(sid, url=url)) if needs_driver(spec) else False
    if n_waiting(sid, url) or (spec.method == "tpe" and created < n_trials) or live:
        start_driver(sid, client=c, url=url)
        return sorted(numbers)
    if driver:                  # nothing left for a driver: `wait` and `status` refresh themselves
        set_sweep(sid, url, driver_job_id=None)
    if not numbers:
        refresh(sid, client=c, url=url)            # DONE again when every trial is finished
    return sorted(numbers)


def cancel(sid: int, *, client=None, url: str | None = None) -> list[str]:
    """Cancel the sweep: its driver first (so nothing new is submitted), then every chunk."""
    c = slurm_client(client)
    with transaction(url) as tx:
        sw = queries.sweep(tx, sid)
        if sw is None:
            raise UserInputError(f"no sweep {sid}", field="ID")
        queries.update_sweep(tx, sid, status=SweepStatus.CANCELLED.value, updated_at=now())
        chunks = queries.chunks(tx, sid)
    ids = ([sw.driver_job_id] if sw.driver_job_id else []) + [ch.job_id for ch in chunks if ch.job_id]
    # a chunk whose submitter stopped between its sbatch and the database: found by name
    unnamed = [(f"{sw.name}-s{sid}-c{ch.number}", ch.created_at)
               for ch in chunks if ch.state == ChunkState.SUBMITTING.value]
    for jname, created in unnamed:
        try:
            found = c.jobs_by_name(jname, utc(created or now()) - dt.timedelta(minutes=5), getpass.getuser())
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


def driver_poll_s() -> float:
    from gpuhpc.config import getenv

    return getenv("GPUHPC_SWEEP_DRIVER_POLL")


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
    sw = sweep_record(sid, url)
    status, driver, beat = sw.status, sw.driver_job_id, sw.updated_at
    if status != SweepStatus.RUNNING.value or not driver:
        return None, None
    if beat is not None and (now() - utc(beat)).total_seconds() < max(15.0, 6 * driver_poll_s()):
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

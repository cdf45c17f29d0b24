"""One trial's next state (:func:`gpuhpc.sweeps.refresh.next_state`): pure, from the row the
database holds and what this round saw of Slurm and the trial's files. One test per transition."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from types import SimpleNamespace

import pytest

from gpuhpc.slurm.state import SlurmState
from gpuhpc.sweeps.refresh import (
    DIRECT, FINISHED_BY_METRICS, GONE, GONE_AFTER, PRUNED_MARK, Observations, TrialRow, next_state,
)
from gpuhpc.sweeps.state import TrialState

AT = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
LONG_AGO = AT - dt.timedelta(seconds=GONE_AFTER + 60)


def _slurm(state: str, task: int = 3, *, elapsed: int = 3600, gpus: int = 2, job: str = "500"):
    return SimpleNamespace(job_id=f"{job}_{task}", array_job_id=job, array_task_id=str(task), job_id_raw=f"6{task}",
                           state=SlurmState.parse(state), exit_code="0:0", elapsed_s=elapsed, gpus={"a100": gpus})


def _row(state=TrialState.RUNNING, raw="RUNNING", **kw) -> TrialRow:
    base = dict(id=1, number=7, state=state, chunk_id=1, task=3, array_job="500", chunk_created=LONG_AGO,
                raw_state=raw, restarts=0, gpu_hours=Decimal(0), objective=None, updated_at=AT)
    base.update(kw)
    return TrialRow(**base)


def _settle(row: TrialRow, obs: Observations, **looked):
    """next_state, answering what it wants from ``looked`` (as refresh does)."""
    d = next_state(row, obs)
    seen = []
    while d.wants:
        seen.append(d.wants)
        more = {}
        if DIRECT in d.wants:
            more.update(direct_asked=True, direct=looked.get("direct"),
                        finished_by_files=looked.get("finished_by_files", False))
        if PRUNED_MARK in d.wants:
            more["pruned_mark"] = looked.get("pruned_mark", False)
        obs = Observations(**{**obs.__dict__, **more})
        d = next_state(row, obs)
    return d, seen


def test_pending_to_running_from_the_queue():
    d = next_state(_row(TrialState.PENDING, "PENDING"), Observations(at=AT, queued=_slurm("RUNNING")))
    assert d.state is TrialState.RUNNING and d.raw_state == "RUNNING" and not d.wants and d.read_metrics


def test_requeued_in_the_queue_shows_as_pending():
    d = next_state(_row(), Observations(at=AT, queued=_slurm("REQUEUED")))
    assert d.state is TrialState.PENDING and d.raw_state == "REQUEUED"


def test_running_to_completed_from_accounting_with_restarts_and_gpu_hours():
    runs = [_slurm("REQUEUED", elapsed=1800), _slurm("COMPLETED", elapsed=3600)]
    d, seen = _settle(_row(), Observations(at=AT, queued=None, accounting_answered=True, runs=runs))
    assert d.state is TrialState.COMPLETED and d.raw_state == "COMPLETED"
    assert d.restarts == 1 and d.gpu_hours == Decimal(3) and d.accounting and d.job_id_raw == "63"
    assert seen == [frozenset({PRUNED_MARK})] and d.read_metrics      # its final metrics are read once


def test_timeout_is_failed():
    d, _ = _settle(_row(), Observations(at=AT, accounting_answered=True, runs=[_slurm("TIMEOUT")]))
    assert d.state is TrialState.FAILED and d.raw_state == "TIMEOUT"


def test_failed_with_progress_stays_failed_and_its_metrics_are_read():
    """A trial that reported progress and then failed is failed (its metrics kept), never completed."""
    row = _row(objective=0.5)
    d, _ = _settle(row, Observations(at=AT, accounting_answered=True, runs=[_slurm("FAILED")]))
    assert d.state is TrialState.FAILED and d.read_metrics


def test_ended_trial_the_pruner_marked_is_pruned():
    obs = Observations(at=AT, accounting_answered=True, runs=[_slurm("CANCELLED by 1000")])
    d, seen = _settle(_row(), obs, pruned_mark=True)
    assert d.state is TrialState.PRUNED and seen == [frozenset({PRUNED_MARK})]
    d, _ = _settle(_row(), obs, pruned_mark=False)
    assert d.state is TrialState.CANCELLED


def test_finished_for_slurmctld_but_accounting_not_asked_keeps_its_state():
    d = next_state(_row(), Observations(at=AT, queued=_slurm("COMPLETED"), accounting_answered=False))
    assert d.state is TrialState.RUNNING and d.raw_state == "COMPLETED" and not d.wants


def test_a_failed_sacct_never_marks_a_trial_gone():
    d = next_state(_row(), Observations(at=AT, queued=None, accounting_answered=False))
    assert d.state is TrialState.RUNNING and d.raw_state == "RUNNING" and not d.wants


def test_accounting_not_yet_final_keeps_its_state_with_slurmctlds_word():
    d = next_state(_row(), Observations(at=AT, queued=_slurm("COMPLETED"), accounting_answered=True,
                                        runs=[_slurm("RUNNING")]))
    assert d.state is TrialState.RUNNING and d.raw_state == "COMPLETED"


def test_cancelled_while_pending_by_slurmctlds_word():
    d, _ = _settle(_row(TrialState.PENDING, "PENDING"),
                   Observations(at=AT, queued=_slurm("CANCELLED"), accounting_answered=True))
    assert d.state is TrialState.CANCELLED


def test_a_cancelled_pending_range_in_accounting():
    rng = SimpleNamespace(job_id="500_[3-9]", state=SlurmState.parse("CANCELLED"))
    d, _ = _settle(_row(TrialState.PENDING, "PENDING"), Observations(at=AT, accounting_answered=True, range_row=rng))
    assert d.state is TrialState.CANCELLED


def test_a_failed_squeue_changes_nothing():
    d = next_state(_row(), Observations(at=AT, queue_answered=False, accounting_answered=True,
                                        runs=[_slurm("FAILED")]))
    assert d.state is TrialState.RUNNING and d.raw_state == "RUNNING" and not d.accounting


def test_a_waiting_trial_is_not_followed_in_its_old_array():
    d = next_state(_row(TrialState.WAITING, "CANCELLED"), Observations(at=AT, accounting_answered=True,
                                                                       runs=[_slurm("CANCELLED")]))
    assert d.state is TrialState.WAITING and d.raw_state == "CANCELLED" and not d.read_metrics


def test_missing_from_squeue_and_sacct_is_marked_gone_first():
    d = next_state(_row(), Observations(at=AT, accounting_answered=True))
    assert d.state is TrialState.RUNNING and d.raw_state == GONE and not d.wants


def test_gone_recently_waits_without_asking():
    d = next_state(_row(raw=GONE, updated_at=AT - dt.timedelta(seconds=30)),
                   Observations(at=AT, accounting_answered=True))
    assert d.state is TrialState.RUNNING and d.raw_state == GONE and not d.wants


def test_gone_for_minutes_asks_one_direct_sacct_then_decides():
    row = _row(raw=GONE, updated_at=LONG_AGO)
    obs = Observations(at=AT, accounting_answered=True)
    assert next_state(row, obs).wants == frozenset({DIRECT})
    d, _ = _settle(row, obs, direct=([_slurm("COMPLETED")], None))          # the direct query has it
    assert d.state is TrialState.COMPLETED and d.restarts == 0 and d.accounting
    d, _ = _settle(row, obs, direct=([], None), finished_by_files=True)     # lost record, finished by its files
    assert d.state is TrialState.COMPLETED and d.raw_state == FINISHED_BY_METRICS
    d, _ = _settle(row, obs, direct=([], None))                             # never known to accounting
    assert d.state is TrialState.CANCELLED
    d, _ = _settle(row, obs, direct=None)                                    # the direct query failed
    assert d.state is TrialState.RUNNING and d.raw_state == GONE


@pytest.mark.parametrize("chunk_age_s", [30.0, None])
def test_gone_in_a_young_chunk_is_not_decided(chunk_age_s):
    created = AT - dt.timedelta(seconds=chunk_age_s) if chunk_age_s is not None else None
    d = next_state(_row(raw=GONE, updated_at=LONG_AGO, chunk_created=created),
                   Observations(at=AT, accounting_answered=True))
    assert d.state is TrialState.RUNNING and not d.wants

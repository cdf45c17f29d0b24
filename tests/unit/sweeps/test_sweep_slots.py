"""Parallelism slots: a task whose batch script has exited (COMPLETING, Slurm's epilog running
on) no longer holds one of the sweep's P slots, but still counts against MaxSubmitJobs."""
from __future__ import annotations

from types import SimpleNamespace

from gpuhpc.sweeps import planner, store


class _Tx:
    """The two queries :func:`store.live_chunks` makes, answered from lists: (chunk id, raw state)
    of each queued trial, (chunk id, job id) of each chunk."""

    def __init__(self, trials: list[tuple[int, str]], chunks: list[tuple[int, str]]) -> None:
        self.trials = [(cid, "running", raw) for cid, raw in trials]
        self.chunks = chunks

    def execute(self, sql: str, params: tuple):
        return SimpleNamespace(fetchall=lambda: self.trials if "FROM sweep_trials" in sql else self.chunks)


def test_a_completing_task_frees_its_slot_but_stays_queued():
    tx = _Tx([(1, "RUNNING"), (1, "COMPLETING"), (1, "PENDING"), (1, "COMPLETED"), (2, "COMPLETING")],
             [(1, "100"), (2, "101")])
    assert store.live_chunks(tx, 7, slots=True) == [(1, "100", 2)]           # chunk 2: nothing runs
    assert store.live_chunks(tx, 7) == [(1, "100", 3), (2, "101", 1)]        # what slurmctld counts
    assert planner.slots_in_use(store.live_chunks(tx, 7, slots=True), {1: 16, 2: 4}) == 2

"""Trial and sweep states (plain enums: no database import, the submit path uses them)."""
from __future__ import annotations

import enum


class TrialState(str, enum.Enum):
    WAITING = "waiting"         # not submitted yet (the driver submits it later), or to resubmit
    PENDING = "pending"         # queued in Slurm
    RUNNING = "running"
    REQUEUED = "requeued"       # preempted / requeued / node failure: comes back, not done
    COMPLETED = "completed"
    FAILED = "failed"           # failed for good (exit code, time limit, OOM, requeue cap)
    CANCELLED = "cancelled"
    PRUNED = "pruned"           # stopped early by the sweep's pruner (docs/sweeps.md): never resumed

    @property
    def is_terminal(self) -> bool:
        return self in (TrialState.COMPLETED, TrialState.FAILED, TrialState.CANCELLED, TrialState.PRUNED)


class SweepStatus(str, enum.Enum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"         # the driver could not submit more (quota); `sweep resume` retries
    FAILED = "failed"           # stopped by fail_fast (its message says why); `sweep resume` retries

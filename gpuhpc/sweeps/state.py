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


class ChunkState(str, enum.Enum):
    """A submitted array's row (``sweep_chunks.state``)."""
    SUBMITTING = "submitting"   # recorded, its trials claimed, sbatch not yet recorded (recover finds it by name)
    SUBMITTED = "submitted"     # its array job id recorded
    FAILED = "failed"           # never reached Slurm: its trials went back to waiting


class SweepStatus(str, enum.Enum):
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    BLOCKED = "blocked"         # the driver could not submit more (quota); `sweep resume` retries
    FAILED = "failed"           # stopped by fail_fast (its message says why); `sweep resume` retries


#: Slurm state -> trial state (anything else: pending)
SLURM_STATES = {
    "PENDING": TrialState.PENDING, "CONFIGURING": TrialState.RUNNING, "RUNNING": TrialState.RUNNING,
    "COMPLETING": TrialState.RUNNING, "SUSPENDED": TrialState.RUNNING, "STOPPED": TrialState.RUNNING,
    "SIGNALING": TrialState.RUNNING, "STAGE_OUT": TrialState.RUNNING, "RESIZING": TrialState.RUNNING,
    "COMPLETED": TrialState.COMPLETED, "CANCELLED": TrialState.CANCELLED,
    "FAILED": TrialState.FAILED, "TIMEOUT": TrialState.FAILED, "OUT_OF_MEMORY": TrialState.FAILED,
    "BOOT_FAIL": TrialState.FAILED, "DEADLINE": TrialState.FAILED, "REVOKED": TrialState.FAILED,
    "SPECIAL_EXIT": TrialState.FAILED,
    "REQUEUED": TrialState.REQUEUED, "REQUEUE_HOLD": TrialState.REQUEUED, "REQUEUE_FED": TrialState.REQUEUED,
    "PREEMPTED": TrialState.REQUEUED, "NODE_FAIL": TrialState.REQUEUED,
}


def ended(raw: str | None) -> bool:
    """Has slurmctld shown this task finished (its raw state), even if accounting has not
    confirmed it yet (the trial keeps its state until then, but no longer holds a slot)?"""
    word = (raw or "").split(" ", 1)[0]
    return word in SLURM_STATES and SLURM_STATES[word].is_terminal


def trial_over(raw: str | None) -> bool:
    """Has this task's trial stopped running (:func:`ended`, or COMPLETING: the batch script
    has exited and only Slurm's epilog runs on)? Its parallelism slot is free: a sweep runs P
    trials at once, not P epilogs, and a busy node's epilog can take seconds per task."""
    return ended(raw) or (raw or "").split(" ", 1)[0] == "COMPLETING"

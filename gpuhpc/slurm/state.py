"""Slurm job states as an enum, with the raw string Slurm printed kept alongside; a node's state in one word."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class JobState(str, enum.Enum):
    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    SUSPENDED = "SUSPENDED"
    COMPLETING = "COMPLETING"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    REQUEUED = "REQUEUED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    REQUEUE_FED = "REQUEUE_FED"
    RESIZING = "RESIZING"
    REVOKED = "REVOKED"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STOPPED = "STOPPED"
    SIGNALING = "SIGNALING"
    STAGE_OUT = "STAGE_OUT"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    UNKNOWN = "UNKNOWN"

    @property
    def is_finished(self) -> bool:
        """Terminal states. PREEMPTED, REQUEUED and NODE_FAIL are *not* terminal: with
        ``--requeue`` Slurm (or gpuhpc) puts the job back in the queue."""
        return self in _FINISHED

    @property
    def is_active(self) -> bool:
        return not self.is_finished


_FINISHED = frozenset({
    JobState.COMPLETED, JobState.CANCELLED, JobState.FAILED, JobState.TIMEOUT,
    JobState.BOOT_FAIL, JobState.DEADLINE, JobState.OUT_OF_MEMORY, JobState.REVOKED,
    JobState.SPECIAL_EXIT,
})

_ALIASES = {
    "PD": "PENDING", "R": "RUNNING", "CG": "COMPLETING", "CD": "COMPLETED", "CA": "CANCELLED",
    "F": "FAILED", "TO": "TIMEOUT", "NF": "NODE_FAIL", "PR": "PREEMPTED", "S": "SUSPENDED",
    "CF": "CONFIGURING", "BF": "BOOT_FAIL", "DL": "DEADLINE", "OOM": "OUT_OF_MEMORY",
    "RQ": "REQUEUED", "RH": "REQUEUE_HOLD", "RF": "REQUEUE_FED", "RS": "RESIZING",
    "RV": "REVOKED", "SE": "SPECIAL_EXIT", "ST": "STOPPED", "SI": "SIGNALING", "SO": "STAGE_OUT",
}


@dataclass(frozen=True)
class SlurmState:
    """A parsed state: ``state`` is the enum, ``raw`` exactly what Slurm printed
    (e.g. ``"CANCELLED by 0"``)."""

    state: JobState
    raw: str

    @classmethod
    def parse(cls, raw: str) -> "SlurmState":
        text = (raw or "").strip()
        head = text.split()[0].rstrip("+") if text else ""
        head = _ALIASES.get(head, head)
        try:
            state = JobState(head)
        except ValueError:
            state = JobState.UNKNOWN
        return cls(state, text)

    @property
    def is_finished(self) -> bool:
        return self.state.is_finished

    def __str__(self) -> str:
        return self.state.value


def node_state(state: str) -> str:
    """``IDLE+DRAIN`` -> drain, ``DOWN+NOT_RESPONDING`` -> down, ``MIXED`` -> mixed ..."""
    parts = state.upper().split("+")
    if "DRAIN" in parts or parts[0] in ("DRAINED", "DRAINING"):
        return "drain"
    if parts[0] == "DOWN" or "NOT_RESPONDING" in parts:
        return "down"
    return {"ALLOCATED": "alloc"}.get(parts[0], parts[0].lower())

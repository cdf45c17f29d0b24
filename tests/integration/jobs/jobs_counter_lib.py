"""A deterministic Checkpointable callable for the Python-API test (importable by the job
through PYTHONPATH)."""
from __future__ import annotations

import os
import time

from gpuhpc.jobs.checkpoint import Checkpointable


def advance(step: int, value: int) -> int:
    return (value * 6364136223846793005 + 1442695040888963407 + step) % (1 << 61)


def uninterrupted(steps: int) -> dict:
    value = 1
    for s in range(1, steps + 1):
        value = advance(s, value)
    return {"step": steps, "value": value}


class Counter(Checkpointable):
    def __init__(self) -> None:
        self.state = (0, 1)          # (step, value): replaced in one assignment

    def __call__(self, steps: int, step_seconds: float, progress: str, slow_runs: int = 0) -> dict:
        """Counts to ``steps``, ``step_seconds`` per step in the runs before the ``slow_runs``-th
        restart (0: every run), so the run after a test's last interruption ends at once."""
        step, value = self.state
        if slow_runs and self.restarts >= slow_runs:
            step_seconds = 0.0
        with open(progress, "a", buffering=1) as log:
            log.write(f"start {self.restarts} {step} {os.environ.get('GPUHPC_RUN_ID', '-')}\n")
            while step < steps:
                time.sleep(step_seconds)
                step, value = step + 1, advance(step + 1, value)
                self.state = (step, value)
                log.write(f"step {step}\n")
        return {"step": step, "value": value}


def save_checkpoints(tag: str, count: int) -> dict:
    """A plain Python-mode call that saves ``count`` checkpoints ``<tag>-1``.. with save_atomic
    (keep-last-3 pruning) where gpuhpc puts this job's checkpoints, and returns that directory and
    the NCCL settings the job got."""
    import os

    from gpuhpc.jobs import checkpoint as ckpt

    for i in range(1, count + 1):
        ckpt.save_atomic(f"{tag} {i}\n".encode(), f"{tag}-{i}")
    keys = ("GPUHPC_CHECKPOINT_DIR", "NCCL_IB_HCA", "GPUHPC_COLLECTIVE_TIMEOUT_S", "GPUHPC_STOP_COLLECTIVE_TIMEOUT_S")
    return {"dir": str(ckpt.checkpoint_dir()), **{k: os.environ.get(k) for k in keys}}

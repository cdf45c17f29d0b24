"""A deterministic Checkpointable objective for the Python-API test (importable by the trials
through PYTHONPATH)."""
from __future__ import annotations

import os
import time

from gpuhpc.jobs.checkpoint import Checkpointable


class Objective(Checkpointable):
    """Counts ``steps`` steps, then returns ``x*x + steps``; progress lines go to
    ``$GPUHPC_TRIAL_DIR/progress`` (``start <restart> <step>``), so a test can see a trial
    resume from its checkpoint instead of from step 0."""

    def __init__(self, steps: int = 30, step_s: float = 0.1) -> None:
        self.steps, self.step_s = steps, step_s
        self.step = 0

    def __call__(self, x: int) -> float:
        with open(os.path.join(os.environ["GPUHPC_TRIAL_DIR"], "progress"), "a", buffering=1) as log:
            log.write(f"start {self.restarts} {self.step}\n")
            while self.step < self.steps:
                time.sleep(self.step_s)
                self.step += 1
                log.write(f"step {self.step}\n")
        return float(x * x + self.steps)

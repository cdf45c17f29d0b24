"""A plain function for test_sweeps_driver_faults' requeue-cap case (importable by the job
through PYTHONPATH; a uniquely named module)."""
from __future__ import annotations

import time


def count(path: str, steps: int, step_s: float) -> int:
    """Write ``step i`` lines to ``path`` for ``steps`` steps; returns ``steps``."""
    with open(path, "a", buffering=1) as log:
        for i in range(1, steps + 1):
            time.sleep(step_s)
            log.write(f"step {i}\n")
    return steps

"""gpuhpc: GPU Slurm clusters people love to use.

Public API (imported lazily so ``import gpuhpc`` and the CLI stay fast)::

    import gpuhpc
    job = gpuhpc.submit(train, cfg, resources=gpuhpc.Resources(gpus=8, gpu_type="h100", time="2h"))
    job.result()
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "submit": "gpuhpc.jobs.api",
    "Job": "gpuhpc.jobs.api",
    "map_array": "gpuhpc.jobs.api",
    "batch": "gpuhpc.jobs.api",
    "as_completed": "gpuhpc.jobs.watch",
    "Resources": "gpuhpc.jobs.spec",
    "JobSpec": "gpuhpc.jobs.spec",
    "Checkpointable": "gpuhpc.jobs.checkpoint",
    "should_stop": "gpuhpc.jobs.coord",
    "save_shard": "gpuhpc.jobs.checkpoint",
    "commit": "gpuhpc.jobs.checkpoint",
    "report": "gpuhpc.ledger.metrics",
    "should_prune": "gpuhpc.sweeps.trial",
    "sweep": "gpuhpc.remote.sweeps",
    "Sweep": "gpuhpc.sweeps.api",
    "sprint": "gpuhpc.sprints.run",
    "SlurmClient": "gpuhpc.slurm.client",
    "JobState": "gpuhpc.slurm.state",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpuhpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value

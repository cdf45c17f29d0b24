"""This process's rank and the job's world size, from the environment (stdlib only).

``RANK``/``WORLD_SIZE`` (torchrun, the deepspeed template), else ``SLURM_PROCID``/
``SLURM_NTASKS``, else 0/1. Below both :mod:`gpuhpc.jobs.checkpoint` (whose shards are per
rank) and :mod:`gpuhpc.jobs.coord` (which makes the ranks agree on a stop).
"""
from __future__ import annotations

import os


def _env_int(*names: str, default: int) -> int:
    for n in names:
        raw = os.environ.get(n, "")
        if raw.strip().isdigit():
            return int(raw)
    return default


def rank() -> int:
    return _env_int("RANK", "SLURM_PROCID", default=0)


def world_size() -> int:
    return max(1, _env_int("WORLD_SIZE", "SLURM_NTASKS", default=1))

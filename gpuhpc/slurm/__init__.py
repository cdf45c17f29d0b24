"""All Slurm access lives here: argv builders, output parsers, and :class:`SlurmClient`.

The names below load on first use, so that the pure modules (``gpuhpc.slurm.durations``,
``commands``, ``parsers``) can be imported without the client and its runner."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.slurm.state import JobState, SlurmState

__all__ = ["SlurmClient", "JobState", "SlurmState"]


def __getattr__(name: str):
    if name == "SlurmClient":
        from gpuhpc.slurm.client import SlurmClient

        return SlurmClient
    if name in ("JobState", "SlurmState"):
        from gpuhpc.slurm import state

        return getattr(state, name)
    raise AttributeError(f"module 'gpuhpc.slurm' has no attribute {name!r}")

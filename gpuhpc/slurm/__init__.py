"""All Slurm access lives here: argv builders, output parsers, and :class:`SlurmClient`."""
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.state import JobState, SlurmState

__all__ = ["SlurmClient", "JobState", "SlurmState"]

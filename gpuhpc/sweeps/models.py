"""Sweep state in the gpuhpc database (the ledger's, SQLite or PostgreSQL; migration 0003).

- ``sweeps``: one row per sweep (its validated spec as JSON, status, directory, driver job);
- ``sweep_chunks``: one row per submitted array (``--array=0-(k-1)%P``), with the array job
  id and the trial of each task id (also in the chunk's parameter file the tasks read);
- ``sweep_trials``: one row per trial: its parameters, the array task it runs as now, and what
  Slurm's accounting says about it (state, restarts, GPU-hours), plus its reported metrics.

Trial state is *derived* from ``sacct --duplicates`` (never from heartbeats), so no trial can
be a zombie: see :mod:`gpuhpc.sweeps.refresh`.
"""
from __future__ import annotations

# the tables are declared with the ledger's (gpuhpc/ledger/orm.py), so that the one metadata
# Alembic compares holds them
from gpuhpc.ledger.orm import Sweep, SweepChunk, SweepTrial  # noqa: F401


from gpuhpc.sweeps.state import SweepStatus, TrialState  # noqa: F401

"""Hyper-parameter sweeps as Slurm job arrays: :mod:`~gpuhpc.sweeps.spec` (sweep files),
:mod:`~gpuhpc.sweeps.store` (the state store), :mod:`~gpuhpc.sweeps.planner` and
:mod:`~gpuhpc.sweeps.submission` (chunks), :mod:`~gpuhpc.sweeps.holds` (quota),
:mod:`~gpuhpc.sweeps.refresh` (state from accounting), :mod:`~gpuhpc.sweeps.control` (prune, resume, cancel),
:mod:`~gpuhpc.sweeps.driver` (the driver job), :mod:`~gpuhpc.sweeps.trial` (what a task runs),
:mod:`~gpuhpc.sweeps.api` (``gpuhpc.sweep`` / ``gpuhpc.Sweep``), :mod:`~gpuhpc.sweeps.pruners` (early
stopping: ``pruner:`` and its decisions). docs/sweeps.md."""

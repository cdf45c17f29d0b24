"""``gpuhpc.report(step=..., **metrics)``: figures reported from inside a running job.

One reporting API for two readers:

- throughput (``samples_per_s=...``) for the cost report's $/throughput: see below;
- a sweep trial's metrics (``loss=...``): inside a trial (``$GPUHPC_METRICS_FILE`` set by
  :mod:`gpuhpc.sweeps.trial`) each call also appends one JSON line (``{"step", "metrics"}``)
  to the trial's own file, with one ``O_APPEND`` write, which the sweep reads back into the
  database. ``gpuhpc report-metric NAME VALUE [--step N]`` is the shell's way to call it.

Appends one JSON line per call to ``$GPUHPC_METRICS_DIR/<cluster>/<job>[_<task>].jsonl``
(default ``~/.local/share/gpuhpc/metrics``), keyed by ``SLURM_JOB_ID`` (the array job id)
and ``SLURM_ARRAY_TASK_ID``. ``gpuhpc ledger ingest`` reads these files, and only a regular
file owned by the job's user, named after a job accounting knows (see ``ingest_metrics``). No network, no
database: safe to call from every rank, every step (only numbers are kept).
"""
from __future__ import annotations

import json
import math
import os
import time

from gpuhpc.config import getenv

_warned = False


def _job_key() -> tuple[str, str, str | None] | None:
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "") or "default"
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    job = array_job or os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    return cluster, job, (task if array_job and task is not None else None)


def _append_line(path: str, record: dict) -> None:
    """One ``write()`` of one line with ``O_APPEND``: concurrent writers never interleave."""
    line = json.dumps(record, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def report(step: int | None = None, **metrics: float) -> None:
    """Record figures for the current Slurm job, e.g. ``report(samples_per_s=1234.5)`` or, in a
    sweep trial, ``report(step=100, loss=0.25)``.

    Values must be numbers, ``step`` a whole number. A value that is not finite (NaN, inf: a
    diverging run) never raises (one rank raising while its peers wait in the next collective
    would hang the job): it is recorded as a *failed* value, ``"failed": {"loss": "nan"}`` in
    the line, never among ``metrics``, so no reader takes it for a result (a sweep trial whose
    objective only ever failed has no objective), and a warning says so. Only rank 0 writes when
    ``SLURM_PROCID``/``RANK`` says this process is another rank, so multi-rank jobs are not
    counted N times.
    """
    if not metrics:
        return
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise ValueError(f"step {step!r} is not a whole number >= 0")
    clean: dict[str, float] = {}
    failed: dict[str, str] = {}
    for key, value in metrics.items():
        if not key.isidentifier():
            raise ValueError(f"metric name {key!r} is not an identifier")
        v = float(value)
        if math.isfinite(v):
            clean[key] = v
        else:
            failed[key] = repr(v)           # 'nan', 'inf', '-inf': valid JSON, unlike NaN
    if failed:
        import warnings

        warnings.warn(f"gpuhpc.report(): {', '.join(f'{k}={v}' for k, v in failed.items())} not finite; "
                      "recorded as failed values", RuntimeWarning, stacklevel=2)
    for rank_var in ("RANK", "SLURM_PROCID"):
        rank = os.environ.get(rank_var)
        if rank is not None and rank.strip() not in ("", "0"):
            return
    trial_file = getenv("GPUHPC_METRICS_FILE")
    if trial_file:
        _append_line(trial_file, {"ts": time.time(), "step": step, "metrics": clean,
                                  **({"failed": failed} if failed else {}),
                                  "trial": getenv("GPUHPC_TRIAL_ID"),
                                  "job_id": os.environ.get("SLURM_JOB_ID"),
                                  "restart": os.environ.get("SLURM_RESTART_COUNT", "0")})
    from gpuhpc.ledger.paths import metrics_dir

    key = _job_key()
    if key is None and trial_file:
        return
    if key is None:            # not in a Slurm job (a local test run): nothing to attribute it to
        global _warned
        if not _warned:
            import warnings

            warnings.warn("gpuhpc.report(): not inside a Slurm job (no SLURM_JOB_ID); metrics not recorded",
                          stacklevel=2)
            _warned = True
        return
    cluster, job, task = key
    folder = metrics_dir() / cluster
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{job}_{task}" if task is not None else job
    # one write() of a short line with O_APPEND is atomic enough for concurrent ranks
    _append_line(str(folder / f"{name}.jsonl"), {"ts": time.time(), "cluster": cluster, "job_id": job,
                                                 "array_task_id": task, "metrics": clean,
                                                 **({"failed": failed} if failed else {})})

"""``gpuhpc.report(samples_per_s=...)``: throughput reported from inside a running job.

Appends one JSON line per call to ``$GPUHPC_METRICS_DIR/<cluster>/<job>[_<task>].jsonl``
(default ``~/.local/share/gpuhpc/metrics``), keyed by ``SLURM_JOB_ID`` (the array job id)
and ``SLURM_ARRAY_TASK_ID``. ``gpuhpc ledger ingest`` reads these files. No network, no
database: safe to call from every rank, every step (only numbers are kept).
"""
from __future__ import annotations

import json
import math
import os
import time


_warned = False


def _job_key() -> tuple[str, str, str | None] | None:
    cluster = os.environ.get("SLURM_CLUSTER_NAME", "") or "default"
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    task = os.environ.get("SLURM_ARRAY_TASK_ID")
    job = array_job or os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    return cluster, job, (task if array_job and task is not None else None)


def report(**metrics: float) -> None:
    """Record throughput figures for the current Slurm job, e.g. ``report(samples_per_s=1234.5)``.

    Values must be finite numbers. Only rank 0 writes when ``SLURM_PROCID``/``RANK`` says
    this process is another rank, so multi-rank jobs are not counted N times.
    """
    if not metrics:
        return
    clean: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.isidentifier():
            raise ValueError(f"metric name {key!r} is not an identifier")
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"metric {key}={value!r} is not a finite number")
        clean[key] = v
    for rank_var in ("RANK", "SLURM_PROCID"):
        rank = os.environ.get(rank_var)
        if rank is not None and rank.strip() not in ("", "0"):
            return
    from gpuhpc.ledger.paths import metrics_dir

    key = _job_key()
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
    line = json.dumps({"ts": time.time(), "cluster": cluster, "job_id": job,
                       "array_task_id": task, "metrics": clean}, separators=(",", ":"))
    # one write() of a short line with O_APPEND is atomic enough for concurrent ranks
    fd = os.open(folder / f"{name}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)

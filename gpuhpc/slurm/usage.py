"""Running jobs' CPU and memory use from ``sstat`` (jobacct_gather's samples): the argv builder,
its parser and the call through a SlurmClient. Kept in its own module (beside commands.py and
parsers.py) for the Slurm exporter: per job, CPU seconds used so far and the largest RSS."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SEP = "|"          # sstat has no --delimiter; its fields (ids, times, sizes) never hold a "|"
SSTAT_FIELDS = ("JobID", "AveCPU", "NTasks", "MaxRSS")


def sstat(job_ids: Iterable[str]) -> list[str]:
    """``sstat`` for every step of ``job_ids`` (running jobs only), parsable."""
    return ["sstat", "--noheader", "--parsable2", "--allsteps",
            f"--jobs={','.join(str(j) for j in job_ids)}", f"--format={','.join(SSTAT_FIELDS)}"]


def cpu_seconds(text: str) -> float | None:
    """sstat/sacct CPU times (``00:00:18``, ``01:02.345``, ``1-02:03:04``) -> seconds."""
    from gpuhpc.slurm.durations import reported_seconds

    t = (text or "").strip()
    if not t:
        return None
    whole, _, frac = t.partition(".")
    secs = reported_seconds(whole)
    if secs is None:
        return None
    return secs + (float(f"0.{frac}") if frac.isdigit() else 0.0)


_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def size_bytes(text: str) -> float | None:
    """``63868K`` / ``1.5G`` / ``0`` -> bytes."""
    t = (text or "").strip().upper()
    if not t:
        return None
    unit = t[-1] if t[-1] in _UNITS and not t[-1].isdigit() else ""
    try:
        return float(t[: len(t) - len(unit)] if unit else t) * _UNITS[unit]
    except ValueError:
        return None


@dataclass(frozen=True)
class JobUsage:
    """A running job's use so far, summed over its steps."""

    job_id: str
    cpu_seconds: float
    max_rss_bytes: float


def parse_sstat(text: str) -> dict[str, JobUsage]:
    """``sstat`` rows (:func:`sstat`) -> {job id: usage}: CPU = AveCPU × NTasks summed over the
    steps, memory = the largest step's MaxRSS."""
    cpu: dict[str, float] = {}
    rss: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split(SEP)
        if len(parts) != len(SSTAT_FIELDS):
            continue
        step, ave, ntasks, maxrss = parts
        job = step.split(".", 1)[0]
        c = cpu_seconds(ave) or 0.0
        n = int(ntasks) if ntasks.strip().isdigit() else 1
        cpu[job] = cpu.get(job, 0.0) + c * n
        rss[job] = max(rss.get(job, 0.0), size_bytes(maxrss) or 0.0)
    return {j: JobUsage(j, cpu[j], rss[j]) for j in cpu}


def job_usage(client, job_ids: Iterable[str], *, batch: int = 200) -> dict[str, JobUsage]:
    """sstat for running jobs through ``client`` (a SlurmClient), ``batch`` ids a call; a job
    that ended in between is left out, not an error."""
    ids = [str(j) for j in job_ids]
    out: dict[str, JobUsage] = {}
    for i in range(0, len(ids), batch):
        res = client.run(sstat(ids[i:i + batch]), check=False)
        out.update(parse_sstat(res.stdout))
    return out

"""A job's GPU and CPU use as Prometheus recorded it: the HTTP client, the records a report is
made of (:class:`JobEfficiency`, :class:`Device`, :class:`RankRow`), the pure
:func:`summarize`, and :func:`fetch_series`, which fills a report from the job's series.

Below both :mod:`gpuhpc.monitoring.efficiency` (the reports) and
:mod:`gpuhpc.monitoring.summaries` (their copy in the ledger); imports neither.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from decimal import Decimal

from gpuhpc.errors import GpuhpcError
from gpuhpc.monitoring import JOB_INFO, JOB_JOIN

DEFAULT_URL = "http://127.0.0.1:9090"
DEFAULT_THRESHOLD = 5.0
UTIL = "gpuhpc_gpu_utilization_percent"
MEM = "gpuhpc_gpu_memory_used_bytes"
CPU = "gpuhpc_slurm_job_cpu_used_seconds"
RSS = "gpuhpc_slurm_job_memory_max_rss_bytes"


def idle_threshold(value: float | None = None) -> float:
    if value is not None:
        return value
    from gpuhpc.config import getenv

    env = getenv("GPUHPC_IDLE_THRESHOLD")       # a bad value: UserInputError naming it
    return DEFAULT_THRESHOLD if env is None else env


class Prometheus:
    """The few HTTP API calls the report needs."""

    def __init__(self, url: str | None = None, timeout: float = 30) -> None:
        from gpuhpc.config import getenv

        self.url = (url or getenv("GPUHPC_PROMETHEUS_URL") or DEFAULT_URL).rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict, key: str = "result"):
        full = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(full, timeout=self.timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            try:
                detail = json.load(exc).get("error", "")
            except ValueError:
                detail = ""
            raise GpuhpcError(f"Prometheus at {self.url}: HTTP {exc.code} {detail}".strip()) from None
        except (urllib.error.URLError, OSError) as exc:
            raise GpuhpcError(f"cannot reach Prometheus at {self.url}: {getattr(exc, 'reason', exc)}",
                              hint="set GPUHPC_PROMETHEUS_URL") from None
        if body.get("status") != "success":
            raise GpuhpcError(f"Prometheus: {body.get('error', 'query failed')}")
        return body["data"][key]

    def config(self) -> str:
        """The running configuration (YAML text)."""
        return self._get("/api/v1/status/config", {}, key="yaml")

    def query(self, expr: str, at: dt.datetime | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at.timestamp():.3f}"
        return self._get("/api/v1/query", params)

    def query_range(self, expr: str, start: dt.datetime, end: dt.datetime, step: int) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": expr, "start": f"{start.timestamp():.3f}",
                                                  "end": f"{end.timestamp():.3f}", "step": str(step)})


# ------------------------------------------------------------------ records and pure summaries
@dataclass
class Device:
    """One GPU or MIG instance a job held."""

    node: str
    gpu: str
    mig: str = ""
    times: list[float] = field(default_factory=list)
    util: list[float] = field(default_factory=list)
    mem_times: list[float] = field(default_factory=list)
    mem: list[float] = field(default_factory=list)
    mean_util: float = 0.0
    peak_util: float = 0.0
    peak_mem_bytes: float = 0.0
    idle_hours: float = 0.0
    held_hours: float = 0.0
    idle: bool = False

    @property
    def name(self) -> str:
        return f"{self.node} gpu {self.gpu}" + (f" ({self.mig})" if self.mig else "")

    def to_dict(self) -> dict:
        return {"node": self.node, "gpu": self.gpu, "mig": self.mig, "mean_util_percent": round(self.mean_util, 2),
                "peak_util_percent": round(self.peak_util, 2), "peak_memory_bytes": self.peak_mem_bytes, "idle_gpu_hours": round(self.idle_hours, 4),
                "held_gpu_hours": round(self.held_hours, 4), "idle": self.idle}


@dataclass
class JobEfficiency:
    """One job's report."""

    job_id: str
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    state: str = ""
    gpu_type: str = ""
    gpus: int = 0
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    elapsed_s: int = 0
    time_limit_s: int | None = None
    threshold: float = DEFAULT_THRESHOLD
    step_s: int = 15
    devices: list[Device] = field(default_factory=list)
    rate: Decimal | None = None        # per GPU-hour, multipliers applied; None: no price
    advice: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)          # what could not be read (stderr)
    cpus: int = 0
    cpu_times: list[float] = field(default_factory=list)    # the Slurm exporter's sstat samples
    cpu_used: list[float] = field(default_factory=list)     # CPU seconds used so far, per sample
    rss: list[float] = field(default_factory=list)          # largest step RSS so far, per sample
    source: str = "prometheus"                              # or "ledger": the run's stored summary

    @property
    def cpu_used_seconds(self) -> float | None:
        return max(self.cpu_used) if self.cpu_used else None

    @property
    def cpu_efficiency(self) -> float | None:
        used = self.cpu_used_seconds
        if used is None or not self.cpus or not self.elapsed_s:
            return None
        return used / (self.cpus * self.elapsed_s)

    @property
    def peak_rss_bytes(self) -> float | None:
        return max(self.rss) if self.rss else None

    @property
    def idle_gpu_hours(self) -> float:
        return sum(d.idle_hours for d in self.devices)

    @property
    def idle_cost(self) -> Decimal | None:
        if self.rate is None:
            return None
        return (Decimal(str(round(self.idle_gpu_hours, 6))) * self.rate).quantize(Decimal("0.01"))

    @property
    def time_limit_used(self) -> float | None:
        return self.elapsed_s / self.time_limit_s if self.time_limit_s else None

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "user": self.user, "account": self.account, "partition": self.partition,
                "state": self.state, "gpu_type": self.gpu_type, "gpus": self.gpus,
                "start": self.start.isoformat() if self.start else None,
                "end": self.end.isoformat() if self.end else None, "elapsed_s": self.elapsed_s,
                "time_limit_s": self.time_limit_s,
                "time_limit_used": round(self.time_limit_used, 4) if self.time_limit_used is not None else None,
                "idle_threshold_percent": self.threshold, "idle_gpu_hours": round(self.idle_gpu_hours, 4),
                "rate_per_gpu_hour": str(self.rate) if self.rate is not None else None,
                "idle_cost": str(self.idle_cost) if self.idle_cost is not None else None,
                "cpus": self.cpus, "cpu_used_seconds": self.cpu_used_seconds,
                "cpu_efficiency": round(self.cpu_efficiency, 4) if self.cpu_efficiency is not None else None,
                "peak_rss_bytes": self.peak_rss_bytes,
                "devices": [d.to_dict() for d in self.devices], "advice": self.advice, "source": self.source}


def _key(metric: dict) -> tuple[str, str, str]:
    return metric.get("node", ""), metric.get("gpu", ""), metric.get("mig", "")


def _gpu_sort(k: tuple[str, str, str]):
    return (k[0], int(k[1]) if k[1].isdigit() else 1 << 30, k[2])


def summarize(util: list[dict], mem: list[dict], *, threshold: float, step_s: int) -> list[Device]:
    """Prometheus range results (``matrix``) -> one :class:`Device` per (node, gpu, mig)."""
    devs: dict[tuple[str, str, str], Device] = {}
    for results, times, values in ((util, "times", "util"), (mem, "mem_times", "mem")):
        for series in results:
            k = _key(series["metric"])
            d = devs.setdefault(k, Device(*k))
            for t, v in series["values"]:
                getattr(d, times).append(float(t))
                getattr(d, values).append(float(v))
    for d in devs.values():
        order = sorted(range(len(d.times)), key=d.times.__getitem__)
        d.times, d.util = [d.times[i] for i in order], [d.util[i] for i in order]
        if d.util:
            d.mean_util = sum(d.util) / len(d.util)
            d.peak_util = max(d.util)
            d.held_hours = len(d.util) * step_s / 3600
            d.idle_hours = sum(1 for u in d.util if u < threshold) * step_s / 3600
        d.peak_mem_bytes = max(d.mem, default=0.0)
        d.idle = bool(d.util) and d.mean_util < threshold
    return [devs[k] for k in sorted(devs, key=_gpu_sort)]


def fetch_series(rep: JobEfficiency, prom: Prometheus, start: dt.datetime, end: dt.datetime | None,
                 now: dt.datetime, *, label: str | None = None) -> None:
    """Fill ``rep`` (devices, CPU and RSS samples) from Prometheus' series of the job labelled
    ``label`` (default ``rep.job_id``) between ``start`` and ``end`` (or now)."""
    span = max(1.0, (min(end or now, now) - start).total_seconds())
    rep.step_s = max(5, math.ceil(span / 500))
    # one step past the end: the last scrape of a job's GPUs may land just after Slurm's End
    stop = min((end or now) + dt.timedelta(seconds=rep.step_s), now)
    sel = f'{{job_id="{label or rep.job_id}"}}'
    # the per-GPU series carry no job labels: the job's devices are those its job_info series names
    util = prom.query_range(job_series(UTIL, sel), start, stop, rep.step_s)
    mem = prom.query_range(job_series(MEM, sel), start, stop, rep.step_s)
    rep.devices = summarize(util, mem, threshold=rep.threshold, step_s=rep.step_s)
    for expr, values in ((CPU, rep.cpu_used), (RSS, rep.rss)):
        for series in prom.query_range(f"max({expr}{sel})", start, stop, rep.step_s):
            for t, v in series["values"]:
                if values is rep.cpu_used:
                    rep.cpu_times.append(float(t))
                values.append(float(v))


def job_series(metric: str, selector: str = '{job_id!=""}') -> str:
    """PromQL: ``metric``'s per-GPU series of the devices the jobs ``selector`` picks hold, with
    their ``job_id`` and ``user`` (joined from ``gpuhpc_gpu_job_info``)."""
    return f"{metric} {JOB_JOIN} {JOB_INFO}{selector}"


@dataclass
class RankRow:
    job_id: str
    user: str
    account: str
    gpu_type: str
    gpus: int
    idle_gpu_hours: float
    rate: Decimal | None
    source: str = "prometheus"          # or "ledger"
    slurm_job_id: str = ""              # the job_id label (an array task's own id)

    @property
    def idle_cost(self) -> Decimal | None:
        return None if self.rate is None else (Decimal(str(round(self.idle_gpu_hours, 6))) * self.rate).quantize(Decimal("0.01"))

    def to_dict(self) -> dict:
        return {"job_id": self.job_id, "user": self.user, "account": self.account, "gpu_type": self.gpu_type,
                "gpus": self.gpus, "idle_gpu_hours": round(self.idle_gpu_hours, 4),
                "rate_per_gpu_hour": str(self.rate) if self.rate is not None else None,
                "idle_cost": str(self.idle_cost) if self.idle_cost is not None else None, "source": self.source}

"""GPU exporter: per-GPU and per-MIG-instance metrics from NVML, and one ``gpuhpc_gpu_job_info``
series per device a Slurm job holds, with the job and user (:mod:`gpuhpc.monitoring.jobmap`);
the other series carry no job labels (queries join them in: ``JOB_JOIN``). A prometheus_client
custom collector (every scrape asks NVML afresh; nothing runs between scrapes).

Beside gpuhpc's own series, dcgm-exporter's default fields under dcgm-exporter's names
(``DCGM_FI_DEV_*``, labels ``gpu``/``UUID``/``device``/``modelName``/``Hostname``): clocks, the
clock event (throttle) reasons bitmask, power limit, energy, PCIe replays, ECC (volatile and
aggregate, single- and double-bit), retired pages, row remapping, NVLink error counters, the last
XID; per MIG instance the graphics-engine activity from NVML's GPM (Hopper and later; between two
scrapes), which is also the instance's ``gpuhpc_gpu_utilization_percent`` where NVML's utilisation
call is not supported on MIG devices. XIDs come from an NVML event set the collector holds open
(NVML stays initialised for the exporter's life): each scrape takes the events queued since the
last one (``gpuhpc_gpu_xid_errors_total`` by code, ``DCGM_FI_DEV_XID_ERRORS`` the last); XIDs from
before the exporter started are the health checks' (kernel log).

GRES index order (what the job map is keyed by): GPUs in NVML index order; a GPU in MIG mode
contributes its MIG devices in NVML's MIG index order instead of itself. That is the order
``AutoDetect=nvml`` and gpuhpc's ``node inventory`` write gres.conf in.

    python -m gpuhpc.monitoring.gpu_exporter --node gpu-node1 --port 9411 [--addr 127.0.0.1]

NVML comes from ``pynvml`` (nvidia-ml-py). ``GPUHPC_NVML_MODULE`` names another module with the same
calls to use instead: the local test cluster runs its exporters on the NVML stand-in of the tests
(``tests/standins/nvml_standin.py``, on ``PYTHONPATH``; not part of this package).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from collections import defaultdict

from gpuhpc.monitoring import METRICS
from gpuhpc.monitoring import jobmap

_MIG_NAME = re.compile(r"MIG\s+(\S+)")


def load_nvml():
    """pynvml, or the pynvml-compatible module ``GPUHPC_NVML_MODULE`` names (a test stand-in)."""
    from gpuhpc.config import getenv

    name = getenv("GPUHPC_NVML_MODULE")
    if name:
        return importlib.import_module(name)
    import pynvml

    return pynvml


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class GpuCollector:
    """``collect()`` yields one metric family per :data:`METRICS` ``gpuhpc_gpu_*`` name."""

    def __init__(self, node: str, nvml=None, jobmap_dir: str | None = None) -> None:
        self.node = node
        self.nvml = nvml or load_nvml()
        self.jobmap_dir = jobmap_dir
        self.errors = 0
        self._events = None                 # the XID event set (NVML held initialised while it exists)
        self._xid_tried = False
        self.xid_last: dict[tuple[str, ...], int] = {}                 # board's DCGM labels -> last XID
        self.xid_count: dict[tuple[str, ...], int] = defaultdict(int)  # (*labels, xid) -> count
        self._gpm: dict[tuple[str, int], object] = {}                  # (board UUID, GI) -> last GPM sample
        self._gpm_ok: dict[str, bool] = {}

    # one sample: (metric name, label values, value)
    def samples(self, jobs: dict[int, dict] | None = None) -> list[tuple[str, tuple[str, ...], float]]:
        """Every sample of one scrape; ``jobs`` ({GRES index: {"job_id", "user"}}) instead of the
        node's job map (bench/monitoring_cardinality.py)."""
        nv = self.nvml
        nv.nvmlInit()
        try:
            self._xid_watch()
            jobs = jobmap.read(self.node, self.jobmap_dir) if jobs is None else jobs
            out: list[tuple[str, tuple[str, ...], float]] = []
            gres = 0
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                model = _s(nv.nvmlDeviceGetName(h))
                uuid = _s(self._call(nv.nvmlDeviceGetUUID, h) or "")
                minor = self._call(nv.nvmlDeviceGetMinorNumber, h) if hasattr(nv, "nvmlDeviceGetMinorNumber") else None
                dcgm = (self.node, str(i), uuid, f"nvidia{minor if minor is not None else i}", model, self.node)
                migs = self._migs(h)
                if migs:
                    for mh in migs:
                        name = _s(nv.nvmlDeviceGetName(mh))
                        m = _MIG_NAME.search(name)
                        profile = m.group(1) if m else "mig"
                        gr = self._gpm_mig(h, mh, uuid, dcgm, profile, out)
                        out += self._device(mh, gres, profile, model, jobs.get(gres), is_mig=True, gr_active=gr)
                        gres += 1
                    # whole-board values (power, temperature, links) once, on the physical GPU
                    out += self._board(h, model)
                else:
                    out += self._device(h, gres, "", model, jobs.get(gres), is_mig=False, dcgm=dcgm)
                    gres += 1
                out += self._health(h, dcgm)
            out += self._xids()
            return out
        finally:
            nv.nvmlShutdown()

    def _call(self, fn, *args):
        """``fn(*args)``, or None where NVML fails; a failure other than "not supported" (or a
        call this driver lacks) counts in ``gpuhpc_gpu_exporter_errors_total``."""
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) not in (getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3),
                                                   getattr(nv, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)):
                self.errors += 1
            return None

    def _migs(self, h) -> list:
        nv = self.nvml
        mode = self._call(nv.nvmlDeviceGetMigMode, h)
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        out = []
        for k in range(self._call(nv.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
            try:
                out.append(nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k))
            except nv.NVMLError:
                continue        # an empty slot
        return out

    def _device(self, h, gres: int, profile: str, model: str, job: dict | None, *, is_mig: bool,
                dcgm: tuple[str, ...] | None = None, gr_active: float | None = None) -> list:
        """A job-assignable device (a GPU, or a MIG instance): ``gpu`` is its GRES index. ``dcgm``:
        a whole GPU's dcgm-exporter labels (its DCGM_* copies of utilisation and memory);
        ``gr_active``: a MIG instance's GPM graphics activity (0-1), its utilisation where NVML's
        utilisation call is not supported on MIG devices."""
        nv = self.nvml
        uuid = _s(self._call(nv.nvmlDeviceGetUUID, h) or "")
        labels = (self.node, str(gres), profile, uuid, model)
        out = [("gpuhpc_gpu_info", labels, 1.0)]
        if job and job.get("job_id"):
            out.append(("gpuhpc_gpu_job_info", (self.node, str(gres), profile, uuid, str(job["job_id"]),
                                                str(job.get("user", ""))), 1.0))
        util = self._call(nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            out.append(("gpuhpc_gpu_utilization_percent", labels, float(util.gpu)))
            out.append(("gpuhpc_gpu_memory_utilization_percent", labels, float(util.memory)))
            if dcgm:
                out.append(("DCGM_FI_DEV_GPU_UTIL", dcgm, float(util.gpu)))
                out.append(("DCGM_FI_DEV_MEM_COPY_UTIL", dcgm, float(util.memory)))
        elif gr_active is not None:
            out.append(("gpuhpc_gpu_utilization_percent", labels, round(gr_active * 100.0, 3)))
        mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out.append(("gpuhpc_gpu_memory_used_bytes", labels, float(mem.used)))
            out.append(("gpuhpc_gpu_memory_total_bytes", labels, float(mem.total)))
            if dcgm:
                out.append(("DCGM_FI_DEV_FB_USED", dcgm, float(mem.used // 2**20)))
                out.append(("DCGM_FI_DEV_FB_FREE", dcgm, float((mem.total - mem.used) // 2**20)))
        if not is_mig:
            out += self._board(h, model, labels)
        return out

    # -------------------------------------------------------------- dcgm-exporter's fields
    def _health(self, h, dcgm: tuple[str, ...]) -> list:
        """A board's clocks, throttle reasons, power, energy, PCIe replays, ECC, retired pages, row
        remapping and NVLink error counters under dcgm-exporter's names; each left out where NVML
        does not support it (as nvidia-smi's N/A)."""
        nv = self.nvml
        out: list = []

        def add(metric: str, value) -> None:
            if value is not None:
                out.append((metric, dcgm, float(value)))

        def call(name: str, *args):
            fn = getattr(nv, name, None)
            return self._call(fn, h, *args) if fn is not None else None

        add("DCGM_FI_DEV_SM_CLOCK", call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM))
        add("DCGM_FI_DEV_MEM_CLOCK", call("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM))
        reasons = call("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:             # drivers before 535 know only the older name
            reasons = call("nvmlDeviceGetCurrentClocksThrottleReasons")
        add("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", reasons)
        t = call("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)
        add("DCGM_FI_DEV_GPU_TEMP", t)
        p = call("nvmlDeviceGetPowerUsage")
        add("DCGM_FI_DEV_POWER_USAGE", p / 1000.0 if p is not None else None)
        lim = call("nvmlDeviceGetPowerManagementLimit")
        add("DCGM_FI_DEV_POWER_MGMT_LIMIT", lim / 1000.0 if lim is not None else None)
        add("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", call("nvmlDeviceGetTotalEnergyConsumption"))
        add("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", call("nvmlDeviceGetPcieReplayCounter"))
        for metric, kind, counter in (
                ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC),
                ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
                ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_AGGREGATE_ECC),
                ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC)):
            add(metric, call("nvmlDeviceGetTotalEccErrors", kind, counter))
        for metric, cause in (("DCGM_FI_DEV_RETIRED_SBE", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                              ("DCGM_FI_DEV_RETIRED_DBE", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
            pages = call("nvmlDeviceGetRetiredPages", cause)
            add(metric, len(pages) if pages is not None else None)
        add("DCGM_FI_DEV_RETIRED_PENDING", call("nvmlDeviceGetRetiredPagesPendingStatus"))
        rows = call("nvmlDeviceGetRemappedRows")
        if rows is not None:
            corr, unc, pending, failure = rows
            add("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", corr)
            add("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", unc)
            add("DCGM_FI_DEV_ROW_REMAP_PENDING", 1 if pending else 0)
            add("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1 if failure else 0)
        nvlink = (("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
                  ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
                  ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
                  ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"))
        ids = [getattr(nv, f, None) for _, f in nvlink]
        if all(i is not None for i in ids):
            for (metric, _), fv in zip(nvlink, call("nvmlDeviceGetFieldValues", ids) or []):
                if fv.nvmlReturn == 0:
                    add(metric, fv.value.ullVal)
        return out

    def _gpm_mig(self, h, mh, board_uuid: str, dcgm: tuple[str, ...], profile: str, out: list) -> float | None:
        """A MIG instance's graphics-engine activity (0-1) between the last scrape's GPM sample
        and this one's (NVML GPM: Hopper and later); appends ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``.
        None on the first scrape, or where GPM is not supported."""
        nv = self.nvml
        if not hasattr(nv, "nvmlGpmMigSampleGet"):
            return None
        if board_uuid not in self._gpm_ok:
            sup = self._call(nv.nvmlGpmQueryDeviceSupport, h)
            self._gpm_ok[board_uuid] = bool(sup is not None and sup.isSupportedDevice)
        gi = self._call(nv.nvmlDeviceGetGpuInstanceId, mh)
        if not self._gpm_ok[board_uuid] or gi is None:
            return None
        sample = self._call(nv.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        if self._call(nv.nvmlGpmMigSampleGet, h, gi, sample) is None:
            self._call(nv.nvmlGpmSampleFree, sample)
            return None
        prev, self._gpm[(board_uuid, gi)] = self._gpm.get((board_uuid, gi)), sample
        if prev is None:
            return None
        try:
            q = nv.c_nvmlGpmMetricsGet_t()
            q.version, q.numMetrics, q.sample1, q.sample2 = nv.NVML_GPM_METRICS_GET_VERSION, 1, prev, sample
            q.metrics[0].metricId = nv.NVML_GPM_METRIC_GRAPHICS_UTIL
            got = self._call(nv.nvmlGpmMetricsGet, q)
        finally:
            self._call(nv.nvmlGpmSampleFree, prev)
        if got is None or got.metrics[0].nvmlReturn != 0:
            return None
        value = min(max(float(got.metrics[0].value) / 100.0, 0.0), 1.0)
        out.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", (*dcgm, profile, str(gi)), value))
        return value

    def _xid_watch(self) -> None:
        """Open the XID event set once (NVML initialised once more, for the collector's life)."""
        nv = self.nvml
        if self._xid_tried or not hasattr(nv, "nvmlEventSetCreate"):
            return
        self._xid_tried = True
        try:
            nv.nvmlInit()
        except nv.NVMLError:
            return
        events = self._call(nv.nvmlEventSetCreate)
        if events is None:
            nv.nvmlShutdown()
            return
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self._call(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, events)
        self._events = events

    def _xids(self) -> list:
        """The XIDs queued since the last scrape (at most 10,000 a scrape), counted per board and
        code; the samples: every board's last XID (0: none) and the counts."""
        nv = self.nvml
        if self._events is None:
            return []
        for _ in range(10_000):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break               # NVML_ERROR_TIMEOUT: nothing more queued
            if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                continue
            labels = self._labels_of(data.device)
            self.xid_last[labels] = int(data.eventData)
            self.xid_count[(*labels, str(int(data.eventData)))] += 1
        return ([("DCGM_FI_DEV_XID_ERRORS", labels, float(self.xid_last.get(labels, 0)))
                 for labels in self._boards()]
                + [("gpuhpc_gpu_xid_errors_total", key, float(n)) for key, n in sorted(self.xid_count.items())])

    def _boards(self) -> list[tuple[str, ...]]:
        nv = self.nvml
        return [self._labels_of(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]

    def _labels_of(self, h) -> tuple[str, ...]:
        nv = self.nvml
        uuid = _s(self._call(nv.nvmlDeviceGetUUID, h) or "")
        index = self._call(nv.nvmlDeviceGetIndex, h)
        minor = self._call(nv.nvmlDeviceGetMinorNumber, h) if hasattr(nv, "nvmlDeviceGetMinorNumber") else None
        i = index if index is not None else 0
        return (self.node, str(i), uuid, f"nvidia{minor if minor is not None else i}",
                _s(self._call(nv.nvmlDeviceGetName, h) or ""), self.node)

    def _board(self, h, model: str, labels: tuple[str, ...] | None = None) -> list:
        """Whole-board values: power, temperature, PCIe, NVLink. A GPU in MIG mode reports them
        with empty ``gpu``/``mig`` labels (several jobs share the board)."""
        nv = self.nvml
        labels = labels or (self.node, "", "", _s(self._call(nv.nvmlDeviceGetUUID, h) or ""), model)
        out = []
        p = self._call(nv.nvmlDeviceGetPowerUsage, h)
        if p is not None:
            out.append(("gpuhpc_gpu_power_watts", labels, p / 1000.0))
        t = self._call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if t is not None:
            out.append(("gpuhpc_gpu_temperature_celsius", labels, float(t)))
        for metric, counter in (("gpuhpc_gpu_pcie_tx_bytes_per_second", nv.NVML_PCIE_UTIL_TX_BYTES),
                                ("gpuhpc_gpu_pcie_rx_bytes_per_second", nv.NVML_PCIE_UTIL_RX_BYTES)):
            v = self._call(nv.nvmlDeviceGetPcieThroughput, h, counter)
            if v is not None:
                out.append((metric, labels, v * 1024.0))        # NVML: KB/s
        fields = self._call(nv.nvmlDeviceGetFieldValues, h, [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                                            nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])
        for metric, fv in zip(("gpuhpc_gpu_nvlink_tx_bytes_total", "gpuhpc_gpu_nvlink_rx_bytes_total"), fields or []):
            if fv.nvmlReturn == 0:
                out.append((metric, labels, fv.value.ullVal * 1024.0))   # KiB counter
        return out

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, UnknownMetricFamily

        try:
            samples = self.samples()
        except self.nvml.NVMLError:
            self.errors += 1
            samples = []
        families = {}
        for name, (kind, help_, labels) in METRICS.items():
            if name.startswith("DCGM_"):
                # dcgm-exporter's exact names: its counters have no _total (untyped here)
                cls = UnknownMetricFamily if kind == "counter" else GaugeMetricFamily
                families[name] = cls(name, help_, labels=list(labels))
                continue
            if not name.startswith("gpuhpc_gpu_"):
                continue
            cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            base = name[: -len("_total")] if kind == "counter" else name
            families[name] = cls(base, help_, labels=list(labels))
        for name, labels, value in samples:
            families[name].add_metric(list(labels), value)
        families["gpuhpc_gpu_exporter_errors_total"].add_metric([self.node], float(self.errors))
        yield from families.values()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.monitoring.gpu_exporter")
    ap.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0])
    ap.add_argument("--port", type=int, default=9411)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--jobmap-dir", default=None, help=f"default ${jobmap.ENV_DIR} or {jobmap.DEFAULT_DIR}")
    args = ap.parse_args(argv)
    from gpuhpc.monitoring import serve

    serve(GpuCollector(args.node, jobmap_dir=args.jobmap_dir), port=args.port, addr=args.addr,
          what=f"GPU ({args.node})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU exporter: per-GPU and per-MIG-instance metrics from NVML, and one ``gpuhpc_gpu_job_info``
series per device a Slurm job holds, with the job and user (:mod:`gpuhpc.monitoring.jobmap`);
the other series carry no job labels (queries join them in: ``JOB_JOIN``). A prometheus_client
custom collector (every scrape asks NVML afresh; nothing runs between scrapes).

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

from gpuhpc.monitoring import GPU_LABELS, METRICS
from gpuhpc.monitoring import jobmap

_MIG_NAME = re.compile(r"MIG\s+(\S+)")


def load_nvml():
    """pynvml, or the pynvml-compatible module ``GPUHPC_NVML_MODULE`` names (a test stand-in)."""
    name = os.environ.get("GPUHPC_NVML_MODULE")
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

    # one sample: (metric name, label values, value)
    def samples(self, jobs: dict[int, dict] | None = None) -> list[tuple[str, tuple[str, ...], float]]:
        """Every sample of one scrape; ``jobs`` ({GRES index: {"job_id", "user"}}) instead of the
        node's job map (bench/monitoring_cardinality.py)."""
        nv = self.nvml
        nv.nvmlInit()
        try:
            jobs = jobmap.read(self.node, self.jobmap_dir) if jobs is None else jobs
            out: list[tuple[str, tuple[str, ...], float]] = []
            gres = 0
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                model = _s(nv.nvmlDeviceGetName(h))
                migs = self._migs(h)
                if migs:
                    for mh in migs:
                        name = _s(nv.nvmlDeviceGetName(mh))
                        m = _MIG_NAME.search(name)
                        out += self._device(mh, gres, m.group(1) if m else "mig", model, jobs.get(gres), is_mig=True)
                        gres += 1
                    # whole-board values (power, temperature, links) once, on the physical GPU
                    out += self._board(h, model)
                else:
                    out += self._device(h, gres, "", model, jobs.get(gres), is_mig=False)
                    gres += 1
            return out
        finally:
            nv.nvmlShutdown()

    def _call(self, fn, *args):
        nv = self.nvml
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) != getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
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

    def _device(self, h, gres: int, profile: str, model: str, job: dict | None, *, is_mig: bool) -> list:
        """A job-assignable device (a GPU, or a MIG instance): ``gpu`` is its GRES index."""
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
        mem = self._call(nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out.append(("gpuhpc_gpu_memory_used_bytes", labels, float(mem.used)))
            out.append(("gpuhpc_gpu_memory_total_bytes", labels, float(mem.total)))
        if not is_mig:
            out += self._board(h, model, labels)
        return out

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
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            samples = self.samples()
        except self.nvml.NVMLError:
            self.errors += 1
            samples = []
        families = {}
        for name, (kind, help_, labels) in METRICS.items():
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

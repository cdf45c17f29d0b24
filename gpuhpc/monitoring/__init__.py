"""Monitoring: Prometheus exporters for GPUs (NVML, :mod:`.gpu_exporter`) and Slurm
(:mod:`.slurm_exporter`), the Prolog/Epilog job mapping (:mod:`.jobmap`), the metric
catalogue dashboards and rules are checked against (:data:`METRICS`), and per-job
efficiency summaries (:mod:`.efficiency`).

Only this package imports ``prometheus_client``; only :mod:`.gpu_exporter` imports ``pynvml``
(or the pynvml-compatible module ``GPUHPC_NVML_MODULE`` names: the tests' NVML stand-in).
"""
from __future__ import annotations

# name -> (type, help, labels): everything the exporters export. A test checks the exporters
# against it, and every dashboard panel and rule against it.
# The per-GPU series carry no job labels: a job's id and user are on one gpuhpc_gpu_job_info
# series per held device, and queries join them in (JOB_JOIN), so the per-GPU series are the same
# whatever job runs (docs/monitoring.md, "Cardinality"; bench/monitoring_cardinality.py).
GPU_LABELS = ("node", "gpu", "mig", "uuid", "model")
JOB_INFO_LABELS = ("node", "gpu", "mig", "uuid", "job_id", "user")
# `<per-GPU series> * on(node, gpu) group_left(job_id, user) <JOB_INFO>`: the series of the devices
# a job holds, with the job's labels (append a selector to gpuhpc_gpu_job_info to pick jobs)
JOB_INFO = "gpuhpc_gpu_job_info"
JOB_JOIN = "* on(node, gpu) group_left(job_id, user)"
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "gpuhpc_gpu_info": ("gauge", "One per GPU or MIG instance (value 1).", GPU_LABELS),
    "gpuhpc_gpu_job_info": ("gauge", "One per GPU or MIG instance a Slurm job holds (value 1): its job id and user.",
                            JOB_INFO_LABELS),
    "gpuhpc_gpu_utilization_percent": ("gauge", "GPU (or MIG instance) utilisation, %.", GPU_LABELS),
    "gpuhpc_gpu_memory_utilization_percent": ("gauge", "Memory controller utilisation, %.", GPU_LABELS),
    "gpuhpc_gpu_memory_used_bytes": ("gauge", "Frame buffer memory used.", GPU_LABELS),
    "gpuhpc_gpu_memory_total_bytes": ("gauge", "Frame buffer memory size.", GPU_LABELS),
    "gpuhpc_gpu_power_watts": ("gauge", "Board power draw (whole GPU).", GPU_LABELS),
    "gpuhpc_gpu_temperature_celsius": ("gauge", "GPU core temperature.", GPU_LABELS),
    "gpuhpc_gpu_pcie_tx_bytes_per_second": ("gauge", "PCIe transmit throughput.", GPU_LABELS),
    "gpuhpc_gpu_pcie_rx_bytes_per_second": ("gauge", "PCIe receive throughput.", GPU_LABELS),
    "gpuhpc_gpu_nvlink_tx_bytes_total": ("counter", "NVLink data transmitted, all links.", GPU_LABELS),
    "gpuhpc_gpu_nvlink_rx_bytes_total": ("counter", "NVLink data received, all links.", GPU_LABELS),
    "gpuhpc_gpu_exporter_errors_total": ("counter", "NVML calls that failed other than 'not supported'.", ("node",)),
    "gpuhpc_slurm_nodes": ("gauge", "Nodes of the cluster by state (each node once, whatever its partitions).",
                           ("state",)),
    "gpuhpc_slurm_gpus": ("gauge", "GPUs of the cluster by type and state (alloc, idle, drained, down; each node once).",
                          ("type", "state")),
    "gpuhpc_slurm_partition_nodes": ("gauge", "Nodes of a partition by state.", ("partition", "state")),
    "gpuhpc_slurm_partition_gpus": ("gauge", "GPUs of a partition by type and state (alloc, idle, drained, down).",
                                    ("partition", "type", "state")),
    "gpuhpc_slurm_partition_pending_jobs": ("gauge", "Pending jobs per partition.", ("partition",)),
    "gpuhpc_slurm_partition_pending_gpus": ("gauge", "GPUs pending jobs ask for, by type (0 for each GPU type a "
                                            "partition has).", ("partition", "type")),
    "gpuhpc_slurm_job_gpus": ("gauge", "GPUs a running job holds, by type.", ("job_id", "user", "account",
                                                                           "partition", "type")),
    "gpuhpc_slurm_job_cpu_used_seconds": ("gauge", "CPU time a running job has used so far (sstat, all steps).",
                                          ("job_id", "user", "account", "partition")),
    "gpuhpc_slurm_job_memory_max_rss_bytes": ("gauge", "Largest resident set of a running job's steps (sstat).",
                                              ("job_id", "user", "account", "partition")),
    "gpuhpc_slurm_scrape_ok": ("gauge", "1 when the last Slurm scrape worked.", ()),
}
# recording rules (gpuhpc/monitoring/prometheus/rules.yml) define these; dashboards may use them too
RECORDED = {
    "gpuhpc:job_gpu_utilization_percent:avg",
    "gpuhpc:gpu_idle_held:bool",
    "gpuhpc:partition_gpu_allocated_ratio",
}


def serve(collector, *, port: int, addr: str, what: str) -> None:
    """Serve ``collector`` on ``addr:port`` (``/metrics``) until killed: the exporters' main loop."""
    import sys
    import time

    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(collector)
    start_http_server(port, addr=addr, registry=registry)
    sys.stderr.write(f"gpuhpc {what} exporter on {addr}:{port}\n")
    while True:
        time.sleep(3600)

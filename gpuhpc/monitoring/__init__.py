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
# dcgm-exporter's labels, on the DCGM_* series (a MIG instance's carry the GPU instance too)
DCGM_LABELS = ("node", "gpu", "UUID", "device", "modelName", "Hostname")
DCGM_MIG_LABELS = (*DCGM_LABELS, "GPU_I_PROFILE", "GPU_I_ID")
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
    "gpuhpc_gpu_xid_errors_total": ("counter", "XID errors NVML reported since the exporter started, by XID code.",
                                    (*DCGM_LABELS, "xid")),
    **{name: (kind, help_, DCGM_MIG_LABELS if name.startswith("DCGM_FI_PROF_") else DCGM_LABELS)
       for name, (kind, help_) in {
        # dcgm-exporter's names (its etc/default-counters.csv, and the ECC, retired-page and NVLink
        # error fields it lists commented out), so dashboards made for it work. Labels: dcgm-exporter's
        # (gpu = the board's NVML index, UUID, device = nvidiaN, modelName, Hostname; a MIG instance's
        # also GPU_I_PROFILE and GPU_I_ID) and gpuhpc's node. dcgm-exporter's counters have no
        # _total suffix: exposed as untyped, under its exact names.
        "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilisation (in %)."),
        "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilisation (in %)."),
        "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
        "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
        "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
        "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
        "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit (in W)."),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", "Total energy consumption since the driver loaded (in mJ)."),
        "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
        "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("gauge", "Current clock event (throttle) reasons, NVML's bitmask "
                                               "(0x1 idle, 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal, "
                                               "0x40 HW thermal, 0x80 HW power brake, ...)."),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
        "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error NVML reported since the exporter started "
                                            "(0: none)."),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Single-bit (corrected) volatile ECC errors."),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Double-bit (uncorrected) volatile ECC errors."),
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Single-bit (corrected) persistent ECC errors."),
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Double-bit (uncorrected) persistent ECC errors."),
        "DCGM_FI_DEV_RETIRED_SBE": ("counter", "Pages retired for multiple single-bit errors."),
        "DCGM_FI_DEV_RETIRED_DBE": ("counter", "Pages retired for double-bit errors."),
        "DCGM_FI_DEV_RETIRED_PENDING": ("gauge", "1 when pages are pending retirement (a reset retires them)."),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Rows remapped for correctable errors."),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Rows remapped for uncorrectable errors."),
        "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "1 when a row remap waits for a GPU reset."),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "1 when remapping of rows has failed."),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", "NVLink flow-control CRC errors, all links."),
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("counter", "NVLink data CRC errors, all links."),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "NVLink retries, all links."),
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("counter", "NVLink recovery errors, all links."),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine was active, per MIG "
                                                   "instance (NVML GPM, Hopper and later; between two scrapes)."),
    }.items()},
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
    # the ledger's commands (cron) through node_exporter's textfile collector (gpuhpc.ledger.textfile)
    "gpuhpc_ledger_ingest_success_timestamp_seconds": ("gauge", "When gpuhpc ledger ingest last succeeded.", ()),
    "gpuhpc_ledger_sync_success_timestamp_seconds": ("gauge", "When gpuhpc ledger sync-slurm last succeeded.", ()),
    "gpuhpc_ledger_drift": ("gauge", "Differences between the ledger and Slurm the last gpuhpc ledger check found, "
                                     "by kind.", ("kind",)),
    "gpuhpc_ledger_drift_associations": ("gauge", "Associations whose limits or usage in Slurm differ from the "
                                                  "ledger's (the last gpuhpc ledger check).", ()),
    "gpuhpc_ledger_check_timestamp_seconds": ("gauge", "When gpuhpc ledger check last ran.", ()),
    "gpuhpc_ledger_rollover_timestamp_seconds": ("gauge", "When gpuhpc ledger rollover last ran.", ()),
    "gpuhpc_ledger_rollover_plan_timestamp_seconds": ("gauge", "When sync-slurm wrote the reset plan the rollover "
                                                               "read.", ()),
    "gpuhpc_ledger_rollover_next_reset_timestamp_seconds": ("gauge", "The next period start the reset plan has.", ()),
    "gpuhpc_ledger_rollover_resets": ("gauge", "Associations the last rollover reset.", ()),
    "gpuhpc_ledger_rollover_failures": ("gauge", "Resets the last rollover could not make.", ()),
    "gpuhpc_ledger_alerts_timestamp_seconds": ("gauge", "When gpuhpc ledger alerts last ran through.", ()),
    "gpuhpc_ledger_alerts_sent": ("gauge", "Budget alerts the last gpuhpc ledger alerts sent.", ()),
    "gpuhpc_ledger_alerts_failed": ("gauge", "Budget alerts the last gpuhpc ledger alerts could not send.", ()),
}
# recording rules (gpuhpc/monitoring/prometheus/rules.yml) define these; dashboards may use them too
RECORDED = {
    "gpuhpc:job_gpu_utilization_percent:avg",
    "gpuhpc:gpu_idle_held:bool",
    "gpuhpc:partition_gpu_allocated_ratio",
    "gpuhpc:job_idle_gpu_samples:sum5m",
    "gpuhpc:ledger_ingest_age_seconds",
    "gpuhpc:ledger_sync_age_seconds",
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

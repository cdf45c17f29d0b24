#!/usr/bin/env python3
"""Benchmark: Prometheus series from the GPU exporters of a 500-node × 8-GPU cluster running a day
of 1-minute sweep trials (one GPU each), before and after the job labels moved to one
``gpuhpc_gpu_job_info`` series per held GPU (issue 35.2).

The samples come from the exporter's own code (``GpuCollector.samples``, on the NVML stand-in's
8× H100 state from tests/fixtures, with the minute's job map passed in). "After" is what it
exports; "before" is the same samples labelled the old way: ``job_id`` and ``user`` on every
per-GPU series (empty on free GPUs), no job_info series.

- series per scrape: one scrape of all the nodes (every node through the exporter).
- new series per hour: series identities Prometheus has not seen before, per hour of the day
  (what the head block grows by: churn). Every trial is scraped at least once, so the scrape
  interval does not change the figure. The day is run through the exporter for ``--sample``
  nodes and scaled to ``--nodes`` (nodes differ only in their ``node`` label).

Prints the figures and the before/after ratios; asserts nothing.

    .venv/bin/python bench/monitoring_cardinality.py [--nodes 500] [--hours 24] [--sample 4]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))          # tests/standins: the NVML stand-in

from gpuhpc.monitoring.gpu_exporter import GpuCollector  # noqa: E402
from standins import nvml_standin  # noqa: E402

GPUS = 8
JOB_LABELLED = ("gpuhpc_gpu_info", "gpuhpc_gpu_utilization_percent", "gpuhpc_gpu_memory_utilization_percent",
                "gpuhpc_gpu_memory_used_bytes", "gpuhpc_gpu_memory_total_bytes", "gpuhpc_gpu_power_watts",
                "gpuhpc_gpu_temperature_celsius", "gpuhpc_gpu_pcie_tx_bytes_per_second",
                "gpuhpc_gpu_pcie_rx_bytes_per_second", "gpuhpc_gpu_nvlink_tx_bytes_total",
                "gpuhpc_gpu_nvlink_rx_bytes_total")


def after(samples) -> set[tuple]:
    """Series identities of one scrape as exported now."""
    return {(name, labels) for name, labels, _ in samples}


def before(samples) -> set[tuple]:
    """The same scrape the old way: job_id and user on every per-GPU series, no job_info."""
    jobs = {(labels[0], labels[1]): (labels[4], labels[5]) for name, labels, _ in samples
            if name == "gpuhpc_gpu_job_info"}
    out = set()
    for name, labels, _ in samples:
        if name == "gpuhpc_gpu_job_info":
            continue
        if name in JOB_LABELLED:
            labels = labels + jobs.get((labels[0], labels[1]), ("", ""))
        out.add((name, labels))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--sample", type=int, default=4, help="nodes run through the whole day (then scaled)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpuhpc-cardinality-")
    state = nvml_standin.local_cluster_states(str(REPO / "tests" / "fixtures"))["gpu-node1"]
    nvml_standin.write_state(f"{tmp}/node.json", state)
    os.environ[nvml_standin.ENV] = f"{tmp}/node.json"
    names = [f"gpu{i:04d}" for i in range(args.nodes)]
    collectors = {n: GpuCollector(n, nvml=nvml_standin, jobmap_dir=f"{tmp}/jobmap") for n in names}
    job = iter(range(10**6, 10**9))

    def minute_jobs() -> dict[int, dict]:       # every GPU starts a new 1-minute trial
        return {g: {"job_id": str(next(job)), "user": f"user{g % 3}"} for g in range(GPUS)}

    # one scrape of every node
    scrape = [collectors[n].samples(minute_jobs()) for n in names]
    per_scrape = {"before": sum(len(before(s)) for s in scrape), "after": sum(len(after(s)) for s in scrape)}

    # the day, through the exporter for the sampled nodes
    sample = names[: max(1, min(args.sample, args.nodes))]
    seen: dict[str, set] = {"before": set(), "after": set()}
    hourly: dict[str, list[int]] = {"before": [], "after": []}
    for _hour in range(args.hours):
        new = {"before": 0, "after": 0}
        for _minute in range(60):
            for n in sample:
                s = collectors[n].samples(minute_jobs())
                for way, ids in (("before", before(s)), ("after", after(s))):
                    fresh = ids - seen[way]
                    new[way] += len(fresh)
                    seen[way] |= fresh
        for way in hourly:
            hourly[way].append(new[way] * args.nodes // len(sample))
    steady = {way: (sum(v[1:]) // max(1, len(v) - 1)) if len(v) > 1 else v[0] for way, v in hourly.items()}
    day = {way: sum(v) for way, v in hourly.items()}

    print(f"GPU exporter series, {args.nodes} nodes x {GPUS} GPUs, a new 1-GPU trial on every GPU every minute, "
          f"{args.hours} h ({len(sample)} nodes run through the day, scaled)")
    print(f"{'':34}{'before (job labels)':>22}{'after (job_info)':>20}{'ratio':>10}")
    rows = (("series per scrape", per_scrape), ("new series, first hour", {w: v[0] for w, v in hourly.items()}),
            ("new series per hour, after that", steady), (f"new series in {args.hours} h", day))
    for label, v in rows:
        ratio = v["before"] / v["after"] if v["after"] else float("inf")
        print(f"{label:34}{v['before']:>22,}{v['after']:>20,}{ratio:>9.1f}x")
    per_gpu = {w: len({i for i in seen[w] if i[0] != "gpuhpc_gpu_job_info"}) // (len(sample) * GPUS) for w in seen}
    print(f"per-GPU series (job_info aside) over the day, per GPU: before {per_gpu['before']:,}, "
          f"after {per_gpu['after']:,} (constant in the number of jobs)")


if __name__ == "__main__":
    main()

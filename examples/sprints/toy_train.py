#!/usr/bin/env python3
"""A stand-in for a training job for `gpuhpc sprint` on a CPU cluster: it runs ~1 s and reports
the throughput (and GPU utilisation) a model of one data-parallel step would have:

* compute per GPU: 2 ms + 0.05 ms per sample; an input pipeline of 2,500 samples/s per GPU;
* all-reduce: 3 ms x log2(GPUs per node) inside a node, 10 ms per extra node under one leaf
  switch, 4x that when the nodes span several leaves.

In a Slurm job the shape is the job's own: its nodes (``SLURM_JOB_NUM_NODES``), GPUs per node
(``SLURM_GPUS_ON_NODE``) and the leaf switches its nodes really span (``scontrol show topology``);
the flags are the fallback outside Slurm. Only rank 0 reports (``SLURM_PROCID``), with the shape it
saw (``alloc_nodes``, ``alloc_gpus_per_node``, ``alloc_leaves``).
Deterministic, so the sprint's recommendation is known in advance (docs/sprints.md)."""
from __future__ import annotations

import argparse
import math
import os
import time

import gpuhpc


def model(batch_size: int, gpus_per_node: int, nodes: int, placement: str = "one-leaf",
          leaves: int | None = None) -> tuple[float, float]:
    """(samples/s of the whole job, GPU utilisation %); ``leaves``: the leaf switches the nodes
    span (default: all ``nodes`` when spread, else 1)."""
    if leaves is None:
        leaves = nodes if placement == "spread" else 1
    compute = 0.002 + 0.00005 * batch_size
    step = max(compute, batch_size / 2500.0)
    comm = 0.003 * math.log2(gpus_per_node) if gpus_per_node > 1 else 0.0
    if nodes > 1:
        comm += 0.010 * (nodes - 1) * (4 if leaves > 1 else 1)
    step += comm
    return nodes * gpus_per_node * batch_size / step, 100.0 * compute / step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--placement", choices=["one-leaf", "spread", "one-nvlink"], default="one-leaf")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--reports", type=int, default=1,
                    help="reports of the throughput: the first a slow warm-up (a fifth), then the model's "
                         "within +-2 %% (median: the model's exactly)")
    a = ap.parse_args()
    nodes, gpus, leaves = allocation(a.nodes, a.gpus_per_node, a.placement)
    thr, util = model(a.batch_size, gpus, nodes, leaves=leaves)
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:           # "train"
        time.sleep(0.05)
    if os.environ.get("SLURM_PROCID", "0") == "0":
        # --reports N: a warm-up report (a fifth of the throughput), then N - 2 alternating -2 %/+2 %,
        # then the model's value with the rest (an even N: the median after the warm-up is the model's)
        early = ([0.2] + [0.98, 1.02] * (a.reports // 2))[:a.reports - 1] if a.reports > 1 else []
        for step, f in enumerate(early):
            gpuhpc.report(step=step, samples_per_s=thr * f)
        gpuhpc.report(samples_per_s=thr, gpu_util_percent=util, alloc_nodes=nodes, alloc_gpus_per_node=gpus,
                      alloc_leaves=leaves)
        print(f"{nodes} node(s) x {gpus} GPU(s) on {leaves} leaf switch(es): {thr:.1f} samples/s, "
              f"GPU util {util:.0f}%")
    return 0


def allocation(nodes: int, gpus: int, placement: str) -> tuple[int, int, int]:
    """(nodes, GPUs per node, leaf switches spanned): the Slurm job's own, else the flags'."""
    if "SLURM_JOB_NUM_NODES" not in os.environ:
        return nodes, gpus, (nodes if placement == "spread" else 1)
    nodes = int(os.environ["SLURM_JOB_NUM_NODES"])
    gpus = int(os.environ.get("SLURM_GPUS_ON_NODE") or 0) or gpus
    leaves = 1
    if nodes > 1:
        from gpuhpc.hostlist import expand
        from gpuhpc.slurm.client import SlurmClient
        from gpuhpc.topology.placement import leaf_nodes, placement as placed

        leaves = len(placed(leaf_nodes(SlurmClient().topology()), expand(os.environ["SLURM_JOB_NODELIST"])).leaves)
    return nodes, gpus, max(1, leaves)


if __name__ == "__main__":
    raise SystemExit(main())

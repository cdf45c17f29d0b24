#!/usr/bin/env python3
"""A stand-in for a training job for `gpuhpc sprint` on a CPU cluster: it runs ~1 s and reports
the throughput (and GPU utilisation) a model of one data-parallel step would have:

* compute per GPU: 2 ms + 0.05 ms per sample; an input pipeline of 2,500 samples/s per GPU;
* all-reduce: 3 ms x log2(GPUs per node) inside a node, 10 ms per extra node under one leaf
  switch, 4x that when the nodes are spread across leaves.

Deterministic, so the sprint's recommendation is known in advance (docs/sprints.md)."""
from __future__ import annotations

import argparse
import math
import time

import gpuhpc


def model(batch_size: int, gpus_per_node: int, nodes: int, placement: str) -> tuple[float, float]:
    """(samples/s of the whole job, GPU utilisation %)."""
    compute = 0.002 + 0.00005 * batch_size
    step = max(compute, batch_size / 2500.0)
    comm = 0.003 * math.log2(gpus_per_node) if gpus_per_node > 1 else 0.0
    if nodes > 1:
        comm += 0.010 * (nodes - 1) * (4 if placement == "spread" else 1)
    step += comm
    return nodes * gpus_per_node * batch_size / step, 100.0 * compute / step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--gpus-per-node", type=int, default=1)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--placement", choices=["one-leaf", "spread"], default="one-leaf")
    ap.add_argument("--seconds", type=float, default=1.0)
    a = ap.parse_args()
    thr, util = model(a.batch_size, a.gpus_per_node, a.nodes, a.placement)
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:           # "train"
        time.sleep(0.05)
    gpuhpc.report(samples_per_s=thr, gpu_util_percent=util)
    print(f"{thr:.1f} samples/s, GPU util {util:.0f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Slurm exporter: for the cluster (each node once) and per partition, nodes by state and GPUs
allocated/idle/drained/down by type; per partition, pending jobs and the GPUs they ask for; per running job, the GPUs it holds, the CPU time it has
used and its largest RSS. Asked through :class:`~gpuhpc.slurm.client.SlurmClient` on every
scrape (``scontrol show node``, one ``squeue``, one ``sstat`` for the running jobs);
:func:`samples` is pure, for the tests.

    python -m gpuhpc.monitoring.slurm_exporter --port 9410 [--addr 127.0.0.1]
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from gpuhpc.monitoring import METRICS
from gpuhpc.slurm.state import node_state


def tres_gpus(tres_per_node: str) -> dict[str, int]:
    """squeue's ``%b`` (``gres:gpu:h100:8``, ``gres/gpu:2``, ``N/A``) -> GPUs per node by type."""
    from gpuhpc.slurm.parsers import parse_gres

    items = []
    for item in (tres_per_node or "").split(","):
        item = item.strip()
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        items.append(item.replace("=", ":"))
    return parse_gres(",".join(i for i in items if i.startswith("gpu")))


def samples(nodes, queue, usage=None) -> list[tuple[str, tuple[str, ...], float]]:
    """(metric, label values, value) from ``SlurmClient.nodes()``, ``SlurmClient.queue()`` and
    the running jobs' sstat usage (:func:`gpuhpc.slurm.usage.job_usage`)."""
    usage = usage or {}
    node_counts: dict[tuple[str, str], int] = defaultdict(int)
    gpus: dict[tuple[str, str, str], int] = defaultdict(int)
    cluster_nodes: dict[str, int] = defaultdict(int)
    cluster_gpus: dict[tuple[str, str], int] = defaultdict(int)
    partitions: set[str] = set()
    for n in nodes:
        st = node_state(n.state)
        cluster_nodes[st] += 1
        for t, total in n.gpus_total.items():
            alloc = min(n.gpus_alloc.get(t, 0), total)
            cluster_gpus[(t, "alloc")] += alloc
            cluster_gpus[(t, "drained" if st == "drain" else "down" if st == "down" else "idle")] += total - alloc
            for s in ("alloc", "idle", "drained", "down"):
                cluster_gpus.setdefault((t, s), 0)
        for p in n.partitions:
            partitions.add(p)
            node_counts[(p, st)] += 1
            for t, total in n.gpus_total.items():
                alloc = min(n.gpus_alloc.get(t, 0), total)
                gpus[(p, t, "alloc")] += alloc
                rest = "drained" if st == "drain" else "down" if st == "down" else "idle"
                gpus[(p, t, rest)] += total - alloc
                for s in ("alloc", "idle", "drained", "down"):
                    gpus.setdefault((p, t, s), 0)
    pending_jobs: dict[str, int] = defaultdict(int)
    pending_gpus: dict[tuple[str, str], int] = defaultdict(int)
    out: list[tuple[str, tuple[str, ...], float]] = []
    for row in queue:
        state = row.state.raw.split()[0] if row.state.raw else ""
        per_node = tres_gpus(row.tres_per_node)
        if state == "PENDING":
            for p in row.partition.split(","):
                pending_jobs[p] += 1
                for t, k in per_node.items():
                    pending_gpus[(p, t)] += k * max(1, row.nodes)
        elif state == "RUNNING":
            u = usage.get(row.job_id)
            if u is not None:
                labels = (row.job_id, row.user, row.account, row.partition)
                out.append(("gpuhpc_slurm_job_cpu_used_seconds", labels, u.cpu_seconds))
                out.append(("gpuhpc_slurm_job_memory_max_rss_bytes", labels, u.max_rss_bytes))
            for t, k in per_node.items():
                out.append(("gpuhpc_slurm_job_gpus", (row.job_id, row.user, row.account, row.partition, t),
                            float(k * max(1, row.nodes))))
    for st, k in sorted(cluster_nodes.items()):
        out.append(("gpuhpc_slurm_nodes", (st,), float(k)))
    for (t, st), k in sorted(cluster_gpus.items()):
        out.append(("gpuhpc_slurm_gpus", (t, st), float(k)))
    for p, t, _ in gpus:                    # a GPU type nothing pends for: 0, not no series
        pending_gpus.setdefault((p, t), 0)
    for (p, st), k in sorted(node_counts.items()):
        out.append(("gpuhpc_slurm_partition_nodes", (p, st), float(k)))
    for (p, t, st), k in sorted(gpus.items()):
        out.append(("gpuhpc_slurm_partition_gpus", (p, t, st), float(k)))
    for p in sorted(partitions | set(pending_jobs)):
        out.append(("gpuhpc_slurm_partition_pending_jobs", (p,), float(pending_jobs.get(p, 0))))
    for (p, t), k in sorted(pending_gpus.items()):
        out.append(("gpuhpc_slurm_partition_pending_gpus", (p, t), float(k)))
    return out


class SlurmCollector:
    """prometheus_client custom collector over a SlurmClient."""

    def __init__(self, client=None) -> None:
        if client is None:
            from gpuhpc.slurm.client import SlurmClient

            client = SlurmClient(timeout=20)
        self.client = client

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from gpuhpc.errors import GpuhpcError

        from gpuhpc.slurm.usage import job_usage

        try:
            queue = self.client.queue()
            running = [r.job_id for r in queue if r.state.raw.startswith("RUNNING") and "_" not in r.job_id]
            data, ok = samples(self.client.nodes(), queue, job_usage(self.client, running)), 1.0
        except GpuhpcError:
            data, ok = [], 0.0
        fams = {name: GaugeMetricFamily(name, help_, labels=list(labels))
                for name, (_, help_, labels) in METRICS.items() if name.startswith("gpuhpc_slurm_")}
        for name, labels, value in data:
            fams[name].add_metric(list(labels), value)
        fams["gpuhpc_slurm_scrape_ok"].add_metric([], ok)
        yield from fams.values()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.monitoring.slurm_exporter")
    ap.add_argument("--port", type=int, default=9410)
    ap.add_argument("--addr", default="127.0.0.1")
    args = ap.parse_args(argv)
    from gpuhpc.monitoring import serve

    serve(SlurmCollector(), port=args.port, addr=args.addr, what="Slurm")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Slurm exporter: for the cluster (each node once) and per partition, nodes by state and GPUs
allocated/idle/drained/down by type; per partition, pending jobs and the GPUs they ask for; per
running job, the GPUs it holds, the CPU time it has used and its largest RSS.

What a scrape costs slurmctld (a 500-node site has several scrapers: an HA pair of Prometheus,
retries): one look at the cluster (``scontrol show node`` and one ``squeue``) per ``--ttl``
seconds (default 4, below any scrape interval; scrapes inside it reuse that look), never an
``sstat`` per scrape. The running jobs' CPU and memory come from ``sstat --allsteps``, which asks
every slurmd running a step: a background refresh, at most once per ``--usage-interval`` (30 s,
Slurm's default JobAcctGatherFrequency: sstat has nothing fresher), and a scrape serves the last
one. Every Slurm command has a timeout (``--timeout``, 8 s) below Prometheus' default scrape
timeout (10 s): a slow slurmctld makes ``gpuhpc_slurm_scrape_ok`` 0, not a scrape Prometheus gives
up on. :func:`samples` is pure, for the tests; bench/slurm_exporter.py prints the cost against
the per-scrape path at 500 nodes and 5,000 jobs.

    python -m gpuhpc.monitoring.slurm_exporter --port 9410 [--addr 127.0.0.1] [--ttl 4]
        [--usage-interval 30] [--timeout 8]
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
    """prometheus_client custom collector over a SlurmClient: the cluster looked at once per
    ``ttl`` s, the running jobs' sstat usage refreshed at most once per ``usage_interval`` s (in a
    background thread with ``background``; inline otherwise, as the tests want). ``clock``: a
    monotonic clock (the bench's is simulated)."""

    def __init__(self, client=None, *, ttl: float = 4.0, usage_interval: float = 30.0, timeout: float = 8.0,
                 usage_client=None, background: bool = True, clock=None) -> None:
        import threading
        import time

        if client is None:
            from gpuhpc.slurm.client import SlurmClient

            client = SlurmClient(timeout=timeout)
            # sstat fans out to the slurmds: its own, longer timeout, off the scrape's path
            usage_client = usage_client or SlurmClient(timeout=max(timeout, usage_interval))
        self.client = client
        self.usage_client = usage_client or client
        self.ttl, self.usage_interval, self.background = ttl, usage_interval, background
        self.clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._look: tuple[float, list, list] | None = None        # (when, nodes, queue)
        self._running: list[str] = []
        self.usage: dict = {}
        self._usage_at: float | None = None
        self._usage_busy = False
        self._samples: tuple | None = None
        self.looks = 0              # how often slurmctld was asked (nodes + queue)
        self.usage_runs = 0         # how often sstat ran

    def look(self) -> tuple[list, list]:
        """The nodes and the queue, asked at most once per ``ttl`` s (a failure is not kept)."""
        with self._lock:
            now = self.clock()
            if self._look is not None and now - self._look[0] < self.ttl:
                return self._look[1], self._look[2]
            queue = self.client.queue()
            nodes = self.client.nodes()
            self._look = (now, nodes, queue)
            self.looks += 1
            self._running = [r.job_id for r in queue if r.state.raw.startswith("RUNNING") and "_" not in r.job_id]
            return nodes, queue

    def refresh_usage(self) -> None:
        """sstat for the running jobs of the last look (one batch per 200 jobs)."""
        from gpuhpc.errors import GpuhpcError
        from gpuhpc.slurm.usage import job_usage

        try:
            ids = list(self._running)
            self.usage = job_usage(self.usage_client, ids) if ids else {}
            self.usage_runs += 1
        except GpuhpcError:
            pass                    # the last usage stays; the next refresh tries again
        finally:
            self._usage_at = self.clock()
            self._usage_busy = False

    def _usage_due(self) -> None:
        import threading

        with self._lock:
            if self._usage_busy or (self._usage_at is not None
                                    and self.clock() - self._usage_at < self.usage_interval):
                return
            self._usage_busy = True
        if self.background:
            threading.Thread(target=self.refresh_usage, name="gpuhpc-sstat", daemon=True).start()
        else:
            self.refresh_usage()

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        from gpuhpc.errors import GpuhpcError

        try:
            nodes, queue = self.look()
            self._usage_due()
            key = (id(queue), id(self.usage))         # the same look and usage: the same samples
            if self._samples is None or self._samples[0] != key:
                self._samples = (key, samples(nodes, queue, self.usage))
            data, ok = self._samples[1], 1.0
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
    ap.add_argument("--ttl", type=float, default=4.0, help="seconds a look at the cluster serves scrapes "
                    "(keep it below the scrape interval)")
    ap.add_argument("--usage-interval", type=float, default=30.0, help="seconds between sstat refreshes")
    ap.add_argument("--timeout", type=float, default=8.0, help="per Slurm command (below the scrape timeout)")
    args = ap.parse_args(argv)
    from gpuhpc.monitoring import serve

    serve(SlurmCollector(ttl=args.ttl, usage_interval=args.usage_interval, timeout=args.timeout),
          port=args.port, addr=args.addr, what="Slurm")
    return 0


if __name__ == "__main__":
    sys.exit(main())

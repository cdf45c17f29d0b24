"""Cluster-wide views built from SlurmClient reads (no rendering here)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.parsers import NodeInfo, PartitionInfo


@dataclass(frozen=True)
class GpuTypeSummary:
    gpu_type: str
    total: int
    allocated: int
    mig: bool

    @property
    def free(self) -> int:
        return self.total - self.allocated


@dataclass(frozen=True)
class ClusterStatus:
    nodes: list[NodeInfo]
    partitions: list[PartitionInfo]
    gpus: list[GpuTypeSummary] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "nodes": [
                {**asdict(n), "partitions": list(n.partitions), "features": list(n.features),
                 "gpus_free": n.gpus_free}
                for n in self.nodes
            ],
            "gpus": [{**asdict(g), "free": g.free} for g in self.gpus],
            "partitions": [asdict(p) for p in self.partitions],
        }


def is_mig_type(gpu_type: str) -> bool:
    """MIG profiles look like ``1g.10gb`` / ``3g.40gb`` (optionally vendor-prefixed by
    Slurm's autodetect: ``nvidia_h100_80gb_hbm3_1g.10gb``)."""
    import re

    return re.search(r"(^|_)\d+g\.\d+gb$", gpu_type) is not None


def cluster_status(client: SlurmClient | None = None) -> ClusterStatus:
    client = client or SlurmClient()
    nodes = client.nodes()
    partitions = client.partitions()
    totals: dict[str, list[int]] = {}
    for node in nodes:
        for gtype, count in node.gpus_total.items():
            t = totals.setdefault(gtype, [0, 0])
            t[0] += count
            t[1] += node.gpus_alloc.get(gtype, 0)
    gpus = [GpuTypeSummary(k, v[0], v[1], is_mig_type(k)) for k, v in sorted(totals.items())]
    return ClusterStatus(nodes=nodes, partitions=partitions, gpus=gpus)

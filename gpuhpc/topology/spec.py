"""What topology needs from the cluster spec: node names, NVLink domains, compute HCA names.

Read through the typed, validated :class:`~gpuhpc.spec.cluster.ClusterSpec` (the one ``gpuhpc conf
validate`` checks and ``gpuhpc conf render`` renders slurm.conf from), so topology.conf names the
nodes slurm.conf defines, and ``--block-by nvlink`` takes the spec's ``nvlink_domain`` /
``nvlink_domain_size`` / ``nvlink_domains`` node-group fields. Also reads ``host clique-id``
files (``gpuhpc node clique`` on every node) for the NVLink domains a driver reports.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuhpc.errors import UserInputError
from gpuhpc.spec.cluster import ClusterSpec


@dataclass(frozen=True)
class SpecNodes:
    hosts: list[str]               # every node name, in spec order
    domains: dict[str, str]        # node -> NVLink domain (groups that declare one)
    hcas: set[str]                 # compute HCA names (node_groups[*].ib_hcas)


def from_spec(spec: ClusterSpec) -> SpecNodes:
    return SpecNodes([n for _, n in spec.nodes()], spec.nvlink_domains(), spec.ib_hcas())


def load(path: str | Path) -> SpecNodes:
    """Load and validate a cluster spec (exit 2 on what ``gpuhpc conf validate`` rejects)."""
    from gpuhpc.conf.validate import validate
    from gpuhpc.spec.cluster import load_spec

    spec = load_spec(path)
    validate(spec)
    return from_spec(spec)


def read_cliques(path: str | Path) -> dict[str, str]:
    """``host clique-id`` lines (e.g. collected from ``nvidia-smi -q``: ClusterUUID + CliqueId)."""
    out: dict[str, str] = {}
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UserInputError(f"no such file: {p}", field="--cliques") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").replace(":", " ", 1).split()
        if len(parts) < 2:
            raise UserInputError(f"expected 'HOST CLIQUE', got {line!r}", field=f"{p}:{lineno}")
        out[parts[0]] = " ".join(parts[1:])
    return out

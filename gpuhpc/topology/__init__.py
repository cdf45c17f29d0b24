"""Fabric topology: ibnetdiscover parser, rails, Slurm tree/block writers, synthetic dumps.

Typical use::

    from gpuhpc.topology import topology_from_ibnetdiscover
    result = topology_from_ibnetdiscover(text, source="fabric.out", rail="auto")
    print(result.text)          # topology.conf
    for w in result.warnings: ...
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress, expand, natural_key
from gpuhpc.topology.fabric import Fabric, Tree, analyse, build_tree
from gpuhpc.topology.ibnetdiscover import Dump, parse
from gpuhpc.topology.writers import block_conf, block_groups_by_domain, block_groups_by_leaf, tree_conf

__all__ = ["TopologyResult", "topology_from_ibnetdiscover", "parse", "analyse", "build_tree",
           "tree_conf", "block_conf", "compress", "expand", "Dump", "Fabric", "Tree"]


@dataclass
class TopologyResult:
    text: str
    tree: Tree
    fabric: Fabric
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "rails": [{"index": r.index, "label": r.label, "hca_names": sorted(r.names), "hosts": len(r.hosts),
                       "leaves": len(r.leaves), "storage": r.storage,
                       "chosen": any(c.index == r.index for c in self.tree.rails)} for r in self.fabric.rails],
            "switches": [{"name": s.name, "level": s.level, "nodes": compress(s.nodes) if s.nodes else "",
                          "switches": compress(s.children) if s.children else ""} for s in self.tree.switches],
            "hosts": {h: v for h, v in sorted(self.tree.hosts.items())},
            "warnings": self.warnings,
            "topology_conf": self.text,
        }


def topology_from_ibnetdiscover(text: str, *, source: str = "<stdin>", rail: str = "auto",
                                spec_hosts: list[str] | None = None, fmt: str = "tree",
                                block_by: str = "leaf", block_size: int | None = None,
                                domains: dict[str, str] | None = None,
                                compute_hcas: set[str] | None = None) -> TopologyResult:
    """ibnetdiscover text -> topology.conf text plus warnings. Raises UserInputError (exit 2)."""
    if fmt not in ("tree", "block", "spec"):
        raise UserInputError(f"unknown format {fmt!r}", field="--format", hint="tree, block or spec")
    dump = parse(text, source)
    fab = analyse(dump)
    tree = build_tree(fab, rail=rail, spec_hosts=spec_hosts, compute_hcas=compute_hcas)
    warnings = tree.warnings
    chosen = ", ".join(r.label for r in tree.rails) or "-"
    header = f"topology.conf for Slurm topology/{fmt}, from {source} by gpuhpc (rail: {chosen})"
    if fmt == "tree":
        out = tree_conf(tree, header=header)
    elif fmt == "spec":
        from gpuhpc.topology.writers import spec_yaml

        out = spec_yaml(tree, header=f"cluster spec topology from {source} by gpuhpc (rail: {chosen})")
    else:
        if block_by == "leaf":
            groups = block_groups_by_leaf(tree)
        elif block_by == "nvlink":
            if not domains:
                raise UserInputError("no NVLink domains known", field="--block-by",
                                     hint="give --cliques FILE (host clique-id lines), or nvlink_domain, nvlink_domain_size or "
                                          "nvlink_domains on the --spec node groups")
            placed = sorted(tree.hosts)
            groups = block_groups_by_domain(domains, placed if placed else None)
            lost = sorted(set(placed) - set(domains))
            if lost:
                warnings.append(f"{len(lost)} host(s) have no NVLink domain, left out of the blocks: {compress(sorted(lost, key=natural_key))}")
        else:
            raise UserInputError(f"unknown grouping {block_by!r}", field="--block-by", hint="leaf or nvlink")
        out = block_conf(groups, block_size=block_size, header=header, warnings=warnings)
    return TopologyResult(out, tree, fab, warnings)

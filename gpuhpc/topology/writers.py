"""topology.conf writers: topology/tree (``SwitchName=``) and topology/block (``BlockName=``)."""
from __future__ import annotations

from collections.abc import Mapping

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress, compress_terms, natural_key
from gpuhpc.topology.fabric import Tree


def tree_conf(tree: Tree, *, header: str | None = None) -> str:
    lines = [f"# {h}" for h in (header or "").splitlines() if h]
    if not tree.switches:
        lines.append("# no switches found: nothing for topology/tree to use")
    for sw in tree.switches:
        if sw.level == 0:
            lines.append(f"SwitchName={sw.name} Nodes={compress(sw.nodes)}")
        else:
            lines.append(f"SwitchName={sw.name} Switches={compress(sw.children)}")
    return "\n".join(lines) + "\n"


def block_groups_by_leaf(tree: Tree) -> dict[str, list[str]]:
    return {sw.name: list(sw.nodes) for sw in tree.switches if sw.level == 0}


def block_groups_by_domain(domains: Mapping[str, str], hosts: list[str] | None = None) -> dict[str, list[str]]:
    """host -> NVLink domain (clique) id  ->  domain -> hosts (only ``hosts`` when given)."""
    keep = set(hosts) if hosts is not None else None
    out: dict[str, list[str]] = {}
    for host, dom in domains.items():
        if keep is not None and host not in keep:
            continue
        out.setdefault(str(dom), []).append(host)
    return out


def block_conf(groups: Mapping[str, list[str]], *, block_size: int | None = None,
               header: str | None = None, warnings: list[str] | None = None) -> str:
    """Slurm topology/block: one ``BlockName=`` per group (split into ``block_size`` chunks
    when given) and ``BlockSizes=`` base,2*base,4*base... up to the node count."""
    warn = warnings if warnings is not None else []
    lines = [f"# {h}" for h in (header or "").splitlines() if h]
    if block_size is not None and block_size < 1:
        raise UserInputError("must be >= 1", field="--block-size")
    ordered = sorted(((k, sorted(v, key=natural_key)) for k, v in groups.items() if v),
                     key=lambda kv: natural_key(kv[1][0]))
    if not ordered:
        lines.append("# no nodes: nothing for topology/block to use")
        return "\n".join(lines) + "\n"
    base = block_size or min(len(v) for _, v in ordered)
    blocks: list[tuple[str, list[str]]] = []
    for key, hosts in ordered:
        if block_size:
            chunks = [hosts[i:i + base] for i in range(0, len(hosts), base)]
        else:
            chunks = [hosts]
        for ch in chunks:
            if len(ch) < base:
                warn.append(f"block from {key} has {len(ch)} node(s), fewer than the base block size {base}: "
                            f"Slurm only plans whole blocks ({compress(ch)})")
            blocks.append((key, ch))
    seen: set[str] = set()
    for i, (key, ch) in enumerate(blocks, 1):
        dup = seen.intersection(ch)
        if dup:
            warn.append(f"node(s) {compress(sorted(dup, key=natural_key))} fall in more than one block")
        seen.update(ch)
        lines.append(f"# b{i}: {key}")
        lines.append(f"BlockName=b{i} Nodes={compress(ch)}")
    total = sum(len(ch) for _, ch in blocks)
    sizes = [base]
    while sizes[-1] * 2 <= total:
        sizes.append(sizes[-1] * 2)
    lines.append(f"BlockSizes={','.join(str(s) for s in sizes)}")
    return "\n".join(lines) + "\n"


def spec_yaml(tree: Tree, *, header: str | None = None) -> str:
    """The tree as the cluster spec's ``topology:`` section (gpuhpc.spec ``Topology``), so that
    ``gpuhpc conf render`` writes topology.conf through slurm-conf/topology.conf.j2."""
    import yaml

    switches = []
    for sw in tree.switches:
        if sw.level == 0:
            switches.append({"name": sw.name, "nodes": compress_terms(sorted(sw.nodes, key=natural_key))})
        else:
            switches.append({"name": sw.name, "switches": list(sw.children)})
    lines = [f"# {h}" for h in (header or "").splitlines() if h]
    lines.append("# paste into the cluster spec; `gpuhpc conf render` writes topology.conf from it")
    body = yaml.safe_dump({"topology": {"plugin": "tree", "switches": switches}}, sort_keys=False,
                          default_flow_style=None, width=120)
    return "\n".join(lines) + "\n" + body

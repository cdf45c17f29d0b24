"""Where a job landed on the fabric: pure functions over ``scontrol show topology`` records.

* :func:`leaf_nodes`: leaf switch (level 0) -> its nodes;
* :func:`fewest_leaves`: the fewest leaves that can hold ``n`` of the ``allowed`` nodes (what
  ``sbatch --switches`` should ask for);
* :func:`placement`: the leaves a job's nodes span against that best ("1 leaf (best 1)");
* :func:`nvlink_domains`: node -> NVLink domain, from the node features ``nvl-<domain>`` that
  ``gpuhpc conf render`` gives the nodes of a spec's NVLink domains (every Slurm release; the
  22.05 way to keep a job in one domain is ``--constraint=[nvl-a|nvl-b]``), else from
  topology/block's ``BlockName=`` records (Slurm 23.11+); a placement then also says how many
  domains the job spanned against the fewest that could hold it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuhpc.hostlist import expand, natural_key

#: how long a multi-node job may wait for the fewest leaves (sbatch --switches=N@TIME)
DEFAULT_WAIT = "5:00"
#: the node feature that names a node's NVLink domain (``nvl-<domain>``)
NVLINK_FEATURE = "nvl-"


def nvlink_feature(domain: str) -> str:
    return f"{NVLINK_FEATURE}{domain}"


def nvlink_domains(features: Mapping[str, Iterable[str]],
                   records: Sequence[Mapping[str, str]] = ()) -> dict[str, set[str]]:
    """NVLink domain -> its nodes: from the nodes' ``nvl-<domain>`` features (``features``:
    node -> its features), else from topology/block records (``BlockName=``, ``Nodes=``)."""
    out: dict[str, set[str]] = {}
    for node, feats in features.items():
        for f in feats:
            if f.startswith(NVLINK_FEATURE) and len(f) > len(NVLINK_FEATURE):
                out.setdefault(f[len(NVLINK_FEATURE):], set()).add(node)
    if out:
        return out
    for r in records:
        if r.get("BlockName") and r.get("Nodes"):
            out[r["BlockName"]] = set(expand(r["Nodes"]))
    return out


def leaf_nodes(records: Sequence[Mapping[str, str]]) -> dict[str, set[str]]:
    """``scontrol show topology`` records -> leaf switch name -> its nodes (leaves: Level 0 or
    no Switches=)."""
    out: dict[str, set[str]] = {}
    for r in records:
        name = r.get("SwitchName")
        if not name:
            continue
        level = r.get("Level", "")
        if (level == "0" or (not level and not r.get("Switches"))) and r.get("Nodes"):
            out[name] = set(expand(r["Nodes"]))
    return out


def fewest_leaves(leaves: Mapping[str, set[str]], n: int, allowed: Iterable[str] | None = None) -> int:
    """The fewest leaves that hold ``n`` nodes among ``allowed`` (all when None); 0 when the
    topology says nothing (no leaves, or the nodes are under none)."""
    allow = set(allowed) if allowed is not None else None
    sizes = sorted((len(v if allow is None else v & allow) for v in leaves.values()), reverse=True)
    total = 0
    for i, s in enumerate(sizes, 1):
        total += s
        if s and total >= n:
            return i
    return 0


@dataclass(frozen=True)
class Placement:
    nodes: tuple[str, ...]
    leaves: tuple[str, ...]        # the leaves the nodes span
    best: int                      # the fewest the partition allowed (0: unknown)
    unplaced: tuple[str, ...]      # nodes under no leaf
    domains: tuple[str, ...] = ()  # the NVLink domains the nodes span (none known: empty)
    best_domains: int = 0          # the fewest domains of the partition that hold as many nodes

    @property
    def domain_spread(self) -> bool:
        return bool(self.best_domains) and len(self.domains) > self.best_domains

    @property
    def spread(self) -> bool:
        return bool(self.best) and len(self.leaves) > self.best

    def summary(self) -> str:
        n = len(self.leaves)
        text = f"{n} lea{'f' if n == 1 else 'ves'} (best {self.best or '?'})"
        if self.spread:
            text = f"spread: {text}"
        if self.domains:
            d = len(self.domains)
            dom = (f"{'spread: ' if self.domain_spread else ''}{d} NVLink domain{'' if d == 1 else 's'} "
                   f"(best {self.best_domains or '?'})")
            text = f"{text}; {dom}" if self.leaves or self.best else dom
        return text

    def to_dict(self) -> dict:
        return {"nodes": list(self.nodes), "leaves": list(self.leaves), "best": self.best,
                "spread": self.spread, "unplaced": list(self.unplaced), "nvlink_domains": list(self.domains),
                "best_nvlink_domains": self.best_domains, "nvlink_spread": self.domain_spread,
                "summary": self.summary()}


def placement(leaves: Mapping[str, set[str]], nodes: Iterable[str], allowed: Iterable[str] | None = None,
              domains: Mapping[str, set[str]] | None = None) -> Placement:
    """The leaves (and NVLink ``domains``, when known) ``nodes`` span, against the fewest of
    ``allowed`` (the job's partition) that could hold as many nodes."""
    ns = sorted(set(nodes), key=natural_key)
    spanned = sorted({leaf for leaf, members in leaves.items() if members & set(ns)}, key=natural_key)
    placed = set().union(*leaves.values()) if leaves else set()
    doms = sorted({d for d, members in (domains or {}).items() if members & set(ns)}, key=natural_key)
    return Placement(tuple(ns), tuple(spanned), fewest_leaves(leaves, len(ns), allowed),
                     tuple(n for n in ns if n not in placed), tuple(doms),
                     fewest_leaves(domains, len(ns), allowed) if doms else 0)


def worst_spread(jobs: Iterable[Mapping], leaves: Mapping[str, set[str]],
                 partition_nodes: Mapping[str, Iterable[str]]) -> list[dict]:
    """Multi-node jobs (dicts with job_id, user, account, partition, nodes, gpu_hours) on more
    leaves than their partition needed, the most extra leaves first, then the most GPU-hours."""
    out = []
    for j in jobs:
        nodes = list(j["nodes"])
        if len(nodes) < 2:
            continue
        p = placement(leaves, nodes, partition_nodes.get(j["partition"]))
        if not p.spread:
            continue
        out.append({"job_id": j["job_id"], "user": j.get("user", ""), "account": j.get("account", ""),
                    "partition": j["partition"], "nodes": len(nodes), "leaves": len(p.leaves), "best": p.best,
                    "extra_leaves": len(p.leaves) - p.best, "gpu_hours": round(float(j.get("gpu_hours", 0)), 3),
                    "summary": p.summary()})
    return sorted(out, key=lambda r: (-r["extra_leaves"], -r["gpu_hours"], r["job_id"]))

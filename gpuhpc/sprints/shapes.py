"""Each sprint configuration's Slurm request: the GPUs-per-node, nodes and placement axes as a
sweep's per-trial resources (``resources_by``, :meth:`gpuhpc.sweeps.spec.SweepSpec.resources_for`).
Pure functions over what Slurm says (topology, partition, nodes); no I/O here.

* ``gpus_per_node`` -> ``gpus`` (GPUs per node, of ``resources.gpu_type`` when the file sets one);
* ``nodes`` -> ``nodes``;
* ``placement: one-leaf`` -> ``--switches=1`` and a node list of ``nodes`` nodes under one leaf
  (the leaf with the most nodes of the partition with the GPUs);
* ``placement: spread`` -> ``--switches`` off and a node list with one node under each of
  ``nodes`` different leaves;
* ``placement: one-nvlink`` -> every node in one NVLink domain: the matching-OR constraint
  ``[nvl-a|nvl-b|...]`` over the domains (node features ``nvl-<domain>``, the Slurm 22.05 way)
  that hold ``nodes`` nodes with the GPUs; Slurm picks the domain;
* a one-node configuration is the same request whatever its placement.

A multi-node configuration is pinned to nodes that realise its placement (nodes drained or down
when the sprint starts are left out), so what a trial
measures is the placement it names: ``--switches=N@TIME`` alone lets Slurm take any placement
after ``max_switch_wait`` on a busy cluster. The price: such a trial waits for those nodes.
Without a tree topology (no leaves), one-leaf asks nothing more and spread is refused.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import natural_key
from gpuhpc.slurm.state import node_state

RESOURCE_AXES = ("gpus_per_node", "nodes", "placement")


def _up(node: Any) -> bool:
    """Slurm may start a job there now: not drained or down (a trial pinned to such a node waits
    until someone resumes it). A record without a state (a test's) counts as up."""
    return node_state(getattr(node, "state", "") or "") not in ("drain", "down")


def _gpus(node: Any, gpu_type: str | None) -> int:
    total = getattr(node, "gpus_total", {}) or {}
    return total.get(gpu_type, 0) if gpu_type else sum(total.values())


def spread_nodelist(leaves: Mapping[str, set[str]], n: int, eligible: Iterable[str]) -> str | None:
    """One eligible node under each of ``n`` different leaves (leaves and nodes in natural
    order), as a comma list; None when fewer than ``n`` leaves hold an eligible node."""
    ok = set(eligible)
    picks = []
    for leaf in sorted(leaves, key=natural_key):
        mine = sorted(leaves[leaf] & ok - set(picks), key=natural_key)
        if mine:
            picks.append(mine[0])
        if len(picks) == n:
            return ",".join(picks)
    return None


def shape(config: Mapping[str, Any], *, gpu_type: str | None = None, leaves: Mapping[str, set[str]] | None = None,
          nodes: Sequence[Any] | None = None, partition: str | None = None) -> dict[str, Any]:
    """The resources (a job file's keys) that configuration ``config`` adds to the sprint's own.
    ``leaves``: :func:`gpuhpc.topology.placement.leaf_nodes`; ``nodes``: ``scontrol show node``
    records (``name``, ``partitions``, ``gpus_total``); both are needed only for ``spread``."""
    g, n = int(config.get("gpus_per_node", 0)), int(config.get("nodes", 1))
    out: dict[str, Any] = {"nodes": n}
    if g:
        out["gpus"] = g
    if n < 2:
        return out
    if config.get("placement") == "one-nvlink":
        return {**out, **one_nvlink(n, g, gpu_type=gpu_type, nodes=nodes, partition=partition)}
    spread = config.get("placement") == "spread"
    if not leaves:
        if spread:
            raise UserInputError("placement spread needs a tree topology (scontrol show topology lists no leaf "
                                 "switch)", field="axes.placement", hint="drop spread, or configure the fabric's leaves")
        return out
    pool = [x for x in (nodes or []) if not partition or partition in getattr(x, "partitions", ())]
    eligible = [x.name for x in pool if _gpus(x, gpu_type) >= g and _up(x)] if nodes is not None else \
        [name for v in leaves.values() for name in v]
    picked = spread_nodelist(leaves, n, eligible) if spread else one_leaf_nodelist(leaves, n, eligible)
    if picked is None:
        where = f"partition {partition}" if partition else "the cluster"
        need = f"{n} leaf switches with a node" if spread else f"a leaf switch with {n} nodes"
        out_now = sorted((x.name for x in pool if _gpus(x, gpu_type) >= g and not _up(x)), key=natural_key)
        now = f" (drained or down now: {','.join(out_now)})" if out_now else ""
        raise UserInputError(f"placement {config.get('placement')} over {n} nodes needs {need} of {g} GPU(s) in "
                             f"{where}; there is none{now}", field="axes.placement",
                             hint="fewer nodes or GPUs per node" + (", or resume those nodes" if now else ""))
    out.update({"nodelist": picked, "switches": "off" if spread else "1"})
    return out


def one_nvlink(n: int, g: int, *, gpu_type: str | None, nodes: Sequence[Any] | None,
               partition: str | None) -> dict[str, Any]:
    """``constraint: [nvl-a|nvl-b]``: the NVLink domains with ``n`` nodes of ``g`` GPUs."""
    from gpuhpc.topology.placement import nvlink_domains, nvlink_feature

    pool = [x for x in (nodes or []) if not partition or partition in getattr(x, "partitions", ())]
    domains = nvlink_domains({x.name: getattr(x, "features", ()) for x in pool if _gpus(x, gpu_type) >= g and _up(x)})
    fit = sorted((d for d, members in domains.items() if len(members) >= n), key=natural_key)
    if not fit:
        where = f"partition {partition}" if partition else "the cluster"
        raise UserInputError(f"placement one-nvlink over {n} nodes needs an NVLink domain with {n} nodes of {g} "
                             f"GPU(s) in {where} (node features nvl-<domain>); there is none", field="axes.placement",
                             hint="give the spec's node groups nvlink_domain(s) and re-render, or drop one-nvlink")
    feats = [nvlink_feature(d) for d in fit]
    return {"constraint": feats[0] if len(feats) == 1 else "[" + "|".join(feats) + "]"}


def one_leaf_nodelist(leaves: Mapping[str, set[str]], n: int, eligible: Iterable[str]) -> str | None:
    """``n`` eligible nodes under the leaf that has the most (the first such leaf in natural
    order), as a comma list; None when no leaf has ``n``."""
    ok = set(eligible)
    best = max(sorted(leaves, key=natural_key), key=lambda leaf: len(leaves[leaf] & ok), default=None)
    if best is None or len(leaves[best] & ok) < n:
        return None
    return ",".join(sorted(leaves[best] & ok, key=natural_key)[:n])


def resource_rules(configs: Sequence[Mapping[str, Any]], params_of: Callable[[Mapping[str, Any]], dict[str, Any]], *,
                   multi_node_template: str | None = None, **kw: Any) -> list[dict[str, Any]]:
    """The sweep's ``resources_by``: one rule per distinct (GPUs per node, nodes, placement) of
    ``configs``, matching on the sweep parameters (``params_of`` a configuration) other than the
    batch size; a multi-node one starts with ``multi_node_template`` when given."""
    rules: dict[tuple, dict[str, Any]] = {}
    for c in configs:
        key = tuple(c.get(a) for a in RESOURCE_AXES)
        if key not in rules:
            when = {k: v for k, v in params_of(c).items() if k != "batch_size"}
            rules[key] = {"when": when, "resources": shape(c, **kw)}
            if multi_node_template and int(c.get("nodes", 1)) > 1:
                rules[key]["template"] = multi_node_template
    return list(rules.values())

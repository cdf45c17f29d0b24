"""Each sprint configuration's Slurm request: the GPUs-per-node, nodes and placement axes as a
sweep's per-trial resources (``resources_by``, :meth:`gpuhpc.sweeps.spec.SweepSpec.resources_for`).
Pure functions over what Slurm says (topology, partition, nodes); no I/O here.

* ``gpus_per_node`` -> ``gpus`` (GPUs per node, of ``resources.gpu_type`` when the file sets one);
* ``nodes`` -> ``nodes``;
* ``placement: one-leaf`` -> nothing more: a multi-node job asks for the fewest leaf switches its
  partition allows (``--switches=N@5:00``, :func:`gpuhpc.jobs.api.with_fewest_switches`);
* ``placement: spread`` -> ``--switches`` off and a node list with one node under each of
  ``nodes`` different leaves (nodes of the partition with the GPUs), so the job really spans leaves;
* a one-node configuration is the same request whatever its placement.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import natural_key

RESOURCE_AXES = ("gpus_per_node", "nodes", "placement")


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
    if n > 1 and config.get("placement") == "spread":
        if not leaves:
            raise UserInputError("placement spread needs a tree topology (scontrol show topology lists no leaf "
                                 "switch)", field="axes.placement", hint="drop spread, or configure the fabric's leaves")
        pool = [x for x in (nodes or []) if not partition or partition in getattr(x, "partitions", ())]
        eligible = [x.name for x in pool if _gpus(x, gpu_type) >= g] if nodes is not None else \
            [name for v in leaves.values() for name in v]
        picked = spread_nodelist(leaves, n, eligible)
        if picked is None:
            where = f"partition {partition}" if partition else "the cluster"
            raise UserInputError(f"placement spread over {n} nodes needs {n} leaf switches with a node of "
                                 f"{g} GPU(s) in {where}; there are fewer", field="axes.placement",
                                 hint="fewer nodes, or drop spread")
        out.update({"nodelist": picked, "switches": "off"})
    return out


def resource_rules(configs: Sequence[Mapping[str, Any]], axes: Sequence[str], **kw: Any) -> list[dict[str, Any]]:
    """The sweep's ``resources_by``: one rule per distinct (GPUs per node, nodes, placement) of
    ``configs``, matching on the resource ``axes`` that are sweep parameters."""
    rules: dict[tuple, dict[str, Any]] = {}
    for c in configs:
        key = tuple(c.get(a) for a in RESOURCE_AXES)
        if key not in rules:
            rules[key] = {"when": {a: c[a] for a in RESOURCE_AXES if a in axes}, "resources": shape(c, **kw)}
    return list(rules.values())

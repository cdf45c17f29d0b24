"""What ``gpuhpc power`` knows about the cluster: the cloud pools and their settings, read from
the ``power`` part of the template context (:func:`gpuhpc.conf.context.build_context`), which
the gpuhpc_elastic role writes as JSON, or straight from a cluster spec (YAML)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from gpuhpc.config import getenv
from gpuhpc import hostlist
from gpuhpc.errors import UserInputError

CONFIG_ENV = "GPUHPC_ELASTIC_CONFIG"
DEFAULT_CONFIG = "/etc/gpuhpc/elastic.json"


@dataclass(frozen=True)
class Pool:
    """One ``capacity: cloud`` node group."""
    name: str
    nodes: tuple[str, ...]
    provider: str
    market: str = "on_demand"
    instance_types: tuple[str, ...] = ()
    max_nodes: int = 0
    boot_timeout: int | None = None
    capacity_cooldown: int = 300
    price_tier: int = 0
    restart_budget: int = 3       # reclaims a job may be requeued after; the next one holds it
    hourly_price: str = "0"       # per instance-hour at launch (a Decimal string); the provider's when it has one
    on_demand_hourly_price: str | None = None   # what on-demand would cost: spot savings (default: hourly_price)
    # multi-node jobs (docs/elastic.md, "Multi-node jobs"): a launch of more than one node in one
    # availability zone; a placement group ("cluster": gpuhpc-<cluster>-<pool>, made if missing;
    # any other value: an existing group's name); an On-Demand Capacity Reservation or a Capacity
    # Block for ML (capacity_type "capacity-block", with the block's reservation id)
    single_zone: bool = True
    placement_group: str | None = None
    capacity_reservation_id: str | None = None
    capacity_type: str | None = None


@dataclass(frozen=True)
class ElasticConfig:
    cluster: str
    pools: tuple[Pool, ...]
    state_dir: str
    orphan_grace: int = 600
    resume_timeout: int = 300
    protect_after: int = 3        # boot failures in a row that put a pool in protected mode
    provider_settings: dict[str, Any] = field(default_factory=dict)   # e.g. {"aws": {"region": ...}}

    @cached_property
    def pool_by_node(self) -> dict[str, Pool]:
        """Node name -> its pool (the first pool that lists it), built once: a lookup per node, not
        a scan of every pool's nodes (quadratic at 10,000 nodes)."""
        out: dict[str, Pool] = {}
        for p in self.pools:
            for n in p.nodes:
                out.setdefault(n, p)
        return out

    @cached_property
    def pool_by_name(self) -> dict[str, Pool]:
        return {p.name: p for p in reversed(self.pools)}

    @cached_property
    def nodes_expr(self) -> str:
        """Every cloud node as one hostlist (compressed once)."""
        return hostlist.compress([n for p in self.pools for n in p.nodes])

    def pool_of(self, node: str) -> Pool | None:
        return self.pool_by_node.get(node)

    def pool(self, name: str) -> Pool:
        try:
            return self.pool_by_name[name]
        except KeyError:
            raise KeyError(name) from None


def config_from_context(ctx: dict[str, Any]) -> ElasticConfig:
    """From a template context (``gpuhpc conf context SPEC``) or the JSON the role writes (the
    same keys: ``cluster_name`` and ``power``, plus optional ``providers`` settings)."""
    power = ctx.get("power")
    if not power:
        raise UserInputError("the cluster has no capacity: cloud node group", field="node_groups",
                             hint="docs/elastic.md")
    pools = tuple(Pool(name=g["name"], nodes=tuple(hostlist.expand(g["nodes"])), provider=g["provider"],
                       market=g.get("market", "on_demand"), instance_types=tuple(g.get("instance_types") or ()),
                       max_nodes=int(g.get("max_nodes") or 0), boot_timeout=g.get("boot_timeout"),
                       capacity_cooldown=int(g.get("capacity_cooldown", 300)), price_tier=int(g.get("price_tier", 0)),
                       restart_budget=int(g.get("restart_budget", 3)), hourly_price=str(g.get("hourly_price") or "0"),
                       on_demand_hourly_price=(str(g["on_demand_hourly_price"]) if g.get("on_demand_hourly_price")
                                               is not None else None),
                       single_zone=bool(g.get("single_zone", True)), placement_group=g.get("placement_group"),
                       capacity_reservation_id=g.get("capacity_reservation_id"),
                       capacity_type=g.get("capacity_type"))
                  for g in power["groups"])
    for i, p in enumerate(pools):
        if p.capacity_type not in (None, "capacity-block"):
            raise UserInputError(f"capacity_type {p.capacity_type!r} is not known", field=f"power.groups[{i}].capacity_type",
                                 hint="capacity-block, or leave it out")
        if p.capacity_type == "capacity-block" and (p.market != "on_demand" or not p.capacity_reservation_id):
            raise UserInputError("a Capacity Block needs market on_demand and its capacity_reservation_id",
                                 field=f"power.groups[{i}].capacity_reservation_id", hint="cr-... of the block")
    return ElasticConfig(cluster=ctx["cluster_name"], pools=pools, state_dir=power["state_dir"],
                         orphan_grace=int(power.get("orphan_grace", 600)),
                         resume_timeout=int(power.get("resume_timeout", 300)),
                         protect_after=int(power.get("protect_after", 3)),
                         provider_settings=dict(ctx.get("providers") or {}))


def load_config(path: str | os.PathLike[str] | None = None) -> ElasticConfig:
    """``path``, else ``$GPUHPC_ELASTIC_CONFIG``, else /etc/gpuhpc/elastic.json. A ``.yaml``/``.yml``
    file is a cluster spec (validated and turned into its context here)."""
    p = Path(path or getenv(CONFIG_ENV) or DEFAULT_CONFIG)
    if p.suffix in (".yaml", ".yml"):
        from gpuhpc.conf.context import build_context
        from gpuhpc.conf.validate import validate
        from gpuhpc.spec.cluster import load_spec

        spec = load_spec(p)
        validate(spec)
        return config_from_context(build_context(spec))
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserInputError(f"no elastic config at {p}", field=CONFIG_ENV,
                             hint="gpuhpc conf context SPEC > /etc/gpuhpc/elastic.json (the gpuhpc_elastic role)") from None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"cannot read the elastic config {p}: {exc}", field=CONFIG_ENV) from None
    return config_from_context(data)

"""The instance journal: one JSON line per instance event under ``<state_dir>/instances.jsonl``
(``launch`` with its prices, ``end`` with its boot, idle and suspend tails), appended under a
``flock`` by the power worker and the reconciler. The ledger folds it into ``instance_usage``
(``gpuhpc power ingest``, :mod:`gpuhpc.ledger.instances`): instance-hours per type and market,
priced at launch, next to the jobs' GPU-hours in the cost report."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance

NAME = "instances.jsonl"


def path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / NAME


def append(state_dir: str | os.PathLike[str], *events: dict) -> None:
    if not events:
        return
    Path(state_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(path(state_dir), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in events))


def read(state_dir: str | os.PathLike[str]) -> list[dict]:
    """Every event; a line that does not parse is skipped."""
    out = []
    try:
        text = path(state_dir).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def launch_event(config: ElasticConfig, pool: Pool, inst: Instance, price: str | None = None) -> dict:
    return {"event": "launch", "cluster": config.cluster, "id": inst.id, "node": inst.node, "pool": pool.name,
            "provider": pool.provider, "type": inst.instance_type or "-", "market": pool.market,
            "at": inst.launched_at, "price": price or pool.hourly_price,
            "on_demand_price": pool.on_demand_hourly_price or pool.hourly_price}


def end_event(config: ElasticConfig, instance_id: str, at: float, reason: str, *, registered_at: float | None = None,
              last_busy: float | None = None, suspend_at: float | None = None, orphan: Instance | None = None,
              pool: Pool | None = None) -> dict:
    """``reason``: suspend | boot-failed | gone | reclaim | impaired (failed status checks) | orphan. An orphan was never journalled
    at launch: its event carries what a launch event would (from the provider's listing)."""
    e = {"event": "end", "cluster": config.cluster, "id": instance_id, "at": at, "reason": reason,
         "registered_at": registered_at, "last_busy": last_busy, "suspend_at": suspend_at}
    if orphan is not None:
        e.update(orphan=True, node=orphan.node, pool=orphan.pool, type=orphan.instance_type or "-",
                 market=orphan.market, launched_at=orphan.launched_at,
                 price=pool.hourly_price if pool else "0",
                 on_demand_price=(pool.on_demand_hourly_price or pool.hourly_price) if pool else "0")
    return e

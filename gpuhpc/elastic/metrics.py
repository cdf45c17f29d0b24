"""Elastic capacity's metrics for Prometheus, from the instance journal and the power records
(no Slurm command): node transitions (launched, ended, per node), submit -> running of the jobs
that resumed a node (the reconciler journals it), resume failures per pool and code (a capacity error at launch, a boot that never registered), reclaims, lost instances,
orphans, and each pool's state (cooling down, protected, boot failures in a row, instances up).
:func:`samples` is pure, for the tests; the exporter that serves them is
:mod:`gpuhpc.monitoring.elastic_exporter` (only gpuhpc.monitoring imports prometheus_client):

    python -m gpuhpc.monitoring.elastic_exporter --port 9420 [--addr 127.0.0.1] [--config PATH]
"""
from __future__ import annotations

from collections import Counter

from gpuhpc.elastic.config import ElasticConfig
from gpuhpc.elastic.store import State

# name -> (kind, help, labels)
METRICS = {
    "gpuhpc_elastic_node_transitions_total": ("counter", "Cloud node power transitions (up: an instance launched "
                                              "for it; down: its instance ended)", ("pool", "node", "to")),
    "gpuhpc_elastic_launches_total": ("counter", "Instances launched", ("pool",)),
    "gpuhpc_elastic_resume_failures_total": ("counter", "Resumes that failed: a capacity (or other provider) "
                                             "error at launch, or a boot that never registered", ("pool", "code")),
    "gpuhpc_elastic_instance_ends_total": ("counter", "Instances ended, by reason (suspend, boot-failed, reclaim, "
                                           "gone, orphan)", ("pool", "reason")),
    "gpuhpc_elastic_reclaims_total": ("counter", "Spot reclaims and lost instances (jobs requeued)", ("pool",)),
    "gpuhpc_elastic_submit_to_running_seconds_total": ("counter", "Sum of submit -> running of the jobs that "
                                                       "resumed a node (divide by the count)", ("pool",)),
    "gpuhpc_elastic_cold_starts_total": ("counter", "Jobs that resumed a node and started", ("pool",)),
    "gpuhpc_elastic_submit_to_running_last_seconds": ("gauge", "Submit -> running of the last job that resumed "
                                                      "a node", ("pool",)),
    "gpuhpc_elastic_pool_cooling": ("gauge", "1 while the pool cools down after a capacity error", ("pool",)),
    "gpuhpc_elastic_pool_protected": ("gauge", "1 while the pool is protected after boot failures in a row", ("pool",)),
    "gpuhpc_elastic_pool_boot_failures": ("gauge", "Boot failures in a row", ("pool",)),
    "gpuhpc_elastic_pool_instances": ("gauge", "Nodes with a launched instance on record", ("pool",)),
}


def samples(config: ElasticConfig, events: list[dict], state: State, now: float) -> list[tuple[str, tuple, float]]:
    """(metric, labels, value) from the journal's events and the records."""
    pool_of = {e["id"]: e.get("pool", "") for e in events if e.get("event") == "launch" or e.get("orphan")}
    node_of = {e["id"]: e.get("node", "") for e in events if e.get("event") == "launch" or e.get("orphan")}
    c: Counter = Counter()
    last: dict[str, float] = {}
    for e in events:
        kind = e.get("event")
        if kind == "launch":
            c[("gpuhpc_elastic_launches_total", (e.get("pool", ""),))] += 1
            c[("gpuhpc_elastic_node_transitions_total", (e.get("pool", ""), e.get("node", ""), "up"))] += 1
        elif kind == "launch_failed":
            c[("gpuhpc_elastic_resume_failures_total", (e.get("pool", ""), e.get("code", "")))] += 1
        elif kind == "end":
            pool, reason = pool_of.get(e.get("id"), ""), e.get("reason", "")
            c[("gpuhpc_elastic_instance_ends_total", (pool, reason))] += 1
            if node_of.get(e.get("id")):
                c[("gpuhpc_elastic_node_transitions_total", (pool, node_of[e["id"]], "down"))] += 1
            if reason == "boot-failed":
                c[("gpuhpc_elastic_resume_failures_total", (pool, "boot-timeout"))] += 1
            if reason in ("reclaim", "gone"):
                c[("gpuhpc_elastic_reclaims_total", (pool,))] += 1
        elif kind == "job_start" and e.get("start_at") is not None and e.get("submit_at") is not None:
            waited = max(0.0, float(e["start_at"]) - float(e["submit_at"]))
            c[("gpuhpc_elastic_submit_to_running_seconds_total", (e.get("pool", ""),))] += waited
            c[("gpuhpc_elastic_cold_starts_total", (e.get("pool", ""),))] += 1
            last[e.get("pool", "")] = waited
    out = [(name, labels, float(v)) for (name, labels), v in sorted(c.items())]
    out += [("gpuhpc_elastic_submit_to_running_last_seconds", (p,), v) for p, v in sorted(last.items())]
    up = Counter(r.pool for r in state.nodes.values() if r.instance_id)
    for p in config.pools:
        cd = state.cooldowns.get(p.name)
        out += [("gpuhpc_elastic_pool_cooling", (p.name,), 1.0 if cd and cd["until"] > now else 0.0),
                ("gpuhpc_elastic_pool_protected", (p.name,), 1.0 if p.name in state.protected else 0.0),
                ("gpuhpc_elastic_pool_boot_failures", (p.name,), float(state.boot_failures.get(p.name, 0))),
                ("gpuhpc_elastic_pool_instances", (p.name,), float(up.get(p.name, 0)))]
    return out

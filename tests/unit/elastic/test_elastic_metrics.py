"""The elastic metrics (gpuhpc.elastic.metrics): transitions, resume failures, reclaims and pool
state from the journal and the records, pure; and the collector's exposition."""
from __future__ import annotations

from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.metrics import samples
from gpuhpc.monitoring.elastic_exporter import ElasticCollector
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.store import NodeRecord, State, Store

CFG = ElasticConfig(cluster="c", state_dir="/nonexistent", pools=(Pool("spot", ("s1", "s2"), "local", market="spot"),
                                                                  Pool("od", ("o1",), "local")))
NOW = 1_800_000_000.0


def _events(cfg=CFG):
    spot = cfg.pool("spot")
    return [journal.launch_event(cfg, spot, Instance("i-1", "s1", "spot", "running", NOW)),
            journal.launch_event(cfg, spot, Instance("i-2", "s2", "spot", "running", NOW)),
            journal.end_event(cfg, "i-1", NOW + 60, "reclaim"),
            journal.end_event(cfg, "i-2", NOW + 90, "boot-failed"),
            {"event": "launch_failed", "cluster": "c", "pool": "od", "code": "InsufficientInstanceCapacity",
             "nodes": ["o1"], "at": NOW},
            {"event": "job_start", "cluster": "c", "job": "7", "pool": "spot", "submit_at": NOW - 30, "start_at": NOW},
            {"event": "job_start", "cluster": "c", "job": "8", "pool": "spot", "submit_at": NOW, "start_at": NOW + 10}]


def test_transitions_failures_reclaims_and_pool_state():
    state = State(nodes={"s1": NodeRecord("s1", "spot", "t", NOW, instance_id="i-9")},
                  cooldowns={"od": {"until": NOW + 10, "code": "x"}}, protected={"spot": {"since": NOW, "failures": 3}},
                  boot_failures={"spot": 3})
    got = {(n, labels): v for n, labels, v in samples(CFG, _events(), state, NOW)}
    assert got[("gpuhpc_elastic_launches_total", ("spot",))] == 2
    assert got[("gpuhpc_elastic_node_transitions_total", ("spot", "s1", "up"))] == 1
    assert got[("gpuhpc_elastic_node_transitions_total", ("spot", "s1", "down"))] == 1
    assert got[("gpuhpc_elastic_resume_failures_total", ("od", "InsufficientInstanceCapacity"))] == 1
    assert got[("gpuhpc_elastic_resume_failures_total", ("spot", "boot-timeout"))] == 1
    assert got[("gpuhpc_elastic_reclaims_total", ("spot",))] == 1
    assert got[("gpuhpc_elastic_pool_cooling", ("od",))] == 1 and got[("gpuhpc_elastic_pool_cooling", ("spot",))] == 0
    assert got[("gpuhpc_elastic_pool_protected", ("spot",))] == 1 and got[("gpuhpc_elastic_pool_boot_failures", ("spot",))] == 3
    assert got[("gpuhpc_elastic_pool_instances", ("spot",))] == 1
    assert got[("gpuhpc_elastic_cold_starts_total", ("spot",))] == 2
    assert got[("gpuhpc_elastic_submit_to_running_seconds_total", ("spot",))] == 40
    assert got[("gpuhpc_elastic_submit_to_running_last_seconds", ("spot",))] == 10


def test_the_collector_exposes_them(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), pools=CFG.pools)
    journal.append(tmp_path, *_events(cfg))
    with Store(tmp_path).update() as st:
        st.boot_failures["spot"] = 1
    reg = CollectorRegistry()
    reg.register(ElasticCollector(cfg))
    text = generate_latest(reg).decode()
    assert 'gpuhpc_elastic_reclaims_total{pool="spot"} 1.0' in text
    assert 'gpuhpc_elastic_pool_boot_failures{pool="spot"} 1.0' in text

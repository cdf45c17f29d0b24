"""Single-node jobs of one pool are one launch per resume call (issue 38.2: "one launch per pool
and pass for single-node jobs"; ParallelCluster batches them the same way): 500 one-GPU jobs are
one CreateFleet, not 500, and the launch is best effort: the nodes that got an instance boot, the
rest go DOWN with the code (their jobs requeue) and the pool cools down. A multi-node job stays
one all-or-nothing launch of its own."""
from __future__ import annotations

import json

import pytest

from gpuhpc.elastic import worker
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.power import BATCH_MAX, resume_plans
from gpuhpc.elastic.providers.base import TAG_NODE, CapacityError, Instance, PartialLaunch
from gpuhpc.elastic.reconcile import COOLDOWN_REASON
from gpuhpc.elastic.store import Store
from gpuhpc.slurm.power import PowerNode

from .fakes import RecordingSlurm
from .test_ec2_provider import SPOT, described, ec2, ec2_account, fleet_types, provider  # noqa: F401 (fixtures)


def test_single_node_jobs_of_a_pool_are_one_best_effort_launch(tmp_path):
    names = tuple(f"g{i}" for i in range(8))
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), pools=(Pool("gpu", names, "x"),))
    jobs = [{"job_id": 100 + i, "nodes": f"g{i}"} for i in range(5)] + [{"job_id": 200, "nodes": "g5,g6"}]
    plans = resume_plans(cfg, list(names), json.dumps({"jobs": jobs}), Store(tmp_path), now=100.0)
    assert [(p.nodes, p.job_id, p.each) for p in plans] == [
        (("g5", "g6"), "200", False),                                  # the two-node job: all or nothing
        (("g0", "g1", "g2", "g3", "g4", "g7"), None, True)]            # five one-node jobs and g7: one batch
    records = Store(tmp_path).read().nodes
    assert {n: records[n].job_id for n in ("g0", "g4", "g7")} == {"g0": "100", "g4": "104", "g7": None}
    assert len({records[n].token for n in ("g0", "g1", "g7")}) == 1


def test_a_batch_is_cut_at_batch_max_and_max_nodes_refuses_only_the_excess(tmp_path):
    names = tuple(f"g{i}" for i in range(BATCH_MAX + 20))
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), pools=(Pool("gpu", names, "x", max_nodes=BATCH_MAX + 5),))
    plans = resume_plans(cfg, list(names), None, Store(tmp_path), now=100.0)
    assert [(p.op, len(p.nodes)) for p in plans] == [("refuse", 15), ("launch", BATCH_MAX), ("launch", 5)]
    assert plans[0].nodes == names[-15:] and "505 of 505 in use, 15 more asked" in plans[0].reason
    assert sorted(Store(tmp_path).read().nodes) == sorted(names[:BATCH_MAX + 5])


class ShortProvider:
    """Gets instances for the first ``k`` nodes of a best-effort launch."""

    def __init__(self, k):
        self.k, self.asked = k, []

    def launch(self, pool, nodes, token, each=False):
        self.asked.append((tuple(nodes), each))
        got = [Instance(f"i-{n}", n, pool.name, "pending", 1.0, "t") for n in nodes[:self.k]]
        if len(got) < len(nodes):
            raise PartialLaunch("InsufficientInstanceCapacity", "short", got)
        return got


def test_the_worker_boots_what_a_short_batch_got_and_requeues_the_rest(tmp_path, monkeypatch):
    names = ("g0", "g1", "g2", "g3", "g4")
    short = ShortProvider(3)
    monkeypatch.setattr(worker, "provider_for", lambda name, config: short)
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), pools=(Pool("gpu", names, "x", capacity_cooldown=300),))
    store = Store(tmp_path)
    plans = resume_plans(cfg, ["g0", "g1", "g2", "g3"], None, store, now=100.0)
    slurm = RecordingSlurm([PowerNode(n, "IDLE+CLOUD+POWERING_UP") for n in names[:4]]
                           + [PowerNode("g4", "IDLE+CLOUD+POWERED_DOWN")])
    worker.run_plans(cfg, plans, slurm)
    assert short.asked == [(("g0", "g1", "g2", "g3"), True)]
    assert {n: r.instance_id for n, r in store.read().nodes.items()} == {"g0": "i-g0", "g1": "i-g1", "g2": "i-g2"}
    assert sorted(c[1] for c in slurm.calls if c[0] == "update") == ["g0", "g1", "g2"]
    downs = {c[1]: c[2] for c in slurm.calls if c[0] == "down"}
    assert set(downs) == {"g3", "g4"}          # the node left without an instance, and the pool's idle one
    assert all(r.startswith(COOLDOWN_REASON) and "InsufficientInstanceCapacity" in r for r in downs.values())
    assert store.read().cooldowns["gpu"]["code"] == "InsufficientInstanceCapacity"


BATCH = Pool(name="spot", nodes=("spot01", "spot02", "spot03"), provider="aws", market="spot",
             instance_types=SPOT.instance_types)


def test_ec2_best_effort_takes_what_each_type_gives_and_tags_each_node(ec2):
    p, faulty = provider(ec2, partial=2)          # every fleet returns at most two instances
    got = p.launch(BATCH, ["spot01", "spot02", "spot03"], "tokb", each=True)
    assert fleet_types(faulty) == ["p5.48xlarge", "p5e.48xlarge"]
    assert [(i.node, i.instance_type) for i in got] == [
        ("spot01", "p5.48xlarge"), ("spot02", "p5.48xlarge"), ("spot03", "p5e.48xlarge")]
    first = next(kw for op, kw in faulty.calls if op == "create_fleet")
    assert "MinTargetCapacity" not in first["SpotOptions"] and "SingleAvailabilityZone" not in first["SpotOptions"]
    tags = {i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]} for i in described(ec2, p)}
    assert sorted(t[TAG_NODE] for t in tags.values()) == ["spot01", "spot02", "spot03"]
    # the same launch again starts nothing new
    again = p.launch(BATCH, ["spot01", "spot02", "spot03"], "tokb", each=True)
    assert [i.id for i in again] == [i.id for i in got] and len(fleet_types(faulty)) == 2


def test_ec2_best_effort_short_of_capacity_keeps_what_it_got(ec2):
    p, _ = provider(ec2, partial=2, capacity={"p5e.48xlarge": "InsufficientInstanceCapacity",
                                              "p4d.24xlarge": "MaxSpotInstanceCountExceeded"})
    with pytest.raises(PartialLaunch) as exc:
        p.launch(BATCH, ["spot01", "spot02", "spot03"], "tokc", each=True)
    assert exc.value.code == "MaxSpotInstanceCountExceeded"
    assert [i.node for i in exc.value.instances] == ["spot01", "spot02"]
    assert sorted(i.node for i in p.instances()) == ["spot01", "spot02"]      # the worker keeps them


def test_ec2_best_effort_with_no_capacity_at_all_is_a_capacity_error(ec2):
    p, _ = provider(ec2, capacity={t: "InsufficientInstanceCapacity" for t in BATCH.instance_types})
    with pytest.raises(CapacityError) as exc:
        p.launch(BATCH, ["spot01", "spot02"], "tokd", each=True)
    assert not isinstance(exc.value, PartialLaunch) and p.instances() == []

"""The local provider's registry, fault injection and ownership, without starting slurmd
(``never_boot`` instances have no process)."""
from __future__ import annotations

import json

import pytest

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import CapacityError
from gpuhpc.elastic.providers.local import LocalProvider

POOL = Pool("spot", ("n1", "n2"), "local", market="spot")


def provider(tmp_path, cluster="c", faults=None) -> LocalProvider:
    cfg = ElasticConfig(cluster=cluster, pools=(POOL,), state_dir=str(tmp_path))
    if faults is not None:
        (tmp_path / "local-faults.json").write_text(json.dumps(faults))
    return LocalProvider(cfg)


def test_a_capacity_fault_fails_the_launch_with_its_code(tmp_path):
    p = provider(tmp_path, faults={"spot": {"mode": "capacity", "code": "VcpuLimitExceeded"}})
    with pytest.raises(CapacityError) as exc:
        p.launch(POOL, ["n1"], "tok")
    assert exc.value.code == "VcpuLimitExceeded" and p.instances() == []


def test_never_boot_instances_are_pending_idempotent_and_interruptible(tmp_path):
    p = provider(tmp_path, faults={"spot": {"mode": "never_boot"}})
    first = p.launch(POOL, ["n1", "n2"], "tok-1")
    assert [(i.node, i.state, i.market) for i in first] == [("n1", "pending", "spot"), ("n2", "pending", "spot")]
    assert [i.id for i in p.launch(POOL, ["n1", "n2"], "tok-1")] == [i.id for i in first]
    p.interrupt(first[0].id, at=123.0)
    assert {i.id: i.interrupted_at for i in p.instances()}[first[0].id] == 123.0


def test_terminate_ends_only_this_clusters_instances(tmp_path):
    mine = provider(tmp_path, faults={"spot": {"mode": "never_boot"}})
    other = provider(tmp_path, cluster="other")
    ids = [i.id for i in mine.launch(POOL, ["n1"], "tok-2")]
    assert other.instances() == [] and other.terminate(ids) == []
    assert mine.terminate(ids + ["i-0123"]) == ids and mine.instances() == []

"""Multi-node jobs on EC2 (issue 38.5), against moto with the fault layer of test_ec2_provider.py:
a multi-node launch in one availability zone, a cluster placement group per pool (made once, named
per pool, in every override), On-Demand Capacity Reservations and Capacity Blocks for ML as pool
options. moto has no placement groups and no capacity blocks: the layer below stands in for the
first and launches a block's request as on-demand, and the tests assert the request built. Each
test ends with a describe showing no instance of its cluster."""
from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from gpuhpc.elastic.config import Pool, config_from_context
from gpuhpc.elastic.providers.base import TAG_CLUSTER
from gpuhpc.elastic.providers.ec2 import Ec2Provider, launch_template_data
from gpuhpc.errors import UserInputError

from .fakes import moto_ec2
from .test_ec2_provider import FaultyEc2

GPU = Pool(name="gpu", nodes=tuple(f"g{i}" for i in range(1, 9)), provider="aws", instance_types=("p5.48xlarge",),
           max_nodes=8)


class PlacementEc2(FaultyEc2):
    """The fault layer plus what moto lacks: placement groups (kept here; a describe of an unknown
    group fails as EC2's does) and capacity blocks (the request is recorded, then launched as
    on-demand, since moto launches nothing for ``capacity-block``)."""

    def __init__(self, client, **kw):
        super().__init__(client, **kw)
        self.groups: dict[str, dict] = {}

    def describe_placement_groups(self, GroupNames):
        self.calls.append(("describe_placement_groups", {"GroupNames": GroupNames}))
        missing = [g for g in GroupNames if g not in self.groups]
        if missing:
            raise ClientError({"Error": {"Code": "InvalidPlacementGroup.Unknown",
                                         "Message": f"The Placement Group '{missing[0]}' is unknown."}},
                              "DescribePlacementGroups")
        return {"PlacementGroups": [self.groups[g] for g in GroupNames]}

    def create_placement_group(self, **kw):
        self.calls.append(("create_placement_group", kw))
        self.groups[kw["GroupName"]] = {"GroupName": kw["GroupName"], "Strategy": kw["Strategy"], "State": "available"}
        return {}

    def create_fleet(self, **req):
        spec = req["TargetCapacitySpecification"]
        if spec["DefaultTargetCapacityType"] == "capacity-block":
            self.calls.append(("create_fleet", req))
            sent = {**req, "TargetCapacitySpecification": {**spec, "DefaultTargetCapacityType": "on-demand"}}
            return self.client.create_fleet(**sent)
        return super().create_fleet(**req)


@pytest.fixture(scope="module")
def account():
    with moto_ec2() as (client, _ami):
        yield client


@pytest.fixture
def ec2(account, request):
    """(provider, fault layer) for a cluster named after the test; afterwards nothing of it runs."""
    faulty = PlacementEc2(account)
    p = Ec2Provider(request.node.name.replace("_", "-")[:40], faulty, launch_template="gpuhpc-node",
                    sleep=lambda s: None)
    yield p, faulty
    p.terminate([i.id for i in p.instances()])
    left = [i for r in account.describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [p.cluster]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    assert left == [], left


def fleets(faulty) -> list[dict]:
    return [kw for op, kw in faulty.calls if op == "create_fleet"]


def options(req: dict) -> dict:
    return req.get("SpotOptions") or req["OnDemandOptions"]


def test_a_multi_node_launch_asks_for_one_availability_zone_a_single_node_need_not(ec2):
    p, faulty = ec2
    p.subnets = ["subnet-a", "subnet-b"]            # two zones' subnets: one override per subnet
    req = p.fleet_request(GPU, "p5.48xlarge", 4, "tok-a")
    assert options(req)["SingleAvailabilityZone"] is True and options(req)["MinTargetCapacity"] == 4
    assert [o["SubnetId"] for o in req["LaunchTemplateConfigs"][0]["Overrides"]] == ["subnet-a", "subnet-b"]
    assert "SingleAvailabilityZone" not in options(p.fleet_request(GPU, "p5.48xlarge", 1, "tok-b"))
    spread = Pool(**{**GPU.__dict__, "single_zone": False})
    assert "SingleAvailabilityZone" not in options(p.fleet_request(spread, "p5.48xlarge", 4, "tok-c"))
    p.subnets = []
    got = p.launch(GPU, ["g1", "g2", "g3"], "tok-d")            # and through moto: one fleet, one zone
    assert [i.node for i in got] == ["g1", "g2", "g3"] and len(fleets(faulty)) == 1
    assert options(fleets(faulty)[0])["SingleAvailabilityZone"] is True
    zones = {i["Placement"]["AvailabilityZone"] for r in faulty.client.describe_instances(
        InstanceIds=[i.id for i in got])["Reservations"] for i in r["Instances"]}
    assert len(zones) == 1


def test_a_cluster_placement_group_is_made_once_per_pool_and_in_every_override(ec2):
    p, faulty = ec2
    pool = Pool(**{**GPU.__dict__, "placement_group": "cluster"})
    p.subnets = ["subnet-a"]
    req = p.fleet_request(pool, "p5.48xlarge", 2, "t")
    p.subnets = []
    name = f"gpuhpc-{p.cluster}-gpu"
    assert req["LaunchTemplateConfigs"][0]["Overrides"] == [
        {"InstanceType": "p5.48xlarge", "SubnetId": "subnet-a", "Placement": {"GroupName": name}}]
    p.launch(pool, ["g1", "g2"], "pg1")
    p.launch(pool, ["g3"], "pg2")
    made = [kw for op, kw in faulty.calls if op == "create_placement_group"]
    assert [(m["GroupName"], m["Strategy"]) for m in made] == [(name, "cluster")]
    assert {t["Key"]: t["Value"] for t in made[0]["TagSpecifications"][0]["Tags"]}[TAG_CLUSTER] == p.cluster
    assert all(o["Placement"] == {"GroupName": name} for f in fleets(faulty)
               for o in f["LaunchTemplateConfigs"][0]["Overrides"])
    # a new provider (the next worker) finds the group and makes none
    again = Ec2Provider(p.cluster, faulty, launch_template="gpuhpc-node", sleep=lambda s: None)
    assert again.ensure_placement_group(pool) == name
    assert len([1 for op, _ in faulty.calls if op == "create_placement_group"]) == 1
    # a group named in the pool is used as is, never made
    named = Pool(**{**GPU.__dict__, "placement_group": "site-pg"})
    assert again.ensure_placement_group(named) == "site-pg"
    assert len([1 for op, _ in faulty.calls if op == "create_placement_group"]) == 1


def test_an_on_demand_capacity_reservation_is_used_first(ec2):
    p, faulty = ec2
    pool = Pool(**{**GPU.__dict__, "capacity_reservation_id": "cr-0123456789abcdef0"})
    got = p.launch(pool, ["g1", "g2"], "odcr")
    req = fleets(faulty)[0]
    assert req["OnDemandOptions"]["CapacityReservationOptions"] == {"UsageStrategy": "use-capacity-reservations-first"}
    assert req["OnDemandOptions"]["AllocationStrategy"] == "lowest-price"
    assert req["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand"
    assert len(got) == 2
    # the reservation itself is targeted by the pool's launch template
    data = launch_template_data(pool, image_id="ami-1", user_data="#!/bin/sh\n", cluster=p.cluster)
    assert data["CapacityReservationSpecification"] == {
        "CapacityReservationTarget": {"CapacityReservationId": "cr-0123456789abcdef0"}}
    assert "InstanceMarketOptions" not in data


def test_a_capacity_block_is_asked_for_as_one(ec2):
    p, faulty = ec2
    pool = Pool(**{**GPU.__dict__, "capacity_type": "capacity-block", "capacity_reservation_id": "cr-block1"})
    got = p.launch(pool, ["g1", "g2"], "blk")
    req = fleets(faulty)[0]
    assert req["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "capacity-block"
    assert "AllocationStrategy" not in req["OnDemandOptions"] and "SpotOptions" not in req
    assert req["OnDemandOptions"]["CapacityReservationOptions"]["UsageStrategy"] == "use-capacity-reservations-first"
    assert req["OnDemandOptions"]["SingleAvailabilityZone"] is True and len(got) == 2
    data = launch_template_data(pool, image_id="ami-1", user_data="#!/bin/sh\n", cluster=p.cluster)
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"]["CapacityReservationTarget"]["CapacityReservationId"] == "cr-block1"


def _ctx(**group):
    return {"cluster_name": "c", "power": {"state_dir": "/x", "groups": [
        {"name": "gpu", "nodes": "g[1-2]", "provider": "aws", **group}]}}


def test_pool_options_are_read_and_a_block_without_its_reservation_is_refused():
    pool = config_from_context(_ctx(placement_group="cluster", single_zone=False,
                                    capacity_reservation_id="cr-1")).pools[0]
    assert (pool.placement_group, pool.single_zone, pool.capacity_reservation_id) == ("cluster", False, "cr-1")
    assert config_from_context(_ctx()).pools[0].single_zone is True
    with pytest.raises(UserInputError, match="capacity_reservation_id"):
        config_from_context(_ctx(capacity_type="capacity-block"))
    with pytest.raises(UserInputError, match="capacity_reservation_id"):
        config_from_context(_ctx(capacity_type="capacity-block", capacity_reservation_id="cr-1", market="spot"))
    with pytest.raises(UserInputError, match="capacity_type"):
        config_from_context(_ctx(capacity_type="reserved"))


def test_the_spec_carries_the_pool_options_to_the_elastic_config():
    from gpuhpc.spec.cluster import NodeGroup

    base = dict(name="gpu", hostname="g{n}", count=2, sockets=1, cores_per_socket=4, memory_mb=1000,
                capacity="cloud", provider="aws")
    g = NodeGroup(**base, placement_group="cluster", capacity_type="capacity-block", capacity_reservation_id="cr-9")
    assert (g.placement_group, g.capacity_type) == ("cluster", "capacity-block")
    with pytest.raises(ValueError, match="capacity-block"):
        NodeGroup(**base, capacity_type="capacity-block")
    with pytest.raises(ValueError, match="only for capacity: cloud"):
        NodeGroup(**{**base, "capacity": "static", "provider": None}, placement_group="cluster")


def test_the_spec_pool_options_reach_the_elastic_config_and_defaults_add_nothing():
    """spec -> template context -> ElasticConfig: the options given reach the pool; a group that
    gives none adds no key to the context (the rendered files and goldens stay as they were)."""
    import copy
    from pathlib import Path

    import yaml

    from gpuhpc.conf.context import build_context
    from gpuhpc.spec.cluster import spec_from_data

    example = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "elastic.yaml"
    data = yaml.safe_load(example.read_text())
    plain = build_context(spec_from_data(copy.deepcopy(data)))
    od = next(g for g in data["node_groups"] if g["name"] == "ondemand")
    od.update(placement_group="cluster", single_zone=False, capacity_type="capacity-block",
              capacity_reservation_id="cr-0abc")
    ctx = build_context(spec_from_data(data))
    pool = config_from_context(ctx).pool("ondemand")
    assert (pool.placement_group, pool.single_zone, pool.capacity_type, pool.capacity_reservation_id) == \
        ("cluster", False, "capacity-block", "cr-0abc")
    assert config_from_context(ctx).pool("spot").single_zone is True
    keys = {"single_zone", "placement_group", "capacity_reservation_id", "capacity_type"}
    assert not keys & {k for g in plain["power"]["groups"] for k in g}

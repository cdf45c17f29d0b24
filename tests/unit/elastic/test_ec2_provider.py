"""The EC2 provider against moto's in-process EC2 (mock_aws), with a fault-injection layer moto
lacks (capacity errors per instance type, quota, throttling, interruption notices): ordered
fallback across instance types, all-or-nothing launches, idempotent retries, and terminating only
instances this cluster tagged."""
from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from gpuhpc.elastic.config import Pool
from gpuhpc.elastic.providers.base import TAG_CLUSTER, TAG_NODE, TAG_TOKEN, CapacityError, ProviderError
from gpuhpc.elastic.providers.ec2 import Ec2Provider

SPOT = Pool(name="spot", nodes=("spot01", "spot02", "spot03"), provider="aws", market="spot",
            instance_types=("p5.48xlarge", "p5e.48xlarge", "p4d.24xlarge"), max_nodes=3)


class FaultyEc2:
    """moto's client with injected faults: ``capacity`` maps an instance type to the error code its
    instant fleet reports (as EC2 does: no instances, an Errors entry); ``throttle`` makes the next
    N calls fail with RequestLimitExceeded; ``partial`` caps how many instances a fleet returns."""

    def __init__(self, client, capacity=None, throttle=0, partial=None):
        self.client = client
        self.capacity = dict(capacity or {})
        self.throttle = throttle
        self.partial = partial
        self.calls: list[tuple[str, dict]] = []

    def _maybe_throttle(self, op):
        if self.throttle > 0:
            self.throttle -= 1
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, op)

    def create_fleet(self, **req):
        self.calls.append(("create_fleet", req))
        self._maybe_throttle("CreateFleet")
        itype = req["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"]
        if itype in self.capacity:
            return {"FleetId": "fleet-x", "Instances": [], "Errors": [
                {"ErrorCode": self.capacity[itype], "ErrorMessage": "no capacity", "Lifecycle": "spot"}]}
        if self.partial is not None:
            req = {**req, "TargetCapacitySpecification": {**req["TargetCapacitySpecification"],
                                                          "TotalTargetCapacity": self.partial}}
        # moto's instant fleet does not take SpotOptions.MinTargetCapacity: strip what it ignores
        return self.client.create_fleet(**req)

    def __getattr__(self, op):
        fn = getattr(self.client, op)

        def call(**kw):
            self.calls.append((op, kw))
            self._maybe_throttle(op)
            return fn(**kw)
        return call


@pytest.fixture(scope="module")
def ec2_account():
    """One moto account for the module (its set-up costs seconds); each test is its own cluster."""
    with mock_aws():
        client = boto3.client("ec2", region_name="us-east-1")
        ami = client.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"]
        client.create_launch_template(LaunchTemplateName="gpuhpc-node", LaunchTemplateData={"ImageId": ami})
        yield client, ami


@pytest.fixture
def ec2(ec2_account, request):
    client, ami = ec2_account
    client.test_cluster = request.node.name.replace("_", "-")[:40]
    client.test_ami = ami
    return client


def provider(client, **faults) -> tuple[Ec2Provider, FaultyEc2]:
    faulty = FaultyEc2(client, **faults)
    return Ec2Provider(client.test_cluster, faulty, launch_template="gpuhpc-node", sleep=lambda s: None), faulty


def described(client, p: Ec2Provider) -> list[dict]:
    return [i for r in client.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [p.cluster]}])
            ["Reservations"] for i in r["Instances"]]


def fleet_types(faulty: FaultyEc2) -> list[str]:
    return [kw["LaunchTemplateConfigs"][0]["Overrides"][0]["InstanceType"] for op, kw in faulty.calls if op == "create_fleet"]


def test_launch_tags_every_instance_with_cluster_pool_node_and_token(ec2):
    p, faulty = provider(ec2)
    got = p.launch(SPOT, ["spot01", "spot02"], "tok1")
    assert [i.node for i in got] == ["spot01", "spot02"] and {i.instance_type for i in got} == {"p5.48xlarge"}
    fleet = next(kw for op, kw in faulty.calls if op == "create_fleet")
    assert fleet["Type"] == "instant" and fleet["SpotOptions"]["AllocationStrategy"] == "capacity-optimized"
    assert fleet["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "spot"
    tags = {i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]} for i in described(ec2, p)}
    assert {t[TAG_NODE] for t in tags.values()} == {"spot01", "spot02"}
    assert all(t[TAG_CLUSTER] == p.cluster and t[TAG_TOKEN] == "tok1-0" for t in tags.values())
    assert {i.id for i in p.instances()} == {i.id for i in got}


def test_capacity_errors_fall_back_along_the_ordered_instance_types(ec2):
    p, faulty = provider(ec2, capacity={"p5.48xlarge": "InsufficientInstanceCapacity"})
    got = p.launch(SPOT, ["spot01"], "tok2")
    assert fleet_types(faulty) == ["p5.48xlarge", "p5e.48xlarge"]
    assert [i.instance_type for i in got] == ["p5e.48xlarge"]


@pytest.mark.parametrize("code", ["InsufficientInstanceCapacity", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"])
def test_no_type_left_raises_the_capacity_code_and_leaves_nothing_running(ec2, code):
    p, faulty = provider(ec2, capacity={t: code for t in SPOT.instance_types})
    with pytest.raises(CapacityError) as exc:
        p.launch(SPOT, ["spot01", "spot02"], "tok3")
    assert exc.value.code == code
    assert fleet_types(faulty) == list(SPOT.instance_types)
    assert p.instances() == []


def test_a_partial_fleet_is_ended_all_or_nothing(ec2):
    p, _ = provider(ec2, partial=1)
    with pytest.raises(CapacityError):
        p.launch(SPOT, ["spot01", "spot02", "spot03"], "tok4")
    assert p.instances() == []


def test_throttling_is_retried_and_the_retry_launches_once(ec2):
    p, faulty = provider(ec2, throttle=2)
    got = p.launch(SPOT, ["spot01"], "tok5")
    assert len(got) == 1 and len(p.instances()) == 1


def test_a_second_launch_with_the_same_token_starts_nothing_new(ec2):
    p, faulty = provider(ec2)
    first = p.launch(SPOT, ["spot01", "spot02"], "tok6")
    again = p.launch(SPOT, ["spot01", "spot02"], "tok6")        # the worker retried after a crash
    assert {i.id for i in again} == {i.id for i in first}
    assert fleet_types(faulty) == ["p5.48xlarge"] and len(p.instances()) == 2


def test_throttling_without_end_is_a_provider_error(ec2):
    p, _ = provider(ec2, throttle=99)
    with pytest.raises(ProviderError) as exc:
        p.launch(SPOT, ["spot01"], "tok7")
    assert exc.value.code == "RequestLimitExceeded" and not isinstance(exc.value, CapacityError)


def test_terminate_ends_only_instances_this_cluster_tagged(ec2):
    p, _ = provider(ec2)
    mine = p.launch(SPOT, ["spot01"], "tok8")[0].id
    ami = ec2.test_ami
    foreign = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "someone-else"}]}])["Instances"][0]["InstanceId"]
    untagged = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    assert p.terminate([mine, foreign, untagged, "local-x-1"]) == [mine]
    states = {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}
    assert states[foreign] == states[untagged] == "running" and states[mine] in ("shutting-down", "terminated")
    assert p.instances() == []


def test_on_demand_pools_ask_for_on_demand_capacity(ec2):
    p, faulty = provider(ec2)
    pool = Pool(name="od", nodes=("od01",), provider="aws", instance_types=("p5.48xlarge",))
    p.launch(pool, ["od01"], "tok9")
    fleet = next(kw for op, kw in faulty.calls if op == "create_fleet")
    assert fleet["TargetCapacitySpecification"]["DefaultTargetCapacityType"] == "on-demand" and "SpotOptions" not in fleet


def test_a_spot_launch_is_priced_from_the_spot_price_history(ec2):
    p, _ = provider(ec2)
    price = p.price(SPOT, "p5.48xlarge")
    assert price is not None and Decimal(price) > 0          # moto's history: one price per zone
    assert p.price(replace(SPOT, market="on_demand"), "p5.48xlarge") is None    # on-demand: the pool's price

"""The EC2 provider against moto's in-process EC2 (mock_aws), with a fault-injection layer moto
lacks (capacity errors per instance type, quota, throttling, interruption notices, EC2's filter
limit, instances not yet visible after their fleet): ordered fallback across instance types,
all-or-nothing launches, idempotent retries, terminating only instances this cluster tagged, and
what breaks at a few hundred nodes (issue 38.2); the worker never cools a pool for throttling."""
from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest
from botocore.exceptions import ClientError

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import (TAG_CLUSTER, TAG_NODE, TAG_TOKEN, CapacityError, ProviderError,
                                           ThrottledError)
from gpuhpc.elastic.providers.ec2 import Ec2Provider

from .fakes import RecordingSlurm, moto_ec2

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
                                                          "TotalTargetCapacity": min(
                self.partial, req["TargetCapacitySpecification"]["TotalTargetCapacity"])}}
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
    with moto_ec2() as account:
        yield account


@pytest.fixture
def ec2(ec2_account, request):
    """The account's client for a cluster named after the test; afterwards the test's instances are
    ended and a describe must show none of its cluster pending or running (nothing leaked)."""
    client, ami = ec2_account
    client.test_cluster = request.node.name.replace("_", "-")[:40]
    client.test_ami = ami
    yield client
    mine = [i["InstanceId"] for r in client.describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [client.test_cluster]}])["Reservations"] for i in r["Instances"]]
    if mine:
        client.terminate_instances(InstanceIds=mine)
    left = [i for r in client.describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLUSTER}", "Values": [client.test_cluster]},
        {"Name": "instance-state-name", "Values": ["pending", "running"]}])["Reservations"] for i in r["Instances"]]
    assert left == [], left


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


# EC2 refuses more than 200 values in one filter; the provider's chunk and the fault layer's limit
# are made small here (12 nodes, chunks of 5) so that moto need not start 250 instances
BIG = Pool(name="big", nodes=tuple(f"n{i:03d}" for i in range(12)), provider="aws", market="on_demand",
           instance_types=("p5.48xlarge",), max_nodes=12)
LIMIT = 5


class ScaleEc2(FaultyEc2):
    """FaultyEc2 plus EC2's filter limit, and ``invisible``: the first N DescribeInstances calls
    after a fleet leave out that fleet's instances."""

    def __init__(self, client, invisible=0, **kw):
        super().__init__(client, **kw)
        self.invisible = invisible
        self.fresh: set[str] = set()

    def create_fleet(self, **req):
        resp = super().create_fleet(**req)
        self.fresh = {i for inst in resp.get("Instances", []) for i in inst.get("InstanceIds", [])}
        return resp

    def describe_instances(self, **kw):
        self.calls.append(("describe_instances", kw))
        if any(len(f["Values"]) > LIMIT for f in kw.get("Filters", [])):
            raise ClientError({"Error": {"Code": "FilterLimitExceeded",
                                         "Message": "The maximum number of filter values specified on a single "
                                                    "call is 200"}}, "DescribeInstances")
        resp = self.client.describe_instances(**kw)
        if self.invisible > 0 and self.fresh:
            self.invisible -= 1
            for r in resp["Reservations"]:
                r["Instances"] = [i for i in r["Instances"] if i["InstanceId"] not in self.fresh]
        return resp


def scale_provider(client, sleeps=None, **faults) -> tuple[Ec2Provider, ScaleEc2]:
    faulty = ScaleEc2(client, **faults)
    return Ec2Provider(client.test_cluster, faulty, launch_template="gpuhpc-node", filter_values_max=LIMIT,
                       sleep=(sleeps.append if sleeps is not None else (lambda s: None))), faulty


def test_more_nodes_than_one_filter_holds_launch_and_terminate_within_the_filter_limit(ec2):
    assert Ec2Provider.__init__.__kwdefaults__["filter_values_max"] == 200           # EC2's own limit
    p, faulty = scale_provider(ec2)
    got = p.launch(BIG, list(BIG.nodes), "big1")
    assert [i.node for i in got] == list(BIG.nodes) and len({i.id for i in got}) == 12
    assert len([1 for op, _ in faulty.calls if op == "create_fleet"]) == 1
    ids = [i.id for i in got]
    assert sorted(p.terminate(ids)) == sorted(ids)
    terminates = [kw["InstanceIds"] for op, kw in faulty.calls if op == "terminate_instances"]
    assert sum(len(t) for t in terminates) == 12
    described = [kw for op, kw in faulty.calls if op == "describe_instances"]
    assert all(len(f["Values"]) <= LIMIT for kw in described for f in kw.get("Filters", []))


def test_instances_not_yet_visible_after_the_fleet_are_launched_not_a_capacity_error(ec2):
    sleeps: list[float] = []
    p, faulty = scale_provider(ec2, sleeps=sleeps, invisible=2)
    got = p.launch(BIG, list(BIG.nodes[:3]), "vis1")
    assert [i.node for i in got] == list(BIG.nodes[:3])
    assert len([1 for op, _ in faulty.calls if op == "create_fleet"]) == 1        # one fleet, not a fallback
    assert len(sleeps) == 2                                                      # described again, twice
    mine = {i["InstanceId"]: {t["Key"]: t["Value"] for t in i["Tags"]}
            for r in ec2.describe_instances(Filters=[{"Name": f"tag:{TAG_CLUSTER}", "Values": [p.cluster]}])
            ["Reservations"] for i in r["Instances"]}
    assert {t[TAG_NODE] for t in mine.values()} == set(BIG.nodes[:3])


def test_still_invisible_instances_are_taken_from_the_fleets_answer(ec2):
    p, _ = scale_provider(ec2, invisible=99)
    got = p.launch(BIG, list(BIG.nodes[:2]), "vis2")
    assert [i.node for i in got] == list(BIG.nodes[:2]) and all(i.id.startswith("i-") for i in got)
    assert {i.instance_type for i in got} == {"p5.48xlarge"} and {i.pool for i in got} == {"big"}


def test_throttling_backs_off_with_jitter_then_is_not_a_capacity_error(ec2):
    sleeps: list[float] = []
    p, _ = scale_provider(ec2, sleeps=sleeps, throttle=99)
    with pytest.raises(ThrottledError) as exc:
        p.launch(BIG, ["n000"], "thr1")
    assert exc.value.code == "RequestLimitExceeded" and not isinstance(exc.value, CapacityError)
    assert len(sleeps) == p.retries
    caps = [min(20.0, p.backoff * 2 ** a) for a in range(p.retries)]
    assert all(0 <= s <= cap for s, cap in zip(sleeps, caps)), (sleeps, caps)


@pytest.mark.parametrize("error, cools", [(ThrottledError("RequestLimitExceeded"), False),
                                         (CapacityError("InsufficientInstanceCapacity"), True)])
def test_throttling_never_cools_the_pool_capacity_does(tmp_path, monkeypatch, error, cools):
    from gpuhpc.elastic import worker
    from gpuhpc.elastic.power import Plan
    from gpuhpc.elastic.store import Store
    from gpuhpc.slurm.power import PowerNode

    class Failing:
        def launch(self, pool, nodes, token):
            raise error

    assert isinstance(error, ProviderError)
    monkeypatch.setattr(worker, "provider_for", lambda name, config: Failing())
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path),
                        pools=(Pool("spot", ("s1", "s2", "s3"), "aws", market="spot", capacity_cooldown=300),))
    slurm = RecordingSlurm([PowerNode("s1", "IDLE+CLOUD+POWERING_UP"), PowerNode("s2", "IDLE+CLOUD+POWERED_DOWN"),
                    PowerNode("s3", "IDLE+CLOUD+POWERED_DOWN")])
    store = Store(tmp_path)
    import time

    before = time.time()
    worker.launch(cfg, slurm, store, Plan("launch", "spot", ("s1",), "tok"), before)
    downed = [c[1] for c in slurm.calls if c[0] == "down"]
    assert downed[0] == "s1"                                   # the launch's own node: its job requeues
    cooling = store.read().cooldowns["spot"]["until"] > before + 60
    assert cooling == cools and (downed == ["s1"]) != cools, (downed, store.read().cooldowns)


class ImpairedEc2(FaultyEc2):
    """EC2's status checks, which moto always reports ok: ``impaired`` maps an instance id to the
    checks it fails; answers filtered as EC2 does, a page at a time (one status per page)."""

    def __init__(self, client, impaired=None, **kw):
        super().__init__(client, **kw)
        self.impaired = dict(impaired or {})

    def describe_instance_status(self, Filters, NextToken=None):
        self.calls.append(("describe_instance_status", {"Filters": Filters, "NextToken": NextToken}))
        self._maybe_throttle("DescribeInstanceStatus")
        check = Filters[0]["Name"].split("-")[0]
        rows = [{"InstanceId": i, "SystemStatus": {"Status": "impaired" if "system" in c else "ok"},
                 "InstanceStatus": {"Status": "impaired" if "instance" in c else "ok"}}
                for i, c in sorted(self.impaired.items()) if check in c]
        at = int(NextToken or 0)
        return {"InstanceStatuses": rows[at:at + 1], **({"NextToken": str(at + 1)} if at + 1 < len(rows) else {})}


def test_instances_failing_status_checks_are_reported_with_the_checks(ec2):
    p, _ = provider(ec2)
    got = p.launch(SPOT, ["spot01", "spot02", "spot03"], "tok-st")
    faulty = ImpairedEc2(ec2, impaired={got[0].id: ("system",), got[2].id: ("system", "instance"),
                                        "i-notours": ("instance",)})
    p.ec2 = faulty
    seen = {i.node: i.impaired for i in p.instances()}
    assert seen == {"spot01": "system", "spot02": None, "spot03": "system+instance"}
    assert sum(1 for op, _ in faulty.calls if op == "describe_instance_status") == 4   # 2 checks, 3 rows, a page each
    faulty.throttle = 10                                   # no answer: nobody is taken for impaired
    p.sleep, p.retries = (lambda s: None), 1
    assert p.impaired() == {}

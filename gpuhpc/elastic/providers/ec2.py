"""The ``aws`` provider: EC2 through boto3 (the one module besides gpuhpc.staging that may import
it; pyproject.toml ``[tool.importlinter]``).

A launch walks the pool's ``instance_types`` in order: one ``CreateFleet Type=instant`` per type
for all the nodes at once (``MinTargetCapacity`` = the node count: all or nothing), spot with the
``capacity-optimized`` allocation strategy, on-demand ``lowest-price`` (one type per call, so the
order given is the preference). A capacity error on one type moves on to the next; when every type
fails, :class:`CapacityError` carries the last code. Each call has a ClientToken derived from the
launch token, and before it the provider looks for instances already tagged with that token, so a
retried launch (throttling, a worker that died) never starts a second set. Throttling is retried
with full-jitter exponential backoff and then raised as :class:`ThrottledError`, never as a
capacity error. It lists and terminates only instances tagged ``gpuhpc:cluster=<cluster>``.

At a few hundred nodes: EC2 refuses a filter with more than 200 values (FilterLimitExceeded), so
instance ids are described 200 at a time, page by page; and a ``DescribeInstances`` right after
``CreateFleet`` may not show the new instances yet (EC2 is eventually consistent), so the fleet's
own answer decides what was launched: a missing instance is described again after a short backoff
and, if still invisible, recorded from the fleet's answer (its id, type and the tags given at
launch), never taken for a capacity failure.

Provider settings (``providers.aws`` in the elastic config): ``region``, ``launch_template``
(name; AMI, security groups, key and user data that starts slurmd with ``-N <gpuhpc:node tag>``),
``subnets`` (one fleet override per subnet and type); or, for the pools' own templates made by
:func:`setup` (user data from :mod:`gpuhpc.elastic.providers.userdata`, IMDSv2 required, the munge
key in SSM): ``image_id``, ``controllers``, ``instance_profile``, ``security_groups``,
``key_name``, ``munge_parameter``, ``slurmd``. Pool options for multi-node jobs (one zone, a
placement group, capacity reservations and blocks): :meth:`Ec2Provider.fleet_request`."""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import random
import time
from decimal import Decimal
from typing import Any

import boto3
from botocore.exceptions import ClientError

from gpuhpc.elastic.providers.userdata import METADATA_OPTIONS, munge_parameter, user_data
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import (TAG_CLUSTER, TAG_NODE, TAG_POOL, TAG_TOKEN, CapacityError,
                                           Instance, PartialLaunch, ProviderError, ThrottledError)

CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "MaxSpotInstanceCountExceeded", "SpotMaxPriceTooLow",
    "InstanceLimitExceeded", "VcpuLimitExceeded", "UnfulfillableCapacity", "capacity-not-available",
})
THROTTLE_CODES = frozenset({"RequestLimitExceeded", "Throttling", "ThrottlingException"})
INTERRUPTION_CODES = frozenset({"marked-for-termination", "marked-for-stop", "instance-terminated-by-service"})
FILTER_VALUES_MAX = 200          # EC2: "The maximum number of filter values specified on a single call is 200"
TERMINATE_MAX = 1000            # instance ids per TerminateInstances call
MAX_BACKOFF_S = 20.0


def template_name(cluster: str, pool: str) -> str:
    """The launch template :func:`setup` makes for a pool."""
    return f"gpuhpc-{cluster}-{pool}"


def launch_template_data(pool: Pool, *, image_id: str, user_data: str, instance_profile: str | None = None,
                         security_groups: list[str] | None = None, key_name: str | None = None,
                         cluster: str = "") -> dict:
    """A pool's launch template: the image, the nodes' instance profile, the first-boot script
    (:func:`gpuhpc.elastic.providers.userdata.user_data`), IMDSv2 required with a hop limit of 1 (a
    container on the node cannot reach the role) and tags in the metadata (the node reads its name
    there), and the pool's capacity reservation (a Capacity Block: its market type too)."""
    data: dict[str, Any] = {
        "ImageId": image_id,
        "UserData": base64.b64encode(user_data.encode()).decode(),
        "MetadataOptions": dict(METADATA_OPTIONS),
        "TagSpecifications": [{"ResourceType": "volume", "Tags": [{"Key": TAG_CLUSTER, "Value": cluster},
                                                                 {"Key": TAG_POOL, "Value": pool.name}]}],
    }
    if instance_profile:
        data["IamInstanceProfile"] = ({"Arn": instance_profile} if instance_profile.startswith("arn:")
                                      else {"Name": instance_profile})
    if security_groups:
        data["SecurityGroupIds"] = list(security_groups)
    if key_name:
        data["KeyName"] = key_name
    if pool.capacity_reservation_id:
        data["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": pool.capacity_reservation_id}}
    if pool.capacity_type == "capacity-block":
        data["InstanceMarketOptions"] = {"MarketType": "capacity-block"}
    return data


class Ec2Provider:
    name = "aws"

    def __init__(self, cluster: str, client: Any, *, launch_template: str | None = None,
                 subnets: list[str] | None = None, retries: int = 6, backoff: float = 0.5, sleep=time.sleep,
                 visible_retries: int = 3, filter_values_max: int = FILTER_VALUES_MAX,
                 managed_templates: bool = False) -> None:
        self.cluster = cluster
        self.ec2 = client
        self.launch_template = launch_template
        self.managed_templates = managed_templates      # one template per pool, made by setup()
        self.subnets = list(subnets or [])
        self._groups: set[str] = set()                  # placement groups known to exist
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self.visible_retries = visible_retries
        self.filter_values_max = filter_values_max

    @classmethod
    def from_config(cls, config: ElasticConfig) -> "Ec2Provider":
        aws = dict(config.provider_settings.get("aws") or {})
        managed = bool(aws.get("image_id"))
        if not aws.get("launch_template") and not managed:
            raise ProviderError("NoLaunchTemplate", "providers.aws.launch_template (or image_id, for the pools' own "
                                                    "templates) is not set in the elastic config")
        return cls(config.cluster, boto3.client("ec2", region_name=aws.get("region")),
                   launch_template=aws.get("launch_template"), subnets=aws.get("subnets"), managed_templates=managed)

    # ------------------------------------------------------------ names
    def template_for(self, pool: Pool) -> str:
        """The launch template a pool's fleets use: its own (``gpuhpc-<cluster>-<pool>``, made by
        :func:`setup`) when the provider manages templates, else ``providers.aws.launch_template``."""
        if self.managed_templates or not self.launch_template:
            return template_name(self.cluster, pool.name)
        return self.launch_template

    def placement_group_for(self, pool: Pool) -> str | None:
        """``placement_group: cluster``: the pool's own cluster placement group; another value: that
        group, as named; none: None."""
        if not pool.placement_group:
            return None
        return f"gpuhpc-{self.cluster}-{pool.name}" if pool.placement_group == "cluster" else pool.placement_group

    def ensure_placement_group(self, pool: Pool) -> str | None:
        """The pool's placement group, made (strategy ``cluster``, tagged with the cluster) when it
        is the pool's own and does not exist yet; an existing group named in the pool is used as is."""
        name = self.placement_group_for(pool)
        if name is None or name in self._groups:
            return name
        if pool.placement_group == "cluster":
            try:
                found = self._call("describe_placement_groups", GroupNames=[name]).get("PlacementGroups", [])
            except ProviderError as exc:
                if "NotFound" not in exc.code and "InvalidPlacementGroup" not in exc.code:
                    raise
                found = []
            if not found:
                try:
                    self._call("create_placement_group", GroupName=name, Strategy="cluster", TagSpecifications=[
                        {"ResourceType": "placement-group", "Tags": [{"Key": TAG_CLUSTER, "Value": self.cluster},
                                                                     {"Key": TAG_POOL, "Value": pool.name}]}])
                except ProviderError as exc:
                    if "Duplicate" not in exc.code:     # made meanwhile by another worker: fine
                        raise
        self._groups.add(name)
        return name

    # ------------------------------------------------------------ calls with retries
    def _call(self, op: str, **kwargs: Any) -> dict:
        for attempt in range(self.retries + 1):
            try:
                return getattr(self.ec2, op)(**kwargs)
            except ClientError as exc:
                code = exc.response.get("Error", {}).get("Code", "ClientError")
                if code in THROTTLE_CODES:
                    if attempt < self.retries:      # full jitter: many workers do not retry in step
                        self.sleep(random.uniform(0, min(MAX_BACKOFF_S, self.backoff * 2 ** attempt)))
                        continue
                    raise ThrottledError(code, str(exc)) from None
                if code in CAPACITY_CODES:
                    raise CapacityError(code, str(exc)) from None
                raise ProviderError(code, str(exc)) from None
        raise AssertionError("unreachable")

    def _describe(self, filters: list[dict]) -> list[dict]:
        out = []
        kwargs: dict[str, Any] = {"Filters": filters}
        while True:
            resp = self._call("describe_instances", **kwargs)
            for res in resp.get("Reservations", []):
                out.extend(res.get("Instances", []))
            token = resp.get("NextToken")
            if not token:
                return out
            kwargs["NextToken"] = token

    def _describe_ids(self, ids: list[str]) -> list[dict]:
        """The instances with these ids, :data:`FILTER_VALUES_MAX` ids a call."""
        out: list[dict] = []
        n = self.filter_values_max
        for i in range(0, len(ids), n):
            out += self._describe([{"Name": "instance-id", "Values": ids[i:i + n]}])
        return out

    def _owned(self, extra: list[dict] | None = None) -> list[dict]:
        return self._describe([{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]},
                               {"Name": "instance-state-name", "Values": ["pending", "running"]}, *(extra or [])])

    @staticmethod
    def _instance(raw: dict, interrupted: dict[str, float] | None = None,
                  impaired: dict[str, str] | None = None) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        launched = raw.get("LaunchTime")
        return Instance(id=raw["InstanceId"], node=tags.get(TAG_NODE), pool=tags.get(TAG_POOL),
                        state=raw.get("State", {}).get("Name", "pending"),
                        launched_at=launched.timestamp() if hasattr(launched, "timestamp") else time.time(),
                        instance_type=raw.get("InstanceType", ""),
                        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on_demand",
                        addr=raw.get("PrivateIpAddress"),
                        interrupted_at=(interrupted or {}).get(raw["InstanceId"]),
                        impaired=(impaired or {}).get(raw["InstanceId"]))

    # ------------------------------------------------------------ Provider
    def launch(self, pool: Pool, nodes: list[str], token: str, *, each: bool = False) -> list[Instance]:
        if not pool.instance_types:
            raise ProviderError("NoInstanceTypes", f"pool {pool.name} lists no instance_types")
        if each:
            return self._launch_each(pool, nodes, token)
        last = None
        for i, itype in enumerate(pool.instance_types):
            attempt_token = f"{token}-{i}"
            got = self._owned([{"Name": f"tag:{TAG_TOKEN}", "Values": [attempt_token]}])
            if len(got) < len(nodes):
                try:
                    got = self._fleet(pool, itype, len(nodes), attempt_token,
                                      node=nodes[0] if len(nodes) == 1 else None)
                except CapacityError as exc:
                    last = exc
                    continue
            if len(got) < len(nodes):          # partial: all or nothing
                self.terminate([g["InstanceId"] for g in got])
                last = CapacityError("InsufficientInstanceCapacity", f"{len(got)}/{len(nodes)} {itype}")
                continue
            got = sorted(got, key=lambda g: g["InstanceId"])
            if len(got) > len(nodes):                  # more than asked for: none left unowned
                self.terminate([g["InstanceId"] for g in got[len(nodes):]])
            return self._name(nodes, got[:len(nodes)])
        raise last or CapacityError("InsufficientInstanceCapacity", pool.name)

    def _launch_each(self, pool: Pool, nodes: list[str], token: str) -> list[Instance]:
        """Best effort for single-node jobs batched into one launch: one fleet per instance type
        for the nodes still without an instance, no minimum; what a type gives is kept, the next
        type is asked for the rest. A retried launch takes what each attempt's token already has
        and asks that type nothing more (the same ClientToken with another count is refused)."""
        got: list[dict] = []
        last: CapacityError | None = None
        for i, itype in enumerate(pool.instance_types):
            want = len(nodes) - len(got)
            if want <= 0:
                break
            attempt_token = f"{token}-{i}"
            mine = self._owned([{"Name": f"tag:{TAG_TOKEN}", "Values": [attempt_token]}])
            if not mine:
                try:
                    mine = self._fleet(pool, itype, want, attempt_token,
                                       node=nodes[len(got)] if want == 1 else None, each=True)
                except CapacityError as exc:
                    last = exc
                    continue
            mine = sorted(mine, key=lambda g: g["InstanceId"])
            if len(mine) > want:                       # more than asked for: none left unowned
                self.terminate([g["InstanceId"] for g in mine[want:]])
            got.extend(mine[:want])
        named = self._name(nodes[:len(got)], got)
        if len(named) < len(nodes):
            code = last.code if last else "InsufficientInstanceCapacity"
            if not named:
                raise last or CapacityError(code, pool.name)
            raise PartialLaunch(code, f"{len(named)}/{len(nodes)} in pool {pool.name}", named)
        return named

    def _name(self, nodes: list[str], got: list[dict]) -> list[Instance]:
        """Tag each instance with its node (one call per instance not tagged at launch: a node's
        name differs per instance, and a fleet's tags are one set for all)."""
        for node, raw in zip(nodes, got):
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
            if tags.get(TAG_NODE) == node:          # one node: tagged at launch
                continue
            self._call("create_tags", Resources=[raw["InstanceId"]], Tags=[{"Key": TAG_NODE, "Value": node}])
            raw.setdefault("Tags", []).append({"Key": TAG_NODE, "Value": node})
        return [self._instance(raw) for raw in got]

    def fleet_request(self, pool: Pool, itype: str, count: int, token: str, node: str | None = None,
                      each: bool = False) -> dict:
        """The CreateFleet request of one launch (pure but for the pool's placement group name):
        ``instant``, all or nothing (``MinTargetCapacity``; not for ``each``, a batch of single-node
        jobs, which takes what it gets, in any zone), one instance type; a multi-node launch
        in one availability zone (``SingleAvailabilityZone``) unless the pool says ``single_zone:
        false``; the pool's placement group in every override; an On-Demand Capacity Reservation or
        a Capacity Block used first (the template targets the reservation); the cluster, pool and
        launch tags on every instance, and the node's name too when the launch is one node."""
        spot = pool.market == "spot"
        block = pool.capacity_type == "capacity-block"
        group = self.placement_group_for(pool)
        overrides = [{"InstanceType": itype, **({"SubnetId": s} if s else {}),
                      **({"Placement": {"GroupName": group}} if group else {})} for s in (self.subnets or [None])]
        tags = [{"Key": TAG_CLUSTER, "Value": self.cluster}, {"Key": TAG_POOL, "Value": pool.name},
                {"Key": TAG_TOKEN, "Value": token}] + ([{"Key": TAG_NODE, "Value": node}] if node else [])
        options: dict[str, Any] = {"SingleInstanceType": True, **({} if each else {"MinTargetCapacity": count})}
        if count > 1 and not each and (pool.single_zone or group):     # a cluster placement group is one zone anyway
            options["SingleAvailabilityZone"] = True
        req: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": token,
            "LaunchTemplateConfigs": [{"LaunchTemplateSpecification": {"LaunchTemplateName": self.template_for(pool),
                                                                       "Version": "$Default"},
                                       "Overrides": overrides}],
            "TargetCapacitySpecification": {"TotalTargetCapacity": count, "DefaultTargetCapacityType":
                                            "spot" if spot else "capacity-block" if block else "on-demand"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}],
        }
        if spot:
            req["SpotOptions"] = {"AllocationStrategy": "capacity-optimized", **options}
        elif block or pool.capacity_reservation_id:
            # no allocation strategy for a block; the reservation the template targets comes first
            req["OnDemandOptions"] = {**({} if block else {"AllocationStrategy": "lowest-price"}), **options,
                                      "CapacityReservationOptions": {"UsageStrategy": "use-capacity-reservations-first"}}
        else:
            req["OnDemandOptions"] = {"AllocationStrategy": "lowest-price", **options}
        return req

    def _fleet(self, pool: Pool, itype: str, count: int, token: str, node: str | None = None,
               each: bool = False) -> list[dict]:
        spot = pool.market == "spot"
        self.ensure_placement_group(pool)
        req = self.fleet_request(pool, itype, count, token, node, each)
        resp = self._call("create_fleet", **req)
        ids = [i for inst in resp.get("Instances", []) for i in inst.get("InstanceIds", [])]
        if len(ids) < count and not (each and ids):
            codes = [e.get("ErrorCode", "") for e in resp.get("Errors", [])]
            if ids:
                self.terminate(ids)
            raise CapacityError(next((c for c in codes if c), "InsufficientInstanceCapacity"), itype)
        return self._visible(ids, itype, spot, req["TagSpecifications"][0]["Tags"])

    def _visible(self, ids: list[str], itype: str, spot: bool, tags: list[dict]) -> list[dict]:
        """The launched instances as DescribeInstances shows them; those it does not show yet
        (eventual consistency) are asked for again, then taken from the fleet's own answer."""
        seen = {r["InstanceId"]: r for r in self._describe_ids(ids)}
        for attempt in range(self.visible_retries):
            missing = [i for i in ids if i not in seen]
            if not missing:
                break
            self.sleep(random.uniform(0, min(MAX_BACKOFF_S, self.backoff * 2 ** attempt)))
            seen.update({r["InstanceId"]: r for r in self._describe_ids(missing)})
        return [seen.get(i) or {"InstanceId": i, "InstanceType": itype, "State": {"Name": "pending"},
                                "InstanceLifecycle": "spot" if spot else None, "Tags": [dict(t) for t in tags]}
                for i in ids]

    def price(self, pool: Pool, instance_type: str) -> str | None:
        """The spot price per hour of ``instance_type`` now (the highest of its zones' latest
        prices: a conservative cost), for the ledger's launch price; None for on-demand pools or
        when EC2 does not say (the pool's ``hourly_price`` is used). Never fails a launch."""
        if pool.market != "spot":
            return None
        try:
            got = self.ec2.describe_spot_price_history(
                InstanceTypes=[instance_type], ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
                StartTime=dt.datetime.now(dt.timezone.utc), MaxResults=50)
        except (ClientError, AttributeError):
            return None
        latest: dict[str, tuple] = {}
        for row in got.get("SpotPriceHistory", []):
            zone = row.get("AvailabilityZone", "")
            if zone not in latest or row["Timestamp"] > latest[zone][0]:
                latest[zone] = (row["Timestamp"], row["SpotPrice"])
        return max((p for _, p in latest.values()), key=Decimal, default=None)

    def terminate(self, instance_ids: list[str]) -> list[str]:
        ids = [i for i in instance_ids if i.startswith("i-")]
        if not ids:
            return []
        mine = [r["InstanceId"] for r in self._describe_ids(ids)
                if any(t["Key"] == TAG_CLUSTER and t["Value"] == self.cluster for t in r.get("Tags", []))]
        if mine:
            for i in range(0, len(mine), TERMINATE_MAX):
                self._call("terminate_instances", InstanceIds=mine[i:i + TERMINATE_MAX])
        return mine

    def interruptions(self) -> dict[str, float]:
        """Instance id -> notice time, for spot requests EC2 has marked for reclaim."""
        try:
            resp = self._call("describe_spot_instance_requests",
                              Filters=[{"Name": "state", "Values": ["active", "closed"]}])
        except ProviderError:
            return {}
        out = {}
        for req in resp.get("SpotInstanceRequests", []):
            when = req.get("Status", {}).get("UpdateTime")
            if req.get("InstanceId") and req.get("Status", {}).get("Code") in INTERRUPTION_CODES:
                out[req["InstanceId"]] = when.timestamp() if hasattr(when, "timestamp") else time.time()
        return out

    def impaired(self) -> dict[str, str]:
        """Instance id -> the EC2 status checks it fails (``system``, ``instance`` or
        ``system+instance``), for the instances EC2 reports impaired: one filtered call per check
        (and page), whatever the number of instances. An error answers {}: no instance is ended
        for want of an answer."""
        failed: dict[str, list[str]] = {}
        for check, key in (("system", "SystemStatus"), ("instance", "InstanceStatus")):
            token = None
            while True:
                try:
                    resp = self._call("describe_instance_status", Filters=[
                        {"Name": f"{check}-status.status", "Values": ["impaired"]}], **({"NextToken": token} if token else {}))
                except ProviderError:
                    return {}
                for st in resp.get("InstanceStatuses", []):
                    if st.get(key, {}).get("Status") == "impaired":      # the filter, checked again
                        failed.setdefault(st["InstanceId"], []).append(check)
                token = resp.get("NextToken")
                if not token:
                    break
        return {iid: "+".join(checks) for iid, checks in failed.items()}

    def instances(self) -> list[Instance]:
        notices, bad = self.interruptions(), self.impaired()
        return [self._instance(raw, notices, bad) for raw in self._owned()]

    # ------------------------------------------------------------ set-up (once, by an administrator)
    def ensure_launch_template(self, pool: Pool, data: dict) -> tuple[str, bool]:
        """The pool's launch template with ``data`` as its default version: made when missing, a
        new default version when its data changed (the version's description holds the data's
        digest), untouched otherwise. Returns (name, whether anything changed)."""
        name = template_name(self.cluster, pool.name)
        digest = "gpuhpc sha256:" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:32]
        try:
            versions = self._call("describe_launch_template_versions", LaunchTemplateName=name,
                                  Versions=["$Default"]).get("LaunchTemplateVersions", [])
        except ProviderError as exc:
            if "NotFound" not in exc.code and "NotFound" not in str(exc):
                raise
            versions = None
        if versions is None:
            self._call("create_launch_template", LaunchTemplateName=name, LaunchTemplateData=data,
                       VersionDescription=digest, TagSpecifications=[{"ResourceType": "launch-template", "Tags": [
                           {"Key": TAG_CLUSTER, "Value": self.cluster}, {"Key": TAG_POOL, "Value": pool.name}]}])
            return name, True
        if versions and versions[0].get("VersionDescription") == digest:
            return name, False
        made = self._call("create_launch_template_version", LaunchTemplateName=name, LaunchTemplateData=data,
                          VersionDescription=digest)["LaunchTemplateVersion"]
        self._call("modify_launch_template", LaunchTemplateName=name, DefaultVersion=str(made["VersionNumber"]))
        return name, True


def put_munge_key(ssm: Any, parameter: str, key: bytes, kms_key_id: str | None = None) -> None:
    """The cluster's munge key into SSM Parameter Store: a SecureString holding it in base64 (the
    nodes' user data decodes it); overwritten when it exists."""
    if not 32 <= len(key) <= 2048:
        raise ProviderError("InvalidMungeKey", f"a munge key is 32 to 2048 bytes, not {len(key)}")
    ssm.put_parameter(Name=parameter, Value=base64.b64encode(key).decode(), Type="SecureString", Overwrite=True,
                      Description="gpuhpc munge key (base64)", **({"KeyId": kms_key_id} if kms_key_id else {}))


def setup(config: ElasticConfig, *, munge_key: bytes | None = None, ec2: Any = None, ssm: Any = None) -> dict:
    """What an administrator runs once per change (docs/elastic.md): the munge key into SSM (when
    given), and for every ``aws`` pool its launch template (user data, IMDSv2, reservation) and its
    own placement group. ``providers.aws``: ``region``, ``image_id``, ``instance_profile``,
    ``security_groups``, ``key_name``, ``controllers`` (the conf servers), ``munge_parameter``
    (default ``/gpuhpc/<cluster>/munge-key``), ``slurmd``. Returns what it made or changed."""
    aws = dict(config.provider_settings.get("aws") or {})
    if not aws.get("image_id") or not aws.get("controllers"):
        from gpuhpc.errors import UserInputError

        raise UserInputError("providers.aws needs image_id and controllers for the pools' launch templates",
                             field="providers.aws", hint="docs/elastic.md, Nodes that come up by themselves")
    parameter = aws.get("munge_parameter") or munge_parameter(config.cluster)
    ec2 = ec2 or boto3.client("ec2", region_name=aws.get("region"))
    out: dict[str, Any] = {"parameter": parameter, "templates": {}, "placement_groups": []}
    if munge_key is not None:
        put_munge_key(ssm or boto3.client("ssm", region_name=aws.get("region")), parameter, munge_key,
                      aws.get("kms_key_id"))
        out["munge_key"] = "stored"
    provider = Ec2Provider(config.cluster, ec2, subnets=aws.get("subnets"), managed_templates=True)
    for pool in config.pools:
        if pool.provider != "aws":
            continue
        script = user_data(cluster=config.cluster, pool=pool.name, controllers=aws["controllers"],
                           parameter=parameter, slurmd=aws.get("slurmd") or "/usr/sbin/slurmd")
        data = launch_template_data(pool, image_id=aws["image_id"], user_data=script,
                                    instance_profile=aws.get("instance_profile"),
                                    security_groups=aws.get("security_groups"), key_name=aws.get("key_name"),
                                    cluster=config.cluster)
        name, changed = provider.ensure_launch_template(pool, data)
        out["templates"][name] = "changed" if changed else "unchanged"
        group = provider.ensure_placement_group(pool)
        if group:
            out["placement_groups"].append(group)
    return out

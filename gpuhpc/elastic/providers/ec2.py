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
``subnets`` (one fleet override per subnet and type)."""
from __future__ import annotations

import datetime as dt
import random
import time
from decimal import Decimal
from typing import Any

import boto3
from botocore.exceptions import ClientError

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import (TAG_CLUSTER, TAG_NODE, TAG_POOL, TAG_TOKEN, CapacityError, Instance,
                                           ProviderError, ThrottledError)

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


class Ec2Provider:
    name = "aws"

    def __init__(self, cluster: str, client: Any, *, launch_template: str, subnets: list[str] | None = None,
                 retries: int = 6, backoff: float = 0.5, sleep=time.sleep, visible_retries: int = 3,
                 filter_values_max: int = FILTER_VALUES_MAX) -> None:
        self.cluster = cluster
        self.ec2 = client
        self.launch_template = launch_template
        self.subnets = list(subnets or [])
        self.retries = retries
        self.backoff = backoff
        self.sleep = sleep
        self.visible_retries = visible_retries
        self.filter_values_max = filter_values_max

    @classmethod
    def from_config(cls, config: ElasticConfig) -> "Ec2Provider":
        aws = dict(config.provider_settings.get("aws") or {})
        if not aws.get("launch_template"):
            raise ProviderError("NoLaunchTemplate", "providers.aws.launch_template is not set in the elastic config")
        return cls(config.cluster, boto3.client("ec2", region_name=aws.get("region")),
                   launch_template=aws["launch_template"], subnets=aws.get("subnets"))

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
    def _instance(raw: dict, interrupted: dict[str, float] | None = None) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        launched = raw.get("LaunchTime")
        return Instance(id=raw["InstanceId"], node=tags.get(TAG_NODE), pool=tags.get(TAG_POOL),
                        state=raw.get("State", {}).get("Name", "pending"),
                        launched_at=launched.timestamp() if hasattr(launched, "timestamp") else time.time(),
                        instance_type=raw.get("InstanceType", ""),
                        market="spot" if raw.get("InstanceLifecycle") == "spot" else "on_demand",
                        addr=raw.get("PrivateIpAddress"),
                        interrupted_at=(interrupted or {}).get(raw["InstanceId"]))

    # ------------------------------------------------------------ Provider
    def launch(self, pool: Pool, nodes: list[str], token: str) -> list[Instance]:
        if not pool.instance_types:
            raise ProviderError("NoInstanceTypes", f"pool {pool.name} lists no instance_types")
        last = None
        for i, itype in enumerate(pool.instance_types):
            attempt_token = f"{token}-{i}"
            got = self._owned([{"Name": f"tag:{TAG_TOKEN}", "Values": [attempt_token]}])
            if len(got) < len(nodes):
                try:
                    got = self._fleet(pool, itype, len(nodes), attempt_token)
                except CapacityError as exc:
                    last = exc
                    continue
            if len(got) < len(nodes):          # partial: all or nothing
                self.terminate([g["InstanceId"] for g in got])
                last = CapacityError("InsufficientInstanceCapacity", f"{len(got)}/{len(nodes)} {itype}")
                continue
            got = sorted(got, key=lambda g: g["InstanceId"])[:len(nodes)]
            for node, raw in zip(nodes, got):
                self._call("create_tags", Resources=[raw["InstanceId"]], Tags=[{"Key": TAG_NODE, "Value": node}])
                raw.setdefault("Tags", []).append({"Key": TAG_NODE, "Value": node})
            return [self._instance(raw) for raw in got]
        raise last or CapacityError("InsufficientInstanceCapacity", pool.name)

    def _fleet(self, pool: Pool, itype: str, count: int, token: str) -> list[dict]:
        spot = pool.market == "spot"
        overrides = [{"InstanceType": itype, **({"SubnetId": s} if s else {})} for s in (self.subnets or [None])]
        req: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": token,
            "LaunchTemplateConfigs": [{"LaunchTemplateSpecification": {"LaunchTemplateName": self.launch_template,
                                                                       "Version": "$Default"},
                                       "Overrides": overrides}],
            "TargetCapacitySpecification": {"TotalTargetCapacity": count,
                                            "DefaultTargetCapacityType": "spot" if spot else "on-demand"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": [
                {"Key": TAG_CLUSTER, "Value": self.cluster}, {"Key": TAG_POOL, "Value": pool.name},
                {"Key": TAG_TOKEN, "Value": token}]}],
        }
        if spot:
            req["SpotOptions"] = {"AllocationStrategy": "capacity-optimized", "SingleInstanceType": True,
                                  "MinTargetCapacity": count}
        else:
            req["OnDemandOptions"] = {"AllocationStrategy": "lowest-price", "SingleInstanceType": True,
                                      "MinTargetCapacity": count}
        resp = self._call("create_fleet", **req)
        ids = [i for inst in resp.get("Instances", []) for i in inst.get("InstanceIds", [])]
        if len(ids) < count:
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

    def instances(self) -> list[Instance]:
        notices = self.interruptions()
        return [self._instance(raw, notices) for raw in self._owned()]

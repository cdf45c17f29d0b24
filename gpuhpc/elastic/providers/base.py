"""The provider interface. Every instance a provider makes carries ownership tags
(:data:`TAG_CLUSTER`, :data:`TAG_NODE`, :data:`TAG_POOL`, :data:`TAG_TOKEN`); it lists and ends only
instances with its cluster's tag. A launch is all or nothing (one job's nodes): a provider that
gets fewer instances than nodes ends the ones it got and raises :class:`CapacityError`. A launch
with ``each=True`` (single-node jobs of one pool, batched into one call) is best effort: the
nodes it got instances for run, and :class:`PartialLaunch` names the rest."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpuhpc.elastic.config import Pool

TAG_CLUSTER = "gpuhpc:cluster"
TAG_NODE = "gpuhpc:node"
TAG_POOL = "gpuhpc:pool"
TAG_TOKEN = "gpuhpc:token"


class ProviderError(Exception):
    """A provider call failed for a reason other than capacity (credentials, a bad template)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code


class ThrottledError(ProviderError):
    """EC2 kept throttling (RequestLimitExceeded) past the provider's jittered retries. Not a
    capacity problem: the launch's own nodes go DOWN so their jobs requeue, but the pool does not
    cool down (its other nodes stay available, the next launch tries again at once)."""


class CapacityError(ProviderError):
    """No capacity (InsufficientInstanceCapacity, a quota, no spot capacity) in any instance type:
    the nodes go DOWN at once with the code and the pool cools down."""


class PartialLaunch(CapacityError):
    """A best-effort launch (``each=True``) got instances for its first ``len(instances)`` nodes
    only (in order): those run; the rest go DOWN with the code and the pool cools down."""

    def __init__(self, code: str, message: str = "", instances: "list[Instance] | tuple" = ()) -> None:
        super().__init__(code, message)
        self.instances = list(instances)


@dataclass(frozen=True)
class Instance:
    id: str
    node: str | None            # TAG_NODE
    pool: str | None            # TAG_POOL
    state: str                  # pending | running | terminated
    launched_at: float
    instance_type: str = ""
    market: str = "on_demand"
    addr: str | None = None
    interrupted_at: float | None = None   # a spot interruption notice, when the provider has one
    impaired: str | None = None           # the provider's health checks it fails ("system", "instance")


class Provider(Protocol):
    name: str

    def launch(self, pool: Pool, nodes: list[str], token: str, *, each: bool = False) -> list[Instance]:
        """One instance per node (in order), tagged; idempotent for the same ``token``. All or
        nothing, or with ``each`` best effort (:class:`PartialLaunch` for a shortfall)."""
        ...

    def terminate(self, instance_ids: list[str]) -> list[str]:
        """End these instances if this cluster tagged them; returns the ids it ended."""
        ...

    def instances(self) -> list[Instance]:
        """This cluster's instances that are not terminated."""
        ...

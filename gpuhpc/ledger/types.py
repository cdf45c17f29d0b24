"""The ledger's records that the submit path and the quota decision share (stdlib only)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChargeRequest:
    """What a submission asks the ledger to hold (:func:`gpuhpc.ledger.hooks.reserve`)."""

    cluster: str
    user: str
    account: str | None
    partition: str | None
    qos: str | None
    gpu_type: str | None        # "h100" or a MIG profile "1g.10gb"; None = CPU-only
    gpus: int                   # total GPUs per array task (nodes × gpus per node)
    time_limit_s: int
    array_size: int = 1
    job_name: str = ""
    # for the max_share pricing policy's hold (gpuhpc.ledger.pricing.request_price): what one task
    # names of CPUs and memory (MB; 0: not named) and its nodes' shapes (pricing.NodeShape, one per node)
    cpus: int = 0
    mem_mb: int = 0
    shapes: tuple = ()

"""The hold at submit under the ``max_share`` pricing policy (issue 34 point 9's leftover): when the
request names its CPUs or memory (or asks for whole nodes), the hold is the largest share of its
partition's node that it names × the node's price, as ingest will charge it, not only its GPUs;
a request that names neither keeps the per-GPU worst case."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import QuotaExceeded, SlurmError
from gpuhpc.jobs import admission
from gpuhpc.jobs.spec import Resources
from gpuhpc.ledger import adjust, admin, hooks, pricing
from gpuhpc.slurm.parsers import NodeInfo

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
H100 = pricing.NodeShape(16, 64000, (("h100", 8),))
NODES = [NodeInfo("gpu-node1", "IDLE", 16, 0, 64000, 0, ("gpu", "all"), {"h100": 8}),
         NodeInfo("gpu-node2", "IDLE", 16, 0, 64000, 0, ("gpu", "all"), {"h100": 8}),
         NodeInfo("cpu-node1", "IDLE", 16, 0, 32000, 0, ("cpu", "all"), {})]


@pytest.fixture()
def book() -> pricing.PriceBook:
    b = pricing.PriceBook()
    b.add_price("h100", T0, rate="2.50")
    return b


def _price(book, mode=pricing.MAX_SHARE, **kw):
    args = {"gpu_type": "h100", "gpus": 1, "time_limit_s": 3600, "array_size": 1, "partition": "gpu", "qos": None,
            "at": T0, "mode": mode, "cpus": 16, "mem_mb": 8000, "shapes": (H100,), **kw}
    return pricing.request_price(book, **args)


def test_request_price_is_the_max_share_of_what_the_request_names(book):
    assert _price(book).amount == Decimal("20.000000")                         # all 16 CPUs: the node
    assert _price(book, cpus=2, mem_mb=32000).amount == Decimal("10.000000")   # half the memory
    assert _price(book, cpus=2).amount == Decimal("2.500000")                  # its GPU is the most
    assert _price(book, array_size=3).amount == Decimal("60.000000")           # each task a node of its own
    assert _price(book, gpus=2, cpus=32, shapes=(H100, H100)).amount == Decimal("40.000000")
    assert _price(book).gpu_hours == Decimal("1.000000")                       # GPU-hours: the GPUs
    # per_gpu, or no shape known: the worst case of its GPUs
    assert _price(book, mode=pricing.PER_GPU).amount == Decimal("2.500000")
    assert _price(book, shapes=()).amount == Decimal("2.500000")


class Client:
    def __init__(self, nodes=NODES):
        self.asked, self.nodes_ = 0, nodes

    def nodes(self):
        self.asked += 1
        if self.nodes_ is None:
            raise SlurmError("scontrol show node failed")
        return self.nodes_

    def cluster_name(self):
        return "local"


def test_share_request_from_the_job_spec():
    c = Client()
    assert admission.share_request(Resources(gpus=1, gpu_type="h100", partition="gpu"), c) == {}
    assert c.asked == 0                             # names neither: nothing asked of Slurm
    got = admission.share_request(Resources(nodes=2, gpus=1, gpu_type="h100", partition="gpu", cpus_per_task=4,
                                            tasks_per_node=2, mem="8G"), c)
    assert got == {"cpus": 16, "mem_mb": 16384, "shapes": (H100, H100)}
    assert admission.share_request(Resources(gpus=1, gpu_type="h100", partition="gpu", exclusive=True), c) == \
        {"cpus": 16, "mem_mb": 64000, "shapes": (H100,)}
    assert admission.share_request(Resources(partition="all", cpus_per_task=2), c) == {}     # mixed: no one shape
    assert admission.share_request(Resources(partition="gpu", mem="1G"), Client(None)) == {}  # Slurm did not answer


@pytest.fixture()
def ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("15"), url=ledger_url)
    return ledger_url


def _req(**kw):
    return hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="gpu", qos=None,
                               gpu_type="h100", gpus=1, time_limit_s=3600, **kw)


def test_the_hold_under_max_share_is_the_requests_share(ledger):
    # per_gpu (the default): the GPU alone, whatever the CPUs
    res = hooks.reserve(_req(cpus=16, mem_mb=8000, shapes=(H100,)))
    assert res.amount == Decimal("2.500000")
    res.release()
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=ledger)
    res = hooks.reserve(_req(cpus=4, mem_mb=8000, shapes=(H100,)))           # a quarter of the node: 5.00
    assert res.amount == Decimal("5.000000") and res.gpu_hours == Decimal("1.000000")
    res.release()
    with pytest.raises(QuotaExceeded, match=r"this job needs up to 20\.00"):
        hooks.reserve(_req(cpus=16, mem_mb=8000, shapes=(H100,)))             # the node: more than 15
    res = hooks.reserve(_req())                                              # names nothing: its GPU
    assert res.amount == Decimal("2.500000")
    res.release()


def test_submit_path_passes_the_request_to_the_hold(ledger, monkeypatch):
    """admission.reserve (what gpuhpc submit calls before sbatch) with a writable ledger."""
    monkeypatch.setattr(admission.getpass, "getuser", lambda: "alice")
    admin.set_quota("research", money=Decimal("100"), url=ledger)
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=ledger)
    r = Resources(gpus=1, gpu_type="h100", partition="gpu", account="research", time="1h", cpus_per_task=16)
    res = admission.reserve(r, "train", Client())
    assert res is not None and res.amount == Decimal("20.000000")
    res.release()
    res = admission.reserve(Resources(gpus=1, gpu_type="h100", partition="gpu", account="research", time="1h"),
                            "train", Client())
    assert res.amount == Decimal("2.500000")
    res.release()


def test_a_sweeps_hold_under_max_share_is_its_trials_share(ledger, monkeypatch):
    """A sweep's holds (gpuhpc/sweeps/holds.py: the check before its arrays and each array's hold)
    take the share its trials name, as a job's hold does: 16 CPUs of a 16-CPU h100 node is the
    node's price, 20.00 an hour, which a 15.00 budget refuses; a trial naming only its GPU holds 2.50."""
    from gpuhpc.sweeps import holds
    from gpuhpc.sweeps.spec import SweepSpec

    monkeypatch.setattr(holds.getpass, "getuser", lambda: "alice")
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=ledger)
    res = {"gpus": 1, "gpu_type": "h100", "partition": "gpu", "account": "research", "time": "1h"}
    base = {"name": "s", "command": "echo {x}", "parameters": {"x": {"values": [1, 2]}}, "metric": {"name": "loss"},
            "method": "grid"}
    heavy = SweepSpec.from_mapping({**base, "resources": {**res, "cpus_per_task": 16}})
    light = SweepSpec.from_mapping({**base, "resources": res})
    c = Client()
    share = holds.share_of(heavy, c)
    assert share == {"cpus": 16, "mem_mb": 0, "shapes": (H100,)} and c.asked == 1
    assert holds.share_of(light, c) == {} and c.asked == 1           # names neither: nothing asked
    admin.set_quota("research", money=Decimal("100"), url=ledger)
    hold = hooks.reserve(holds.charge_request(heavy, 1, "local", share=share))      # an array's hold
    assert hold.amount == Decimal("20.000000")
    hold.release()
    admin.set_quota("research", money=Decimal("15"), url=ledger)
    with pytest.raises(QuotaExceeded, match=r"0 of the sweep's 1 trials would fit"):
        holds.check_quota(heavy, 1, "local", ledger, share)
    holds.check_quota(light, 2, "local", ledger, holds.share_of(light, c))     # 2 × 2.50 fits

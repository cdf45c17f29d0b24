"""Fair prices on shared nodes and MIG (issue 34 point 9): GPU-hours weigh a MIG slice by its
fraction of a full GPU (at admission and ingest), and the ``max_share`` pricing policy charges the
largest of a run's shares of its node's GPUs, CPUs and memory (Slurm's MAX_TRES). The local
cluster's version: tests/integration/ledger/test_fair_prices.py."""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from decimal import Decimal
from fractions import Fraction

import pytest
from sqlalchemy import select

from gpuhpc.cli.main import main
from gpuhpc.errors import LedgerError, QuotaExceeded
from gpuhpc.ledger import adjust, admin, check, db, hooks, ingest, pricing
from gpuhpc.ledger.orm import UsageRecord
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.parsers import NodeInfo
from gpuhpc.transport import CommandResult

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
NOW = dt.datetime.now(UTC)
H100 = pricing.NodeShape(16, 64000, (("h100", 8),))
MIG = pricing.NodeShape(16, 64000, (("1g.10gb", 7), ("3g.40gb", 2)))
NODES = [NodeInfo("gpu-node1", "IDLE", 16, 0, 64000, 0, ("gpu", "all"), {"h100": 8}),
         NodeInfo("gpu-node2", "IDLE", 16, 0, 64000, 0, ("gpu", "all"), {"h100": 8}),
         NodeInfo("mig-node1", "IDLE", 16, 0, 64000, 0, ("mig", "all"), {"1g.10gb": 7, "3g.40gb": 2}),
         NodeInfo("cpu-node1", "IDLE", 16, 0, 32000, 0, ("cpu", "all"), {})]


def ts(minutes: float) -> str:
    base = NOW.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    return (base + dt.timedelta(minutes=minutes)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture()
def book() -> pricing.PriceBook:
    b = pricing.PriceBook()
    b.add_price("h100", T0, rate="2.50")
    b.add_price("1g.10gb", T0, base="h100", fraction="1/7")
    b.add_price("3g.40gb", T0, base="h100", fraction="3/7")
    b.add_multiplier("partition", "gpu", T0, "0.6")
    return b


# ------------------------------------------------------------------ MIG slices in GPU-hours
def test_gpu_weight_of_mig_profiles():
    assert pricing.gpu_weight("1g.10gb") == Fraction(1, 7)
    assert pricing.gpu_weight("3g.40gb") == Fraction(3, 7)
    assert pricing.gpu_weight("7g.80gb") == 1 and pricing.gpu_weight("1g.10gb+me") == Fraction(1, 7)
    assert pricing.gpu_weight("2g.12gb") == Fraction(1, 2)          # A30: four slices
    assert pricing.gpu_weight("h100") == 1 and pricing.gpu_weight(None) == 1 and pricing.gpu_weight("gpu") == 1


def test_mig_slice_hours_are_its_fraction_of_a_gpu_hour(book):
    p = pricing.price_usage(book, gpu_type="1g.10gb", gpus=7, seconds=3600, partition=None, qos=None, at=T0)
    assert p.gpu_hours == Decimal("1.000000") and p.amount == Decimal("2.500000") and p.rate == Decimal("2.500000")
    wc = pricing.worst_case(book, gpu_type="3g.40gb", gpus=1, time_limit_s=7 * 3600, array_size=2, partition=None,
                            qos=None, at=T0)
    assert wc.gpu_hours == Decimal("6.000000")                       # 2 × 7 h × 3/7


@pytest.mark.parametrize("gpu_type,gpus,seconds,partition", [
    ("1g.10gb", 1, 1, None), ("1g.10gb", 3, 4000, "gpu"), ("3g.40gb", 2, 3599, None), ("h100", 8, 61, "gpu"),
    (None, 0, 100, None), ("a100", 1, 60, None)])
def test_price_cache_matches_price_usage(book, gpu_type, gpus, seconds, partition):
    want = pricing.price_usage(book, gpu_type=gpu_type, gpus=gpus, seconds=seconds, partition=partition, qos=None,
                               at=T0)
    assert pricing.PriceCache(book).price(gpu_type, gpus, seconds, partition, None, T0) == want


def test_gpu_hour_quota_admits_mig_slices_by_fraction(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_quota("research", gpu_hours=Decimal("2"), url=ledger_url)

    def req(gpu_type, gpus, hours):
        return hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="mig", qos=None,
                                   gpu_type=gpu_type, gpus=gpus, time_limit_s=hours * 3600)

    # 7 × 1g.10gb for 2 h is 2 GPU-hours (14 before: refused); one more slice-hour does not fit
    assert hooks.reserve(req("1g.10gb", 7, 2)).gpu_hours == Decimal("2.000000")
    with pytest.raises(QuotaExceeded):
        hooks.reserve(req("1g.10gb", 1, 1))


def test_ingest_counts_mig_runs_by_fraction(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_price("1g.10gb", base="h100", fraction="1/7", effective_from=T0, url=ledger_url)
    admin.set_quota("research", gpu_hours=Decimal("100"), url=ledger_url)
    ingest.ingest_rows(rows(row("800", "COMPLETED", ts(0), ts(60), 3600, gpus=7, gpu_type="1g.10gb",
                                partition="mig")), url=ledger_url)
    (st,) = admin.quota_status("research", url=ledger_url)
    assert st.used_gpu_hours == Decimal("1.000000") and st.used_money == Decimal("2.500000")
    # a reprice at the same per-slice rate books nothing (the slice's GPU-hours are not its device-hours)
    booked = adjust.reprice("1g.10gb", "0.357143", since=NOW - dt.timedelta(days=1), until=NOW, reason="same rate",
                            dry_run=True, url=ledger_url)
    assert abs(booked.amount) <= Decimal("0.000010"), booked.as_dict()


# ------------------------------------------------------------------ max_share
def test_max_share_charges_the_largest_share_of_the_node(book):
    def price(cpus, mem, gpus={"h100": 1}, partition=None, shapes=(H100,)):
        return pricing.max_share_price(book, gpus=gpus, cpus=cpus, mem_mb=mem, shapes=list(shapes), seconds=3600,
                                       partition=partition, qos=None, at=T0)

    assert price(2, 8000).amount == Decimal("2.500000")              # 1/8 of everything: its GPU
    assert price(16, 8000).amount == Decimal("20.000000")            # all CPUs: the whole node (8 × 2.50)
    assert price(2, 32000).amount == Decimal("10.000000")            # half the memory: half the node
    assert price(8, 1000, gpus={}).amount == Decimal("10.000000")    # CPU-only on a GPU node: half of it
    assert price(16, 8000, partition="gpu").amount == Decimal("12.000000")   # × the partition's 0.6
    p = price(16, 8000)
    assert p.gpu_hours == Decimal("1.000000") and p.rate == Decimal("20.000000")   # GPU-hours: the GPUs held
    # two nodes: the share of both, the same as one node's (32 CPUs of 2 × 16 = the 2 nodes)
    assert price(32, 8000, gpus={"h100": 2}, shapes=(H100, H100)).amount == Decimal("40.000000")
    # a MIG node's price is its slices': 7/7 + 2 × 3/7 of an h100 = 13/7 × 2.50
    assert price(16, 1000, gpus={"1g.10gb": 1}, shapes=(MIG,)).amount == Decimal("4.642857")
    # a node without GPUs costs nothing
    assert price(16, 32000, gpus={}, shapes=(pricing.NodeShape(16, 32000),)).amount == Decimal("0.000000")


def test_price_cache_run_matches_max_share_price(book):
    cache = pricing.PriceCache(book, mode=pricing.MAX_SHARE, nodes=pricing.fleet(NODES))
    for gpus, cpus, mem, part in [({"h100": 1}, 16, 8000, "gpu"), ({"h100": 3}, 4, 60000, "all"),
                                  ({"1g.10gb": 2}, 10, 100, "mig"), ({}, 8, 1000, "gpu"), ({"h100": 1}, 1, 10, "gpu")]:
        shapes = pricing.fleet(NODES).shapes_of("", part, gpus)
        for secs in (1, 59, 3601):
            want = pricing.max_share_price(book, gpus=gpus, cpus=cpus, mem_mb=mem, shapes=shapes, seconds=secs,
                                           partition=part, qos=None, at=T0)
            assert cache.price_run(gpus, cpus, mem, "", secs, part, None, T0) == want


def test_fleet_picks_the_shape_a_run_is_shared_from():
    f = pricing.fleet(NODES)
    assert f.shapes_of("", "gpu", ["h100"]) == [H100]
    assert f.shapes_of("", "mig", []) == [MIG]
    assert f.shapes_of("", "all", ["1g.10gb"]) == [MIG]               # mixed partition: by the GPU type
    assert f.shapes_of("", "all", []) is None                         # a CPU-only run there: no single shape
    assert f.shapes_of("gpu-node[1-2]", "all", []) == [H100, H100]    # sacct named the nodes
    assert f.shapes_of("gpu-node9", "gpu", ["h100"]) == [H100]        # an unknown node: the partition decides


def test_alloc_tres_cpus_and_memory():
    assert pricing.alloc_cpus_mem({"cpu": "16", "mem": "62.50G"}) == (16, Fraction(64000))
    assert pricing.alloc_cpus_mem({"cpu": "2", "mem": "8000M"}) == (2, Fraction(8000))
    assert pricing.alloc_cpus_mem({"mem": "1T"}) == (0, Fraction(1024 * 1024))
    assert pricing.alloc_cpus_mem({"cpu": "x", "mem": "junk"}) == (0, Fraction(0))


def test_unknown_pricing_mode_is_refused(book):
    with pytest.raises(LedgerError, match="policy set pricing per_gpu"):
        pricing.PriceCache(book, mode="cheap")


def _share_rows(url):
    """Two runs of 1 h with one h100 each: one with all 16 CPUs, one with 2; a CPU-only run of 8 CPUs."""
    data = rows(row("900", "COMPLETED", ts(0), ts(60), 3600, gpus=1),
                row("901", "COMPLETED", ts(0), ts(60), 3600, gpus=1),
                row("902", "COMPLETED", ts(0), ts(60), 3600, gpus=0))
    tres = {"900": {"cpu": "16", "mem": "8000M"}, "901": {"cpu": "2", "mem": "8000M"}, "902": {"cpu": "8", "mem": "1000M"}}
    return [replace(r, alloc_tres={**r.alloc_tres, **tres[r.job_id]}) for r in data]


def _amounts(url):
    with db.session_scope(url) as s:
        return {u.job_id: (Decimal(u.amount), Decimal(u.gpu_hours)) for u in s.scalars(select(UsageRecord))}


@pytest.fixture()
def shared_ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("1000"), url=ledger_url)
    return ledger_url


def test_ingest_per_gpu_by_default(shared_ledger):
    ingest.ingest_rows(_share_rows(shared_ledger), url=shared_ledger, nodes=pricing.fleet(NODES))
    assert _amounts(shared_ledger) == {"900": (Decimal("2.5"), Decimal(1)), "901": (Decimal("2.5"), Decimal(1)),
                                       "902": (Decimal(0), Decimal(0))}


def test_ingest_max_share_policy(shared_ledger):
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=shared_ledger)
    ingest.ingest_rows(_share_rows(shared_ledger), url=shared_ledger, nodes=pricing.fleet(NODES))
    # the row builder's partition is "gpu" (no multiplier here): the node is 8 × 2.50 = 20.00 an hour
    assert _amounts(shared_ledger) == {"900": (Decimal("20"), Decimal(1)), "901": (Decimal("2.5"), Decimal(1)),
                                       "902": (Decimal("10"), Decimal(0))}
    (st,) = admin.quota_status("research", url=shared_ledger)
    assert st.used_money == Decimal("32.500000")


def test_policy_cli(ledger_url, capsys):
    assert main(["ledger", "policy", "set", "pricing", "max_share"]) == 0
    assert main(["ledger", "policy", "list", "--json"]) == 0
    pol = {p["name"]: p["value"] for p in json.loads(capsys.readouterr().out)}
    assert pol["pricing"] == "max_share"
    assert main(["ledger", "policy", "set", "pricing", "cheapest"]) == 2
    assert "per_gpu, max_share" in capsys.readouterr().err


# ------------------------------------------------------------------ the Slurm mirror
def test_max_share_weights_for_slurm(book):
    f = pricing.fleet(NODES)
    parts = {p: list(ns) for p, ns in f.partitions.items()}
    w = pricing.max_share_weights(book, T0, parts, f.shapes, 1_000_000)
    # gpu: 8 × 2.50 × 0.6 = 12.00 an hour: per CPU 12/16, per MB 12/64000 (in millionths)
    assert w["gpu"] == "CPU=750000,Mem=187.5,GRES/gpu=1500000"
    # mig: 13/7 × 2.50; GRES/gpu at the cheapest slice, the dearer one at its whole rate (MAX_TRES takes the max)
    assert w["mig"] == "CPU=290178.571429,Mem=72.544643,GRES/gpu=357142.857143,GRES/gpu:3g.40gb=1071428.571429"
    assert "all" not in w and "cpu" not in w                        # mixed shapes; no priced GPU


def test_flags_difference():
    assert pricing.flags_difference(pricing.MAX_SHARE, "") == ("(none)", "MAX_TRES (pricing policy max_share)")
    assert pricing.flags_difference(pricing.MAX_SHARE, "MAX_TRES,NO_FAIR_TREE") is None
    assert pricing.flags_difference(pricing.PER_GPU, "") is None
    assert pricing.flags_difference(pricing.PER_GPU, "MAX_TRES") == ("MAX_TRES", "no MAX_TRES (pricing policy per_gpu)")


class SlurmStandIn:
    """A Runner answering ``ledger check``'s commands: no budgets, the partitions' weights, PriorityFlags."""

    def __init__(self, flags: str, weights: dict[str, str]):
        self.flags, self.weights, self.is_local = flags, weights, False

    def run(self, argv, *, input=None, timeout=None, env=None):
        out = ""
        if argv == ["sinfo", "--version"]:
            out = "slurm 22.05.8\n"
        elif argv == ["scontrol", "show", "config"]:
            out = f"ClusterName = lab\nPriorityFlags = {self.flags}\n"
        elif argv == ["scontrol", "--oneliner", "show", "partition"]:
            out = "".join(f"PartitionName={p} Nodes=x State=UP TRESBillingWeights={w}\n" for p, w in self.weights.items())
        elif argv == ["scontrol", "--oneliner", "show", "node"]:
            out = "".join(f"NodeName={n.name} CPUTot={n.cpus} RealMemory={n.real_memory_mb} "
                          f"Gres={','.join(f'gpu:{t}:{c}' for t, c in n.gpus_total.items()) or '(null)'} State=IDLE "
                          f"Partitions={','.join(n.partitions)}\n" for n in NODES)
        return CommandResult(tuple(argv), 0, out, "")


def test_check_reports_slurm_billing_per_gpu_under_max_share(ledger_url):
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    per_gpu = {"gpu": "CPU=0,GRES/gpu=2500000", "cpu": "CPU=0"}
    res = check.check(SlurmClient(SlurmStandIn("", per_gpu)), url=ledger_url, now=NOW)
    assert res.in_step, res.as_dict()                                # per_gpu: Slurm bills as the ledger does
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=ledger_url)
    res = check.check(SlurmClient(SlurmStandIn("", per_gpu)), url=ledger_url, now=NOW)
    lines = sorted(d.line() for d in res.differences)
    assert res.counts()["pricing"] == 1 and res.counts()["weights"] == 1, lines
    assert "PriorityFlags: (none) in slurmctld, the ledger's pricing needs MAX_TRES" in lines[0]
    assert "partition gpu: TRESBillingWeights CPU=0,GRES/gpu=2500000 in slurmctld, the price book gives " \
           "CPU=1250000,Mem=312.5,GRES/gpu=2500000" in lines[1]
    mirrored = {"gpu": "CPU=1250000,Mem=312.5,GRES/gpu=2500000", "cpu": "CPU=0"}
    res = check.check(SlurmClient(SlurmStandIn("MAX_TRES", mirrored)), url=ledger_url, now=NOW)
    assert res.in_step, res.as_dict()


def test_slurm_mirror_of_a_gpu_hour_quota_with_mig_runs(ledger_url):
    """Slurm's gres/gpu counts a slice as a whole GPU: sync-slurm raises GrpTRESMins by what
    Slurm counts beyond the ledger, and ledger check compares Slurm's usage with the ledger's plus it."""
    from gpuhpc.ledger import slurm_sync

    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", gpu_hours=Decimal("10"), url=ledger_url)
    # 7 slice-hours of 1g.10gb (1 GPU-hour in the ledger, 7 in Slurm) and 1 h100-hour
    ingest.ingest_rows(rows(row("810", "COMPLETED", ts(0), ts(60), 3600, gpus=7, gpu_type="1g.10gb",
                                partition="mig"),
                            row("811", "COMPLETED", ts(0), ts(60), 3600, gpus=1)), url=ledger_url)
    (st,) = admin.quota_status("research", url=ledger_url)
    assert st.used_gpu_hours == Decimal("2.000000")
    (plan,) = slurm_sync.plan(url=ledger_url)
    assert plan.limits["gres/gpu"] == (10 + 6) * 60 - slurm_sync.HEADROOM_MINUTES
    with db.session_scope(ledger_url) as s:
        assert check.without_adjustments(s, st).used_gpu_hours == Decimal("8.000000")   # = Slurm's 7 + 1


def test_price_book_file_sets_the_pricing_policy_and_list_shows_slice_weights(ledger_url, tmp_path, capsys):
    book = tmp_path / "prices.yaml"
    book.write_text('effective_from: 2026-01-01\ngpus:\n  h100: "2.50"\n  "1g.10gb": {of: h100, fraction: "1/7"}\n'
                    "pricing: max_share\n")
    assert main(["ledger", "price", "load", str(book)]) == 0
    assert {p["name"]: p["value"] for p in adjust.list_policies(url=ledger_url)}["pricing"] == "max_share"
    capsys.readouterr()
    assert main(["ledger", "price", "list", "--json"]) == 0
    weights = {p["name"]: p.get("gpu_hours_per_hour") for p in json.loads(capsys.readouterr().out)}
    assert weights == {"h100": "1", "1g.10gb": "1/7"}
    assert main(["ledger", "price", "list"]) == 0
    assert "(1/7 GPU-h an hour)" in capsys.readouterr().out
    # a bad policy in the file is refused before anything is written (exit 2, naming the field)
    book.write_text('gpus:\n  a100: "1.60"\npricing: cheapest\n')
    assert main(["ledger", "price", "load", str(book)]) == 2
    assert "pricing: " in capsys.readouterr().err
    assert "a100" not in {p["name"] for p in admin.list_prices(url=ledger_url)}

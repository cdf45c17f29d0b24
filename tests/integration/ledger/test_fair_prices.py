"""Fair prices on the local cluster (issue 34 point 9): jobs sharing a GPU node and a MIG slice,
ingested under the ``max_share`` pricing policy, each charged what its sacct ``AllocTRES`` and its
node's size (``scontrol show node``) say: the largest of its shares of the node's GPUs (by price),
CPUs and memory × the node's price; GPU-hours count the MIG slice as 1/7 of a GPU. The pure
arithmetic: tests/unit/ledger/test_fair_price_arithmetic.py."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction

import pytest
from sqlalchemy import select

from gpuhpc.ledger import adjust, admin, check, db, ingest, pricing
from gpuhpc.ledger.orm import UsageRecord
from gpuhpc.slurm import parsers
from polling import wait_for

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
ACCOUNT = "research"
RATE = {"h100": Fraction(5, 2), "1g.10gb": Fraction(5, 14), "3g.40gb": Fraction(15, 14)}   # 1/7 and 3/7 of an h100


def _runs(client, job_id: str) -> list[parsers.AcctRow]:
    return [r for r in client.accounting(job_ids=[job_id], duplicates=True) if ingest.parse_time(r.start)]


def _finished(client, job_id: str) -> bool:
    rows = _runs(client, job_id)
    return bool(rows) and rows[-1].state.state.is_finished


def _expected(r: parsers.AcctRow, node: parsers.NodeInfo) -> tuple[Decimal, Decimal]:
    """(amount, GPU-hours) from sacct's AllocTRES and the node's size, worked out here."""
    hours = Fraction(r.elapsed_s, 3600)
    gpus = {t: n for t, n in r.gpus.items() if n}
    node_rate = sum(n * RATE[t] for t, n in node.gpus_total.items())
    gpu_rate = sum(n * RATE[t] for t, n in gpus.items())
    mem = Fraction(r.alloc_tres["mem"].removesuffix("M"))
    share = max(gpu_rate / node_rate, Fraction(int(r.alloc_tres["cpu"]), node.cpus), mem / node.real_memory_mb)
    weight = {"h100": Fraction(1), "1g.10gb": Fraction(1, 7)}
    return (pricing.to_decimal(share * node_rate * hours),
            pricing.to_decimal(sum(n * weight[t] for t, n in gpus.items()) * hours))


def test_shared_node_and_mig_slice_priced_by_largest_share(sqlite_url, client, jobs):
    url = sqlite_url
    db.upgrade(url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=url)
    admin.set_price("1g.10gb", base="h100", fraction="1/7", effective_from=T0, url=url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=url)
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=url)
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)

    common = ["-t", "2", "-A", ACCOUNT, "-o", "/dev/null", "-N", "1"]
    shapes = {  # what each job holds, and which share decides its price
        "cpu-heavy": ["-p", "gpu", "--gres=gpu:h100:1", "-c", "16", "--mem=8000"],   # all CPUs: the whole node
        "gpu-bound": ["-p", "gpu", "--gres=gpu:h100:1", "-c", "1", "--mem=4000"],    # its GPU (1/8 > 1/16)
        "mig-slice": ["-p", "mig", "--gres=gpu:1g.10gb:1", "-c", "4", "--mem=4000"],  # 4 of 16 CPUs > 1/13 by price
    }
    ids = {}
    for name, extra in shapes.items():
        ids[name] = client.submit_script("#!/bin/bash\nsleep 3\n", extra=[*extra, *common, "-J", f"gpuhpc-fair-{name}"])
        jobs.append(ids[name])
    wait_for(lambda: all(_finished(client, j) for j in ids.values()), 240,
             lambda: f"the three jobs to finish in sacct ({ {n: [r.state.raw for r in _runs(client, j)] for n, j in ids.items()} })",
             interval=1)
    rows = {n: _runs(client, j) for n, j in ids.items()}
    assert all(len(rs) == 1 and rs[0].state.state.value == "COMPLETED" for rs in rows.values()), rows

    # what sacct says each held (AllocTRES)
    alloc = {n: rs[0].alloc_tres for n, rs in rows.items()}
    assert (alloc["cpu-heavy"]["cpu"], alloc["cpu-heavy"]["gres/gpu:h100"]) == ("16", "1"), alloc
    assert (alloc["gpu-bound"]["cpu"], alloc["gpu-bound"]["gres/gpu:h100"]) == ("1", "1"), alloc
    assert (alloc["mig-slice"]["cpu"], alloc["mig-slice"]["gres/gpu:1g.10gb"]) == ("4", "1"), alloc

    # ingest as `gpuhpc ledger ingest` does (the nodes' sizes asked of scontrol by the ingest itself)
    acct_rows = [r for r in client.job_runs(since, job_ids=list(ids.values())) if r.array_job_id in ids.values()]
    res = ingest.ingest_rows(acct_rows, url=url)
    assert res.runs_new == 3 and res.unpriced_runs == 0

    nodes = {n.name: n for n in client.nodes()}
    with db.session_scope(url) as s:
        stored = {u.job_id: u for u in s.scalars(select(UsageRecord))}
        got = {n: (Decimal(stored[j].amount), Decimal(stored[j].gpu_hours)) for n, j in ids.items()}
    want = {n: _expected(rs[0], nodes[rs[0].nodelist]) for n, rs in rows.items()}
    assert got == want, (got, want, {n: (rs[0].elapsed_s, rs[0].nodelist) for n, rs in rows.items()})
    # the whole node for the CPU-heavy job (8 GPUs × 2.50 an hour), one GPU for the other
    el = {n: Fraction(rs[0].elapsed_s, 3600) for n, rs in rows.items()}
    assert got["cpu-heavy"][0] == pricing.to_decimal(20 * el["cpu-heavy"])
    assert got["gpu-bound"][0] == pricing.to_decimal(Fraction(5, 2) * el["gpu-bound"])
    # the MIG node's price is its slices' (7 × 1/7 + 2 × 3/7 of an h100); the slice is 1/7 GPU-hour an hour
    assert got["mig-slice"] == (pricing.to_decimal(Fraction(1, 4) * Fraction(13, 7) * Fraction(5, 2) * el["mig-slice"]),
                                pricing.to_decimal(el["mig-slice"] / 7))

    # the local cluster bills per GPU (no PriorityFlags=MAX_TRES, CPU=0): ledger check says so
    lines = [d.line() for d in check.check(client, url=url).differences]
    assert any(line.startswith("PriorityFlags: ") and "MAX_TRES (pricing policy max_share)" in line
               for line in lines), lines
    assert any(line.startswith("partition gpu: TRESBillingWeights CPU=0,") and "CPU=1250000,Mem=312.5" in line
               for line in lines), lines

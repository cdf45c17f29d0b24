"""``gpuhpc ledger reprice`` under the ``max_share`` pricing policy (issue 34 point 9's leftover):
a run is priced again with the function ingest prices it with (the largest share of its node),
not by its GPUs alone: a run that held all of an h100 node's CPUs, and a CPU-only run there, get
the corrected node price; each day's part of a run across midnight its own; a second reprice
books nothing; a MIG run on a node without the type is left alone. (Per GPU:
tests/unit/ledger/test_ledger_adjust.py.)"""
from __future__ import annotations

import datetime as dt
from dataclasses import replace
from decimal import Decimal

import pytest
from sqlalchemy import select

from gpuhpc.cli.main import main
from gpuhpc.errors import LedgerError
from gpuhpc.ledger import adjust, admin, db, ingest, pricing
from gpuhpc.ledger.orm import Charge, UsageRecord
from gpuhpc.slurm.parsers import NodeInfo
from gpuhpc.slurm.state import SlurmState

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
NOW = dt.datetime.now(UTC)
MIDNIGHT = NOW.replace(hour=0, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)     # yesterday's
NODES = [NodeInfo("gpu-node1", "IDLE", 16, 0, 64000, 0, ("gpu", "all"), {"h100": 8}),
         NodeInfo("mig-node1", "IDLE", 16, 0, 64000, 0, ("mig", "all"), {"1g.10gb": 7, "3g.40gb": 2}),
         NodeInfo("mixed-node1", "IDLE", 16, 0, 64000, 0, ("mixed",), {"h100": 4, "1g.10gb": 7})]


def ts(t: dt.datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")


A, B = MIDNIGHT - dt.timedelta(hours=3), MIDNIGHT - dt.timedelta(hours=2)     # 1 h, the day before yesterday
C, D = MIDNIGHT - dt.timedelta(minutes=30), MIDNIGHT + dt.timedelta(minutes=30)   # 1 h across midnight


def _runs():
    """900: 1 h100 and all 16 CPUs (the node: 20.00/h); 901: 1 h100, 2 CPUs (its GPU: 2.50/h);
    902: CPU-only, 8 CPUs (half the node: 10.00/h); 903: the same as 900 across midnight; 904: a
    1g.10gb slice with 2 of the MIG node's 16 CPUs (its 13/7 × 2.50 node: 2/16 of it); 905: CPU-only
    with all 16 CPUs of a node of 4 h100 and 7 1g.10gb (12.50/h)."""
    data = rows(row("900", "COMPLETED", ts(A), ts(B), 3600, gpus=1),
                row("901", "COMPLETED", ts(A), ts(B), 3600, gpus=1),
                row("902", "COMPLETED", ts(A), ts(B), 3600, gpus=0),
                row("903", "COMPLETED", ts(C), ts(D), 3600, gpus=1),
                row("904", "COMPLETED", ts(A), ts(B), 3600, gpus=1, gpu_type="1g.10gb", partition="mig"),
                row("905", "COMPLETED", ts(A), ts(B), 3600, gpus=0, partition="mixed"))
    tres = {"900": ("16", "8000M"), "901": ("2", "8000M"), "902": ("8", "1000M"), "903": ("16", "8000M"),
            "904": ("2", "1000M"), "905": ("16", "1000M")}
    where = {"904": "mig-node1", "905": "mixed-node1"}
    return [replace(r, alloc_tres={**r.alloc_tres, "cpu": tres[r.job_id][0], "mem": tres[r.job_id][1]},
                    nodelist=where.get(r.job_id, "gpu-node1")) for r in data]


def _held(data):
    return [r for v in ingest.group_jobs(data) for r in v.runs]


@pytest.fixture()
def shared(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_price("1g.10gb", base="h100", fraction="1/7", effective_from=T0, url=ledger_url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("1000"), url=ledger_url)
    adjust.set_policy(pricing.POLICY, pricing.MAX_SHARE, url=ledger_url)
    ingest.ingest_rows(_runs(), url=ledger_url, nodes=pricing.fleet(NODES))
    return ledger_url


def _net(url) -> dict[str, Decimal]:
    """What each job's charges net to, corrections included."""
    out: dict[str, Decimal] = {}
    with db.session_scope(url) as s:
        for job, amount in s.execute(select(UsageRecord.job_id, Charge.amount).join(Charge,
                                                                                     Charge.usage_id == UsageRecord.id)):
            out[job] = out.get(job, Decimal(0)) + Decimal(amount)
    return {j: a.quantize(Decimal("0.000001")) for j, a in sorted(out.items())}


def _reprice(url, *, dry_run=False, data=None, **kw):
    data = _runs() if data is None else data
    return adjust.reprice("h100", "2.00", since=A - dt.timedelta(days=1), until=NOW, reason="h100 was 2.50",
                          dry_run=dry_run, url=url, runs=_held(data), nodes=pricing.fleet(NODES), **kw)


def test_max_share_reprice_prices_the_node_share_as_ingest_does(shared):
    assert _net(shared) == {"900": Decimal("20.000000"), "901": Decimal("2.500000"), "902": Decimal("10.000000"),
                            "903": Decimal("20.000000"), "904": Decimal("0.580357"), "905": Decimal("12.500000")}
    dry = _reprice(shared, dry_run=True)
    # at 2.00: 900 16.00 (-4), 901 2.00 (-0.50), 902 8.00 (-2), 903 16.00 (-4); 904's node has no h100;
    # 905's node 4 × 2.00 + its slices still at 1/7 of 2.50 (another type): 10.50 (-2)
    assert dry.amount == Decimal("-12.500000") and dry.skipped == 0, dry.as_dict()
    booked = _reprice(shared)
    assert booked.amount == Decimal("-12.500000") and booked.charges == 6       # 903: one part a day
    assert _net(shared) == {"900": Decimal("16.000000"), "901": Decimal("2.000000"), "902": Decimal("8.000000"),
                            "903": Decimal("16.000000"), "904": Decimal("0.580357"), "905": Decimal("10.500000")}
    (st,) = admin.quota_status("research", url=shared)
    assert st.used_money == Decimal("53.080357")
    with db.session_scope(shared) as s:          # 903's parts: half an hour each side of midnight
        parts = sorted((at, Decimal(m)) for at, m in s.execute(
            select(Charge.bucket_at, Charge.amount).join(UsageRecord, Charge.usage_id == UsageRecord.id)
            .where(UsageRecord.job_id == "903", Charge.kind == "correction")))
    assert [m for _, m in parts] == [Decimal("-2.000000"), Decimal("-2.000000")], parts
    assert parts[1][0] == MIDNIGHT
    again = _reprice(shared)
    assert (again.charges, again.amount) == (0, Decimal(0))


def test_max_share_reprice_of_a_slice_type_reprices_the_mig_nodes_share(shared):
    """1g.10gb at 0.50 a slice-hour: run 904's node is 7 × 0.50 + 2 × 3/7 × 2.50 an hour, 2/16 of it
    (3g.40gb keeps its price: another type)."""
    booked = adjust.reprice("1g.10gb", "0.50", since=A - dt.timedelta(days=1), until=NOW, reason="slice price",
                            url=shared, runs=_held(_runs()), nodes=pricing.fleet(NODES))
    want = (7 * Decimal("0.5") + 2 * Decimal("2.5") * 3 / 7) * 2 / 16
    assert _net(shared)["904"] == want.quantize(Decimal("0.000001"))
    # and 905's mixed node: 4 × 2.50 + 7 × 0.50; the h100 runs on h100-only nodes are left alone
    assert _net(shared)["905"] == Decimal("13.500000") and booked.charges == 2


def test_max_share_reprice_needs_what_the_runs_held(shared):
    with pytest.raises(LedgerError, match="max_share: repricing needs what each run held"):
        adjust.reprice("h100", "2.00", since=A - dt.timedelta(days=1), until=NOW, reason="x", url=shared)
    # a run sacct no longer has is left alone and counted
    booked = _reprice(shared, data=[r for r in _runs() if r.job_id != "902"])
    assert booked.skipped == 1 and _net(shared)["902"] == Decimal("10.000000")


def test_a_refunded_run_gets_nothing_under_max_share(shared):
    adjust.set_policy("node_fail_refund", "on", url=shared)
    data = [replace(r, state=SlurmState.parse("NODE_FAIL")) if r.job_id == "900" else r for r in _runs()]
    ingest.ingest_rows(data, url=shared, nodes=pricing.fleet(NODES))
    assert _net(shared)["900"] == Decimal("0.000000")
    _reprice(shared, data=data)
    assert _net(shared)["900"] == Decimal("0.000000")


def test_cli_reprice_under_max_share_reads_the_runs_from_slurm(shared, monkeypatch, capsys):
    """The command reads sacct's runs of the window and the nodes (here a stand-in client)."""
    from gpuhpc.slurm import client as slurm_client

    seen = []

    class Client:
        def job_runs(self, since, until=None, job_ids=()):
            seen.append((since, until))
            return _runs()

        def nodes(self):
            return NODES

    monkeypatch.setattr(slurm_client, "SlurmClient", Client)
    since = (A - dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    assert main(["ledger", "reprice", "--gpu-type", "h100", "--rate", "2", "--since", since, "--until",
                 "2099-01-01", "--reason", "typo", "--dry-run", "--json"]) == 0
    assert '"amount": "-12.500000"' in capsys.readouterr().out and len(seen) == 1

"""Elastic instance cost charged to accounts, reconciled with instance-hours (issue 34.10, last part;
gpuhpc.ledger.instance_cost): exact figures for two instances of one pool and an orphan of another,
three jobs of two accounts (one on both instances, one after a gap), a period that cuts an
instance, the spread policy, rounding that still adds up, and the ledger path from the journal and
the usage records."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.errors import UserInputError
from gpuhpc.ledger import ingest, instances
from gpuhpc.ledger import instance_cost as ic

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T = dt.datetime(2026, 11, 10, tzinfo=UTC)


def at(s: float) -> dt.datetime:
    return T + dt.timedelta(seconds=s)


def life(iid: str, node: str, pool: str, price: str, launched: float, registered: float | None = None,
         last_busy: float | None = None, suspend: float | None = None, ended: float | None = None,
         orphan: bool = False) -> ic.Life:
    row_ = instances.InstanceUsage(cluster="c", instance_id=iid, node=node, pool=pool, instance_type="g5",
                                   market="on_demand", launched_at=at(launched),
                                   registered_at=None if registered is None else at(registered),
                                   last_busy_at=None if last_busy is None else at(last_busy),
                                   suspend_at=None if suspend is None else at(suspend), ended_at=at(ended),
                                   orphan=orphan, price_per_hour=Decimal(price), on_demand_price_per_hour=Decimal(price))
    return ic.Life("c", iid, node, pool, "g5", "on_demand", Fraction(Decimal(price)), instances.spans(row_, at(99999)))


# i-1 on n1 at 3.60/h (0.001/s): boot 600 s, busy [600, 4200), idle 600 s, suspend 600 s: 5.40
# i-2 on n2 at 7.20/h (0.002/s): launched at 300, boot 600, busy [900, 3900), idle 600, suspend 300: 9.00
# i-3, an orphan of pool spot at 1.80/h (0.0005/s), 1200 s: 0.60
LIVES = [life("i-1", "n1", "gpu", "3.60", 0, 600, 4200, 4800, 5400),
         life("i-2", "n2", "gpu", "7.20", 300, 900, 3900, 4500, 4800),
         life("i-3", "n3", "spot", "1.80", 0, ended=1200, orphan=True)]
# J1 (acct A, 6 GPUs) on n1 [600, 2400); J2 (acct B, 8 GPUs on two nodes: 4 each) on n1 and n2
# [1800, 3000); J3 (acct B, 2 GPUs) on n1 [3300, 4200): a gap [3000, 3300) on n1 that no job covers
RUNS = [ic.JobRun("c", "1", "A", ("n1",), at(600), at(2400), 6),
        ic.JobRun("c", "2", "B", ("n1", "n2"), at(1800), at(3000), 8),
        ic.JobRun("c", "3", "B", ("n1",), at(3300), at(4200), 2)]


def test_each_instance_cost_goes_to_the_accounts_by_their_time_on_it_and_the_rest_to_overhead():
    rep = ic.attribute(LIVES, RUNS)
    # n1: A alone 1200 s (1.20); J1 and J2 share 600 s by GPUs on n1, 6 : 4 (A 0.36, B 0.24); B alone
    # 600 s (0.60); the gap 300 s (unused 0.30); J3 900 s (B 0.90). n2: J2 alone 1200 s (B 2.40)
    acc = {a: (x.cost, x.seconds) for a, x in rep.accounts.items()}
    assert acc == {"A": (Fraction("1.56"), 1560), "B": (Fraction("4.14"), 2940)}
    assert {a: sorted(x.jobs) for a, x in rep.accounts.items()} == {"A": ["1"], "B": ["2", "3"]}
    assert rep.overhead == {
        ("gpu", "boot"): [1200, Fraction("1.80")],
        ("gpu", "unused"): [300 + 900 + 900, Fraction("0.30") + Fraction("3.60")],   # n1's gap, n2 before and after J2
        ("gpu", "idle"): [1200, Fraction("1.80")],
        ("gpu", "suspend"): [900, Fraction("1.20")],
        ("spot", "orphan"): [1200, Fraction("0.60")],
    }
    assert [(i.life.instance_id, i.seconds, i.cost, i.attributed) for i in rep.instances] == [
        ("i-1", 5400, Fraction("5.40"), Fraction("3.30")), ("i-2", 4500, Fraction("9.00"), Fraction("2.40")),
        ("i-3", 1200, Fraction("0.60"), 0)]
    # sum over accounts + overhead = instance cost = instance-hours x price, to the cent and exactly
    assert rep.instance_cost == Fraction("15.00")
    assert rep.accounts_cost + rep.overhead_cost == rep.instance_cost
    assert rep.reconciled
    d = rep.as_dict()
    assert d["totals"] == {"instance_hours": "3.083333", "instance_cost": "15.000000", "accounts": "5.700000",
                           "overhead": "9.300000", "printed_total": "15.000000", "reconciled": True}
    assert rep.reconciliation() == ("3 instances, 3.083333 instance-hours x price = 15.000000 = accounts 5.700000 "
                                    "+ overhead 9.300000: reconciled")


def test_a_period_cuts_the_instances_and_the_jobs_at_its_edges():
    # [2000, 4500): i-1 busy [2000, 4200) + idle [4200, 4500); i-2 busy [2000, 3900) + idle [3900, 4500);
    # the orphan ended before it
    rep = ic.attribute(LIVES, RUNS, since=at(2000), until=at(4500))
    acc = {a: x.cost for a, x in rep.accounts.items()}
    # n1: [2000, 2400) J1 : J2 = 6 : 4 (A 0.24, B 0.16), [2400, 3000) B 0.60, J3 0.90; n2: [2000, 3000) B 2.00
    assert acc == {"A": Fraction("0.24"), "B": Fraction("3.66")}
    assert rep.instance_seconds == 2500 * 2 and rep.instance_cost == Fraction("2.50") + Fraction("5.00")
    assert rep.overhead[("gpu", "unused")] == [300 + 900, Fraction("0.30") + Fraction("1.80")]
    assert ("spot", "orphan") not in rep.overhead and rep.reconciled


def test_overlapping_jobs_without_gpus_split_by_time_and_the_spread_policy_moves_overhead_to_accounts():
    cpu = [ic.JobRun("c", "7", "A", ("n1",), at(600), at(4200), 0), ic.JobRun("c", "8", "B", ("n1",), at(600), at(1800), 4)]
    rep = ic.attribute(LIVES[:1], cpu)
    # [600, 1800): two jobs, one holds no GPU: half each; [1800, 4200): A alone
    assert {a: x.cost for a, x in rep.accounts.items()} == {"A": Fraction("0.60") + Fraction("2.40"), "B": Fraction("0.60")}
    spread = ic.attribute(LIVES[:1], cpu, policy="spread")
    # i-1's overhead (boot, idle, suspend: 1.80) to A and B as 3.00 : 0.60
    assert {a: x.overhead_share for a, x in spread.accounts.items()} == {"A": Fraction("1.50"), "B": Fraction("0.30")}
    assert spread.overhead == {} and spread.reconciled
    assert spread.accounts_cost == spread.instance_cost == Fraction("5.40")
    # a pool no account used keeps its overhead
    alone = ic.attribute(LIVES, RUNS[:1], policy="spread")
    assert alone.overhead == {("spot", "orphan"): [1200, Fraction("0.60")]} and alone.reconciled
    with pytest.raises(UserInputError, match="overhead policy"):
        ic.attribute(LIVES, RUNS, policy="share")


def test_printed_lines_add_up_to_the_printed_total_when_the_exact_figures_do_not_round_evenly():
    # 3.60/h, busy its whole life of 1 s: three 1-GPU jobs share it, a third of 0.001 each
    odd = [life("i-9", "n9", "gpu", "3.60", 0, 0, ended=1)]
    runs = [ic.JobRun("c", str(j), acct, ("n9",), at(0), at(1), 1) for j, acct in ((1, "A"), (2, "B"), (3, "C"))]
    rep = ic.attribute(odd, runs)
    assert rep.reconciled and rep.overhead == {}
    acc, over, total = rep.rounded()
    assert total == Decimal("0.001000")
    # each rounded on its own would print 0.000333 three times: 0.000999; by largest remainder one
    # of them (the first on the tie) carries the last millionth
    assert acc == {"A": Decimal("0.000334"), "B": Decimal("0.000333"), "C": Decimal("0.000333")}
    assert sum(acc.values()) == total
    assert rep.reconciliation().endswith("= 0.001000 = accounts 0.001000 + overhead 0: reconciled")
    assert ic.apportion([Fraction(1, 3)] * 3, Decimal(1)) == [Decimal("0.333334"), Decimal("0.333333"),
                                                              Decimal("0.333333")]


def test_from_the_ledger_the_journal_and_sacct_node_lists(ledger_url):
    cfg = ElasticConfig(cluster="c", state_dir="/nonexistent", pools=(
        Pool("gpu", ("n1", "n2"), "local", hourly_price="3.60"), Pool("spot", ("n3",), "local", hourly_price="1.80")))
    t0 = T.timestamp()
    ev = [journal.launch_event(cfg, cfg.pool("gpu"), Instance("i-1", "n1", "gpu", "running", t0, "g5", "on_demand")),
          journal.end_event(cfg, "i-1", t0 + 5400, "suspend", registered_at=t0 + 600, last_busy=t0 + 4200,
                            suspend_at=t0 + 4800),
          journal.end_event(cfg, "i-3", t0 + 1200, "orphan", pool=cfg.pool("spot"),
                            orphan=Instance("i-3", "n3", "spot", "running", t0, "g5"))]
    assert instances.ingest(ev, ledger_url) == 2
    loc = lambda s: at(s).astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731 - sacct's local time
    ingest.ingest_rows(rows(row("1", "COMPLETED", loc(600), loc(2400), 1800, gpus=6, account="A", cluster="c"),
                            row("2", "COMPLETED", loc(1800), loc(3000), 1200, gpus=4, account="B", cluster="c"),
                            row("3", "COMPLETED", loc(3300), loc(4200), 900, gpus=2, account="B", cluster="c"),
                            row("4", "COMPLETED", loc(100), loc(200), 100, gpus=1, account="A", cluster="c")),
                       url=ledger_url, default_cluster="c")
    nodes = {ic.run_key("c", "1", -1, at(600)): "n1", ic.run_key("c", "2", -1, at(1800)): "n1",
             ic.run_key("c", "3", -1, at(3300)): "n1"}                  # no node list for job 4
    rep = ic.instance_cost(node_lists=nodes, url=ledger_url, since=at(0), until=at(86400))
    assert {a: x.cost for a, x in rep.accounts.items()} == {"A": Fraction("1.56"), "B": Fraction("0.24") + Fraction("0.60") + Fraction("0.90")}
    assert rep.unmatched == ["4"]
    assert rep.instance_cost == Fraction("5.40") + Fraction("0.60") and rep.reconciled
    # a window after every instance: nothing
    assert ic.instance_cost(node_lists=nodes, url=ledger_url, since=at(86400), until=at(2 * 86400)).instances == []


def test_the_command_prints_csv_json_and_the_reconciliation_line(ledger_url, monkeypatch, capsys):
    import csv
    import io
    import json

    from gpuhpc.cli.main import main

    cfg = ElasticConfig(cluster="c", state_dir="/nonexistent", pools=(Pool("gpu", ("n1",), "local", hourly_price="3.60"),))
    t0 = T.timestamp()
    instances.ingest([journal.launch_event(cfg, cfg.pool("gpu"), Instance("i-1", "n1", "gpu", "running", t0, "g5", "on_demand")),
                      journal.end_event(cfg, "i-1", t0 + 5400, "suspend", registered_at=t0 + 600, last_busy=t0 + 4200,
                                        suspend_at=t0 + 4800)], ledger_url)
    loc = lambda s: at(s).astimezone().strftime("%Y-%m-%dT%H:%M:%S")  # noqa: E731
    ingest.ingest_rows(rows(row("1", "COMPLETED", loc(600), loc(2400), 1800, gpus=6, account="A", cluster="c")),
                       url=ledger_url, default_cluster="c")
    asked = []

    def node_lists(client, since, until):
        asked.append((since, until))
        return {ic.run_key("c", "1", -1, at(600)): "n1"}

    monkeypatch.setattr(ic, "sacct_node_lists", node_lists)
    assert main(["ledger", "report", "--instances", "--by-account", "--csv", "--period", "month", "--at",
                 "2026-11-20"]) == 0
    out, err = capsys.readouterr()
    assert asked == [(dt.datetime(2026, 11, 1, tzinfo=UTC), dt.datetime(2026, 12, 1, tzinfo=UTC))]
    lines = list(csv.DictReader(io.StringIO(out)))
    assert [(x["line"], x["key"], x["part"], x["total"]) for x in lines] == [
        ("account", "A", "", "1.800000"), ("overhead", "gpu", "boot", "0.600000"),
        ("overhead", "gpu", "idle", "0.600000"), ("overhead", "gpu", "suspend", "0.600000"),
        ("overhead", "gpu", "unused", "1.800000"), ("instances", "total", "", "5.400000")]
    assert "1.500000 instance-hours x price = 5.400000 = accounts 1.800000 + overhead 3.600000: reconciled" in err
    assert main(["ledger", "report", "--instances", "--by-account", "--json", "--overhead", "spread",
                 "--since", "2026-11-10", "--until", "2026-11-11"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["accounts"][0]["total"] == "5.400000" and d["overhead"] == [] and d["totals"]["reconciled"] is True
    for argv in (["--instances"], ["--instances", "--by-account", "--csv", "--json"],
                 ["--instances", "--by-account", "--period", "month", "--since", "2026-11-01"],
                 ["--instances", "--by-account", "--at", "2026-11-20"], ["--instances", "--by-account", "--jobs"],
                 ["--instances", "--by-account", "--overhead", "share"]):
        assert main(["ledger", "report", *argv]) == 2, argv

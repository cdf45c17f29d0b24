"""sync-slurm planning and idempotency against a SlurmClient over a recording runner (the real sacctmgr run is
in tests/integration/ledger/test_ledger_slurm.py)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

from gpuhpc.ledger import admin, slurm_sync
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult


class RecordingRunner:
    """A Runner that answers ``sacctmgr list`` from in-memory state and records every other
    command line (built by gpuhpc.slurm, as on the real cluster)."""

    def __init__(self, qos=(), accounts=(), assocs=()):
        self.tables = {"qos": list(qos), "account": list(accounts), "association": list(assocs)}
        self.calls: list[tuple[str, ...]] = []
        self.is_local = False
        self.lists: list[list[str]] = []

    def run(self, argv, *, input=None, timeout=None, env=None):
        if argv == ["scontrol", "show", "config"]:
            return CommandResult(tuple(argv), 0, "ClusterName = lab\n", "")
        if argv[:4] == ["sacctmgr", "--noheader", "--parsable2", "list"]:
            self.lists.append(argv)
            fields = argv[-1].removeprefix("format=").split(",")
            out = "".join("|".join(r.get(f, "") for f in fields) + "\n" for r in self.tables[argv[4]])
            return CommandResult(tuple(argv), 0, out, "")
        assert argv[:2] == ["sacctmgr", "-i"], argv
        self.calls.append(tuple(argv[2:]))
        return CommandResult(tuple(argv), 0, "", "")


def RecordingClient(**state) -> SlurmClient:
    return SlurmClient(RecordingRunner(**state))


def test_plan_and_commands(ledger_url):
    admin.add_account("proj", url=ledger_url)
    admin.add_user("alice", "proj", url=ledger_url)
    admin.add_user("bob", "proj", url=ledger_url)
    admin.set_quota("proj", gpu_hours=Decimal("10.5"), money=Decimal("12.5"), period="month", url=ledger_url)
    admin.set_quota("proj", user="bob", gpu_hours=Decimal("1"), period="month", url=ledger_url)
    now = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)
    (p,) = slurm_sync.plan(url=ledger_url, now=now)
    # a GPU-hour quota in GPU-minutes, a money quota in billing-minutes (60,000,000 per unit of money),
    # each 2 minutes below the budget (Slurm's whole-minute arithmetic)
    assert p.limits == {"gres/gpu": 628, "billing": 749_999_998} and p.users == ("alice", "bob") and p.reset
    assert p.user_limits == {"bob": {"gres/gpu": 58, "billing": -1}}
    c = RecordingClient()
    res = slurm_sync.sync(c, [p])
    # the budget sits on the ACCOUNT association: it binds every user under it, however added
    # on this cluster only (one slurmdbd may serve several)
    assert c.runner.calls[0] == ("add", "account", "proj", "Cluster=lab", "Description=proj", "Organization=gpuhpc",
                                 "GrpTRESMins=billing=749999998,gres/gpu=628")
    assert ("add", "user", "alice", "Cluster=lab", "Account=proj") in c.runner.calls
    assert ("add", "user", "bob", "Cluster=lab", "Account=proj", "GrpTRESMins=gres/gpu=58") in c.runner.calls
    assert c.runner.calls[1] == ("modify", "account", "where", "name=proj", "cluster=lab", "set", "RawUsage=0")
    assert all("cluster=lab" in argv for argv in c.runner.lists)
    # bob's own quota restarts bob's own association (a first sync, like the account's)
    assert c.runner.calls[-1] == ("modify", "user", "where", "name=bob", "account=proj", "cluster=lab", "set",
                                  "RawUsage=0")
    assert len(res.commands) == 5
    slurm_sync.record_periods([p], url=ledger_url)
    (p,) = slurm_sync.plan(url=ledger_url, now=now)
    assert not p.reset
    # already in place (a user added with sacctmgr only is left alone): nothing to do
    done = RecordingClient(
        accounts=[{"Account": "proj"}],
        assocs=[{"Account": "proj", "User": "", "GrpTRESMins": "billing=749999998,gres/gpu=628"},
                {"Account": "proj", "User": "alice", "GrpTRESMins": ""},
                {"Account": "proj", "User": "carol", "GrpTRESMins": ""},
                {"Account": "proj", "User": "bob", "GrpTRESMins": "gres/gpu=58"}])
    assert slurm_sync.sync(done, [p]).commands == []
    # next month: Slurm's usage of the budget restarts with the ledger's
    (p2,) = slurm_sync.plan(url=ledger_url, now=now + dt.timedelta(days=20))
    again = slurm_sync.sync(done, [p2], dry_run=True)
    assert again.commands == [["sacctmgr", "-i", "modify", "account", "where", "name=proj", "cluster=lab", "set",
                               "RawUsage=0"],
                              ["sacctmgr", "-i", "modify", "user", "where", "name=bob", "account=proj", "cluster=lab",
                               "set", "RawUsage=0"]]
    assert done.runner.calls == []                                   # dry run ran nothing


def test_each_quota_restarts_its_own_association_on_its_own_period(ledger_url):
    """Issue 34.2: a user quota with a period of its own, and an account with user quotas only:
    each association's Slurm usage restarts when its own quota's period rolls over, never another's
    (the account's usage used to be the only one reset, so these budgets stayed spent in Slurm)."""
    admin.add_account("lab1", url=ledger_url)
    admin.add_user("dana", "lab1", url=ledger_url)
    admin.add_user("eve", "lab1", url=ledger_url)
    admin.set_quota("lab1", user="dana", gpu_hours=Decimal("2"), period="day", url=ledger_url)
    admin.set_quota("lab1", user="eve", gpu_hours=Decimal("5"), period="month", url=ledger_url)
    state = dict(accounts=[{"Account": "lab1"}],
                 assocs=[{"Account": "lab1", "User": "", "GrpTRESMins": ""},
                         {"Account": "lab1", "User": "dana", "GrpTRESMins": "gres/gpu=118"},
                         {"Account": "lab1", "User": "eve", "GrpTRESMins": "gres/gpu=298"}])
    reset = ("set", "RawUsage=0")
    now = dt.datetime(2026, 11, 15, 12, tzinfo=dt.timezone.utc)
    (p,) = slurm_sync.plan(url=ledger_url, now=now)
    assert not p.reset and p.user_resets == ("dana", "eve")           # first sync: both start from zero
    slurm_sync.sync(RecordingClient(**state), [p])
    slurm_sync.record_periods([p], url=ledger_url)
    for when, who in ((now + dt.timedelta(hours=1), []),               # same day, same month: nothing
                      (now + dt.timedelta(days=1), ["dana"]),          # dana's day rolled over, eve's month did not
                      (now + dt.timedelta(days=16), ["dana", "eve"])):  # December: both
        (p,) = slurm_sync.plan(url=ledger_url, now=when)
        c = RecordingClient(**state)
        slurm_sync.sync(c, [p])
        assert [argv for argv in c.runner.calls if argv[-2:] == reset] == [
            ("modify", "user", "where", f"name={u}", "account=lab1", "cluster=lab", *reset) for u in who], when
        slurm_sync.record_periods([p], url=ledger_url)


def test_billing_document_and_snapshot(ledger_url, tmp_path):
    from gpuhpc.conf.context import billing_weights
    from gpuhpc.ledger import budget

    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=t0, url=ledger_url)
    admin.set_price("1g.10gb", base="h100", fraction="1/7", effective_from=t0, url=ledger_url)
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=t0, url=ledger_url)
    admin.add_account("proj", url=ledger_url)
    admin.set_quota("proj", money=Decimal("1000"), period="month", url=ledger_url)
    now = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)
    with __import__("gpuhpc.ledger.db", fromlist=["db"]).session_scope(ledger_url) as s:
        book = admin.load_price_book(s)
    doc = budget.billing_document(book, now)
    assert doc["rates"] == {"1g.10gb": "2500000/7", "h100": "2500000"} and doc["partitions"] == {"gpu": "3/5"}
    nodes = [{"nodes": "g1", "gres": "gpu:h100:8"}, {"nodes": "m1", "gres": "gpu:1g.10gb:7,gpu:3g.40gb:2"}]
    parts = [{"name": "gpu", "nodes": "g1"}, {"name": "mig", "nodes": "m1"}, {"name": "all", "nodes": "ALL"}]
    w = billing_weights(doc, parts, nodes, ["h100", "1g.10gb", "3g.40gb"])
    assert w["gpu"] == "CPU=0,GRES/gpu=1500000"                      # 2.50 × 0.6 per GPU-hour, in millionths
    assert w["mig"] == "CPU=0,GRES/gpu=357142.857143"                # 3g.40gb has no price: not billed
    assert w["all"] == "CPU=0,GRES/gpu=357142.857143,GRES/gpu:h100=2142857.142857"
    text = budget.render_snapshot(admin.quota_status(url=ledger_url, now=now), book, now)
    path = budget.write_snapshot(text, tmp_path / "b.txt")
    snap = budget.read_snapshot(path)
    assert snap.rate("gpu", "h100") == Decimal("1.5") and snap.rate("mig", "1g.10gb") == Decimal("0.357143")
    lines, refusal = budget.check_job(snap, account="proj", user="x", partition="gpu", gpu_type="h100", gpus=8,
                                      time_limit_s=3600 * 100, now=now.timestamp())
    assert refusal == "account proj: budget $1,000.00 for 2026-11, $1,000.00 left; this job may cost $1,200.00"
    assert budget.explain_reason("AssocGrpBillingMinutes", account="proj", user="x", partition="gpu",
                                 tres_per_node="gres:gpu:h100:1", nodes=1, time_limit_s=3600, snap=snap,
                                 now=now.timestamp()).endswith("this job may cost $1.50")
    assert budget.explain_reason("Resources", account="proj", user="x", partition="gpu", tres_per_node="",
                                 nodes=1, time_limit_s=60, snap=snap) is None


def test_local_spec_renders_billing_weights_priority_and_lua():
    """The price book's weights land on the partition lines of slurm.conf, from the same templates."""
    from pathlib import Path

    from gpuhpc.conf.context import build_context
    from gpuhpc.conf.render import render_context
    from gpuhpc.spec.cluster import load_spec

    spec = load_spec(Path(__file__).resolve().parents[3] / "examples" / "clusters" / "local.yaml")
    doc = {"unit": "u", "rates": {"h100": "600000", "1g.10gb": "120000"}, "partitions": {"gpu": "1/2"}}
    conf = render_context(build_context(spec, doc))["slurm.conf"]
    lines = {ln.split()[0]: ln for ln in conf.splitlines() if ln.startswith("PartitionName=")}
    assert "TRESBillingWeights=CPU=0,GRES/gpu=300000 " in lines["PartitionName=gpu"]
    assert "TRESBillingWeights=CPU=0,GRES/gpu=600000 " in lines["PartitionName=gpu-hi"]
    assert "TRESBillingWeights=CPU=0,GRES/gpu=120000 " in lines["PartitionName=mig"]
    assert "TRESBillingWeights=CPU=0,GRES/gpu=120000,GRES/gpu:h100=480000 " in lines["PartitionName=all"]
    for want in ("PriorityType=priority/multifactor", "PriorityDecayHalfLife=0", "PriorityUsageResetPeriod=NONE",
                 "JobSubmitPlugins=lua", "AccountingStorageEnforce=associations,limits,qos,safe"):
        assert want in conf.splitlines(), want
    # without a billing document nothing changes (the goldens)
    assert "TRESBillingWeights" not in render_context(build_context(spec))["slurm.conf"]

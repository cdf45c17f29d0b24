"""sync-slurm's qos mode (issue 34 point 8, docs/ledger.md "budget enforcement modes"): the sacctmgr
commands planned against a SlurmClient over a recording runner, the snapshot's ``qos`` lines, the
rollover's and the check's view of a budget QOS. The real Slurm (a one-minute half-life, NoDecay,
job_submit.lua) is tests/integration/ledger/test_budget_qos_nodecay.py."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import adjust, admin, check, db, rollover, slurm_sync
from gpuhpc.slurm import parsers
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult

NOW = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)


class RecordingRunner:
    """Answers ``sacctmgr list`` from in-memory tables; records every other sacctmgr command line."""

    is_local = False

    def __init__(self, qos=(), assocs=()):
        self.tables = {"qos": list(qos), "association": list(assocs)}
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv, *, input=None, timeout=None, env=None):
        if argv == ["scontrol", "show", "config"]:
            return CommandResult(tuple(argv), 0, "ClusterName = lab\n", "")
        if argv[:4] == ["sacctmgr", "--noheader", "--parsable2", "list"]:
            fields = argv[-1].removeprefix("format=").split(",")
            out = "".join("|".join(r.get(f, "") for f in fields) + "\n" for r in self.tables[argv[4]])
            return CommandResult(tuple(argv), 0, out, "")
        assert argv[:2] == ["sacctmgr", "-i"], argv
        self.calls.append(tuple(argv[2:]))
        return CommandResult(tuple(argv), 0, "", "")


def client(**tables) -> SlurmClient:
    return SlurmClient(RecordingRunner(**tables))


def qos_ledger(url):
    admin.add_account("proj", url=url)
    admin.add_user("alice", "proj", url=url)
    admin.set_quota("proj", gpu_hours=Decimal("10"), period="month", url=url)
    admin.add_account("free", url=url)                    # no quota: no QOS
    adjust.set_policy(slurm_sync.ENFORCEMENT, slurm_sync.QOS, url=url)


def test_the_association_mode_stays_the_default(ledger_url):
    admin.add_account("proj", url=ledger_url)
    admin.set_quota("proj", gpu_hours=Decimal("10"), period="month", url=ledger_url)
    (p,) = slurm_sync.plan(url=ledger_url, now=NOW)
    assert p.qos is None and slurm_sync.association_limits(p) == p.limits == {"gres/gpu": 598, "billing": -1}


def test_the_qos_mode_puts_the_budget_on_a_nodecay_qos_granted_as_the_default(ledger_url):
    qos_ledger(ledger_url)
    free, p = slurm_sync.plan(url=ledger_url, now=NOW)
    assert (free.qos, p.qos) == (None, "budget_proj") and p.limits == {"gres/gpu": 598, "billing": -1}
    c = client()
    slurm_sync.sync(c, [free, p])
    calls = c.runner.calls
    # the QOS first (no Cluster=: a QOS is one for the whole slurmdbd), NoDecay and the budget
    assert calls[0] == ("add", "qos", "budget_proj", "Flags=NoDecay", "GrpTRESMins=gres/gpu=598")
    assert calls[1] == ("modify", "qos", "where", "name=budget_proj", "set", "RawUsage=0")     # a first period
    # the account's association carries no budget, and is given the QOS as its default; so is each user's
    assert ("add", "account", "proj", "Cluster=lab", "Description=proj", "Organization=gpuhpc") in calls
    grant = ("set", "QOS+=budget_proj", "DefaultQOS=budget_proj")
    assert ("modify", "account", "where", "name=proj", "cluster=lab", *grant) in calls
    assert ("modify", "user", "where", "name=alice", "account=proj", "cluster=lab", *grant) in calls
    assert not [a for a in calls if "RawUsage=0" in a and "qos" not in a]   # the associations' usage is not the budget
    assert not [a for a in calls if "free" in " ".join(a) and ("QOS+=" in " ".join(a) or a[1] == "qos")]
    # in place: nothing to do (and a QOS's name and flags as sacctmgr prints them)
    slurm_sync.record_periods([free, p], url=ledger_url)
    (_, p) = slurm_sync.plan(url=ledger_url, now=NOW)
    done = client(qos=[{"Name": "budget_proj", "Flags": "NoDecay", "GrpTRESMins": "gres/gpu=598"}],
                  assocs=[{"Account": "proj", "User": "", "QOS": "budget_proj,normal", "DefaultQOS": "budget_proj"},
                          {"Account": "proj", "User": "alice", "QOS": "budget_proj,normal",
                           "DefaultQOS": "budget_proj"},
                          {"Account": "free", "User": "", "QOS": "normal"}])
    assert slurm_sync.sync(done, [free, p]).commands == []


def test_the_qos_mode_restores_nodecay_and_the_limit_and_resets_the_qos_on_a_new_period(ledger_url):
    qos_ledger(ledger_url)
    (_, p) = slurm_sync.plan(url=ledger_url, now=NOW)
    slurm_sync.record_periods([p], url=ledger_url)
    (_, p) = slurm_sync.plan(url=ledger_url, now=NOW + dt.timedelta(days=20))      # December
    assert p.reset
    c = client(qos=[{"Name": "budget_proj", "Flags": "DenyOnLimit", "GrpTRESMins": "gres/gpu=100"}],
               assocs=[{"Account": "proj", "User": "", "QOS": "budget_proj", "DefaultQOS": "budget_proj"}])
    res = slurm_sync.sync(c, [p], dry_run=True)
    assert res.commands[:3] == [
        ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_proj", "set", "Flags+=NoDecay"],
        ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_proj", "set", "GrpTRESMins=billing=-1,gres/gpu=598"],
        ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_proj", "set", "RawUsage=0"]]
    assert c.runner.calls == []


def test_the_qos_mode_refuses_per_user_quotas(ledger_url):
    qos_ledger(ledger_url)
    admin.set_quota("proj", user="alice", gpu_hours=Decimal("1"), period="month", url=ledger_url)
    with pytest.raises(UserInputError) as exc:
        slurm_sync.plan(url=ledger_url, now=NOW)
    assert exc.value.field == "quota" and "alice" in str(exc.value) and "enforcement association" in exc.value.hint


def test_the_snapshot_names_each_accounts_budget_qos(ledger_url, tmp_path):
    qos_ledger(ledger_url)
    _, snap = slurm_sync.publish(url=ledger_url, now=NOW, billing_file=tmp_path / "billing.json",
                                 snapshot_file=tmp_path / "budgets.txt", gpu_types=[])
    lines = open(snap).read().splitlines()
    assert [line for line in lines if line.startswith("qos\t")] == ["qos\tproj\tbudget_proj"]
    assert any(line.startswith("budget\tproj\t") for line in lines)


def test_the_rollover_resets_the_budget_qos_in_the_qos_mode(ledger_url, tmp_path):
    qos_ledger(ledger_url)
    plan = rollover.compute("lab", url=ledger_url, now=NOW)
    (e,) = plan.entries
    assert e.qos == "budget_proj"
    again = rollover.read_plan(rollover.publish("lab", url=ledger_url, now=NOW, path=tmp_path / "p.json"))
    assert again.entries[0].qos == "budget_proj"
    c = client()
    res = rollover.apply(c, again, {}, now=e.resets[0].at + 1, state_file=tmp_path / "s.json")
    assert res.commands == [
        ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_proj", "set", "GrpTRESMins=billing=-1,gres/gpu=598"],
        ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_proj", "set", "RawUsage=0"]]


def test_the_check_compares_the_budget_qos_not_the_association(ledger_url):
    qos_ledger(ledger_url)
    plans = slurm_sync.plan(url=ledger_url, now=NOW)
    assocs = [{"Account": "proj", "User": "", "GrpTRESMins": ""}, {"Account": "proj", "User": "alice", "GrpTRESMins": ""},
              {"Account": "free", "User": "", "GrpTRESMins": ""}]
    assert check.limit_differences(plans, assocs)[0] == []
    ok = [{"Name": "budget_proj", "Flags": "NoDecay", "GrpTRESMins": "gres/gpu=598"}]
    assert check.qos_limit_differences(plans, ok) == ([], 1)
    decays = [{"Name": "budget_proj", "Flags": "", "GrpTRESMins": "gres/gpu=598"}]
    (d,), _ = check.qos_limit_differences(plans, decays)
    assert d.what == "QOS budget_proj of account proj" and "its usage decays" in d.slurm
    (d,), _ = check.qos_limit_differences(plans, [])
    assert d.slurm == "(no QOS)" and d.fix == "gpuhpc ledger sync-slurm --account proj"


QOS_MGR = """Current Association Manager state

QOS Records

QOS=budget_proj(7)
    UsageRaw=3600.000000
    GrpJobs=N(0) GrpJobsAccrue=N(0) GrpSubmitJobs=N(0) GrpWall=N(1.00)
    GrpTRES=cpu=N(0),billing=N(0),gres/gpu=N(0)
    GrpTRESMins=cpu=N(60),billing=N(0),gres/gpu=598({gpu})
    GrpTRESRunMins=cpu=N(0),billing=N(0),gres/gpu=N({running})
    MaxWallPJ=
    PreemptMode=OFF
    Priority=0
    Account Limits
      proj
        MaxJobsPA=N(0) MaxJobsAccruePA=N(0) MaxSubmitJobsPA=N(0)
        MaxTRESPA=cpu=N(0),billing=N(0),gres/gpu=N(0)
    User Limits
      1001
        MaxJobsPU=N(0) MaxJobsAccruePU=N(0) MaxSubmitJobsPU=N(0)
        MaxTRESPU=cpu=N(0),billing=N(0),gres/gpu=N(0)
"""


def test_the_qos_usage_parser_reads_each_qos_own_minutes():
    (q,) = parsers.parse_qos_usage(QOS_MGR.format(gpu=61, running=4))
    assert (q.name, q.limits["gres/gpu"], q.used["gres/gpu"], q.running["gres/gpu"]) == ("budget_proj", 598, 61, 4)
    assert q.limits["cpu"] is None and parsers.parse_qos_usage("") == []


def test_the_check_compares_the_budget_qos_usage_not_the_decayed_association(ledger_url):
    qos_ledger(ledger_url)
    with db.session_scope(ledger_url) as s:                # an hour of GPU settled by ingest this period
        for q in admin.lock_all_quotas(s):
            admin.bucket(s, q, NOW).used_gpu_hours += Decimal(1)
    plans = slurm_sync.plan(url=ledger_url, now=NOW)
    slurm_sync.record_periods(plans, url=ledger_url)
    plans = slurm_sync.plan(url=ledger_url, now=NOW)
    statuses = admin.quota_status(url=ledger_url, now=NOW)
    decayed = [parsers.AssocUsage("proj", "", {"gres/gpu": None}, {"gres/gpu": 20}, {"gres/gpu": 0})]

    def compare(gpu, running=0):
        return check.usage_differences(statuses, plans, decayed, check.Tolerance(), Decimal(1),
                                       parsers.parse_qos_usage(QOS_MGR.format(gpu=gpu, running=running)))

    assert compare(60)[:2] == ([], 1)                      # the QOS counts the hour; the association has decayed
    (d,), _, _ = compare(120)
    assert (d.kind, d.what, d.slurm) == ("usage", "account proj (QOS budget_proj)", "2.0000 GPU-hours")
    assert compare(500, running=3)[:2] == ([], 0)          # jobs running on the QOS: not compared


def test_an_account_whose_quota_is_gone_loses_its_qos_budget(ledger_url):
    qos_ledger(ledger_url)
    admin.add_account("gone", url=ledger_url)                  # had a quota (and so a budget QOS) once
    plans = slurm_sync.plan(url=ledger_url, now=NOW)
    c = client(qos=[{"Name": "budget_gone", "Flags": "NoDecay", "GrpTRESMins": "gres/gpu=100"},
                    {"Name": "budget_proj", "Flags": "NoDecay", "GrpTRESMins": "gres/gpu=598"}])
    res = slurm_sync.sync(c, plans, dry_run=True)
    assert ["sacctmgr", "-i", "modify", "qos", "where", "name=budget_gone", "set", "GrpTRESMins=gres/gpu=-1"] \
        in res.commands
    assert not [a for a in res.commands if "name=budget_proj" in a and "RawUsage=0" not in a]

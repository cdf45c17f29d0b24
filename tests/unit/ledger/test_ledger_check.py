"""gpuhpc ledger check (issue 34): the running Slurm against the ledger, through a SlurmClient over a
runner that answers scontrol/sacctmgr from in-memory text (the real cluster: tests/integration/quota/
test_ledger_check.py); and the QOS multipliers Slurm cannot mirror beside money quotas."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest

from gpuhpc.cli.main import main
from gpuhpc.errors import UserInputError
from gpuhpc.ledger import admin, check, db, slurm_sync
from gpuhpc.slurm import parsers
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult

T0 = dt.datetime(2026, 11, 10, tzinfo=dt.timezone.utc)
T1 = dt.datetime(2026, 11, 20, tzinfo=dt.timezone.utc)

NODES = ("NodeName=gpu-node1 Gres=gpu:h100:8(S:0-1) State=IDLE Partitions=gpu,all\n"
         "NodeName=mig-node1 Gres=gpu:1g.10gb:7,gpu:3g.40gb:2 State=IDLE Partitions=mig,all\n"
         "NodeName=cpu-node1 Gres=(null) State=IDLE Partitions=cpu,all\n")

ASSOC_MGR = """Current Association Manager state

Association Records

ClusterName=lab Account=proj UserName= Partition= Priority=0 ID=3
    GrpTRESMins=cpu=N(3),billing=749999998({billing}),gres/gpu=628({gpu}),gres/gpu:h100=N(1)
    GrpTRESRunMins=cpu=N(0),billing=N(0),gres/gpu=N({running}),gres/gpu:h100=N(0)
    MaxJobs= MaxJobsAccrue= MaxSubmitJobs= MaxWallPJ=
ClusterName=lab Account=proj UserName=alice(1001) Partition= Priority=0 ID=4
    GrpTRESMins=cpu=N(3),billing=N(0),gres/gpu=N(0),gres/gpu:h100=N(0)
    GrpTRESRunMins=cpu=N(0),billing=N(0),gres/gpu=N(0),gres/gpu:h100=N(0)
"""


class SlurmStandIn:
    """A Runner answering the commands ``ledger check`` runs from in-memory state."""

    def __init__(self, weights: dict[str, str | None], assocs: list[dict[str, str]], gpu_min=0, billing_min=0,
                 running=0):
        self.weights, self.assocs = weights, assocs
        self.usage = {"gpu": gpu_min, "billing": billing_min, "running": running}
        self.is_local = False

    def run(self, argv, *, input=None, timeout=None, env=None):
        out = None
        if argv == ["sinfo", "--version"]:           # SlurmClient asks which reads this Slurm has
            out = "slurm 22.05.8\n"
        elif argv == ["scontrol", "show", "config"]:
            out = "ClusterName = lab\n"
        elif argv == ["scontrol", "--oneliner", "show", "partition"]:
            out = "".join(f"PartitionName={p} Nodes=x State=UP" + (f" TRESBillingWeights={w}" if w else "") + "\n"
                          for p, w in self.weights.items())
        elif argv == ["scontrol", "--oneliner", "show", "node"]:
            out = NODES
        elif argv[:3] == ["scontrol", "show", "assoc_mgr"]:
            out = ASSOC_MGR.format(**self.usage)
        elif argv[:4] == ["sacctmgr", "--noheader", "--parsable2", "list"]:
            assert "cluster=lab" in argv            # this cluster's associations only
            fields = argv[-1].removeprefix("format=").split(",")
            out = "".join("|".join(r.get(f, "") for f in fields) + "\n" for r in self.assocs)
        assert out is not None, argv
        return CommandResult(tuple(argv), 0, out, "")


def in_step_weights(url, at) -> dict[str, str]:
    """What the collection renders from the price book at ``at`` (as slurm.conf would carry it)."""
    with db.session_scope(url) as s:
        book = admin.load_price_book(s)
    return check.expected_weights(book, at, {"gpu": ["gpu-node1"], "mig": ["mig-node1"], "cpu": ["cpu-node1"],
                                             "all": ["gpu-node1", "mig-node1", "cpu-node1"]},
                                  {"gpu-node1": ["h100"], "mig-node1": ["1g.10gb", "3g.40gb"], "cpu-node1": []})


@pytest.fixture()
def book(ledger_url):
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0 - dt.timedelta(days=30), url=ledger_url)
    admin.set_price("1g.10gb", base="h100", fraction="1/7", effective_from=T0 - dt.timedelta(days=30), url=ledger_url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0 - dt.timedelta(days=30), url=ledger_url)
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0 - dt.timedelta(days=30), url=ledger_url)
    admin.add_account("proj", url=ledger_url)
    admin.add_user("alice", "proj", url=ledger_url)
    admin.set_quota("proj", gpu_hours=Decimal("10.5"), money=Decimal("12.5"), period="month", url=ledger_url)
    return ledger_url


def synced(url, at) -> list[dict[str, str]]:
    """sacctmgr's rows after a sync at ``at``, and the period recorded (as sync-slurm does)."""
    plans = slurm_sync.plan(url=url, now=at)
    slurm_sync.record_periods(plans, url=url)
    return [{"Account": "proj", "User": "", "GrpTRESMins": "billing=749999998,gres/gpu=628"},
            {"Account": "proj", "User": "alice", "GrpTRESMins": ""}]


def test_in_step_then_a_future_price_takes_effect_without_reaching_slurm(book):
    weights = in_step_weights(book, T0)
    assert weights["gpu"] == "CPU=0,GRES/gpu=1500000"                          # 2.50 x 0.6, in millionths
    assert weights["mig"] == "CPU=0,GRES/gpu=357142.857143,GRES/gpu:3g.40gb=714285.714286"
    client = SlurmClient(SlurmStandIn(weights, synced(book, T0)))
    res = check.check(client, url=book, now=T0)
    assert res.in_step and res.checked == {"weights": 4, "limits": 2, "usage": 2, "reset": 0, "pricing": 1}, res.as_dict()
    # a price dated for T1 becomes effective; slurm.conf still carries T0's weights
    admin.set_price("h100", rate=Decimal("3.00"), effective_from=T1, url=book)
    res = check.check(client, url=book, now=T1)
    assert [(d.kind, d.what) for d in res.differences] == [("weights", "partition all"), ("weights", "partition gpu"),
                                                           ("weights", "partition mig")]
    gpu = res.differences[1]
    assert gpu.slurm == "CPU=0,GRES/gpu=1500000" and gpu.ledger == "CPU=0,GRES/gpu=1800000"
    assert "scontrol reconfigure" in gpu.line() and gpu.line().startswith("partition gpu: TRESBillingWeights")


def test_a_partition_without_weights_bills_cpus_and_is_a_difference(book):
    weights = in_step_weights(book, T0)
    weights["gpu"] = None
    res = check.check(SlurmClient(SlurmStandIn(weights, synced(book, T0))), url=book, now=T0)
    (d,) = res.differences
    assert d.what == "partition gpu" and d.slurm == "(none: Slurm bills CPUs)"


def test_an_empty_price_book_compares_no_weights(ledger_url):
    res = check.check(SlurmClient(SlurmStandIn({"gpu": None}, [])), url=ledger_url, now=T0)
    assert res.in_step and res.checked["weights"] == 0 and "no GPU rate" in res.notes[0]


def test_a_limit_changed_behind_the_ledgers_back(book):
    assocs = synced(book, T0)
    assocs[0]["GrpTRESMins"] = "billing=749999998,gres/gpu=999"        # sacctmgr modify by hand
    assocs[1]["GrpTRESMins"] = "gres/gpu=5"                            # a user limit without a ledger quota
    res = check.check(SlurmClient(SlurmStandIn(in_step_weights(book, T0), assocs)), url=book, now=T0)
    assert [(d.kind, d.what, d.slurm, d.ledger) for d in res.differences] == [
        ("limits", "account proj", "billing=749999998,gres/gpu=999", "billing=749999998,gres/gpu=628"),
        ("limits", "user alice in account proj", "gres/gpu=5", "billing=none,gres/gpu=none")]
    assert res.differences[0].fix == "gpuhpc ledger sync-slurm --account proj"


def test_an_account_with_a_quota_but_no_association(book):
    synced(book, T0)
    res = check.check(SlurmClient(SlurmStandIn(in_step_weights(book, T0), [])), url=book, now=T0)
    (d,) = res.differences
    assert (d.kind, d.what, d.slurm) == ("limits", "account proj", "(no association)")


def charge(url, gpu_hours, money, at):
    """The ledger's counters as ingest leaves them (settled usage in the period of ``at``)."""
    with db.session_scope(url) as s:
        for q in admin.lock_all_quotas(s):
            b = admin.bucket(s, q, at)
            b.used_gpu_hours += gpu_hours
            b.used_money += money


def test_usage_within_and_beyond_the_tolerance(book):
    charge(book, Decimal(1), Decimal("1.50"), T0)                       # 60 GPU-minutes, 90,000,000 billing-minutes
    weights, assocs = in_step_weights(book, T0), synced(book, T0)
    # Slurm's whole minutes a minute behind: within 1 GPU-minute / one minute of the dearest GPU
    res = check.check(SlurmClient(SlurmStandIn(weights, assocs, gpu_min=59, billing_min=90_000_000 - 2_500_000)),
                      url=book, now=T0)
    assert res.in_step, res.as_dict()
    res = check.check(SlurmClient(SlurmStandIn(weights, assocs, gpu_min=120, billing_min=90_000_000)), url=book,
                      now=T0)
    (d,) = res.differences
    assert (d.kind, d.what) == ("usage", "account proj")
    assert d.slurm == "2.0000 GPU-hours" and d.ledger.startswith("1.0000 GPU-hours for 2026-11")
    # a looser tolerance (percent) accepts it
    res = check.check(SlurmClient(SlurmStandIn(weights, assocs, gpu_min=120, billing_min=90_000_000)), url=book,
                      now=T0, tolerance=check.Tolerance(percent=Decimal(60)))
    assert res.in_step


def test_running_jobs_are_not_compared_and_an_unreset_period_is(book):
    weights, assocs = in_step_weights(book, T0), synced(book, T0)
    res = check.check(SlurmClient(SlurmStandIn(weights, assocs, gpu_min=500, running=30)), url=book, now=T0)
    assert res.in_step and res.checked["usage"] == 1                   # billing compared; gres/gpu has jobs running
    assert any("gres/gpu usage not compared: jobs are running" in n for n in res.notes)
    # December began and sync-slurm has not run since: Slurm still counts November's usage
    dec = dt.datetime(2026, 12, 1, 6, tzinfo=dt.timezone.utc)
    res = check.check(SlurmClient(SlurmStandIn(in_step_weights(book, dec), assocs, gpu_min=500)), url=book, now=dec)
    (d,) = res.differences
    assert d.kind == "reset" and d.ledger == "period 2026-12" and "gres/gpu 500 min" in d.slurm
    assert d.line().startswith("account proj: period 2026-12 began but Slurm still counts")


def test_cli_exit_codes_json_and_textfile(book, monkeypatch, capsys, tmp_path):
    now = admin.utcnow()
    stand_in = SlurmStandIn(in_step_weights(book, now), synced(book, now))
    monkeypatch.setattr("gpuhpc.slurm.client.SlurmClient", lambda *a, **k: SlurmClient(stand_in))
    prom = tmp_path / "metrics" / "gpuhpc_ledger.prom"
    assert main(["ledger", "check", "--textfile", str(prom)]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and "0 differences (4 partitions, 2 associations, 2 budgets compared)" in cap.err
    assert 'gpuhpc_ledger_drift{kind="limits"} 0' in prom.read_text()
    stand_in.assocs[0]["GrpTRESMins"] = "billing=749999998,gres/gpu=999"
    assert main(["ledger", "check", "--textfile", str(prom)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("account proj: GrpTRESMins billing=749999998,gres/gpu=999 in Slurm, the ledger's quota "
                           "gives billing=749999998,gres/gpu=628; fix: gpuhpc ledger sync-slurm --account proj")
    text = prom.read_text()
    assert 'gpuhpc_ledger_drift{kind="limits"} 1' in text and 'gpuhpc_ledger_drift{kind="weights"} 0' in text
    assert main(["ledger", "check", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["in_step"] is False and out["counts"]["limits"] == 1
    assert main(["ledger", "check", "--tolerance-percent", "x"]) == 2


def test_qos_multiplier_refused_beside_money_quotas(book, capsys):
    with pytest.raises(UserInputError, match=r"--qos: QOS multiplier for 'low' refused: money quotas exist \(proj\); "
                                             r"Slurm bills by partition weights only"):
        admin.set_multiplier("qos", "low", Decimal("0.5"), url=book)
    admin.set_multiplier("qos", "low", Decimal("1"), url=book)           # 1: what Slurm bills anyway
    admin.set_multiplier("partition", "preempt", Decimal("0.4"), url=book)   # partitions are mirrored
    assert main(["ledger", "price", "set", "--qos", "low", "--multiplier", "0.5"]) == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith("error: --qos: QOS multiplier for 'low' refused") and "--partition P" in err


def test_money_quota_refused_beside_a_qos_multiplier(ledger_url, capsys):
    admin.add_account("proj", url=ledger_url)
    admin.set_multiplier("qos", "low", Decimal("0.5"), effective_from=admin.utcnow() + dt.timedelta(days=3),
                         url=ledger_url)                                # future-dated counts too
    with pytest.raises(UserInputError, match=r"--money: money quota refused: QOS multipliers other than 1 exist \(low\)"):
        admin.set_quota("proj", money=Decimal("100"), url=ledger_url)
    admin.set_quota("proj", gpu_hours=Decimal("100"), url=ledger_url)   # GPU-hours: no billing weights involved
    assert main(["quota", "set", "proj", "--money", "100"]) == 2
    assert "money quota refused" in capsys.readouterr().err
    admin.set_multiplier("qos", "low", Decimal("1"), effective_from=admin.utcnow() + dt.timedelta(days=4),
                         url=ledger_url)
    with pytest.raises(UserInputError):                                # 0.5 still applies for a day
        admin.set_quota("proj", money=Decimal("100"), url=ledger_url)


def test_parsers():
    text = ("PartitionName=gpu AllowGroups=ALL Nodes=gpu-node[1-2] TRESBillingWeights=CPU=0,GRES/gpu=1500000\n"
            "PartitionName=cpu AllowGroups=ALL Nodes=cpu-node1 State=UP\n")
    assert parsers.parse_partition_billing_weights(text) == {"gpu": "CPU=0,GRES/gpu=1500000", "cpu": None}
    a, u = parsers.parse_assoc_usage(ASSOC_MGR.format(gpu=7, billing=11, running=4))
    assert (a.account, a.user, a.limits["gres/gpu"], a.used["gres/gpu"], a.running["gres/gpu"]) == ("proj", "", 628, 7, 4)
    assert (u.user, u.limits["gres/gpu"], u.used["cpu"]) == ("alice", None, 3)
    assert check.parse_weights("CPU=0,GRES/gpu=1500000") == {"gres/gpu": Decimal(1500000)}
    assert check.parse_weights("CPU=0") == {} and check.parse_weights(None) is None

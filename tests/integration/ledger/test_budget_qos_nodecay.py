"""Budgets in the ledger's qos mode leave fair-share decaying (issue 34 point 8).

The shared cluster runs ``PriorityDecayHalfLife=0`` (the association mode needs it, and other tests
depend on it), so this test stands up a private one-node controller (tests/private_slurm.py, in the
shared slurmdbd) with ``priority/multifactor``, a one-minute half-life, ``PriorityCalcPeriod=1``,
``AccountingStorageEnforce=associations,limits,qos,safe`` and gpuhpc's job_submit.lua. ``sync-slurm``'s
Slurm half (:func:`gpuhpc.ledger.slurm_sync.sync`, the plan built by hand: no ledger database) puts an
account's budget on its NoDecay QOS; the budget snapshot names that QOS (its ``qos`` line). Then:

* a plain ``sbatch`` in the account runs in the budget QOS; one asking for another QOS is refused;
* once the job's usage is counted, the account's fair-share usage (``sshare`` RawUsage) falls at a
  later decay pass while the QOS's usage (``UsageRaw``) does not (``Flags=NoDecay``);
* with the QOS's budget below what a job may use, a plain ``sbatch`` waits on ``QOSGrpBillingMinutes``;
* the rollover's reset of a qos-mode entry sets the QOS's ``RawUsage`` back to 0.

Everything it adds to slurmdbd (a cluster, an account, a QOS) is removed afterwards. About two
minutes: two decay passes, one minute apart."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from gpuhpc.ledger import rollover, slurm_sync
from polling import wait_for
from private_slurm import PrivateSlurm

pytestmark = [pytest.mark.integration, pytest.mark.isolated]      # a private controller only

NAME = "gpuhpcnodecay"
ACCOUNT = "gpuhpc-nodecay"
QOS = slurm_sync.budget_qos(ACCOUNT)
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16883, 16884, 17623
LUA = Path(__file__).resolve().parents[3] / "slurm-conf" / "job_submit.lua"


def sacctmgr(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, timeout=60, check=check)


def forget() -> None:
    sacctmgr("delete", "account", ACCOUNT)          # the cluster's associations go with the cluster
    sacctmgr("delete", "qos", QOS)


@pytest.fixture
def nodecay_cluster():
    cluster = PrivateSlurm(
        NAME, (CTLD_PORT, SLURMD_PORT, NODE_PORT), {"nd-node1": "CPUs=1 RealMemory=1000 State=UNKNOWN"},
        ["PartitionName=nd Nodes=nd-node1 Default=YES MaxTime=INFINITE State=UP"],
        extra={"PriorityType": "priority/multifactor", "PriorityDecayHalfLife": "00:01:00",
               "PriorityCalcPeriod": "1", "PriorityWeightFairshare": "1000",
               "AccountingStorageEnforce": "associations,limits,qos,safe", "JobSubmitPlugins": "lua"},
        accounting=True)
    forget()                                                  # leftovers of an interrupted run
    try:
        with cluster.in_slurmdbd(before_start=lambda base: (base / "job_submit.lua").write_text(LUA.read_text())):
            yield cluster
    finally:
        forget()


def plan(billing_minutes: int, reset: bool = False) -> slurm_sync.AccountPlan:
    return slurm_sync.AccountPlan(ACCOUNT, ACCOUNT, ("root",), {"gres/gpu": slurm_sync.UNSET, "billing": billing_minutes},
                                  {}, None, reset, qos=QOS)


def test_a_nodecay_budget_qos_keeps_its_usage_while_fair_share_decays(nodecay_cluster):
    cluster = nodecay_cluster
    client, env = cluster.client, cluster.env

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, env=env)

    def sbatch(*args: str) -> subprocess.CompletedProcess:
        return run("sbatch", "--parsable", f"--account={ACCOUNT}", "--output=/dev/null", *args)

    def squeue(job: str, fmt: str) -> str:
        return run("squeue", "-h", "-j", job, "-o", fmt).stdout.strip()

    def fair_share_usage() -> int:
        rows = [line.split("|") for line in run("sshare", "-h", "-P", "-A", ACCOUNT, "-o",
                                                "Account,User,RawUsage").stdout.splitlines()]
        return next((int(r[2]) for r in rows if len(r) == 3 and r[0].strip() == ACCOUNT and not r[1]), 0)

    def qos_usage() -> float:
        m = re.search(r"UsageRaw=([\d.]+)", run("scontrol", "show", "assoc_mgr", "flags=qos", f"qos={QOS}").stdout)
        return float(m.group(1)) if m else -1.0

    slurm_sync.sync(client, [plan(100, reset=True)])
    (cluster.base / "gpuhpc-budgets.txt").write_text("version\t1\n" + slurm_sync.snapshot_qos_lines([plan(100)]))
    flags = sacctmgr("show", "qos", f"name={QOS}", "format=Flags,GrpTRESMins", "-P", "-n").stdout.strip()
    assert flags.lower() == "nodecay|billing=100", flags
    own = [line for line in sacctmgr("show", "association", f"cluster={NAME}", f"account={ACCOUNT}",
                                     "format=User,GrpTRESMins,DefaultQOS", "-P", "-n").stdout.splitlines()]
    assert own and all(line.split("|")[1:] == ["", QOS] for line in own), own   # the budget is not on them

    # a plain sbatch runs in the budget QOS; asking for another one is refused with the reason
    other = sbatch("--qos=normal", "--time=2", "--wrap=true")
    assert other.returncode != 0 and f"its budget is the QOS {QOS}" in other.stderr, (other.stdout, other.stderr)
    res = sbatch("--time=2", "--wrap=sleep 10")
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    assert squeue(job, "%q") == QOS, squeue(job, "%q")
    wait_for(lambda: squeue(job, "%i") == "", 60, f"job {job} to end ({cluster.logs()})")
    assert run("sacct", "-M", NAME, "-X", "-n", "-P", "-j", job, "-o", "QOS").stdout.strip() == QOS

    # the job's usage reaches both at a decay pass; at a later pass fair-share falls, the QOS keeps it
    wait_for(lambda: fair_share_usage() > 0 and qos_usage() > 0, 90, "the job's usage to be counted")
    (q,) = client.qos_usage([QOS])                          # what gpuhpc ledger check reads in the qos mode
    assert q.name == QOS and q.limits["billing"] == 100 and "billing" in q.used, q
    peak = {"share": 0, "qos": 0.0}
    at_fall: list[float] = []

    def fair_share_fell() -> bool:
        share, q = fair_share_usage(), qos_usage()          # the QOS read after: never before a decay pass
        if share < peak["share"]:
            at_fall.append(q)
            return True
        peak["share"], peak["qos"] = max(peak["share"], share), max(peak["qos"], q)
        return False

    t0 = time.monotonic()
    wait_for(fair_share_fell, 150, "the account's fair-share usage to decay (PriorityDecayHalfLife 1 min)")
    print(f"fair-share usage decayed after {time.monotonic() - t0:.0f}s from {peak['share']}; "
          f"the budget QOS's usage {peak['qos']} -> {at_fall[0]}")
    assert at_fall[0] >= peak["qos"] > 0, (peak, at_fall)   # NoDecay: the budget's usage did not fall

    # a job past the budget waits on the QOS's limit (safe: its whole time limit must fit)
    slurm_sync.sync(client, [plan(1)])
    held = sbatch("--time=5", "--wrap=true")
    assert held.returncode == 0, held.stderr
    held_job = held.stdout.strip().split(";")[0]
    wait_for(lambda: squeue(held_job, "%r") == "QOSGrpBillingMinutes", 30,
             f"job {held_job} to wait on its budget QOS (reason now {squeue(held_job, '%r')!r})")
    client.cancel(held_job)

    # the rollover of a qos-mode entry resets the QOS's usage
    entry = rollover.Entry(ACCOUNT, "", "month", 0, (rollover.Reset(int(time.time()) - 1, plan(100).limits),), QOS)
    res = rollover.apply(client, rollover.Plan(NAME, int(time.time()), [entry]), {},
                         state_file=cluster.base / "resets.state.json")
    assert not res.failed and [c[3] for c in res.commands] == ["qos", "qos"], res.as_dict()
    wait_for(lambda: qos_usage() == 0, 30, "the budget QOS's usage to be reset")

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

    def run(self, argv, *, input=None, timeout=None, env=None):
        if argv[:4] == ["sacctmgr", "--noheader", "--parsable2", "list"]:
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
    admin.set_quota("proj", gpu_hours=Decimal("10.5"), period="month", url=ledger_url)
    now = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)
    (p,) = slurm_sync.plan(url=ledger_url, now=now)
    assert (p.qos, p.grp_gpu_minutes, p.max_job_gpu_minutes, p.users) == ("gpuhpc-proj", 630, 630, ("alice", "bob"))
    c = RecordingClient()
    res = slurm_sync.sync(c, [p])
    assert c.runner.calls[0] == ("add", "qos", "gpuhpc-proj", "Flags=NoDecay", "GrpTRESMins=gres/gpu=630",
                          "MaxTRESMinsPerJob=gres/gpu=630", "Description=gpuhpc period=2026-11-01")
    assert ("add", "account", "proj", "Description=proj", "Organization=gpuhpc", "QOS=gpuhpc-proj",
            "DefaultQOS=gpuhpc-proj") in c.runner.calls
    assert ("add", "user", "bob", "Account=proj", "QOS=gpuhpc-proj", "DefaultQOS=gpuhpc-proj") in c.runner.calls
    assert len(res.commands) == 4
    # already in place: nothing to do
    done = RecordingClient(
        qos=[{"Name": "gpuhpc-proj", "Flags": "NoDecay", "GrpTRESMins": "gres/gpu=630", "MaxTRESMins": "gres/gpu=630",
              "Description": "gpuhpc period=2026-11-01"}],
        accounts=[{"Account": "proj"}],
        assocs=[{"Account": "proj", "User": u, "QOS": "gpuhpc-proj", "DefaultQOS": "gpuhpc-proj"}
                for u in ("", "alice", "bob")])
    assert slurm_sync.sync(done, [p]).commands == []
    # next month: raw usage reset
    (p2,) = slurm_sync.plan(url=ledger_url, now=now + dt.timedelta(days=20))
    again = slurm_sync.sync(done, [p2], dry_run=True)
    assert again.commands == [["sacctmgr", "-i", "modify", "qos", "where", "name=gpuhpc-proj", "set",
                               "Description=gpuhpc period=2026-12-01", "RawUsage=0"]]
    assert done.runner.calls == []                                   # dry run ran nothing

"""The ledger's qos mode (issue 34 point 8) on PostgreSQL: the mode is a ledger policy row, and
from it ``sync-slurm``'s plan puts each budgeted account on its NoDecay QOS, the budget snapshot
(what job_submit.lua reads) names that QOS, and the rollover's reset plan resets the QOS, not the
association. The Slurm half (the QOS in a real slurmctld and slurmdbd, decay on) is
test_budget_qos_nodecay.py's; the same functions on SQLite are tests/unit/ledger/test_sync_qos.py's."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import adjust, admin, db, rollover, slurm_sync

pytestmark = pytest.mark.integration

NOW = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)


def test_the_qos_mode_from_a_postgresql_ledger_plans_publishes_and_resets_the_budget_qos(pg_url, tmp_path):
    db.upgrade(pg_url)
    admin.add_account("proj", url=pg_url)
    admin.set_quota("proj", gpu_hours=Decimal("10"), period="month", url=pg_url)
    admin.add_account("free", url=pg_url)                 # no quota: no QOS
    (p,) = [x for x in slurm_sync.plan(url=pg_url, now=NOW) if x.account == "proj"]
    assert p.qos is None                                  # the association mode until the policy says qos
    adjust.set_policy(slurm_sync.ENFORCEMENT, slurm_sync.QOS, url=pg_url)
    plans = {x.account: x for x in slurm_sync.plan(url=pg_url, now=NOW)}
    assert (plans["free"].qos, plans["proj"].qos) == (None, "budget_proj")
    assert plans["proj"].limits == {"gres/gpu": 598, "billing": -1}
    _, snap = slurm_sync.publish(url=pg_url, now=NOW, billing_file=tmp_path / "billing.json",
                                 snapshot_file=tmp_path / "budgets.txt", gpu_types=[])
    assert [line for line in open(snap).read().splitlines() if line.startswith("qos\t")] == ["qos\tproj\tbudget_proj"]
    resets = rollover.read_plan(rollover.publish("lab", url=pg_url, now=NOW, path=tmp_path / "plan.json"))
    assert [e.qos for e in resets.entries] == ["budget_proj"]
    # per-user quotas have no QOS of their own in this mode: refused, naming the quota
    admin.add_user("alice", "proj", url=pg_url)
    admin.set_quota("proj", user="alice", gpu_hours=Decimal("1"), period="month", url=pg_url)
    with pytest.raises(UserInputError) as err:
        slurm_sync.plan(url=pg_url, now=NOW)
    assert "alice" in str(err.value)

"""The submit path's budget decision where this process may not write the ledger (issue 34.3):
the published budget snapshot decides, as job_submit.lua does for plain sbatch, and the first line
says why. Here: a PostgreSQL URL nothing listens on (the reader role is tested on the cluster,
tests/integration/quota/test_quota_slurm.py)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import QuotaExceeded
from gpuhpc.ledger import admin, budget, hooks

DOWN = "postgresql+psycopg://nobody@127.0.0.1:1/gpuhpc"


def _req(hours: int) -> hooks.ChargeRequest:
    return hooks.ChargeRequest(cluster="", user="alice", account="proj", partition="gpu", qos=None,
                               gpu_type="h100", gpus=1, time_limit_s=hours * 3600)


def test_an_unreachable_ledger_without_a_snapshot_leaves_the_decision_to_slurm(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_DB_URL", DOWN)
    monkeypatch.setenv("GPUHPC_BUDGET_SNAPSHOT", str(tmp_path / "none.txt"))
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    hold, lines = hooks.reserve_or_snapshot(_req(1), "proj")
    assert hold is None
    assert len(lines) == 1 and lines[0].startswith(f"cannot connect to the ledger database {DOWN}: "), lines
    assert lines[0].endswith(f"deciding from Slurm's own limits (no budget snapshot at {tmp_path / 'none.txt'})")


def test_an_unreachable_ledger_decides_from_the_snapshot(ledger_url, monkeypatch, tmp_path):
    admin.set_price("h100", rate=Decimal("2.50"), url=ledger_url)
    admin.add_account("proj", url=ledger_url)
    admin.set_quota("proj", money=Decimal("10"), period="month", url=ledger_url)
    now = dt.datetime.now(dt.timezone.utc)
    with __import__("gpuhpc.ledger.db", fromlist=["db"]).session_scope(ledger_url) as s:
        book = admin.load_price_book(s)
    snap = budget.write_snapshot(budget.render_snapshot(admin.quota_status(url=ledger_url, now=now), book, now),
                                 tmp_path / "b.txt")
    monkeypatch.setenv("GPUHPC_BUDGET_SNAPSHOT", str(snap))
    monkeypatch.setenv("GPUHPC_DB_URL", DOWN)
    hold, lines = hooks.reserve_or_snapshot(_req(1), "proj")            # $2.50 of $10.00
    assert hold is None and lines[0].endswith(": deciding from the budget snapshot"), lines
    assert lines[0].startswith("cannot connect to the ledger database") and len(lines) == 2, lines
    assert lines[1].startswith("account proj: budget $10.00 for "), lines
    with pytest.raises(QuotaExceeded, match=r"this job may cost \$12\.50"):
        hooks.reserve_or_snapshot(_req(5), "proj")
    # the ledger back: a hold, and nothing to say
    monkeypatch.setenv("GPUHPC_DB_URL", ledger_url)
    hold, lines = hooks.reserve_or_snapshot(_req(1), "proj")
    assert hold is not None and lines == []
    hold.release()

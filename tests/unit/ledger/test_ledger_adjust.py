"""Credits, debits and corrections (issue 34.7) on SQLite: charges are append-only, an adjustment
is its own row and charge, counted by the quota and the reports, audited; a corrected rate over a
period books correction charges (never edits); NODE_FAIL refunds by policy; bad input exits 2
with one line naming the field. (PostgreSQL: tests/integration/ledger/test_ledger_adjust_pg.py.)"""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import DatabaseError

from gpuhpc.cli.main import main
from gpuhpc.ledger import adjust, admin, db, ingest, reports
from gpuhpc.ledger.orm import Adjustment, Charge, LedgerAudit

from ledger_sacct_text import row, rows

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NOW = dt.datetime.now(dt.timezone.utc)
BASE = NOW.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)


def ts(minutes: float) -> str:
    return (BASE + dt.timedelta(minutes=minutes)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture()
def ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("1000"), url=ledger_url)
    return ledger_url


def _charges(url) -> list[tuple[str, Decimal]]:
    with db.session_scope(url) as s:
        return [(k, Decimal(a).quantize(Decimal("0.000001")))
                for k, a in s.execute(select(Charge.kind, Charge.amount).order_by(Charge.id))]


def _used(url) -> Decimal:
    (st,) = admin.quota_status("research", url=url)
    return st.used_money


# 8 GPUs × 1800 s × 2.50 / h = 10.00
TEN = rows(row("100", "COMPLETED", ts(0), ts(30), 1800))


def test_charges_are_append_only_in_the_database(ledger):
    ingest.ingest_rows(TEN, url=ledger)
    for sql in ("UPDATE charges SET amount = 0", "DELETE FROM charges"):
        with pytest.raises(DatabaseError, match="charges is append-only"):
            with db.get_engine(ledger).begin() as c:
                c.execute(text(sql))
    adjust.adjust("research", kind="credit", amount="1", reason="goodwill", url=ledger)
    for table in ("adjustments", "ledger_audit"):
        with pytest.raises(DatabaseError, match=f"{table} is append-only"):
            with db.get_engine(ledger).begin() as c:
                c.execute(text(f"DELETE FROM {table}"))
    assert _charges(ledger) == [("usage", Decimal("10.000000")), ("adjust", Decimal("-1.000000"))]


def test_credit_counts_in_the_budget_the_report_and_the_audit(ledger):
    ingest.ingest_rows(TEN, url=ledger)
    assert _used(ledger) == Decimal("10.000000")
    b = adjust.adjust("research", kind="credit", amount="2.5", reason="NODE_FAIL of job 100", job="100", url=ledger)
    assert b.amount == Decimal("-2.5") and b.adjustments[0]["user"] == "alice"       # the job's user
    assert _used(ledger) == Decimal("7.500000")
    adjust.adjust("research", kind="debit", gpu_hours="1", reason="manual run", url=ledger)
    (st,) = admin.quota_status("research", url=ledger)
    assert (st.used_money, st.used_gpu_hours) == (Decimal("7.500000"), Decimal("5.000000"))   # 4 - 0 + 1
    rep = reports.cost_report(by="account", period="month", url=ledger)
    assert rep.total == Decimal("7.500000")
    assert sum(r.adjustments for r in rep.rows) == Decimal("-2.500000")
    with db.session_scope(ledger) as s:
        adj = s.scalars(select(Adjustment).order_by(Adjustment.id)).all()
        assert [(a.kind, a.job_id, a.reason) for a in adj] == [("credit", "100", "NODE_FAIL of job 100"),
                                                              ("debit", None, "manual run")]
        acts = [(a.action, a.actor) for a in s.scalars(select(LedgerAudit).order_by(LedgerAudit.id))]
    assert [a for a, _ in acts][-2:] == ["adjust.credit", "adjust.debit"] and acts[-1][1]
    # a counter built afresh (a new quota period) counts the adjustments from the charges too
    admin.set_quota("research", money=Decimal("1000"), period="week", url=ledger)
    assert _used(ledger) == Decimal("7.500000")


def test_audit_records_price_multiplier_and_quota_changes(ledger):
    admin.set_price("h100", rate=Decimal("3.00"), effective_from=T0, url=ledger)
    admin.set_price("h100", rate=Decimal("3.00"), effective_from=T0, url=ledger)      # unchanged: no row
    admin.set_multiplier("partition", "gpu", Decimal("0.6"), effective_from=T0, url=ledger)
    admin.set_quota("research", money=Decimal("500"), url=ledger)
    admin.remove_quota("research", url=ledger)
    rows_ = adjust.audit_entries(url=ledger)
    got = [(r["action"], r["before"], r["after"]) for r in rows_]
    assert ("price.set", {"rate": "2.500000", "of": None, "fraction": None, "currency": "USD"},
            {"rate": "3.000000", "of": None, "fraction": None, "currency": "USD"}) in got
    assert sum(1 for a, _, _ in got if a == "price.set") == 2           # the first set, the change
    assert ("multiplier.set", None, {"multiplier": "0.600000"}) in got
    assert ("quota.set", {"period": "month", "gpu_hours": None, "money": "1000.000000"},
            {"period": "month", "gpu_hours": None, "money": "500.000000"}) in got
    assert got[-1] == ("quota.remove", {"period": "month", "gpu_hours": None, "money": "500.000000"}, None)


def test_reprice_over_a_period_books_corrections_and_never_edits_charges(ledger):
    admin.set_multiplier("partition", "cheap", Decimal("0.5"), effective_from=T0, url=ledger)
    ingest.ingest_rows(rows(row("100", "COMPLETED", ts(0), ts(30), 1800),
                            row("101", "COMPLETED", ts(0), ts(30), 1800, gpu_type="a100", gpus=4),
                            row("102", "COMPLETED", ts(0), ts(30), 1800, partition="cheap")), url=ledger)
    before = _charges(ledger)
    assert _used(ledger) == Decimal("15.000000")                       # 10 + 0 (a100: no price) + 5
    since, until = BASE - dt.timedelta(days=1), BASE + dt.timedelta(days=1)
    dry = adjust.reprice("h100", "2.00", since=since, until=until, reason="rate typo", dry_run=True, url=ledger)
    assert dry.amount == Decimal("-3.000000") and _charges(ledger) == before
    b = adjust.reprice("h100", "2.00", since=since, until=until, reason="rate typo", url=ledger)
    # 4 GPU-h × (2.00 - 2.50), and on the cheap partition its multiplier still applies: 4 × (2.00 - 2.50) × 0.5
    assert (b.charges, b.amount) == (2, Decimal("-3.000000"))
    assert _charges(ledger) == [*before, ("correction", Decimal("-2.000000")), ("correction", Decimal("-1.000000"))]
    assert _used(ledger) == Decimal("12.000000")
    again = adjust.reprice("h100", "2.00", since=since, until=until, reason="rate typo", url=ledger)
    assert (again.charges, again.amount) == (0, Decimal(0))
    # a window that holds none of the run's charges books nothing
    assert adjust.reprice("h100", "1.00", since=until, until=until + dt.timedelta(days=1), reason="x",
                          url=ledger).charges == 0
    rep = reports.cost_report(by="gpu-type", period="month", url=ledger)
    assert rep.by_gpu_type["h100"] == Decimal("12.000000")


def test_node_fail_refund_by_policy_once(ledger):
    data = rows(row("200", "NODE_FAIL", ts(0), ts(30), 1800), row("201", "COMPLETED", ts(0), ts(30), 1800))
    ingest.ingest_rows(data, url=ledger)
    assert _used(ledger) == Decimal("20.000000")                     # policy off (the default): charged
    assert adjust.set_policy("node_fail_refund", "on", url=ledger)
    res = ingest.ingest_rows(data, url=ledger)                       # the window again: refunded now
    assert (res.refunds, res.refunded_amount) == (1, Decimal("10.000000"))
    assert _used(ledger) == Decimal("10.000000")
    assert ingest.ingest_rows(data, url=ledger).refunds == 0         # idempotent
    assert _charges(ledger)[-1] == ("refund", Decimal("-10.000000"))
    (a,) = adjust.list_adjustments(url=ledger)
    assert (a["kind"], a["job_id"], a["user"], a["amount"]) == ("refund", "200", "alice", "-10.000000")
    assert a["by"].startswith("policy node_fail_refund")
    assert reports.cost_report(by="account", url=ledger).total == Decimal("10.000000")
    with db.session_scope(ledger) as s:
        assert s.scalar(select(func.count()).select_from(Charge)) == 3


@pytest.mark.parametrize("args, field", [
    (["research", "--credit", "--amount", "5"], "--reason"),
    (["research", "--credit", "--amount", "-5", "--reason", "x"], "--amount"),
    (["research", "--credit", "--amount", "five", "--reason", "x"], "--amount"),
    (["research", "--credit", "--amount", "0.0000001", "--reason", "x"], "--amount"),
    (["research", "--debit", "--gpu-hours", "0", "--reason", "x"], "--gpu-hours"),
    (["research", "--debit", "--reason", "x"], "--amount"),
    (["research", "--amount", "1", "--reason", "x"], "--credit/--debit"),
    (["research", "--credit", "--amount", "1", "--reason", "a\x1bb"], "--reason"),
    (["research", "--credit", "--amount", "1", "--reason", "x", "--job", "1; rm"], "--job"),
    (["research", "--credit", "--amount", "1", "--reason", "x", "--user", "bob"], "--user"),
])
def test_adjust_bad_input_exits_2_with_one_line_naming_the_field(ledger, capsys, args, field):
    assert main(["ledger", "adjust", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {field}: "), err
    assert _charges(ledger) == []


def test_adjust_and_reprice_refuse_a_missing_reason_in_the_api_too(ledger):
    from gpuhpc.errors import UserInputError

    for reason in ("", "  ", "two\nlines"):
        with pytest.raises(UserInputError, match="^--reason: "):
            adjust.adjust("research", kind="credit", amount="1", reason=reason, url=ledger)
        with pytest.raises(UserInputError, match="^--reason: "):
            adjust.reprice("h100", "1", since=T0, until=NOW, reason=reason, url=ledger)
    assert _charges(ledger) == []


def test_cli_adjust_reprice_policy_audit(ledger, capsys):
    ingest.ingest_rows(TEN, url=ledger)
    assert main(["ledger", "adjust", "nosuch", "--credit", "--amount", "1", "--reason", "x"]) == 1
    assert main(["ledger", "adjust", "research", "--credit", "--amount", "1", "--reason", "x", "--job", "999"]) == 1
    capsys.readouterr()
    assert main(["ledger", "adjust", "research", "--credit", "--amount", "1.5", "--reason", "goodwill", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["amount"] == "-1.5"
    assert main(["ledger", "reprice", "--gpu-type", "h100", "--rate", "2", "--since", "2000-01-01",
                 "--until", "2000-01-01", "--reason", "x"]) == 2
    assert "--until" in capsys.readouterr().err
    assert main(["ledger", "reprice", "--gpu-type", "h100", "--rate", "2", "--since", "7d", "--until", "2099-01-01",
                 "--reason", "typo"]) == 0
    assert main(["ledger", "policy", "set", "node_fail_refund", "maybe"]) == 2
    assert "error: VALUE: " in capsys.readouterr().err
    assert main(["ledger", "policy", "set", "node_fail_refund", "on"]) == 0
    assert main(["ledger", "policy", "list", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["value"] == "on"
    assert main(["ledger", "adjustments", "--json"]) == 0
    assert [a["kind"] for a in json.loads(capsys.readouterr().out)] == ["credit", "correction"]
    assert main(["ledger", "audit", "--json"]) == 0
    acts = [a["action"] for a in json.loads(capsys.readouterr().out)]
    assert acts[-3:] == ["adjust.credit", "reprice", "policy.set"]
    assert _used(ledger) == Decimal("6.500000")                     # 10 - 1.5 - 4 GPU-h × 0.50


def test_slurm_limits_move_by_the_periods_adjustments_and_check_leaves_them_out(ledger_url):
    """Slurm counts usage, not adjustments: sync-slurm takes a period's adjustments off the budget
    (a credit raises GrpTRESMins), and ``ledger check`` compares Slurm's usage with the ledger's
    less its adjustments, so a credit is neither lost in Slurm nor a drift."""
    from gpuhpc.ledger import check, slurm_sync

    admin.add_account("proj", url=ledger_url)
    admin.add_user("bob", "proj", url=ledger_url)
    admin.set_quota("proj", gpu_hours=Decimal("10.5"), money=Decimal("12.5"), period="month", url=ledger_url)
    admin.set_quota("proj", user="bob", gpu_hours=Decimal("1"), period="month", url=ledger_url)
    now = dt.datetime(2026, 11, 15, tzinfo=dt.timezone.utc)
    adjust.adjust("proj", kind="credit", amount="2", gpu_hours="1", reason="refund", at=now, url=ledger_url)
    adjust.adjust("proj", kind="debit", gpu_hours="0.5", user="bob", reason="x", at=now, url=ledger_url)
    adjust.adjust("proj", kind="credit", amount="100", reason="last month", at=now - dt.timedelta(days=30),
                  url=ledger_url)
    (p,) = slurm_sync.plan(url=ledger_url, now=now)
    # (10.5 + 1 - 0.5) GPU-h × 60 - 2; (12.5 + 2) × 60,000,000 - 2; bob: (1 - 0.5) × 60 - 2
    assert p.limits == {"gres/gpu": 658, "billing": 869_999_998}
    assert p.user_limits == {"bob": {"gres/gpu": 28, "billing": -1}}
    statuses = {st.user: st for st in admin.quota_status("proj", url=ledger_url, now=now)}
    assert (statuses[None].used_gpu_hours, statuses[None].used_money) == (Decimal("-0.5"), Decimal("-2"))
    with db.session_scope(ledger_url) as s:
        plain = {st.user: check.without_adjustments(s, st) for st in statuses.values()}
    assert (plain[None].used_gpu_hours, plain[None].used_money) == (0, 0)
    assert plain["bob"].used_gpu_hours == 0

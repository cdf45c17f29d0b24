"""What finance asks for (issue 34.10, first parts): per-job line items (``gpuhpc ledger report --jobs
--csv``) that add up to the cost report, adjustments included; a burn forecast per budget
(``gpuhpc ledger forecast``: the spend rate over the last N days, the date the budget runs out)."""
from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import pytest

from gpuhpc.cli.main import main
from gpuhpc.errors import UserInputError
from gpuhpc.ledger import adjust, admin, ingest, reports

from ledger_sacct_text import row, rows

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
BASE = dt.datetime.now(dt.timezone.utc).replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)


def ts(minutes: float) -> str:
    return (BASE + dt.timedelta(minutes=minutes)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture()
def ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.50"), effective_from=T0, url=ledger_url)
    admin.set_quota("research", money=Decimal("1000"), url=ledger_url)
    return ledger_url


def test_job_lines_add_up_to_the_cost_report_with_adjustments(ledger, capsys):
    adjust.set_policy("node_fail_refund", "on", url=ledger)
    # 8 GPUs × 30 min × 2.50 = 10.00 each; 200 is refunded (NODE_FAIL), 101 is an array task
    ingest.ingest_rows(rows(row("100", "COMPLETED", ts(0), ts(30), 1800),
                            row("101_3", "COMPLETED", ts(0), ts(30), 1800),
                            row("200", "NODE_FAIL", ts(0), ts(30), 1800)), url=ledger)
    adjust.adjust("research", kind="credit", amount="1.5", reason="=HYPERLINK(\"x\") goodwill", url=ledger)
    lines = reports.job_lines(url=ledger)
    got = {(x["kind"], x["job_id"], x["array_task_id"]): (x["cost"], x["adjustments"], x["total"]) for x in lines}
    assert got == {("run", "100", ""): ("10.000000", "0", "10.000000"),
                   ("run", "101", "3"): ("10.000000", "0", "10.000000"),
                   ("run", "200", ""): ("10.000000", "-10.000000", "0.000000"),
                   ("adjustment", "", ""): ("0", "-1.500000", "-1.500000")}
    total = sum(Decimal(x["total"]) for x in lines)
    assert total == reports.cost_report(by="account", url=ledger).total == Decimal("18.5")
    # a window that starts half way through the runs: their part inside it, as the cost report cuts them
    since = BASE + dt.timedelta(minutes=15)
    part = reports.job_lines(since=since, url=ledger)
    assert {x["job_id"]: x["cost"] for x in part if x["kind"] == "run"} == {"100": "5.000000", "101": "5.000000",
                                                                            "200": "5.000000"}
    assert sum(Decimal(x["total"]) for x in part) == reports.cost_report(since=since, url=ledger).total
    # the CLI's CSV: a header, one row a line; a formula-looking reason is defused, a negative number is not
    assert main(["ledger", "report", "--jobs", "--csv"]) == 0
    out = capsys.readouterr().out
    table = list(csv.DictReader(io.StringIO(out)))
    assert len(table) == 4 and list(table[0]) == list(reports.LINE_FIELDS)
    (credit,) = [t for t in table if t["kind"] == "adjustment"]
    assert credit["reason"].startswith("'=HYPERLINK") and credit["total"] == "-1.500000"
    assert main(["ledger", "report", "--jobs", "--json", "--account", "nosuch"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_ledger_report_bad_input_exits_2(ledger, capsys):
    assert main(["ledger", "report", "--csv"]) == 2
    assert capsys.readouterr().err.startswith("error: --jobs: ")
    assert main(["ledger", "report", "--jobs", "--csv", "--json"]) == 2
    assert capsys.readouterr().err.startswith("error: --csv/--json: ")
    assert main(["ledger", "report", "--jobs", "--since", "last week"]) == 2
    assert "--since" in capsys.readouterr().err


def test_burn_forecast_per_budget(ledger, capsys):
    now = dt.datetime(2026, 11, 10, tzinfo=dt.timezone.utc)
    admin.set_quota("research", money=Decimal("20"), period="month", url=ledger)
    admin.set_quota("research", user="alice", gpu_hours=Decimal("10"), period="total", url=ledger)
    for day in (5, 8):         # 14.00 in the last 7 days: 2.00 a day
        adjust.adjust("research", kind="debit", amount="7", reason="x",
                      at=dt.datetime(2026, 11, day, tzinfo=dt.timezone.utc), url=ledger)
    adjust.adjust("research", kind="debit", amount="100", reason="long ago",
                  at=dt.datetime(2026, 10, 1, tzinfo=dt.timezone.utc), url=ledger)
    adjust.adjust("research", kind="debit", gpu_hours="6", reason="the account's, not alice's",
                  at=dt.datetime(2026, 11, 6, tzinfo=dt.timezone.utc), url=ledger)
    adjust.adjust("research", kind="debit", amount="50", reason="dated after now: not spent yet",
                  at=dt.datetime(2026, 12, 15, tzinfo=dt.timezone.utc), url=ledger)
    adjust.adjust("research", kind="debit", gpu_hours="1", user="alice", reason="x",
                  at=dt.datetime(2026, 11, 9, tzinfo=dt.timezone.utc), url=ledger)
    got = {(b.user, b.measure): b for b in reports.burn_forecast(days=7, now=now, url=ledger)}
    month = got[(None, "money")]
    # 20 - 14 left at 2.00 a day: 3 days, inside November
    assert (month.remaining, month.per_day, month.runs_out) == (Decimal(6), Decimal(2), now + dt.timedelta(days=3))
    total = got[("alice", "gpu_hours")]            # a total quota never resets: 9 GPU-h at 1/7 a day
    assert total.per_day == Decimal("0.142857") and total.runs_out.date() == dt.date(2027, 1, 12)
    assert set(got) == {(None, "money"), ("alice", "gpu_hours")}
    # over 45 days the October debit counts too: 114 spent, 2.533333 a day, the 6 left last 2.4 days
    month45 = {(b.user, b.measure): b for b in reports.burn_forecast(days=45, now=now, url=ledger)}[(None, "money")]
    assert month45.per_day == Decimal("2.533333") and month45.runs_out.date() == dt.date(2026, 11, 12)
    # a budget that lasts the period: no date
    admin.set_quota("research", money=Decimal("1000"), period="month", url=ledger)
    (b,) = [b for b in reports.burn_forecast(days=7, now=now, url=ledger) if b.measure == "money"]
    assert b.runs_out is None and b.per_day == Decimal(2) and b.period_end == dt.datetime(2026, 12, 1,
                                                                                        tzinfo=dt.timezone.utc)
    with pytest.raises(UserInputError, match="^--days: "):
        reports.burn_forecast(days=0, url=ledger)
    assert main(["ledger", "forecast", "--days", "0"]) == 2
    assert main(["ledger", "forecast", "--json"]) == 0
    assert {r["measure"] for r in json.loads(capsys.readouterr().out)} == {"money", "gpu_hours"}


def test_grant_and_cost_centre_on_accounts_reach_the_line_items(ledger, capsys):
    assert main(["ledger", "account", "add", "physics", "--grant", "ERC-2026-42", "--cost-centre", "CC-7"]) == 0
    assert main(["ledger", "user", "add", "bob", "--account", "physics"]) == 0
    assert main(["ledger", "account", "set", "research", "--cost-centre", "CC-1"]) == 0
    ingest.ingest_rows(rows(row("300", "COMPLETED", ts(0), ts(30), 1800, account="physics", user="bob"),
                            row("301", "COMPLETED", ts(0), ts(30), 1800)), url=ledger)
    lines = {x["job_id"]: (x["grant"], x["cost_centre"]) for x in reports.job_lines(url=ledger)}
    assert lines == {"300": ("ERC-2026-42", "CC-7"), "301": ("", "CC-1")}
    capsys.readouterr()
    assert main(["ledger", "account", "list", "--json"]) == 0
    got = {a["account"]: (a["grant"], a["cost_centre"]) for a in json.loads(capsys.readouterr().out)}
    assert got == {"physics": ("ERC-2026-42", "CC-7"), "research": (None, "CC-1")}
    assert main(["ledger", "account", "set", "physics", "--grant", ""]) == 0          # cleared
    audit = [(a["action"], a["target"], a["before"], a["after"]) for a in adjust.audit_entries(url=ledger)
             if a["action"] == "account.set"]
    assert audit == [("account.set", "account physics", None, {"grant": "ERC-2026-42", "cost_centre": "CC-7"}),
                     ("account.set", "account research", {"grant": None, "cost_centre": None},
                      {"grant": None, "cost_centre": "CC-1"}),
                     ("account.set", "account physics", {"grant": "ERC-2026-42", "cost_centre": "CC-7"},
                      {"grant": None, "cost_centre": "CC-7"})]
    capsys.readouterr()
    assert main(["ledger", "account", "set", "research", "--grant", "a\tb"]) == 2
    assert capsys.readouterr().err.startswith("error: --grant: ")
    assert main(["ledger", "account", "add", "chem", "--cost-centre", "x" * 65]) == 2
    assert capsys.readouterr().err.startswith("error: --cost-centre: ")
    assert main(["ledger", "account", "set", "research"]) == 2
    assert main(["ledger", "account", "set", "nosuch", "--grant", "G"]) == 1

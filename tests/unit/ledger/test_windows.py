"""Allocation windows instead of calendar periods (issue 34.10): a fiscal year from 1 July, a
90-day allocation. The quota counters, the budget snapshot, sync-slurm's resets and the forecast
all use the quota's own window (docs/ledger.md, "Budget alerts and allocation windows")."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import QuotaExceeded, UserInputError
from gpuhpc.ledger import admin, budget, db, hooks, ingest, periods, quota, reports, slurm_sync

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
BERLIN = periods.zone("Europe/Berlin")
FISCAL = "2026-07-01/P12M"


def at(y, mo, d, h=0, mi=0) -> dt.datetime:
    return dt.datetime(y, mo, d, h, mi, tzinfo=UTC)


def run_row(job: str, start: dt.datetime, seconds: int, **kw) -> str:
    def sacct_time(t: dt.datetime) -> str:
        return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

    return row(job, "COMPLETED", sacct_time(start), sacct_time(start + dt.timedelta(seconds=seconds)), seconds, **kw)


@pytest.fixture()
def site(tmp_path, monkeypatch):
    path = tmp_path / "site.toml"
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))

    def set_zone(name: str) -> None:
        path.write_text(f'[ledger]\ntimezone = "{name}"\n')
    return set_zone


# ------------------------------------------------------------------ the windows themselves
def test_window_arg_reads_days_weeks_months_years_and_refuses_the_rest():
    assert periods.window_arg("2026-07-01/1y") == FISCAL
    assert periods.window_arg(" 2026-07-01/P12M ") == FISCAL
    assert periods.window_arg("2026-01-05/90d") == "2026-01-05/P90D"
    assert periods.window_arg("2026-01-05/p13W") == "2026-01-05/P91D"
    assert periods.window_arg("2026-01-05/999d") == "2026-01-05/P999D"
    for bad in ("2026-02-30/90d", "2026-07-01/0d", "2026-07-01/1000d", "2026-07-01/11y", "2026-07-01",
                "90d", "2026-07-01/12m; rm -rf /", "2026-07-01/12m\n", "", None):
        with pytest.raises(UserInputError) as exc:
            periods.window_arg(bad)
        assert exc.value.exit_code == 2 and exc.value.field == "--window", bad
    # what is stored round-trips, and fits the period column (VARCHAR(16))
    assert periods.parse_window("2026-01-05/P999D") == periods.Window(dt.date(2026, 1, 5), 999, "D")
    assert len("2026-01-05/P999D") <= 16 and len(periods.window_arg("2026-01-05/10y")) <= 16
    assert periods.parse_window("month") is None and periods.parse_window("2026-07-01/12m") is None
    with pytest.raises(UserInputError, match="unknown period"):
        periods.check_period("fortnight")


def test_a_fiscal_year_from_1_july_begins_at_local_midnight_and_repeats():
    start = periods.period_start(FISCAL, at(2027, 3, 1), BERLIN)
    assert start == at(2026, 6, 30, 22)                          # 1 July 00:00 CEST
    assert periods.period_end(FISCAL, start, BERLIN) == at(2027, 6, 30, 22)
    assert periods.hours_in(FISCAL, start, BERLIN) == 365 * 24    # the DST hours even out over a year
    # before its start date the windows go on backwards; at the boundary the next one begins
    assert periods.period_start(FISCAL, at(2026, 5, 1), BERLIN) == at(2025, 6, 30, 22)
    assert periods.period_start(FISCAL, at(2026, 6, 30, 21, 59), BERLIN) == at(2025, 6, 30, 22)
    assert periods.period_start(FISCAL, at(2027, 6, 30, 22), BERLIN) == at(2027, 6, 30, 22)
    assert periods.period_start(FISCAL, at(2026, 9, 1)) == at(2026, 7, 1)                   # UTC by default
    assert periods.boundaries(FISCAL, at(2026, 6, 1), at(2028, 1, 1), BERLIN) == [at(2026, 6, 30, 22),
                                                                                 at(2027, 6, 30, 22)]


def test_a_90_day_window_and_month_windows_from_the_31st():
    w = "2026-01-05/P90D"
    assert periods.period_start(w, at(2026, 4, 4, 12)) == at(2026, 1, 5)
    assert periods.period_end(w, at(2026, 1, 5)) == at(2026, 4, 5)             # 5 January + 90 days
    assert periods.period_start(w, at(2026, 4, 5)) == at(2026, 4, 5)
    assert periods.period_start(w, at(2026, 1, 4, 23)) == at(2025, 10, 7)
    assert periods.hours_in(w, at(2026, 1, 5)) == 90 * 24
    # a month window counts from its start date: 31 January, 28 February, 31 March, 30 April
    m = "2026-01-31/P1M"
    assert periods.period_start(m, at(2026, 3, 15)) == at(2026, 2, 28)
    assert periods.period_end(m, at(2026, 2, 28)) == at(2026, 3, 31)
    assert periods.period_start(m, at(2026, 5, 1)) == at(2026, 4, 30)
    assert periods.period_start(m, at(2026, 1, 30)) == at(2025, 12, 31)
    q = "2026-02-15/P3M"                                                            # quarters from the 15th
    assert [periods.period_start(q, at(2026, mo, 20)) for mo in (2, 4, 5, 8, 12)] == [
        at(2026, 2, 15), at(2026, 2, 15), at(2026, 5, 15), at(2026, 8, 15), at(2026, 11, 15)]
    assert periods.period_start(q, at(2026, 2, 14)) == at(2025, 11, 15)


# ------------------------------------------------------------------ on the ledger
@pytest.fixture()
def ledger(ledger_url, site):
    site("Europe/Berlin")
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=ledger_url)   # 0.001 per GPU-second
    admin.set_quota("research", gpu_hours=Decimal("10"), period=FISCAL, url=ledger_url)
    return ledger_url


def _book(url):
    with db.session_scope(url) as s:
        return admin.load_price_book(s)


def test_a_window_quota_counts_its_own_window_in_counters_snapshot_forecast_and_sync(ledger):
    # 2 GPUs from 21:00 UTC on 30 June for 2 h: 1 h before the fiscal year (Berlin), 1 h inside
    ingest.ingest_rows(rows(run_row("700", at(2026, 6, 30, 21), 7200, gpus=2),
                            run_row("701", at(2026, 12, 31, 20), 3600, gpus=4)), url=ledger)
    (before,) = admin.quota_status("research", url=ledger, now=at(2026, 6, 30, 21, 30))
    (st,) = admin.quota_status("research", url=ledger, now=at(2027, 1, 15))
    assert (before.period, before.period_start, before.used_gpu_hours) == (FISCAL, at(2025, 6, 30, 22), Decimal(2))
    # the calendar year's end is no boundary: 2 GPU-h from the first run + 4 from the second
    assert (st.period, st.period_start, st.used_gpu_hours) == (FISCAL, at(2026, 6, 30, 22), Decimal(6))
    # the decision at submit: 6 used + 5 GPU-h needed > 10
    req = hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="gpu", qos=None,
                              gpu_type="h100", gpus=5, time_limit_s=3600, job_name="x")
    with pytest.raises(QuotaExceeded, match=r"research \(2026-07-01/P12M\)"):
        quota.reserve(req, url=ledger, now=at(2027, 1, 15))
    quota.reserve(req, url=ledger, now=at(2027, 7, 1))            # the next fiscal year starts afresh
    # the snapshot job_submit.lua reads: the window's label and end
    text = budget.render_snapshot([st], _book(ledger), at(2027, 1, 15))
    (line,) = [x for x in text.splitlines() if x.startswith("budget\t")]
    assert line.split("\t")[4:8] == ["2026-07-01 to 2027-06-30", str(int(at(2027, 6, 30, 22).timestamp())), "10.000000",
                                     "4.000000"]
    # a label from the UTC instant (as `ledger check` gives it) is dated in the accounting zone
    assert budget.period_label(FISCAL, at(2026, 6, 30, 22)) == "2026-07-01 to 2027-06-30"
    assert budget.period_label("month", at(2026, 6, 30, 22)) == "2026-07"
    # the forecast runs to the window's end, not the month's
    (burn,) = reports.burn_forecast(days=1000, url=ledger, now=at(2027, 1, 15))
    assert burn.period_end == at(2027, 6, 30, 22) and burn.runs_out is None     # 8 GPU-h in 1000 days: it lasts
    (burn,) = reports.burn_forecast(days=16, url=ledger, now=at(2027, 1, 15))
    assert burn.runs_out == at(2027, 1, 15) + dt.timedelta(days=16)             # 4/16 a day: 4 left in 16 days
    # sync-slurm resets Slurm's usage when the window rolls over, not at a month end
    (p,) = slurm_sync.plan(url=ledger, accounts=["research"], now=at(2027, 1, 15))
    assert (p.period_start, p.reset) == (at(2026, 6, 30, 22), True)
    slurm_sync.record_periods([p], url=ledger)
    for now, reset in ((at(2027, 2, 1), False), (at(2027, 6, 30, 21), False), (at(2027, 6, 30, 22), True)):
        (p,) = slurm_sync.plan(url=ledger, accounts=["research"], now=now)
        assert p.reset is reset, now


def test_line_items_for_the_quota_window(ledger, capsys):
    """Finance's line items over the account's allocation window: the run across its start counts
    only its part inside."""
    import json

    from gpuhpc.cli.main import main

    ingest.ingest_rows(rows(run_row("700", at(2026, 6, 30, 21), 7200, gpus=2),
                            run_row("701", at(2026, 12, 31, 20), 3600, gpus=4),
                            run_row("702", at(2027, 7, 1), 3600, gpus=1)), url=ledger)
    assert budget.quota_period("research", at(2027, 1, 15)) == (FISCAL, at(2026, 6, 30, 22), at(2027, 6, 30, 22))
    assert main(["ledger", "report", "--jobs", "--json", "--account", "research", "--quota-period", "2027-01-15"]) == 0
    lines = json.loads(capsys.readouterr().out)
    assert sorted((x["job_id"], x["gpu_hours"], x["total"]) for x in lines) == [
        ("700", "2.000000", "7.200000"), ("701", "4.000000", "14.400000")]
    for argv in (["--quota-period", "now"], ["--account", "research", "--quota-period", "now", "--since", "7d"]):
        assert main(["ledger", "report", "--jobs", *argv]) == 2
        assert "--quota-period" in capsys.readouterr().err
    assert main(["ledger", "report", "--jobs", "--account", "nobody", "--quota-period", "now"]) == 1
    assert "account nobody has no quota" in capsys.readouterr().err


def test_quota_set_window_on_the_cli_and_bad_input_exits_2(ledger, capsys):
    from gpuhpc.cli.main import main

    assert main(["quota", "set", "research", "--user", "alice", "--gpu-hours", "5", "--window",
                 "2026-01-05/90d"]) == 0
    assert main(["quota", "show", "research", "--json", "--no-slurm"]) == 0
    out = capsys.readouterr().out
    assert '"period": "2026-01-05/P90D"' in out and '"period": "2026-07-01/P12M"' in out
    for argv, field in ((["--window", "2026-13-01/90d"], "--window"), (["--window", "2026-01-05/90d", "--period",
                                                                          "week"], "--window"),
                        (["--period", "fortnight"], "--period")):
        assert main(["quota", "set", "research", "--gpu-hours", "5", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and field in err and "Traceback" not in err, err
    (st,) = [s for s in admin.quota_status("research", url=ledger) if s.user is None]
    assert st.period == FISCAL                                    # nothing changed by the refused commands

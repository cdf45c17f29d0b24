"""Accounting periods: boundaries in the ledger's zone (DST-safe), a run split at them in
charges, quota counters and reports (docs/ledger.md, "Month end, for finance")."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from sqlalchemy import select

from gpuhpc.errors import QuotaExceeded, UserInputError
from gpuhpc.ledger import admin, db, hooks, ingest, periods, quota, reports
from gpuhpc.ledger.orm import Charge

from ledger_sacct_text import row, rows

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
BERLIN = periods.zone("Europe/Berlin")


def at(y, mo, d, h=0, mi=0) -> dt.datetime:
    return dt.datetime(y, mo, d, h, mi, tzinfo=UTC)


def sacct_time(t: dt.datetime) -> str:
    return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")     # sacct prints the host's local time


def run_row(job: str, start: dt.datetime, seconds: int, state: str = "COMPLETED", **kw) -> str:
    end = "Unknown" if state == "RUNNING" else sacct_time(start + dt.timedelta(seconds=seconds))
    return row(job, state, sacct_time(start), end, seconds, **kw)


@pytest.fixture()
def site(tmp_path, monkeypatch):
    """Write the site config's [ledger] timezone."""
    path = tmp_path / "site.toml"
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))

    def set_zone(name: str) -> None:
        path.write_text(f'[ledger]\ntimezone = "{name}"\n')
    return set_zone


@pytest.fixture()
def ledger(ledger_url, site):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=ledger_url)   # 0.001 per GPU-second
    admin.set_quota("research", gpu_hours=Decimal("4"), period="month", url=ledger_url)
    return ledger_url


# ------------------------------------------------------------------ boundaries
def test_berlin_months_have_743_and_745_hours_around_dst():
    march = periods.period_start("month", at(2026, 3, 15), BERLIN)
    assert march == at(2026, 2, 28, 23)                         # 1 March 00:00 CET
    assert periods.hours_in("month", march, BERLIN) == 743
    october = periods.period_start("month", at(2026, 10, 15), BERLIN)
    assert october == at(2026, 9, 30, 22)                       # 1 October 00:00 CEST
    assert periods.hours_in("month", october, BERLIN) == 745
    assert periods.hours_in("month", periods.period_start("month", at(2026, 11, 15), BERLIN), BERLIN) == 720
    # the DST days themselves: 23 and 25 hours
    assert periods.hours_in("day", periods.period_start("day", at(2026, 3, 29, 12), BERLIN), BERLIN) == 23
    assert periods.hours_in("day", periods.period_start("day", at(2026, 10, 25, 12), BERLIN), BERLIN) == 25
    # 23:30 UTC on 31 October is already November in Berlin
    assert periods.period_start("month", at(2026, 10, 31, 23, 30), BERLIN) == at(2026, 10, 31, 23)
    assert periods.period_start("week", at(2026, 11, 29, 23, 30), BERLIN) == at(2026, 11, 29, 23)   # Monday 30th
    assert periods.boundaries("day", at(2026, 3, 28, 12), at(2026, 3, 30, 12), BERLIN) == [
        at(2026, 3, 28, 23), at(2026, 3, 29, 22)]
    assert periods.period_start("month", at(2026, 10, 31, 23, 30)) == at(2026, 10, 1)   # UTC by default


def test_a_bad_zone_is_exit_2_naming_the_setting(site, tmp_path, monkeypatch, capsys):
    site("Mars/Olympus_Mons")
    with pytest.raises(UserInputError) as exc:
        periods.ledger_zone()
    assert exc.value.exit_code == 2 and exc.value.field == "ledger.timezone"
    assert "ledger.timezone" in str(exc.value)
    from gpuhpc.cli.main import main

    monkeypatch.setenv("GPUHPC_DB_URL", f"sqlite:///{tmp_path / 'l.db'}")
    db.upgrade(f"sqlite:///{tmp_path / 'l.db'}")
    assert main(["report", "cost"]) == 2
    err = capsys.readouterr().err
    assert "ledger.timezone" in err and "Mars/Olympus_Mons" in err and "Traceback" not in err
    site("../../etc/passwd")
    with pytest.raises(UserInputError):
        periods.ledger_zone()


# ------------------------------------------------------------------ a run across a month end
def charges(url):
    with db.session_scope(url) as s:
        return [(c.bucket_at, c.gpu_hours, c.amount) for c in s.scalars(select(Charge).order_by(Charge.id))]


def test_a_run_across_the_month_end_counts_in_each_month_in_berlin(ledger, site):
    site("Europe/Berlin")
    start = at(2026, 11, 30, 22)                 # 23:00 in Berlin; December begins at 23:00 UTC
    # 2 GPUs: first seen running 30 min (all November), then finished after 4 h
    ingest.ingest_rows(rows(run_row("500", start, 1800, "RUNNING", gpus=2)), url=ledger)
    assert charges(ledger) == [(start, Decimal("1.000000"), Decimal("3.600000"))]
    data = rows(run_row("500", start, 4 * 3600, gpus=2))
    res = ingest.ingest_rows(data, url=ledger)
    assert res.charges == 2                      # the top-up: the rest of November, then December
    assert charges(ledger)[1:] == [(start + dt.timedelta(minutes=30), Decimal("1.000000"), Decimal("3.600000")),
                                   (at(2026, 11, 30, 23), Decimal("6.000000"), Decimal("21.600000"))]
    again = ingest.ingest_rows(data, url=ledger)                      # idempotent
    assert (again.charges, len(charges(ledger))) == (0, 3)
    (nov,) = admin.quota_status("research", url=ledger, now=at(2026, 11, 30, 22, 30))
    (dec,) = admin.quota_status("research", url=ledger, now=at(2026, 12, 2))
    assert (nov.period_start, nov.used_gpu_hours, nov.used_money) == (at(2026, 10, 31, 23), Decimal(2), Decimal("7.2"))
    assert (dec.period_start, dec.used_gpu_hours, dec.used_money) == (at(2026, 11, 30, 23), Decimal(6), Decimal("21.6"))
    # the report: November (local) 2 GPU-h, December 6 GPU-h; the parts add up to the run
    rep = reports.cost_report(by="account", period="month", url=ledger)
    assert [(r.as_dict([])["period_start"], r.gpu_hours, r.cost) for r in rep.rows] == [
        ("2026-11-01", Decimal(2), Decimal("7.2")), ("2026-12-01", Decimal(6), Decimal("21.6"))]
    assert rep.total == Decimal("28.8")


def test_quota_usage_counts_only_the_part_inside_the_period(ledger, site):
    """Slurm resets usage at the boundary: at submit in December, December's counter holds only
    the run's December hours (6 of 8), so a 4 GPU-h budget is already spent."""
    site("UTC")
    start = at(2026, 11, 30, 22)
    ingest.ingest_rows(rows(run_row("501", start, 4 * 3600, gpus=2)), url=ledger)     # 4 GPU-h each side
    req = hooks.ChargeRequest(cluster="local", user="alice", account="research", partition="gpu", qos=None,
                              gpu_type="h100", gpus=1, time_limit_s=600, job_name="x")
    with pytest.raises(QuotaExceeded):           # December: 4 used + 1/6 needed > 4
        quota.reserve(req, url=ledger, now=at(2026, 12, 1, 12))
    (dec,) = admin.quota_status("research", url=ledger, now=at(2026, 12, 1, 12))
    assert dec.used_gpu_hours == Decimal(4)
    # a quota set later (its counters built from the charges) sees the same split: the week of
    # Monday 30 November holds the whole run, each month its part
    admin.set_quota("research", user="alice", gpu_hours=Decimal("100"), period="week", url=ledger)
    statuses = admin.quota_status("research", url=ledger, now=at(2026, 12, 1, 12))
    assert sorted((s.period, s.used_gpu_hours) for s in statuses) == [("month", Decimal(4)), ("week", Decimal(8))]
    statuses = admin.quota_status("research", url=ledger, now=at(2026, 11, 30, 23))
    assert sorted((s.period, s.used_gpu_hours) for s in statuses) == [("month", Decimal(4)), ("week", Decimal(8))]
    statuses = admin.quota_status("research", url=ledger, now=at(2026, 11, 29, 23))
    assert sorted((s.period, s.used_gpu_hours) for s in statuses) == [("month", Decimal(4)), ("week", Decimal(0))]


def test_report_windows_cut_runs_at_any_instant(ledger, site):
    site("UTC")
    start = at(2026, 11, 30, 22)
    ingest.ingest_rows(rows(run_row("502", start, 4 * 3600, gpus=2),
                            run_row("503", at(2026, 11, 30, 23, 50), 5, gpus=1, account="research")), url=ledger)

    def window(a, b):
        rep = reports.cost_report(by="account", period="month", since=a, until=b, url=ledger)
        return sum((r.gpu_hours for r in rep.rows), Decimal(0)), rep.total

    assert window(at(2026, 11, 30, 23, 30), at(2026, 12, 1, 0, 30)) == (Decimal("2.001389"), Decimal("7.205000"))
    assert window(at(2026, 12, 1, 1), at(2026, 12, 1, 1, 0) + dt.timedelta(seconds=1)) == (
        Decimal("0.000556"), Decimal("0.002000"))
    # the windows of a partition add up exactly to the whole
    cuts = [at(2026, 11, 30, 21), at(2026, 11, 30, 22, 17), at(2026, 11, 30, 23, 50) + dt.timedelta(seconds=3), at(2026, 12, 1, 3)]
    parts = [window(a, b) for a, b in zip(cuts, cuts[1:])]
    assert sum(p[0] for p in parts) == Decimal("8.001389")
    assert sum(p[1] for p in parts) == window(None, None)[1] == Decimal("28.805000")


def test_reprice_spreads_the_money_over_the_days_the_run_ran(ledger_url, site):
    site("UTC")
    url = ledger_url
    admin.add_account("research", url=url)
    admin.add_user("alice", "research", default=True, url=url)
    admin.set_quota("research", money=Decimal("1000"), period="day", url=url)
    start = at(2026, 11, 30, 23)
    ingest.ingest_rows(rows(run_row("504", start, 2 * 3600, gpus=1)), url=url)      # no price yet: 0
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=url)
    res = ingest.reprice(url=url)
    assert res.repriced_runs == 1 and res.repriced_amount == Decimal("7.2")
    repriced = charges(url)[2:]
    assert repriced == [(start, Decimal(0), Decimal("3.600000")), (at(2026, 12, 1), Decimal(0), Decimal("3.600000"))]
    used = {s.period_start: s.used_money for t in (at(2026, 11, 30, 23, 30), at(2026, 12, 1, 0, 30))
            for s in admin.quota_status("research", url=url, now=t)}
    assert used == {at(2026, 11, 30): Decimal("3.6"), at(2026, 12, 1): Decimal("3.6")}


def test_sreport_rows_parse_and_an_accounts_own_usage_is_its_user_rows():
    from gpuhpc.slurm import commands as cmd
    from gpuhpc.slurm.parsers import parse_sreport_account_user

    argv = cmd.sreport_account_user("2026-12-03T00:00:00", "2026-12-03T03:00:00")
    assert argv[-3:] == ["AccountUtilizationByUser", "start=2026-12-03T00:00:00", "end=2026-12-03T03:00:00"]
    assert "seconds" in argv and "--tres=gres/gpu" in argv
    text = ("local|root|||gres/gpu|1002\nlocal|root|root|root|gres/gpu|436\n"
            "local|research|||gres/gpu|566\nlocal|research|alice|Alice|gres/gpu|566\ngarbage\n")
    got = parse_sreport_account_user(text)
    assert [(u.account, u.user, u.seconds) for u in got] == [
        ("root", "", 1002), ("root", "root", 436), ("research", "", 566), ("research", "alice", 566)]
    assert "--truncate" in cmd.sacct_truncated("a", "b", job_ids=["7"])


def test_slurm_resets_and_the_budget_snapshot_use_the_same_boundaries(ledger, site):
    """sync-slurm resets Slurm's usage at the period the ledger counts in, and the snapshot that
    job_submit.lua reads ends the period where the ledger does (Berlin: 23:00 UTC)."""
    from gpuhpc.ledger import budget, slurm_sync

    site("Europe/Berlin")
    now = at(2026, 11, 30, 23, 30)                      # already 1 December in Berlin
    (plan,) = slurm_sync.plan(url=ledger, accounts=["research"], now=now)
    assert plan.period_start == at(2026, 11, 30, 23)
    statuses = admin.quota_status("research", url=ledger, now=now)
    text = budget.render_snapshot(statuses, _book(ledger), now)
    (line,) = [x for x in text.splitlines() if x.startswith("budget\t")]
    assert line.split("\t")[4:6] == ["2026-12", str(int(at(2026, 12, 31, 23).timestamp()))]


def _book(url):
    with db.session_scope(url) as s:
        return admin.load_price_book(s)

"""Several clusters on one ledger (issue 34.6): runs keyed by cluster, one ingest watermark per
cluster, quotas for every cluster or for one, and what sync-slurm takes off a quota for every
cluster on each cluster (the usage on the others)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from sqlalchemy import select

from gpuhpc.errors import QuotaExceeded, UserInputError
from gpuhpc.ledger import admin, db, ingest, quota
from gpuhpc.ledger.orm import IngestState, UsageRecord
from gpuhpc.ledger.types import ChargeRequest

from ledger_sacct_text import row, rows

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
NOW = dt.datetime.now(dt.timezone.utc)


def ts(minutes: float) -> str:
    base = NOW.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)
    return (base + dt.timedelta(minutes=minutes)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture()
def ledger(ledger_url):
    admin.add_account("research", url=ledger_url)
    admin.add_user("alice", "research", default=True, url=ledger_url)
    admin.set_price("h100", rate=Decimal("3.60"), effective_from=T0, url=ledger_url)
    return ledger_url


def both_clusters():
    """Job 42 on cluster a and job 42 on cluster b, the same start: 1 GPU × 1000 s = 1.00 each."""
    return rows(row("42", "COMPLETED", ts(0), ts(20), 1000, gpus=1, cluster="a"),
                row("42", "COMPLETED", ts(0), ts(20), 1000, gpus=1, cluster="b"))


def test_equal_job_ids_on_two_clusters_are_two_runs(ledger):
    first = ingest.ingest_rows(both_clusters()[:1], url=ledger)      # a's job 42 first, then b's beside it
    assert (first.runs_new, first.charges) == (1, 1)
    res = ingest.ingest_rows(both_clusters(), url=ledger)
    assert (res.runs_new, res.runs_updated, res.charges) == (1, 0, 1)
    again = ingest.ingest_rows(both_clusters(), url=ledger)        # idempotent per cluster
    assert (again.runs_new, again.runs_updated, again.charges) == (0, 0, 0)
    with db.session_scope(ledger) as s:
        recs = sorted((r.cluster, r.job_id, r.amount) for r in s.scalars(select(UsageRecord)))
    assert recs == [("a", "42", Decimal("1.000000")), ("b", "42", Decimal("1.000000"))]


def test_each_cluster_keeps_its_own_watermark(ledger):
    since_a = NOW - dt.timedelta(hours=3)
    ingest.ingest_rows(rows(row("7", "COMPLETED", ts(0), ts(1), 60, gpus=1, cluster="a")), url=ledger,
                       since=since_a, clusters=["a"])
    with db.session_scope(ledger) as s:
        marks = {st.name: st.last_since for st in s.scalars(select(IngestState))}
    assert marks[ingest.watermark_name("a")] == since_a and ingest.watermark_name("b") not in marks
    later = NOW + dt.timedelta(days=5)
    # cluster a goes on from a day before its last ingest; b, never ingested, from 30 days back
    a_next = ingest.default_since(url=ledger, now=later, clusters=["a"])
    assert NOW - dt.timedelta(days=1, minutes=1) < a_next < NOW
    assert ingest.default_since(url=ledger, now=later, clusters=["b"]) == later - dt.timedelta(days=30)
    assert ingest.default_since(url=ledger, now=later, clusters=["a", "b"]) == later - dt.timedelta(days=30)
    ingest.ingest_rows(rows(), url=ledger, since=NOW, clusters=["b"])   # no jobs: still b's watermark
    assert NOW - dt.timedelta(days=1, minutes=1) < ingest.default_since(url=ledger, now=later, clusters=["b"]) < NOW


def test_a_ledger_from_before_0011_goes_on_from_its_one_watermark(ledger):
    with db.session_scope(ledger) as s:
        s.add(IngestState(name=ingest.SOURCE, last_run_at=NOW - dt.timedelta(hours=2), last_detail=""))
    later = NOW + dt.timedelta(days=5)
    assert ingest.default_since(url=ledger, now=later, clusters=["a"]) == NOW - dt.timedelta(days=1, hours=2)


def test_global_quota_counts_both_clusters_cluster_quota_its_own(ledger):
    admin.set_quota("research", money=Decimal("10"), url=ledger)
    admin.set_quota("research", money=Decimal("5"), cluster="a", url=ledger)
    admin.set_quota("research", money=Decimal("5"), cluster="b", url=ledger)
    ingest.ingest_rows(both_clusters(), url=ledger)
    got = {st.cluster: st.used_money for st in admin.quota_status("research", url=ledger)}
    assert got == {None: Decimal("2"), "a": Decimal("1"), "b": Decimal("1")}
    # a counter built afresh from the charges (quota_usage rows gone) counts the same
    with db.session_scope(ledger) as s:
        s.execute(db_delete_counters())
    got = {st.cluster: st.used_money for st in admin.quota_status("research", url=ledger)}
    assert got == {None: Decimal("2"), "a": Decimal("1"), "b": Decimal("1")}


def db_delete_counters():
    from sqlalchemy import delete

    from gpuhpc.ledger.orm import QuotaUsage

    return delete(QuotaUsage)


def test_admission_on_a_cluster_counts_its_quota_and_the_global_one(ledger):
    admin.set_quota("research", money=Decimal("1.5"), cluster="b", url=ledger)
    ingest.ingest_rows(both_clusters(), url=ledger)
    # 1 GPU-hour at 3.60 fits nowhere near b's 0.50 left, but a has no quota of its own
    req = ChargeRequest(cluster="a", user="alice", account="research", partition="gpu", qos="normal",
                        gpu_type="h100", gpus=1, time_limit_s=3600, array_size=1, job_name="x")
    quota.reserve(req, url=ledger).release()
    with pytest.raises(QuotaExceeded, match="on cluster b"):
        quota.reserve(ChargeRequest(**{**req.__dict__, "cluster": "b"}), url=ledger)
    admin.set_quota("research", money=Decimal("4"), url=ledger)          # for every cluster: 2.00 used of 4
    with pytest.raises(QuotaExceeded, match=r"account research \(month\)"):
        quota.reserve(req, url=ledger)


def test_usage_elsewhere_is_the_other_clusters_charges(ledger):
    ingest.ingest_rows(rows(row("1", "COMPLETED", ts(0), ts(20), 1000, gpus=1, cluster="a"),
                            row("2", "COMPLETED", ts(0), ts(20), 2000, gpus=1, cluster="b")), url=ledger)
    start = NOW - dt.timedelta(days=1)
    with db.session_scope(ledger) as s:
        tx = admin.session_tx(s)
        assert quota.usage_elsewhere(tx, "research", None, "a", start, None) == (Decimal("0.555556"), Decimal("2"))
        assert quota.usage_elsewhere(tx, "research", "alice", "b", start, None) == (Decimal("0.277778"), Decimal("1"))
        assert quota.usage_elsewhere(tx, "research", None, "c", start, None) == (Decimal("0.833334"), Decimal("3"))


def test_cluster_arguments_are_checked():
    from gpuhpc.cli.ledger_args import cluster_names

    assert cluster_names(None, "A, b,a") == ["a", "b"]
    assert cluster_names("gpuhpc", None) == ["gpuhpc"]
    assert cluster_names(None, None) == []
    for bad in ("a;rm", "-x", ","):
        with pytest.raises(UserInputError):
            cluster_names(None, bad)
    with pytest.raises(UserInputError, match="not both"):
        cluster_names("a", "b")


def test_sync_slurm_limit_on_each_cluster(ledger):
    """On each cluster, a quota for every cluster is its budget less the other clusters' usage; a
    cluster's own quota is its own (the tighter of the two holds); another cluster's is not there."""
    from gpuhpc.ledger import budget, slurm_sync

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    admin.set_quota("research", gpu_hours=Decimal("2"), cluster="b", url=ledger)
    ingest.ingest_rows(rows(row("1", "COMPLETED", ts(0), ts(20), 1000, gpus=1, cluster="a"),
                            row("2", "COMPLETED", ts(0), ts(20), 2000, gpus=1, cluster="b")), url=ledger)
    limits = {c: slurm_sync.plan(url=ledger, cluster=c)[0].limits for c in ("a", "b", "c")}
    billing = {c: budget.money_to_billing_minutes(Decimal(10) - used) - slurm_sync.HEADROOM_MINUTES
               for c, used in (("a", 2), ("b", 1), ("c", 3))}
    assert limits == {"a": {"gres/gpu": -1, "billing": billing["a"]},
                      "b": {"gres/gpu": 2 * 60 - slurm_sync.HEADROOM_MINUTES, "billing": billing["b"]},
                      "c": {"gres/gpu": -1, "billing": billing["c"]}}
    # a ledger of one cluster (no cluster named): the budget whole, as before
    assert slurm_sync.plan(url=ledger)[0].limits["billing"] == billing["c"] + 3 * 60_000_000


def test_each_cluster_resets_its_usage_on_a_new_period(ledger):
    from gpuhpc.ledger import slurm_sync

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    on_a = slurm_sync.plan(url=ledger, cluster="a")
    assert on_a[0].reset
    slurm_sync.record_periods(on_a, url=ledger, cluster="a")
    assert not slurm_sync.plan(url=ledger, cluster="a")[0].reset
    assert slurm_sync.plan(url=ledger, cluster="b")[0].reset        # b's associations not reset yet


def test_a_ledger_from_before_0011_does_not_reset_again_mid_period(ledger):
    from gpuhpc.ledger import slurm_sync

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    slurm_sync.record_periods(slurm_sync.plan(url=ledger), url=ledger)      # as sync-slurm before 0011 did
    assert not slurm_sync.plan(url=ledger, cluster="a")[0].reset


def test_ledger_check_compares_this_clusters_usage(ledger):
    """``ledger check`` on a cluster compares Slurm's usage there with the ledger's usage there: a
    quota for every cluster less the other clusters' runs, a cluster's own quota as it is."""
    from gpuhpc.ledger import check

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    admin.set_quota("research", money=Decimal("10"), cluster="b", url=ledger)
    ingest.ingest_rows(rows(row("1", "COMPLETED", ts(0), ts(20), 1000, gpus=1, cluster="a"),
                            row("2", "COMPLETED", ts(0), ts(20), 2000, gpus=1, cluster="b")), url=ledger)
    every, own = sorted(admin.quota_status("research", url=ledger), key=lambda st: st.cluster is not None)
    with db.session_scope(ledger) as s:
        assert check.without_adjustments(s, every).used_money == Decimal("3")          # one cluster's ledger
        assert check.without_adjustments(s, every, "a").used_money == Decimal("1")
        assert check.without_adjustments(s, every, "b").used_money == Decimal("2")
        assert check.without_adjustments(s, own, "b").used_money == Decimal("2")


def test_rollover_plan_of_a_cluster_has_its_quotas_only(ledger):
    """The reset plan sync-slurm publishes on a cluster (gpuhpc ledger rollover) resets to that
    cluster's limits: another cluster's quota is not there, nor twice."""
    from gpuhpc.ledger import rollover

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    admin.set_quota("research", gpu_hours=Decimal("2"), cluster="b", url=ledger)
    on_a, on_b = rollover.compute("a", url=ledger), rollover.compute("b", url=ledger)
    assert [e.account for e in on_a.entries] == [e.account for e in on_b.entries] == ["research"]
    assert {r.limits["gres/gpu"] for r in on_a.entries[0].resets} == {-1}
    assert {r.limits["gres/gpu"] for r in on_b.entries[0].resets} == {2 * 60 - 2}


def test_budget_snapshot_of_a_cluster_has_its_budgets_only(ledger, tmp_path):
    """job_submit.lua on cluster a must not refuse a's jobs on b's budget: the snapshot sync-slurm
    writes on a holds a's quotas and those for every cluster."""
    from gpuhpc.ledger import budget, slurm_sync

    admin.set_quota("research", money=Decimal("10"), url=ledger)
    admin.set_quota("research", gpu_hours=Decimal("2"), cluster="b", url=ledger)
    kinds = {}
    for c in ("a", "b"):
        _, snap = slurm_sync.publish(url=ledger, billing_file=tmp_path / f"billing-{c}.json",
                                     snapshot_file=tmp_path / f"snap-{c}.txt", gpu_types=["h100"], cluster=c)
        kinds[c] = sorted(b.kind for b in budget.read_snapshot(snap).budgets)
    assert kinds == {"a": ["money"], "b": ["gpu_hours", "money"]}


def test_quota_set_cluster_from_the_cli_with_its_own_alerts(ledger, capsys):
    from gpuhpc.cli.main import main

    assert main(["quota", "set", "research", "--money", "10", "--alert-at", "50"]) == 0
    assert main(["quota", "set", "research", "--money", "4", "--cluster", "Beta", "--alert-at", "90"]) == 0
    assert main(["quota", "set", "research", "--money", "4", "--cluster", "a;b"]) == 2
    with db.session_scope(ledger) as s:
        from gpuhpc.ledger.orm import Quota

        got = sorted((q.cluster or "", str(q.money), q.alert_at) for q in s.scalars(select(Quota)))
    assert got == [("", "10.000000", "50"), ("beta", "4.000000", "90")]
    assert main(["quota", "remove", "research", "--cluster", "beta"]) == 0
    with db.session_scope(ledger) as s:
        assert [q.cluster for q in s.scalars(select(Quota))] == [None]


def test_a_rate_correction_counts_in_the_quotas_of_its_runs_cluster(ledger):
    """``gpuhpc ledger reprice`` books a correction per run: a cluster's quota counts it only for
    that cluster's runs, as its counter rebuilt from the charges does."""
    from gpuhpc.ledger import adjust

    admin.set_quota("research", money=Decimal("10"), cluster="a", url=ledger)
    admin.set_quota("research", money=Decimal("10"), url=ledger)
    ingest.ingest_rows(rows(row("1", "COMPLETED", ts(0), ts(30), 1800, gpus=1, cluster="a"),      # 1.80
                            row("2", "COMPLETED", ts(0), ts(60), 3600, gpus=1, cluster="b")), url=ledger)  # 3.60
    booked = adjust.reprice("h100", "7.20", since=NOW - dt.timedelta(days=2), until=NOW + dt.timedelta(days=1),
                            reason="the rate was half what it should be", url=ledger)
    assert booked.amount == Decimal("5.40")
    live = {st.cluster: st.used_money for st in admin.quota_status("research", url=ledger)}
    assert live == {"a": Decimal("3.60"), None: Decimal("10.80")}
    with db.session_scope(ledger) as s:
        s.execute(db_delete_counters())
    assert {st.cluster: st.used_money for st in admin.quota_status("research", url=ledger)} == live

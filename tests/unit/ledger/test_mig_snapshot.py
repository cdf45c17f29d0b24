"""Issue 34 point 9's leftover at submit: the budget snapshot (what job_submit.lua and a reader's
``gpuhpc submit`` decide from) counts a MIG slice by its fraction of a GPU, with the weights the
ledger writes (one source: :func:`gpuhpc.ledger.pricing.gpu_weight`). The real job_submit.lua on
the local cluster: tests/integration/ledger/test_mig_budget.py."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.errors import QuotaExceeded
from gpuhpc.ledger import admin, budget, db, hooks

NOW = dt.datetime.now(dt.timezone.utc)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _publish(url: str, path, gpu_types=()) -> budget.Snapshot:
    with db.session_scope(url) as s:
        book = admin.load_price_book(s)
    text = budget.render_snapshot(admin.quota_status(url=url, now=NOW), book, NOW, gpu_types=gpu_types)
    budget.write_snapshot(text, path)
    return budget.read_snapshot(path)


@pytest.fixture()
def mig_quota(ledger_url):
    """Account research with 0.5 GPU-hours a month; 3g.40gb has a price (3/7 of an h100), 1g.10gb none."""
    admin.add_account("research", url=ledger_url)
    admin.set_price("h100", rate=Decimal("2.80"), effective_from=T0, url=ledger_url)
    admin.set_price("3g.40gb", base="h100", fraction="3/7", effective_from=T0, url=ledger_url)
    admin.set_quota("research", gpu_hours=Decimal("0.5"), url=ledger_url)
    return ledger_url


def test_the_snapshot_writes_each_types_weight_from_gpu_weight(mig_quota, tmp_path):
    snap = _publish(mig_quota, tmp_path / "b.txt", gpu_types=["1g.10gb", "h100", "2g.12gb"])
    text = (tmp_path / "b.txt").read_text()
    # the price book's MIG type and the cluster's (no price needed); a whole GPU is not listed
    assert "weight\t3g.40gb\t3/7\n" in text and "weight\t1g.10gb\t1/7\n" in text and "weight\t2g.12gb\t1/2\n" in text
    assert "weight\th100" not in text and "weight\t*" not in text
    assert snap.weights == {"1g.10gb": Fraction(1, 7), "3g.40gb": Fraction(3, 7), "2g.12gb": Fraction(1, 2)}
    assert snap.weight("h100") == 1 and snap.weight(None) == 1 and snap.weight("4g.40gb") == 1   # unlisted: whole


@pytest.mark.parametrize("gpu_type,admitted,uses", [("1g.10gb", 3, "0.43"), ("3g.40gb", 1, "0.43")])
def test_a_gpu_hour_budget_admits_n_slices_and_not_one_more(mig_quota, tmp_path, gpu_type, admitted, uses):
    snap = _publish(mig_quota, tmp_path / "b.txt", gpu_types=["1g.10gb", "3g.40gb"])

    def check(n):
        return budget.check_job(snap, account="research", user="alice", partition="mig", gpu_type=gpu_type, gpus=n,
                                time_limit_s=3600)

    lines, refusal = check(admitted)                   # 3 × 1/7 (or 3/7) of 0.5 GPU-hours: fits
    assert refusal is None and lines[0].endswith(f"this job may use {uses} GPU-hours"), lines
    _, refusal = check(admitted + 1)
    assert refusal is not None and refusal.startswith("account research: budget 0.50 GPU-hours for "), refusal
    # an array counts every task, each by its fraction
    assert budget.check_job(snap, account="research", user="alice", partition="mig", gpu_type=gpu_type, gpus=1,
                            time_limit_s=3600, array_size=admitted + 1)[1] is not None


def test_need_is_rounded_as_the_ledger_rounds_it(ledger_url, tmp_path):
    """A budget of exactly 3 slice-hours (0.428571 GPU-hours, the ledger's 6 decimals) admits them."""
    admin.add_account("research", url=ledger_url)
    admin.set_quota("research", gpu_hours=Decimal("0.428571"), url=ledger_url)
    snap = _publish(ledger_url, tmp_path / "b.txt", gpu_types=["1g.10gb"])
    (b,) = snap.budgets
    assert budget.job_need(snap, b, partition="mig", gpu_type="1g.10gb", gpus=3, time_limit_s=3600) == \
        Decimal("0.428571")
    assert budget.check_job(snap, account="research", user="x", partition="mig", gpu_type="1g.10gb", gpus=3,
                            time_limit_s=3600)[1] is None


def test_a_reader_submit_counts_slices_by_fraction(mig_quota, tmp_path, monkeypatch):
    """``gpuhpc submit`` for a user who cannot write the ledger: the snapshot decides, by fraction."""
    path = tmp_path / "b.txt"
    _publish(mig_quota, path, gpu_types=["1g.10gb"])
    monkeypatch.setenv("GPUHPC_BUDGET_SNAPSHOT", str(path))
    monkeypatch.setenv("GPUHPC_LEDGER", "off")            # no ledger here: the snapshot alone

    def req(n):
        return hooks.ChargeRequest(cluster="", user="alice", account="research", partition="mig", qos=None,
                                   gpu_type="1g.10gb", gpus=n, time_limit_s=3600)

    lines = hooks.submit_budget(req(3), "research")
    assert lines and lines[0].endswith("this job may use 0.43 GPU-hours"), lines
    with pytest.raises(QuotaExceeded, match=r"this job may use 0\.57 GPU-hours"):
        hooks.submit_budget(req(4), "research")


def test_money_is_still_device_hours_at_the_slices_rate(mig_quota, tmp_path):
    """A money budget: a slice-hour costs the slice's rate (3/7 × 2.80 = 1.20), not weighed again."""
    admin.set_quota("research", money=Decimal("2.50"), url=mig_quota)
    snap = _publish(mig_quota, tmp_path / "b.txt", gpu_types=["3g.40gb"])
    (b,) = [b for b in snap.budgets if b.kind == "money"]
    assert budget.job_need(snap, b, partition="mig", gpu_type="3g.40gb", gpus=2, time_limit_s=3600) == \
        Decimal("2.400000")


def test_an_old_snapshot_without_weights_counts_a_slice_whole(tmp_path):
    """A snapshot from before the weights: a slice counts as a GPU (stricter, never an overspend)."""
    path = tmp_path / "old.txt"
    path.write_text("version\t1\nbudget\tresearch\t*\tgpu_hours\t2026-12\t0\t0.50\t0.50\n")
    snap = budget.read_snapshot(path)
    assert budget.check_job(snap, account="research", user="x", partition="mig", gpu_type="1g.10gb", gpus=1,
                            time_limit_s=3600)[1] is not None

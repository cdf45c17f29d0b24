"""Pricing with exact expected numbers."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from fractions import Fraction

import pytest

from gpuhpc.errors import LedgerError, UserInputError
from gpuhpc.ledger import periods, pricing

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 1, 1, tzinfo=UTC)
T1 = dt.datetime(2026, 6, 1, tzinfo=UTC)


@pytest.fixture()
def book() -> pricing.PriceBook:
    b = pricing.PriceBook()
    b.add_price("h100", T0, rate="2.50")
    b.add_price("h100", T1, rate="3.00")               # effective-dated increase
    b.add_price("3g.40gb", T0, base="h100", fraction="3/7")
    b.add_price("1g.10gb", T0, rate="0.40")
    b.add_multiplier("partition", "gpu", T0, "0.6")     # preemptible capacity is cheaper
    b.add_multiplier("partition", "gpu-hi", T0, "1.5")
    b.add_multiplier("qos", "low", T0, "0.5")
    return b


def test_mig_slice_is_exact_fraction_of_parent(book):
    assert book.rate("3g.40gb", T0) == Fraction(5, 2) * Fraction(3, 7)
    one_hour = pricing.price_usage(book, gpu_type="3g.40gb", gpus=1, seconds=3600, partition=None, qos=None, at=T0)
    assert one_hour.amount == Decimal("1.071429")          # 2.50 × 3/7 = 15/14
    # 14 slice-hours = exactly 6 h100-hours
    fourteen = pricing.price_usage(book, gpu_type="3g.40gb", gpus=2, seconds=7 * 3600, partition=None, qos=None, at=T0)
    assert fourteen.amount == Decimal("15.000000")
    assert fourteen.gpu_hours == Decimal("6.000000")          # GPU-hours weigh a 3g slice as 3/7 of a GPU
    assert fourteen.rate == Decimal("2.500000")               # per (weighted) GPU-hour: amount = GPU-hours × rate


def test_mig_fraction_follows_parent_price_change(book):
    assert book.rate("3g.40gb", T1) == Fraction(3) * Fraction(3, 7)
    p = pricing.price_usage(book, gpu_type="3g.40gb", gpus=7, seconds=3600, partition=None, qos=None, at=T1)
    assert p.amount == Decimal("9.000000")


def test_partition_and_qos_multipliers(book):
    p = pricing.price_usage(book, gpu_type="h100", gpus=8, seconds=3600, partition="gpu", qos=None, at=T0)
    assert p.amount == Decimal("12.000000")                # 8 × 2.50 × 0.6
    assert p.rate == Decimal("1.500000")
    p = pricing.price_usage(book, gpu_type="h100", gpus=8, seconds=1800, partition="gpu-hi", qos="low", at=T0)
    assert p.amount == Decimal("7.500000")                 # 4 GPU-h × 2.50 × 1.5 × 0.5
    p = pricing.price_usage(book, gpu_type="3g.40gb", gpus=1, seconds=3600, partition="gpu", qos=None, at=T0)
    assert p.amount == Decimal("0.642857")                 # 15/14 × 3/5 = 9/14


def test_effective_dates(book):
    before = dt.datetime(2025, 12, 31, tzinfo=UTC)
    assert book.rate("h100", before) is None
    assert book.rate("h100", T1 - dt.timedelta(seconds=1)) == Fraction(5, 2)
    assert book.rate("h100", T1) == 3
    assert pricing.price_usage(book, gpu_type="h100", gpus=1, seconds=3600, partition=None, qos=None,
                               at=before).priced is False


def test_worst_case_counts_array_size(book):
    wc = pricing.worst_case(book, gpu_type="h100", gpus=4, time_limit_s=5400, array_size=10, partition=None,
                            qos=None, at=T0)
    assert wc.gpu_hours == Decimal("60.000000")
    assert wc.amount == Decimal("150.000000")


def test_cpu_only_is_free_and_wildcard_rate(book):
    p = pricing.price_usage(book, gpu_type=None, gpus=0, seconds=3600, partition="cpu", qos=None, at=T0)
    assert p.amount == 0 and p.priced
    assert book.rate_or_default("a100", T0) is None
    book.add_price("*", T0, rate="1.00")
    assert book.rate_or_default("a100", T0) == 1


def test_rounding_once_half_even():
    b = pricing.PriceBook()
    b.add_price("x", T0, rate="1")
    # 1 GPU-second at 1/h = 0.000277777… -> 0.000278
    assert pricing.price_usage(b, gpu_type="x", gpus=1, seconds=1, partition=None, qos=None, at=T0).amount == Decimal("0.000278")


def test_bad_inputs():
    with pytest.raises(UserInputError):
        pricing.parse_fraction("three sevenths")
    with pytest.raises(UserInputError):
        pricing.parse_money("-1")
    b = pricing.PriceBook()
    b.add_price("a", T0, base="b", fraction="1/2")
    b.add_price("b", T0, base="a", fraction="1/2")
    with pytest.raises(LedgerError):
        b.rate("a", T0)


def test_periods():
    t = dt.datetime(2026, 11, 30, 2, 53, tzinfo=UTC)       # a Monday
    assert periods.period_start("day", t) == dt.datetime(2026, 11, 30, tzinfo=UTC)
    assert periods.period_start("week", t) == dt.datetime(2026, 11, 30, tzinfo=UTC)
    assert periods.period_start("week", t - dt.timedelta(days=1)) == dt.datetime(2026, 11, 23, tzinfo=UTC)
    assert periods.period_start("month", t) == dt.datetime(2026, 11, 1, tzinfo=UTC)
    assert periods.period_end("month", dt.datetime(2026, 12, 1, tzinfo=UTC)) == dt.datetime(2027, 1, 1, tzinfo=UTC)
    assert pricing.mig_slices("3g.40gb") == 3 and pricing.mig_slices("h100") is None

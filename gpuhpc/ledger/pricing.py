"""Pricing: pure functions over an in-memory price book snapshot (no database here).

Cost of a run = GPUs × hours × rate(GPU type, at) × partition multiplier × QOS multiplier.
A MIG profile is priced either with its own rate or as an exact fraction of its parent GPU
(``3g.40gb`` = 3/7 of ``h100``). Arithmetic is exact (``Fraction``) and money is rounded
once, half-even, to 6 decimals (the ``Numeric(20, 6)`` columns).
"""
from __future__ import annotations

import bisect
import datetime as dt
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import NamedTuple

from gpuhpc.errors import LedgerError, UserInputError

QUANTUM = Decimal("0.000001")
WILDCARD = "*"          # price used for GPU types without a row of their own
GENERIC = "gpu"         # untyped gres/gpu


def to_decimal(value: Fraction | Decimal | int) -> Decimal:
    if isinstance(value, Fraction):
        q = (Decimal(value.numerator) / Decimal(value.denominator)) if value.denominator != 1 else Decimal(value.numerator)
        # exact enough: Decimal context has 28 digits, far beyond the 6 kept
        return q.quantize(QUANTUM, rounding=ROUND_HALF_EVEN)
    return Decimal(value).quantize(QUANTUM, rounding=ROUND_HALF_EVEN)


def parse_fraction(text: str) -> Fraction:
    """``"3/7"`` or ``"0.5"`` -> Fraction (exact)."""
    t = str(text).strip()
    try:
        f = Fraction(t)
    except (ValueError, ZeroDivisionError):
        raise UserInputError(f"not a fraction: {text!r}", hint="write it like 3/7 or 0.5") from None
    if f <= 0:
        raise UserInputError(f"fraction must be positive: {text!r}")
    return f


def parse_money(text: str | float | Decimal, *, what: str = "amount") -> Decimal:
    try:
        d = Decimal(str(text).strip())
    except Exception:
        raise UserInputError(f"{what} is not a number: {text!r}") from None
    if not d.is_finite() or d < 0:
        raise UserInputError(f"{what} must be a non-negative number: {text!r}")
    return d


def at_sacct_resolution(t: dt.datetime) -> dt.datetime:
    """``t`` truncated to the second, the resolution of sacct's times."""
    return t.replace(microsecond=0)


MIG_RE = re.compile(r"^(\d+)g\.\d+gb$")


def mig_slices(profile: str) -> int | None:
    """``3g.40gb`` -> 3 (compute slices); None when not a MIG profile name."""
    m = MIG_RE.match(profile or "")
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class PriceEntry:
    effective_from: dt.datetime
    rate: Fraction | None = None               # per GPU-hour
    base: str | None = None                    # priced as fraction × rate(base)
    fraction: Fraction | None = None


@dataclass
class PriceBook:
    """Effective-dated rates and multipliers. Build it with :meth:`add_price` /
    :meth:`add_multiplier` or :func:`gpuhpc.ledger.quota.load_price_book`.

    Effective times count from the start of their second: sacct reports run starts in whole
    seconds, so a price set at 12:39:00.125 applies to a run that started at 12:39:00."""

    prices: dict[str, list[PriceEntry]] = field(default_factory=dict)
    multipliers: dict[tuple[str, str], list[tuple[dt.datetime, Fraction]]] = field(default_factory=dict)

    def add_price(self, gpu_type: str, effective_from: dt.datetime, *, rate: Fraction | Decimal | str | None = None,
                  base: str | None = None, fraction: Fraction | str | None = None) -> None:
        if (rate is None) == (base is None):
            raise UserInputError(f"price for {gpu_type}: give either a rate or a base GPU type with a fraction")
        entry = PriceEntry(at_sacct_resolution(effective_from), Fraction(str(rate)) if rate is not None else None, base,
                           parse_fraction(str(fraction)) if base is not None else None)
        lst = self.prices.setdefault(gpu_type, [])
        lst.append(entry)
        lst.sort(key=lambda e: e.effective_from)

    def add_multiplier(self, kind: str, name: str, effective_from: dt.datetime, multiplier: Fraction | Decimal | str) -> None:
        lst = self.multipliers.setdefault((kind, name), [])
        lst.append((at_sacct_resolution(effective_from), Fraction(str(multiplier))))
        lst.sort(key=lambda e: e[0])

    # ---------------------------------------------------------------- lookups
    def _entry(self, gpu_type: str, at: dt.datetime) -> PriceEntry | None:
        lst = self.prices.get(gpu_type)
        if not lst:
            return None
        i = bisect.bisect_right([e.effective_from for e in lst], at)
        return lst[i - 1] if i else None

    def rate(self, gpu_type: str, at: dt.datetime, *, _depth: int = 0) -> Fraction | None:
        """Rate per GPU-hour (exact), or None when the price book has none for this type."""
        if _depth > 8:
            raise LedgerError(f"price book: base GPU types of {gpu_type!r} form a cycle")
        entry = self._entry(gpu_type, at)
        if entry is None:
            return None
        if entry.rate is not None:
            return entry.rate
        assert entry.base is not None and entry.fraction is not None
        base = self.rate(entry.base, at, _depth=_depth + 1)
        if base is None:
            raise LedgerError(f"price book: {gpu_type} is priced as {entry.fraction} of {entry.base}, "
                              f"which has no price at {at:%Y-%m-%d %H:%M}")
        return base * entry.fraction

    def rate_or_default(self, gpu_type: str | None, at: dt.datetime) -> Fraction | None:
        """Rate for a type, else the ``*`` wildcard rate, else None. CPU-only (None/"") is free."""
        if not gpu_type:
            return Fraction(0)
        r = self.rate(gpu_type, at)
        return r if r is not None else self.rate(WILDCARD, at)

    def multiplier(self, kind: str, name: str | None, at: dt.datetime) -> Fraction:
        if not name:
            return Fraction(1)
        lst = self.multipliers.get((kind, name))
        if not lst:
            return Fraction(1)
        i = bisect.bisect_right([e[0] for e in lst], at)
        return lst[i - 1][1] if i else Fraction(1)

    def effective_rate(self, gpu_type: str | None, partition: str | None, qos: str | None,
                       at: dt.datetime) -> Fraction | None:
        base = self.rate_or_default(gpu_type, at)
        if base is None:
            return None
        return base * self.multiplier("partition", partition, at) * self.multiplier("qos", qos, at)


class Price(NamedTuple):
    gpu_hours: Decimal
    rate: Decimal          # effective rate per GPU-hour, multipliers applied
    amount: Decimal
    priced: bool = True    # False when the price book had no rate (amount is 0)


def price_usage(book: PriceBook, *, gpu_type: str | None, gpus: int, seconds: int,
                partition: str | None, qos: str | None, at: dt.datetime) -> Price:
    """Price ``gpus`` GPUs of ``gpu_type`` for ``seconds`` (exact, rounded once)."""
    hours = Fraction(max(gpus, 0) * max(seconds, 0), 3600)
    rate = book.effective_rate(gpu_type, partition, qos, at)
    if rate is None:
        return Price(to_decimal(hours), Decimal(0).quantize(QUANTUM), Decimal(0).quantize(QUANTUM), priced=False)
    return Price(to_decimal(hours), to_decimal(rate), to_decimal(hours * rate))


def worst_case(book: PriceBook, *, gpu_type: str | None, gpus: int, time_limit_s: int, array_size: int,
               partition: str | None, qos: str | None, at: dt.datetime) -> Price:
    """Worst case of a submission: gpus × time limit × rate × array size."""
    return price_usage(book, gpu_type=gpu_type, gpus=gpus * max(array_size, 1), seconds=time_limit_s,
                       partition=partition, qos=qos, at=at)


def q6(num: int, den: int) -> Decimal:
    """num/den rounded half-even to 6 decimals, in integers (same result as :func:`to_decimal`)."""
    n = num * 1_000_000
    quo, rem = divmod(n, den)
    twice = 2 * rem
    if twice > den or (twice == den and quo % 2):
        quo += 1
    return Decimal(quo).scaleb(-6)


class PriceCache:
    """Fast repeated pricing for ingest: effective rates memoised per (type, partition, QOS,
    price-book segment); integer rounding. Same results as :func:`price_usage`."""

    def __init__(self, book: PriceBook) -> None:
        self.book = book
        dates = {e.effective_from for lst in book.prices.values() for e in lst}
        dates |= {d for lst in book.multipliers.values() for d, _ in lst}
        self._edges = sorted(dates)
        self._rates: dict[tuple, tuple[Fraction | None, Decimal]] = {}

    def price(self, gpu_type: str | None, gpus: int, seconds: int, partition: str | None, qos: str | None,
              at: dt.datetime) -> Price:
        key = (gpu_type, partition, qos, bisect.bisect_right(self._edges, at))
        hit = self._rates.get(key)
        if hit is None:
            r = self.book.effective_rate(gpu_type, partition, qos, at)
            hit = self._rates[key] = (r, to_decimal(r) if r is not None else Decimal(0).quantize(QUANTUM))
        rate, rate_d = hit
        units = max(gpus, 0) * max(seconds, 0)
        hours = q6(units, 3600)
        if rate is None:
            return Price(hours, rate_d, Decimal(0).quantize(QUANTUM), priced=False)
        return Price(hours, rate_d, q6(units * rate.numerator, 3600 * rate.denominator))


def unmirrored_qos(book: PriceBook, at: dt.datetime) -> list[str]:
    """QOS names whose multiplier is not 1 at ``at`` or in a later-dated entry. Slurm bills a job
    by its partition's ``TRESBillingWeights`` alone, so such a multiplier exists in the ledger only
    and a money budget that Slurm enforces (``GrpTRESMins=billing``) would drift from it."""
    names = []
    for (kind, name), entries in sorted(book.multipliers.items()):
        if kind != "qos":
            continue
        later = [m for eff, m in entries if eff > at]
        if book.multiplier("qos", name, at) != 1 or any(m != 1 for m in later):
            names.append(name)
    return names

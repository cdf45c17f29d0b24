"""Accounting periods in the ledger's time zone, and the split of a run at their boundaries.

A period (day, ISO week from Monday, calendar month, or ``total``) begins at local midnight in
the site's accounting zone, the site config's ``[ledger] timezone`` (an IANA name, default
``UTC``), so a month in ``Europe/Berlin`` is 743 or 745 hours long around the DST changes.
Times are kept as aware UTC instants; only the boundaries are computed in the zone (zoneinfo).

A run that spans a boundary counts in each period for the part inside it (as XDMoD splits
jobs and Slurm's usage restarts at its reset): :func:`run_shares` cuts ``[start, start +
elapsed)`` at given boundaries and gives each part ``C(b) - C(a)`` of a cumulative function
``C`` (priced seconds), so the parts add up exactly to the run's total.

Standard library only (this module is on ``gpuhpc submit``'s path).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError     # at import: a command server's worker stays reusable

from gpuhpc.errors import UserInputError

UTC = dt.timezone.utc
SETTING = "ledger.timezone"
PERIODS = ("day", "week", "month", "total")
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)


def zone(name: str) -> dt.tzinfo:
    """The zone ``name`` (IANA, e.g. ``Europe/Berlin``; ``UTC``); a UserInputError naming
    ``ledger.timezone`` when there is no such zone."""
    text = (name or "").strip()
    if text.upper() in ("UTC", "Z", "ETC/UTC"):
        return UTC
    try:
        if not text or text.startswith(("/", ".")) or ".." in text or "\\" in text:
            raise ValueError(text)
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise UserInputError(f"{name!r} is not a time zone", field=SETTING,
                             hint='use an IANA name such as "UTC" or "Europe/Berlin" '
                                  "(the site config's [ledger] timezone)") from None


def ledger_zone(env: Mapping[str, str] | None = None) -> dt.tzinfo:
    """The accounting zone from the site config (``[ledger] timezone``; default UTC)."""
    from gpuhpc.config import site_setting

    return zone(site_setting("ledger", "timezone", env))


def _local_midnight(d: dt.date, tz: dt.tzinfo) -> dt.datetime:
    """The first instant of local date ``d`` in ``tz``, as UTC. A midnight inside a DST gap
    (fold=0 reads it with the offset before the change) is the instant the day begins."""
    return dt.datetime(d.year, d.month, d.day, tzinfo=tz).astimezone(UTC)


def _first_day(period: str, d: dt.date) -> dt.date:
    if period == "day":
        return d
    if period == "week":
        return d - dt.timedelta(days=d.weekday())
    if period == "month":
        return d.replace(day=1)
    raise UserInputError(f"unknown period {period!r}", hint="use day, week, month or total")


def _next_day(period: str, d: dt.date) -> dt.date:
    if period == "day":
        return d + dt.timedelta(days=1)
    if period == "week":
        return d + dt.timedelta(days=7)
    return (d.replace(day=28) + dt.timedelta(days=4)).replace(day=1)


def period_start(period: str, at: dt.datetime, tz: dt.tzinfo = UTC) -> dt.datetime:
    """Start (a UTC instant) of the day / ISO week / month in ``tz`` containing ``at``; the
    epoch for ``total``."""
    if period == "total":
        return EPOCH
    return _local_midnight(_first_day(period, at.astimezone(tz).date()), tz)


def period_end(period: str, start: dt.datetime, tz: dt.tzinfo = UTC) -> dt.datetime | None:
    """End (exclusive, UTC) of the period starting at ``start``; None for ``total``."""
    if period == "total":
        return None
    return _local_midnight(_next_day(period, _first_day(period, start.astimezone(tz).date())), tz)


def boundaries(period: str, a: dt.datetime, b: dt.datetime, tz: dt.tzinfo = UTC) -> list[dt.datetime]:
    """The period starts strictly inside ``(a, b)``, in order (none for ``total``)."""
    if period == "total" or b <= a:
        return []
    out = []
    start = period_start(period, a, tz)
    while True:
        start = period_end(period, start, tz)
        if start is None or start >= b:
            return out
        if start > a:
            out.append(start)


def hours_in(period: str, start: dt.datetime, tz: dt.tzinfo = UTC) -> Decimal:
    """The period's length in hours (a Berlin March has 743, its October 745)."""
    end = period_end(period, start, tz)
    if end is None:
        raise UserInputError("the total period has no length")
    return Decimal(int((end - start).total_seconds())) / 3600


Cumulative = Callable[[int], tuple[Decimal, Decimal]]     # seconds of the run -> (GPU-hours, money) so far


def run_shares(start: dt.datetime, elapsed_s: int, total: tuple[Decimal, Decimal], cumulative: Cumulative,
               cuts: Iterable[dt.datetime]) -> list[tuple[dt.datetime, dt.datetime, Decimal, Decimal]]:
    """``(from, to, GPU-hours, money)`` of each part of the run ``[start, start + elapsed_s)``
    between consecutive ``cuts`` (instants inside the run; others are ignored). A part's share is
    ``cumulative(b) - cumulative(a)`` in run seconds; the last part ends at ``total`` (what is
    stored for the run), so the shares add up to it exactly. A run of no length is one part."""
    end = start + dt.timedelta(seconds=max(elapsed_s, 0))
    inner = sorted({c for c in cuts if start < c < end})
    points = [start, *inner, end]
    out = []
    prev = (Decimal(0), Decimal(0))
    for i in range(1, len(points)):
        if i == len(points) - 1:
            cur = total
        else:
            cur = cumulative(int((points[i] - start).total_seconds()))
        out.append((points[i - 1], points[i], cur[0] - prev[0], cur[1] - prev[1]))
        prev = cur
    return out

"""Accounting periods in the ledger's time zone, and the split of a run at their boundaries.

A period (day, ISO week from Monday, calendar month, or ``total``) begins at local midnight in
the site's accounting zone, the site config's ``[ledger] timezone`` (an IANA name, default
``UTC``), so a month in ``Europe/Berlin`` is 743 or 745 hours long around the DST changes.
Times are kept as aware UTC instants; only the boundaries are computed in the zone (zoneinfo).

A run that spans a boundary counts in each period for the part inside it (as XDMoD splits
jobs and Slurm's usage restarts at its reset): :func:`run_shares` cuts ``[start, start +
elapsed)`` at given boundaries and gives each part ``C(b) - C(a)`` of a cumulative function
``C`` (priced seconds), so the parts add up exactly to the run's total.

A quota's period may also be an **allocation window** instead of a calendar period: a start
date and a length in days or months, written ``2026-07-01/P12M`` (a fiscal year from 1 July) or
``2026-01-05/P90D`` (a 90-day allocation), as ISO 8601 writes an interval. Windows repeat from
their start (the next fiscal year, the next 90 days; the ones before the start too), each
beginning at local midnight like a month: :func:`period_start`, :func:`period_end`,
:func:`boundaries` and :func:`hours_in` take either kind, so the quota counters, the budget
snapshot, sync-slurm's resets and the forecast all follow the quota's own window.
:func:`window_arg` reads what an admin types (``2026-07-01/1y``, ``2026-01-05/90d``).

Standard library only (this module is on ``gpuhpc submit``'s path).
"""
from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
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


# ------------------------------------------------------------------ allocation windows
WINDOW_FIELD = "--window"
MAX_DAYS = 999              # a window's text fits the period column (VARCHAR(16)): 2026-07-01/P999D
MAX_MONTHS = 120
_STORED = re.compile(r"(\d{4})-(\d{2})-(\d{2})/P([1-9]\d{0,2})([DM])")
_TYPED = re.compile(r"(\d{4}-\d{2}-\d{2})/P?([1-9]\d{0,3})(D|W|M|Y)", re.IGNORECASE)


def add_months(d: dt.date, months: int) -> dt.date:
    """``d`` plus ``months`` calendar months, the day kept or cut to the month's last day
    (31 January + 1 month = 28 or 29 February)."""
    y, m = divmod(d.month - 1 + months, 12)
    year, month = d.year + y, m + 1
    return dt.date(year, month, min(d.day, calendar.monthrange(year, month)[1]))


@dataclass(frozen=True)
class Window:
    """An allocation window: from ``start`` (a local date), ``length`` days (``unit`` ``D``) or
    months (``M``), again and again. Month windows count from ``start`` itself, so a window
    from 31 January lasts to 28 February, the next to 31 March."""

    start: dt.date
    length: int
    unit: str

    @property
    def text(self) -> str:
        return f"{self.start.isoformat()}/P{self.length}{self.unit}"

    def _nth(self, k: int) -> dt.date:
        if self.unit == "D":
            return self.start + dt.timedelta(days=k * self.length)
        return add_months(self.start, k * self.length)

    def bounds(self, d: dt.date) -> tuple[dt.date, dt.date]:
        """(first day, first day of the next) of the window holding local date ``d``."""
        if self.unit == "D":
            k = (d - self.start).days // self.length
        else:
            k = ((d.year - self.start.year) * 12 + d.month - self.start.month) // self.length
            if self._nth(k) > d:
                k -= 1
        return self._nth(k), self._nth(k + 1)


class WindowName(str):
    """A window's text as the ORM reads a quota's period: ``.value`` as a :class:`Period` member
    has (``gpuhpc.ledger.orm``)."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


def parse_window(period: str) -> Window | None:
    """The window a stored period text names (``2026-07-01/P12M``); None for anything else."""
    m = _STORED.fullmatch(str(period or ""))
    if not m:
        return None
    try:
        start = dt.date(int(m[1]), int(m[2]), int(m[3]))
    except ValueError:
        return None
    n = int(m[4])
    if n > (MAX_DAYS if m[5] == "D" else MAX_MONTHS):
        return None
    return Window(start, n, m[5])


def is_window(period: str) -> bool:
    return parse_window(period) is not None


def window_arg(text: str | None, field: str = WINDOW_FIELD) -> str:
    """What an admin typed (``2026-07-01/1y``, ``2026-07-01/P12M``, ``2026-01-05/90d``, ``/13w``)
    -> the stored text (``2026-07-01/P12M``); a UserInputError naming ``field`` otherwise."""
    hint = ("START/LENGTH: a date and a length in days, weeks, months or years, e.g. 2026-07-01/1y "
            f"(a fiscal year from 1 July) or 2026-01-05/90d; up to {MAX_DAYS} days or {MAX_MONTHS} months")
    raw = str(text or "").strip(" ")
    m = _TYPED.fullmatch(raw)             # control characters included: refused
    if not m:
        raise UserInputError(f"{raw!r} is not an allocation window", field=field, hint=hint)
    try:
        start = dt.date.fromisoformat(m[1])
    except ValueError:
        raise UserInputError(f"{m[1]!r} is not a date", field=field, hint=hint) from None
    n, unit = int(m[2]), m[3].upper()
    n, unit = {"D": (n, "D"), "W": (n * 7, "D"), "M": (n, "M"), "Y": (n * 12, "M")}[unit]
    if n > (MAX_DAYS if unit == "D" else MAX_MONTHS):
        raise UserInputError(f"{raw!r} is longer than an allocation window may be", field=field, hint=hint)
    return Window(start, n, unit).text


def check_period(period: str) -> str:
    """``period`` when it is a calendar period or a stored window's text, else a UserInputError."""
    if period in PERIODS or is_window(period):
        return str(period)
    raise UserInputError(f"unknown period {period!r}", field="--period",
                         hint="day, week, month or total; an allocation window with --window START/LENGTH")


def _bounds(period: str, d: dt.date) -> tuple[dt.date, dt.date]:
    """(first day, first day of the next) of the day / ISO week / month / window holding ``d``."""
    if period == "day":
        return d, d + dt.timedelta(days=1)
    if period == "week":
        first = d - dt.timedelta(days=d.weekday())
        return first, first + dt.timedelta(days=7)
    if period == "month":
        first = d.replace(day=1)
        return first, add_months(first, 1)
    w = parse_window(period)
    if w is None:
        raise UserInputError(f"unknown period {period!r}", hint="use day, week, month, total or a window "
                                                                "such as 2026-07-01/P12M")
    return w.bounds(d)


def period_start(period: str, at: dt.datetime, tz: dt.tzinfo = UTC) -> dt.datetime:
    """Start (a UTC instant) of the day / ISO week / month / allocation window in ``tz``
    containing ``at``; the epoch for ``total``."""
    if period == "total":
        return EPOCH
    return _local_midnight(_bounds(period, at.astimezone(tz).date())[0], tz)


def period_end(period: str, start: dt.datetime, tz: dt.tzinfo = UTC) -> dt.datetime | None:
    """End (exclusive, UTC) of the period starting at ``start``; None for ``total``."""
    if period == "total":
        return None
    return _local_midnight(_bounds(period, start.astimezone(tz).date())[1], tz)


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

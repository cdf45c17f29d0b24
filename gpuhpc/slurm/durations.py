"""Slurm time values (``--time``, ``MaxTime``, squeue's ``%l``/``%M``, sacct's ``Elapsed``): the one
parser and its formatter. Pure; nothing here runs Slurm.

Slurm's documented formats (sbatch(1) ``--time``)::

    minutes            120          = 2 h  (a bare number is MINUTES)
    minutes:seconds    90:30
    hours:minutes:seconds    1:02:03
    days-hours         2-12         = 2 days 12 HOURS
    days-hours:minutes       2-12:30
    days-hours:minutes:seconds   2-12:30:15
    INFINITE / UNLIMITED     no limit (parsed as None)

Slurm itself accepts fields out of range (``1:75:00`` is 2:15:00); ``strict=True`` refuses them,
for values a person wrote into a config where the out-of-range field is more likely a typo.
``shorthand=True`` also takes gpuhpc's job-spec shorthand: ``2h``, ``90m``, ``45s``, ``1d``,
``1h30m``, ``1.5h``.
"""
from __future__ import annotations

import re

from gpuhpc.errors import UserInputError

UNLIMITED_WORDS = ("INFINITE", "UNLIMITED")
# what squeue/sacct print where there is no time value
NOT_SET_WORDS = ("", "INVALID", "Partition_Limit", "NOT_SET", "N/A")

_SLURM_RE = re.compile(r"(?:(?P<days>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_SHORT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(min|[smhd])")
_FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or INFINITE"


def parse_duration(value: str | int, *, field: str | None = None, strict: bool = False,
                   shorthand: bool = False) -> int | None:
    """A Slurm time value -> seconds; ``INFINITE``/``UNLIMITED`` -> None.

    An int is minutes (as a bare number is to Slurm). Raises UserInputError (exit 2)."""
    if isinstance(value, bool):
        raise UserInputError("expected a duration", field=field)
    if isinstance(value, int):
        if value < 0:
            raise UserInputError("must not be negative", field=field)
        return value * 60
    text = str(value).strip()
    if text.upper() in UNLIMITED_WORDS:
        return None
    m = _SLURM_RE.fullmatch(text)
    if m:
        return _slurm_seconds(m, text, field, strict)
    if shorthand:
        parts = _SHORT_RE.findall(text.lower())
        if parts and "".join(n + u for n, u in parts) == re.sub(r"\s+", "", text.lower()):
            return int(sum(float(n) * _UNIT_S[u] for n, u in parts))
    hint = f"{_FORMATS}{', or 2h, 90m, 1h30m, 1d' if shorthand else ''}"
    raise UserInputError(f"{text!r} is not a Slurm time", field=field, hint=hint)


def _slurm_seconds(m: re.Match, text: str, field: str | None, strict: bool) -> int:
    days = int(m["days"]) if m["days"] is not None else None
    nums = [int(x) for x in (m["a"], m["b"], m["c"]) if x is not None]
    if days is not None:                     # days-hours[:minutes[:seconds]]
        h, mi, s = (nums + [0, 0])[:3]
    elif len(nums) == 1:                     # minutes
        h, mi, s = 0, nums[0], 0
    elif len(nums) == 2:                     # minutes:seconds
        h, mi, s = 0, nums[0], nums[1]
    else:                                    # hours:minutes:seconds
        h, mi, s = nums
    if strict:
        later = nums[1:]
        if days is not None and h > 23:
            raise UserInputError(f"{text!r}: hours must be < 24 after a day count", field=field)
        if any(x > 59 for x in later):
            raise UserInputError(f"{text!r}: minutes/seconds must be < 60", field=field,
                                 hint="Slurm would carry them over; write the value it means")
    return (days or 0) * 86400 + h * 3600 + mi * 60 + s


def reported_seconds(text: str) -> int | None:
    """A time squeue or sacct printed -> seconds; None for no limit or no value
    (``UNLIMITED``, ``Partition_Limit``, ``INVALID``, ``N/A``...)."""
    t = (text or "").strip()
    if t in NOT_SET_WORDS:
        return None
    return parse_duration(t)


def format_duration(seconds: int | None, *, round_up_minutes: bool = False) -> str:
    """Seconds -> Slurm's ``[D-]HH:MM:SS`` (``1-01:00:00``, ``02:00:00``); None -> ``UNLIMITED``.

    ``round_up_minutes``: Slurm keeps time limits in whole minutes and rounds up; doing it here
    makes what gpuhpc shows equal what Slurm will enforce."""
    if seconds is None:
        return "UNLIMITED"
    if seconds < 0:
        raise ValueError(f"negative duration {seconds}")
    if round_up_minutes:
        seconds = -(-seconds // 60) * 60
    d, rem = divmod(seconds, 86400)
    h, rem = divmod(rem, 3600)
    mi, s = divmod(rem, 60)
    return f"{d}-{h:02d}:{mi:02d}:{s:02d}" if d else f"{h:02d}:{mi:02d}:{s:02d}"

"""gpuhpc.slurm.durations: the one Slurm time parser, with Slurm's documented formats as its
table (tests/durations_cases.py; tests/integration/slurm/test_durations_slurm.py asks Slurm)."""
from __future__ import annotations

import pytest
from durations_cases import SLURM_TIMES

from gpuhpc.errors import UserInputError
from gpuhpc.slurm.durations import format_duration, parse_duration, reported_seconds


@pytest.mark.parametrize(("text", "seconds"), SLURM_TIMES)
def test_slurm_formats(text, seconds):
    assert parse_duration(text) == seconds


def test_the_three_old_disagreements():
    assert parse_duration("2-12") == 2 * 86400 + 12 * 3600      # not 2 days 12 seconds
    assert parse_duration("120") == 7200                        # not 120 seconds
    assert parse_duration("infinite") is None and parse_duration("INFINITE") is None


def test_int_is_minutes():
    assert parse_duration(30) == 1800


@pytest.mark.parametrize("bad", ["", "two days", "1:2:3:4", "-5", "1-", "5m", "1.5", "1-2-3", True])
def test_rejects(bad):
    with pytest.raises(UserInputError) as exc:
        parse_duration(bad, field="partitions[0].max_time")
    assert exc.value.exit_code == 2 and exc.value.field == "partitions[0].max_time"


@pytest.mark.parametrize(("text", "seconds"), [
    ("2h", 7200), ("90m", 5400), ("45s", 45), ("1d", 86400), ("1h30m", 5400), ("1.5h", 5400), ("10min", 600),
])
def test_shorthand(text, seconds):
    assert parse_duration(text, shorthand=True) == seconds
    with pytest.raises(UserInputError):
        parse_duration(text)


@pytest.mark.parametrize(("text", "message"), [("1:75:00", "minutes/seconds must be < 60"),
                                               ("1-24", "hours must be < 24"), ("5:60", "< 60")])
def test_strict(text, message):
    with pytest.raises(UserInputError, match=message):
        parse_duration(text, strict=True)
    assert parse_duration("1-23:59:59", strict=True) == 86400 + 23 * 3600 + 59 * 60 + 59


@pytest.mark.parametrize(("text", "seconds"), [
    ("0:05", 5), ("1:02:03", 3723), ("1-02:03:04", 93784), ("UNLIMITED", None), ("Partition_Limit", None),
    ("INVALID", None), ("", None), ("N/A", None),
])
def test_reported(text, seconds):
    assert reported_seconds(text) == seconds


@pytest.mark.parametrize(("seconds", "text"), [
    (7200, "02:00:00"), (5, "00:00:05"), (86400 + 3600, "1-01:00:00"), (None, "UNLIMITED"), (0, "00:00:00"),
])
def test_format(seconds, text):
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


def test_format_rounds_up_to_minutes():
    assert format_duration(61, round_up_minutes=True) == "00:02:00"
    assert format_duration(7200, round_up_minutes=True) == "02:00:00"

"""The sprint answers the question users ask (issue 33.9): "the cheapest configuration that
finishes N samples by a deadline"; its throughput leaves out the warm-up reports and shows their
spread; an unknown GPU utilisation makes a plateau's cause "unknown", never "input"."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sprints.analysis import Goal, TrialRecord, analyse, bottlenecks, recommend, throughput_of
from gpuhpc.sprints.report import text_table
from gpuhpc.sprints.spec import from_mapping, goal_of

RATE = Decimal("2.50")


def rec(trial, gpn, nodes, thr, rate=RATE, bs=64, util=None, cpu=None):
    return TrialRecord({"batch_size": bs, "gpus_per_node": gpn, "nodes": nodes, "placement": "one-leaf"},
                       throughput=thr, rate=rate, trial=trial, util_percent=util, cpu_percent=cpu)


def test_the_cheapest_configuration_that_finishes_by_the_deadline_not_the_fastest_per_gpu():
    # 36e6 samples: 1 GPU at 1,000/s needs 10 h, 2 GPUs at 1,900/s 5.3 h, 8 GPUs at 6,000/s 1.7 h
    recs = [rec(0, 1, 1, 1000.0), rec(1, 2, 1, 1900.0), rec(2, 8, 1, 6000.0)]
    best, why = recommend(recs, Goal(36_000_000, 6.0, "6h"))
    assert best.trial == 1, why              # 1 GPU is cheaper per sample but misses the deadline
    assert why.startswith("cheapest configuration that finishes 36,000,000 samples by 6h: 5.3 h on 2 GPU(s), 26.32")
    assert recommend(recs)[0].trial == 0      # no goal: the lowest cost per million samples, as before
    best, why = recommend(recs, Goal(36_000_000, 12.0, "12h"))
    assert best.trial == 0 and "25.00" in why and "2 other configuration(s) also finish" in why
    best, why = recommend(recs, Goal(36_000_000, 1.0, "1h"))
    assert best is None and "no configuration finishes 36,000,000 samples by 1h (1.0 h left): the fastest, " \
                            "trial 2 (bs64 1x8gpu one-leaf), needs 1.7 h" in why


def test_without_prices_the_goal_takes_the_fewest_gpu_hours():
    recs = [rec(0, 1, 1, 1000.0, rate=None), rec(1, 4, 1, 3000.0, rate=None), rec(2, 8, 1, 5000.0, rate=None)]
    best, why = recommend(recs, Goal(36_000_000, 4.0, "4h"))
    assert best.trial == 1 and "fewest GPU-hours" in why and "13.3 GPU-hours" in why


def test_the_table_shows_hours_and_cost_for_the_goal():
    res = analyse("t", "samples_per_s", [rec(0, 1, 1, 1000.0), rec(1, 2, 1, 1900.0)], Goal(36_000_000, 6.0, "6h"))
    row0, row1 = res.rows
    assert (row0["hours_for_goal"], row0["finishes_in_time"], row0["cost_for_goal"]) == (10.0, False, 25.0)
    assert (row1["hours_for_goal"], row1["finishes_in_time"]) == (5.26, True)
    assert res.best["trial"] == 1
    assert "recommended: trial 1" in text_table(res)


def test_throughput_is_the_median_after_the_warm_up_with_its_spread():
    assert throughput_of([120.0, 950.0, 1010.0, 990.0, float("nan"), 1040.0], warmup=1) == \
        (1000.0, (950.0, 1040.0), 4)
    assert throughput_of([120.0, 950.0], warmup=2) == (950.0, None, 0)      # too few: the last, no spread
    assert throughput_of([], warmup=1) == (None, None, 0)
    res = analyse("t", "m", [TrialRecord({"batch_size": 1}, throughput=1000.0, spread=(950.0, 1040.0), reports=4)])
    assert (res.rows[0]["throughput_low"], res.rows[0]["throughput_high"], res.rows[0]["reports"]) == (950.0, 1040.0, 4)


def test_an_unknown_utilisation_is_never_called_input_bound():
    plateau = [rec(0, 1, 1, 2000.0, bs=64), rec(1, 1, 1, 2050.0, bs=256)]
    assert [(b["trial"], b["bottleneck"]) for b in bottlenecks(plateau)] == [(1, "unknown")]
    assert "no GPU utilisation figure" in bottlenecks(plateau)[0]["why"]
    known = [rec(0, 1, 1, 2000.0, bs=64, util=30), rec(1, 1, 1, 2050.0, bs=256, util=25)]
    assert [(b["trial"], b["bottleneck"]) for b in bottlenecks(known)] == [(1, "input")]


BASE = {"name": "t", "command": "train --bs {batch_size}", "axes": {"batch_size": [64, 256]}}
NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.timezone.utc)


def test_the_goal_deadline_is_a_duration_or_a_time_with_its_zone():
    spec = from_mapping({**BASE, "goal": {"samples": 10**9, "deadline": "2d"}})
    assert goal_of(spec, NOW) == Goal(10**9, 48.0, "2d")
    spec = from_mapping({**BASE, "goal": {"samples": 10**9, "deadline": "2099-12-04T18:00+01:00"}})
    assert goal_of(spec, NOW).hours == pytest.approx((dt.datetime(2099, 12, 4, 17, tzinfo=dt.timezone.utc)
                                                      - NOW).total_seconds() / 3600)
    assert goal_of(from_mapping(BASE), NOW) is None


@pytest.mark.parametrize("goal, field, says", [
    ({"samples": 10**9, "deadline": "2026-12-05T18:00"}, "goal.deadline", "has no time zone"),
    ({"samples": 10**9, "deadline": "2020-01-01T00:00Z"}, "goal.deadline", "is in the past"),
    ({"samples": 10**9, "deadline": "soon"}, "goal.deadline", "soon"),
    ({"samples": 1.5, "deadline": "1h"}, "goal.samples", "not a whole number"),
    ({"samples": 10}, "goal.deadline", "Field required"),
    ({"samples": 10, "deadline": "1h", "by": 3}, "goal.by", "unknown field"),
])
def test_a_bad_goal_names_the_field(goal, field, says):
    with pytest.raises(UserInputError) as exc:
        from_mapping({**BASE, "goal": goal})
    assert exc.value.field == field and says in str(exc.value)

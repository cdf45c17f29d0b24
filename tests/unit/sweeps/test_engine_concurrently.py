"""planner.concurrently: sweep run's independent questions to slurmctld, asked at once."""
from __future__ import annotations

import threading
import time

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps import planner


def test_results_by_name_and_calls_overlap():
    started = threading.Barrier(3, timeout=5)       # all three must be running at the same time

    def ask(value):
        def fn():
            started.wait()
            return value
        return fn

    assert planner.concurrently({"a": ask(1), "b": ask(2), "c": ask(3)}) == {"a": 1, "b": 2, "c": 3}


def test_an_error_in_any_call_is_raised_after_all_ended():
    ended = []

    def slow():
        time.sleep(0.05)
        ended.append("slow")
        return 1

    def bad():
        raise UserInputError("no node has 100000 GPUs", field="resources.gpus")

    with pytest.raises(UserInputError, match="100000"):
        planner.concurrently({"fits": bad, "limits": slow})
    assert ended == ["slow"]


def test_needs_records_only_for_a_large_batch():
    class L:
        max_job_count = 10000

    assert not planner.needs_records(100, L())
    assert planner.needs_records(101, L())
    L.max_job_count = 1000                         # min(100, 1000 // 20) = 50
    assert planner.needs_records(51, L()) and not planner.needs_records(50, L())
    assert planner.needs_records(101, None) and not planner.needs_records(100, None)

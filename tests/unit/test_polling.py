"""tests/polling.py's wait_for: the one way a test waits never times out silently."""
from __future__ import annotations

import itertools

import pytest

from polling import wait_for


def test_returns_the_first_truthy_value():
    calls = itertools.count()
    assert wait_for(lambda: next(calls) >= 2 and "ready", 5, "the third call", interval=0.01) == "ready"


def test_a_timeout_raises_naming_the_event_and_the_last_value():
    with pytest.raises(AssertionError) as exc:
        wait_for(lambda: [], 0.2, "the queue to fill", interval=0.05)
    assert str(exc.value) == "timed out after 0.2s waiting for the queue to fill (last: [])"


def test_what_may_be_evaluated_when_the_wait_fails():
    state = {"n": 0}

    def pred():
        state["n"] += 1
        return False
    with pytest.raises(AssertionError) as exc:
        wait_for(pred, 0.2, lambda: f"the counter (now {state['n']} calls)", interval=0.05)
    n = state["n"]
    assert n >= 2 and f"waiting for the counter (now {n} calls)" in str(exc.value)


def test_ignored_exceptions_are_not_yet_others_propagate():
    calls = itertools.count()

    def flaky():
        if next(calls) < 2:
            raise ConnectionRefusedError("not up yet")
        return "up"
    assert wait_for(flaky, 5, "the service", interval=0.01, ignore=OSError) == "up"
    with pytest.raises(AssertionError) as exc:
        wait_for(lambda: 1 / 0, 0.1, "a division", interval=0.05, ignore=ZeroDivisionError)
    assert "(last: raised ZeroDivisionError: division by zero)" in str(exc.value)
    with pytest.raises(KeyError):
        wait_for(lambda: {}["x"], 5, "a key", interval=0.01, ignore=OSError)


def test_abort_ends_the_wait_at_once_with_its_reason():
    calls = itertools.count()
    with pytest.raises(AssertionError) as exc:
        wait_for(lambda: next(calls) > 1000, 60, "the job to be ready", interval=0.01,
                 abort=lambda: "the job script exited (1)")
    assert str(exc.value) == "gave up waiting for the job to be ready: the job script exited (1) (last: False)"
    assert next(calls) == 1                      # one call, then abort: no 60 s wait


def test_the_predicate_runs_once_more_after_the_deadline():
    import time

    t0 = time.monotonic()
    # true only after the deadline: a wait that gave up without a last look would fail
    assert wait_for(lambda: time.monotonic() - t0 > 0.3, 0.3, "the deadline to pass", interval=10)


@pytest.mark.parametrize("kw", [{"what": ""}, {"timeout": 0}, {"interval": 0}])
def test_no_nameless_or_empty_wait(kw):
    args = {"predicate": lambda: True, "timeout": 1, "what": "x", **kw}
    with pytest.raises(ValueError):
        wait_for(**args)

"""Polling for integration tests (tests/ is on sys.path through its conftest.py)."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
    """``predicate()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

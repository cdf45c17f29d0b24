"""Polling for tests (tests/ is on sys.path through its conftest.py): the one way a test waits.

``wait_for(predicate, timeout, what)`` calls ``predicate()`` every ``interval`` seconds and returns
its first truthy value. It never gives up silently: when ``timeout`` seconds have passed it raises
``AssertionError("timed out after Ns waiting for WHAT (last: ...)")``, with the predicate's last
value or the last exception it was allowed to raise. What hand-written deadline loops need:

* ``what`` may be a callable, evaluated only when the wait fails, so the message can show the state
  at that moment (``lambda: f"every job to complete (now {states()})"``);
* ``ignore=(OSError,)``: exceptions that mean "not yet" (a service still starting, a file being
  replaced); any other exception propagates at once;
* ``abort=lambda: proc.poll() is not None and f"the job script exited ({proc.returncode})"``: a
  condition that ends the wait at once, failing with the text it returns (the outcome is decided:
  waiting longer cannot help);
* the predicate runs once more after the deadline, so a slow predicate call never loses the wait.
"""
from __future__ import annotations

import time
from collections.abc import Callable

_MISSING = object()


def _text(value: object, limit: int = 300) -> str:
    s = repr(value)
    return s if len(s) <= limit else s[:limit] + "..."


def wait_for(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str], interval: float = 0.5,
             *, ignore: type[BaseException] | tuple[type[BaseException], ...] = (),
             abort: Callable[[], object] | None = None):
    """``predicate()``'s first truthy value; AssertionError naming ``what`` after ``timeout`` s,
    or as soon as ``abort()`` is truthy. Exceptions of the ``ignore`` types count as "not yet"."""
    if not what:
        raise ValueError("wait_for needs `what`: the event it waits for, named in its failure")
    if timeout <= 0 or interval <= 0:
        raise ValueError(f"wait_for: timeout ({timeout}) and interval ({interval}) must be positive")
    deadline = time.monotonic() + timeout
    last: object = _MISSING
    while True:
        overdue = time.monotonic() > deadline
        try:
            value = predicate()
        except ignore as exc:
            value, last = None, exc
        else:
            if value:
                return value
            last = value
        if abort is not None:
            why = abort()
            if why:
                reason = why if isinstance(why, str) else "abort condition met"
                raise AssertionError(f"gave up waiting for {_what(what)}: {reason} (last: {_last(last)})")
        if overdue:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {_what(what)} (last: {_last(last)})")
        time.sleep(min(interval, max(deadline - time.monotonic(), 0) + 0.01))


def _what(what: str | Callable[[], str]) -> str:
    if not callable(what):
        return what
    try:
        return str(what())
    except Exception as exc:               # noqa: BLE001 - the message must not hide the timeout
        return f"<what() raised {exc!r}>"


def _last(last: object) -> str:
    if last is _MISSING:
        return "nothing"
    if isinstance(last, BaseException):
        text = str(last)
        return f"raised {type(last).__name__}: {text if len(text) <= 300 else text[:300] + '...'}"
    return _text(last)

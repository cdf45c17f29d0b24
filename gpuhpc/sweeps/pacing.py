"""When to ask Slurm again: by expectation, not by clock (issue 32.5).

A sweep's follower (its driver, or ``sweep wait`` when it has none) learns nothing from asking
``squeue`` while every running trial is still mid-run: its slots free when those trials end.
Each refresh notes, for the sweep, how long its trials ran (squeue's elapsed time of the tasks it
shows finished, and accounting's) and how long the running ones have run so far
(:class:`Pace`); the next round is due when the first running trial is expected to end
(:func:`next_free_in`), never sooner than the follower's ``poll`` and never later than a few
polls (a trial that fails early, or runs shorter than the others, frees its slot then)."""
from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

#: run times remembered per sweep (the newest): enough for a median, bounded for a long sweep
KEEP = 200


@dataclass
class Pace:
    """What the last refresh of a sweep saw: ``durations`` (seconds) of trials that ended,
    newest last; ``running`` the seconds each running trial had run at ``at``
    (``time.monotonic()``); ``pending`` trials queued and not started."""

    durations: list[float] = field(default_factory=list)
    running: tuple[float, ...] = ()
    pending: int = 0
    at: float = 0.0

    def saw(self, *, ended: Iterable[float], running: Iterable[float], pending: int, at: float | None = None) -> None:
        self.durations = (self.durations + [float(d) for d in ended])[-KEEP:]
        self.running = tuple(float(r) for r in running)
        self.pending = pending
        self.at = time.monotonic() if at is None else at

    @property
    def typical(self) -> float | None:
        """The median run time of the trials that ended so far (None before the first)."""
        return statistics.median(self.durations) if self.durations else None


def next_free_in(pace: Pace | None, now: float | None = None) -> float | None:
    """Seconds from ``now`` until a running trial is expected to end (0: one is overdue), from
    the run times seen so far; None when that cannot be said (no trial has ended yet, or none
    runs: a pending one may start, or the sweep be over, at any time)."""
    if pace is None or not pace.running or pace.typical is None:
        return None
    now = time.monotonic() if now is None else now
    since = max(0.0, now - pace.at)
    return max(0.0, min(pace.typical - r - since for r in pace.running))


def pause(pace: Pace | None, poll: float, *, floor: float | None = None, most: float | None = None,
          now: float | None = None) -> float:
    """How long a follower sleeps before its next round: until a slot is expected to free
    (:func:`next_free_in`), at least ``floor`` (its ``poll``) and at most ``most`` (4 polls: a
    trial that ends early waits that long at worst, and the driver's heartbeat, which ``wait``
    checks against 6 polls, stays fresh). ``poll`` when nothing can be expected."""
    floor = poll if floor is None else floor
    most = max(floor, 4 * poll if most is None else most)
    nxt = next_free_in(pace, now)
    if nxt is None:
        return max(floor, min(poll, most))
    return min(most, max(floor, nxt))

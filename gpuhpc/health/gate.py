"""Drain-reason taxonomy and the drain/resume decision.

A reason gpuhpc sets reads ``gpuhpc:<category>: <message>`` (``gpuhpc:hw: gpu count 7/8``,
``gpuhpc:dev: ib mlx5_1/1 down``, ``gpuhpc:sw: munge``, ``gpuhpc:perf: gpu3 throttled``).
gpuhpc resumes a node only when its current reason starts with ``gpuhpc:``: a drain an admin
set, with any other reason, is never undone (Soperator's rule). The deep checks
(:mod:`gpuhpc.health.deep`: DCGM diagnostics, nccl bandwidth) and the regular checks each undo
only their own drains: a regular check passing every 30 s must not return a node the nightly
nccl test drained. Two exceptions make drains last longer:

- A regular ``gpuhpc:hw:`` drain (a hardware fault: XID 79, a double-bit ECC error, a lost GPU)
  is *sticky*: a clean regular run leaves it (the fault may be gone from what the checks read,
  after a reboot or once the XID is old, yet the GPU is not trusted). An admin returns the node
  (``scontrol update NodeName=N State=RESUME``), or a passing deep run does.
- A ``gpuhpc:perf:`` drain lasts at least ``min_drain_s`` (:class:`~gpuhpc.health.checks.Hysteresis`),
  and a perf failure drains only when enough recent samples failed (:func:`damp`).

:func:`decide` and :func:`damp` are pure; :func:`apply` acts through a
:class:`~gpuhpc.slurm.client.SlurmClient`.
"""
from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuhpc.health.checks import CATEGORIES, HW, PERF, Hysteresis, Result, Status, warn

PREFIX = "gpuhpc:"
MAX_REASON = 200


def reason_for(results: Sequence[Result]) -> str | None:
    """The drain reason for a run's failures (None when nothing failed): the first failure of
    the most serious category (hw, then dev, then sw, then perf), with how many more there are."""
    failed = [r for r in results if r.status is Status.FAIL]
    if not failed:
        return None
    failed.sort(key=lambda r: CATEGORIES.index(r.category) if r.category in CATEGORIES else len(CATEGORIES))
    first = failed[0]
    text = f"{PREFIX}{first.category}: {first.message or first.check}"
    if len(failed) > 1:
        text += f" (+{len(failed) - 1} more)"
    return " ".join(text.replace("=", ":").split())[:MAX_REASON]


def is_ours(reason: str | None) -> bool:
    """Whether gpuhpc set this drain reason (``scontrol`` appends ``[user@time]``: ignored)."""
    return bool(reason) and reason.strip().startswith(PREFIX)


def _bare(reason: str) -> str:
    """A reason without the ``[user@time]`` suffix scontrol shows."""
    text = reason.strip()
    if text.endswith("]") and " [" in text:
        text = text[:text.rindex(" [")]
    return text


def bare(reason: str | None) -> str:
    """A drain reason as it was set (without scontrol's ``[user@time]``)."""
    return _bare(reason or "")


def is_drained(state: str) -> bool:
    return "DRAIN" in state.upper()


class Action(str, enum.Enum):
    NONE = "none"
    DRAIN = "drain"
    RESUME = "resume"


@dataclass(frozen=True)
class Decision:
    """What to do with a node, and why."""

    action: Action
    reason: str | None
    why: str

    def to_dict(self) -> dict:
        return {"action": self.action.value, "reason": self.reason, "why": self.why}


def is_mine(reason: str | None, *, deep: bool = False) -> bool:
    """gpuhpc's drain, set by this set of checks (the deep ones, or the regular ones)."""
    from gpuhpc.health.deep import is_deep_reason

    return is_ours(reason) and is_deep_reason(_bare(reason or "")) == deep


def category(reason: str | None) -> str | None:
    """The category of a gpuhpc drain reason (``gpuhpc:hw: ...`` -> ``hw``); None for another's."""
    if not is_ours(reason):
        return None
    cat, sep, _ = _bare(reason or "")[len(PREFIX):].partition(":")
    return cat if sep else None


def is_sticky(reason: str | None) -> bool:
    """A regular check's hardware drain (``gpuhpc:hw:``, not a deep check's): only an admin or a
    passing deep run returns the node."""
    return is_mine(reason) and category(reason) == HW


def is_perf_drain(reason: str | None) -> bool:
    """A regular check's perf drain (``gpuhpc:perf:``): held for the hysteresis' ``min_drain_s``."""
    return is_mine(reason) and category(reason) == PERF


def returns_on_pass(reason: str | None, *, deep: bool = False) -> bool:
    """Whether a passing run of this set of checks (``deep`` or regular) may resume a node drained
    with ``reason``: its own drains, except a regular run's sticky hardware drain, which a deep
    run returns instead."""
    if deep:
        return is_mine(reason, deep=True) or is_sticky(reason)
    return is_mine(reason) and not is_sticky(reason)


def decide(state: str, current_reason: str, results: Sequence[Result], *, deep: bool = False,
           held_s: float | None = None, min_drain_s: float = 0.0) -> Decision:
    """Drain a failing node (or update gpuhpc's own reason); resume a healthy node that only
    these checks (``deep`` or regular) drained; leave an admin's drain, the other check set's
    drain and a DOWN node alone. A regular hardware drain (``gpuhpc:hw:``) sticks: a regular run
    neither resumes it nor rewrites its reason; a passing deep run (one that tested something)
    resumes it. ``held_s``: how long the node has been drained for a perf reason; such a drain
    is resumed only after ``min_drain_s``, and a perf failure on a node drained for perf keeps the
    drain's reason (and so its time)."""
    new = reason_for(results)
    drained = is_drained(state)
    ours = is_ours(current_reason)
    mine = is_mine(current_reason, deep=deep)
    if new is not None:
        if drained and not ours:
            return Decision(Action.NONE, None, "drained by someone else: their reason stays")
        if drained and not mine:
            return Decision(Action.NONE, None, "drained by gpuhpc's other checks: their reason stays")
        if drained and not deep and is_sticky(current_reason):
            return Decision(Action.NONE, _bare(current_reason),
                            "drained for a hardware fault: the first fault's reason stays")
        if drained and _bare(current_reason) == new:
            return Decision(Action.NONE, new, "already drained for this reason")
        if drained and not deep and is_perf_drain(current_reason) and category(new) == PERF:
            return Decision(Action.NONE, _bare(current_reason), "already drained for performance")
        return Decision(Action.DRAIN, new, "a check failed")
    if drained and returns_on_pass(current_reason, deep=deep):
        if deep and not any(r.status is Status.OK for r in results):
            return Decision(Action.NONE, None, "the deep checks tested nothing here: the drain stays")
        if not deep and is_perf_drain(current_reason) and held_s is not None and held_s < min_drain_s:
            return Decision(Action.NONE, None, f"checks pass, but a perf drain lasts {min_drain_s:g} s "
                                               f"({held_s:.0f} s so far)")
        if is_sticky(current_reason):
            return Decision(Action.RESUME, None, "deep checks pass: returning the node from its hardware drain")
        return Decision(Action.RESUME, None, "checks pass again: undoing gpuhpc's drain")
    if drained and not deep and is_sticky(current_reason):
        return Decision(Action.NONE, None, "healthy now, but drained for a hardware fault: an admin "
                                           "(scontrol update State=RESUME) or a passing deep check returns it")
    if drained and ours:
        return Decision(Action.NONE, None, "healthy here, but drained by gpuhpc's other checks: not resumed")
    if drained:
        return Decision(Action.NONE, None, "healthy, but drained by someone else: not resumed")
    return Decision(Action.NONE, None, "healthy")


def apply(client, node: str, decision: Decision, *, deep: bool = False) -> None:
    """Carry out ``decision`` for ``node`` through ``client`` (a SlurmClient)."""
    if decision.action is Action.DRAIN:
        client.drain_node(node, decision.reason)
    elif decision.action is Action.RESUME:
        # read the reason again right before resuming: an admin may have drained the node since
        now = client.node(node)
        if now is not None and is_drained(now.state) and returns_on_pass(now.reason, deep=deep):
            client.resume_node(node)


# ------------------------------------------------------------------ perf hysteresis
@dataclass
class PerfState:
    """A node's recent perf samples (per check, 1 failed / 0 passed, oldest first) and when
    gpuhpc drained it for perf (epoch seconds; None when it is not): ``state_dir/perf-<node>``."""

    samples: dict[str, list[int]] = field(default_factory=dict)
    drained_at: float | None = None

    @classmethod
    def from_text(cls, text: str | None) -> "PerfState":
        try:
            data = json.loads(text) if text and text.strip() else {}
            samples = {str(k): [1 if x else 0 for x in v] for k, v in (data.get("samples") or {}).items()}
            at = data.get("drained_at")
            return cls(samples, float(at) if at is not None else None)
        except (ValueError, TypeError, AttributeError):
            return cls()            # a damaged file: start counting again

    def to_text(self) -> str:
        return json.dumps({"samples": self.samples, "drained_at": self.drained_at}, sort_keys=True) + "\n"


def damp(results: Sequence[Result], samples: Mapping[str, Sequence[int]],
         h: Hysteresis = Hysteresis()) -> tuple[list[Result], dict[str, list[int]]]:
    """This run's perf results counted into each check's last ``h.window`` samples; a perf
    failure becomes a warning unless ``h.fail_samples`` of them failed (one throttled sample
    drains nothing). Returns the results and the new samples. A skipped check adds no sample."""
    out: list[Result] = []
    new = {k: list(v) for k, v in samples.items()}
    for r in results:
        if r.category != PERF or r.status is Status.SKIP:
            out.append(r)
            continue
        window = (new.get(r.check, []) + [1 if r.status is Status.FAIL else 0])[-max(1, h.window):]
        new[r.check] = window
        failed = sum(window)
        if r.status is Status.FAIL and failed < h.fail_samples:
            out.append(warn(r.check, f"{r.message} ({failed} of the last {len(window)} samples; "
                                     f"drains at {h.fail_samples} of {h.window})", PERF))
        else:
            out.append(r)
    return out, new

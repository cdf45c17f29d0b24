"""Drain-reason taxonomy and the drain/resume decision.

A reason gpuhpc sets reads ``gpuhpc:<category>: <message>`` (``gpuhpc:hw: gpu count 7/8``,
``gpuhpc:sw: munge``, ``gpuhpc:perf: gpu3 throttled``). gpuhpc resumes a node only when its
current reason starts with ``gpuhpc:``: a drain an admin set, with any other reason, is
never undone (Soperator's rule). The deep checks (:mod:`gpuhpc.health.deep`: DCGM diagnostics,
nccl bandwidth) and the regular checks each undo only their own drains: a regular check
passing every 30 s must not return a node the nightly nccl test drained. :func:`decide` is pure; :func:`apply` acts through a
:class:`~gpuhpc.slurm.client.SlurmClient`.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from gpuhpc.health.checks import CATEGORIES, Result, Status

PREFIX = "gpuhpc:"
MAX_REASON = 200


def reason_for(results: Sequence[Result]) -> str | None:
    """The drain reason for a run's failures (None when nothing failed): the first failure of
    the most serious category (hw, then sw, then perf), with how many more there are."""
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


def decide(state: str, current_reason: str, results: Sequence[Result], *, deep: bool = False) -> Decision:
    """Drain a failing node (or update gpuhpc's own reason); resume a healthy node that only
    these checks (``deep`` or regular) drained; leave an admin's drain, the other check set's
    drain and a DOWN node alone."""
    new = reason_for(results)
    drained = is_drained(state)
    ours = is_ours(current_reason)
    mine = is_mine(current_reason, deep=deep)
    if new is not None:
        if drained and not ours:
            return Decision(Action.NONE, None, "drained by someone else: their reason stays")
        if drained and not mine:
            return Decision(Action.NONE, None, "drained by gpuhpc's other checks: their reason stays")
        if drained and _bare(current_reason) == new:
            return Decision(Action.NONE, new, "already drained for this reason")
        return Decision(Action.DRAIN, new, "a check failed")
    if drained and mine:
        return Decision(Action.RESUME, None, "checks pass again: undoing gpuhpc's drain")
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
        if now is not None and is_drained(now.state) and is_mine(now.reason, deep=deep):
            client.resume_node(node)

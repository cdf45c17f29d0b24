"""Node health gate: checks (:mod:`.checks`, pure), the expectations (:mod:`.spec`), running
them on a node (:mod:`.collect`), and the drain/resume decision (:mod:`.gate`).

:func:`check_node` is what ``gpuhpc node health``, ``python -m gpuhpc.health`` (Slurm's
HealthCheckProgram, Prolog, Epilog) and the tests call.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpuhpc.health.checks import Report, Result, Status
from gpuhpc.health.gate import PREFIX, Action, Decision, decide, is_ours, reason_for
from gpuhpc.health.spec import HealthSpec

__all__ = ["Action", "Decision", "HealthSpec", "Outcome", "PREFIX", "Report", "Result", "Status", "check_node",
           "decide", "is_ours", "reason_for"]


@dataclass
class Outcome:
    """A node's checks, the decision taken on them, and whether it was carried out."""

    report: Report
    decision: Decision | None = None
    applied: bool = False

    def to_dict(self) -> dict:
        d = self.report.to_dict()
        d["decision"] = self.decision.to_dict() if self.decision else None
        d["applied"] = self.applied
        return d


def check_node(node: str, *, runner=None, client=None, spec: HealthSpec | None = None, mode: str = "full",
               apply: bool = False, baselines=None) -> Outcome:
    """Run ``mode``'s checks (``prolog``, ``full`` or ``deep``) for ``node`` through ``runner``
    and decide drain/resume from the node's Slurm state (asked through ``client``, a
    SlurmClient); with ``apply``, do it. ``baselines``: the deep checks' per-node baselines
    (:class:`gpuhpc.health.deep.Baselines`)."""
    from gpuhpc.health import collect, gate
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport import default_runner

    runner = runner or default_runner()
    deep = mode == "deep"
    if deep:
        from gpuhpc.health.deep import run_deep

        report = run_deep(node, runner, spec or HealthSpec(), baselines=baselines)
    else:
        report = collect.run_checks(node, runner, spec or HealthSpec(), mode=mode)
    if mode == "prolog" and report.healthy:
        # every job start runs the prolog: a healthy node asks slurmctld nothing (resuming a node
        # gpuhpc drained is HealthCheckProgram's job; a drained node starts no jobs anyway)
        return Outcome(report, Decision(Action.NONE, None, "healthy (prolog: slurmctld not asked)"))
    client = client or SlurmClient(runner)
    info = client.node(node)
    if info is None:
        return Outcome(report)
    decision = gate.decide(info.state, info.reason, report.results, deep=deep)
    if apply and decision.action is not Action.NONE:
        gate.apply(client, node, decision, deep=deep)
        return Outcome(report, decision, True)
    return Outcome(report, decision, False)

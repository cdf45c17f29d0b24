"""Node health gate: checks (:mod:`.checks`, pure), the expectations (:mod:`.spec`), running
them on a node (:mod:`.collect`), and the drain/resume decision (:mod:`.gate`).

:func:`check_node` is what ``gpuhpc node health``, ``python -m gpuhpc.health`` (Slurm's
HealthCheckProgram, Prolog, Epilog) and the tests call.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpuhpc.health.checks import PERF, Report, Result, Status
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
    job_id: str | None = None           # the deep checks' Slurm job

    def to_dict(self) -> dict:
        d = self.report.to_dict()
        d["decision"] = self.decision.to_dict() if self.decision else None
        d["applied"] = self.applied
        if self.job_id is not None:
            d["job_id"] = self.job_id
        return d


def check_node(node: str, *, runner=None, client=None, spec: HealthSpec | None = None, mode: str = "full",
               apply: bool = False, baselines=None, now: float | None = None, spec_path: str | None = None,
               wait_s: float | None = None, on_queued=None) -> Outcome:
    """Run ``mode``'s checks (``prolog``, ``full`` or ``deep``) for ``node`` through ``runner``
    and decide drain/resume from the node's Slurm state (asked through ``client``, a
    SlurmClient); with ``apply``, do it. ``baselines``: the deep checks' per-node baselines
    (:class:`gpuhpc.health.deep.Baselines`). ``now``: the clock (epoch seconds) of the perf
    hysteresis (default: the time now).

    ``deep``: the checks run as an exclusive Slurm job holding the node
    (:func:`gpuhpc.health.deep.run_held`; ``spec_path`` is handed to the job, ``wait_s`` bounds the
    wait for the node's jobs to end, ``on_queued(job_id)`` is told the job's id); this process
    records the baseline and decides.

    Only a run with ``apply`` writes the gate's state on the node (``spec.state_dir``: the XID
    mark, the perf samples): a look without it changes nothing, and leaves what it saw for the
    run that acts."""
    import time

    from gpuhpc.health import collect, gate
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport import default_runner

    runner = runner or default_runner()
    spec = spec or HealthSpec()
    t = time.time() if now is None else now
    deep = mode == "deep"
    if deep:
        return _deep(node, runner, client or SlurmClient(runner), spec, apply=apply, baselines=baselines,
                     spec_path=spec_path, wait_s=wait_s, on_queued=on_queued)
    else:
        info = None
        if mode == "full":
            # the full checks need the node as Slurm knows it: whether a job runs there (GPU
            # processes left), its RealMemory and CPUs (host); the decision below reads it too
            client = client or SlurmClient(runner)
            info = client.node(node)
        report = collect.run_checks(node, runner, spec, mode=mode, record=apply, slurm_node=info)
    if mode == "prolog" and report.healthy:
        # every job start runs the prolog: a healthy node asks slurmctld nothing (resuming a node
        # gpuhpc drained is HealthCheckProgram's job; a drained node starts no jobs anyway)
        return Outcome(report, Decision(Action.NONE, None, "healthy (prolog: slurmctld not asked)"))
    if mode != "full":
        client = client or SlurmClient(runner)
        info = client.node(node)
    perf, held = None, None
    if mode == "full":
        # one throttled sample drains nothing: perf failures count over the last samples
        perf_path = collect.perf_state_path(spec.state_dir, node)
        perf = gate.PerfState.from_text(collect.read_or_none(runner, perf_path))
        before = perf.to_text()
        if info is not None and gate.is_drained(info.state) and gate.is_perf_drain(info.reason):
            perf.drained_at = perf.drained_at if perf.drained_at is not None else t
            held = t - perf.drained_at
        elif info is not None and perf.drained_at is not None:
            # no longer drained for perf (an admin resumed it, or another reason replaced it):
            # the count starts again
            perf.samples, perf.drained_at = {}, None
        report.results, perf.samples = gate.damp(report.results, perf.samples, spec.hysteresis)
    if info is None:
        return Outcome(report)
    decision = gate.decide(info.state, info.reason, report.results, deep=deep, held_s=held,
                           min_drain_s=spec.hysteresis.min_drain_s)
    if not apply:
        return Outcome(report, decision, False)
    if decision.action is not Action.NONE:
        gate.apply(client, node, decision, deep=deep)
    if perf is not None:
        if decision.action is Action.DRAIN:
            perf.drained_at = t if gate.category(decision.reason) == PERF else None
        elif decision.action is Action.RESUME:
            perf.samples, perf.drained_at = {}, None      # after a resume the count starts again
        if perf.to_text() != before and not collect.write_state(runner, spec.state_dir, perf_path, perf.to_text()):
            report.results.append(Result("perf-state", Status.WARN, f"cannot record the perf samples in {perf_path}"))
    return Outcome(report, decision, decision.action is not Action.NONE)


def _deep(node: str, runner, client, spec: HealthSpec, *, apply: bool, baselines, spec_path: str | None,
          wait_s: float | None, on_queued) -> Outcome:
    """The deep checks as a job alone on ``node``, decided and applied here (where the ledger is)."""
    from gpuhpc.health import deep, gate
    from gpuhpc.health.checks import skip

    info = client.node(node)
    if info is None:
        return Outcome(Report(node, [skip(deep.DCGM, "not a Slurm node"), skip(deep.NCCL, "not run", PERF)]))
    if gate.is_drained(info.state) and not gate.returns_on_pass(info.reason, deep=True):
        # drained by an admin, or by the regular checks: a pass would not return it, a failure
        # would not replace their reason, so the node is not held and nothing runs
        why = "drained by someone else" if not gate.is_ours(info.reason) else "drained by gpuhpc's regular checks"
        report = Report(node, [skip(deep.DCGM, f"{why}: not tested"), skip(deep.NCCL, "not run", PERF)])
        return Outcome(report, gate.decide(info.state, info.reason, report.results, deep=True), False)
    base = baselines.get(node) if baselines is not None else None
    old = (gate.bare(info.reason) or "gpuhpc:hw: deep check interrupted") if gate.is_drained(info.state) else None
    run = deep.run_held(node, info, client, runner, spec, baseline=base, drained=old, spec_path=spec_path,
                        wait_s=wait_s, on_queued=on_queued)
    decision = None
    try:
        deep.record_baseline(node, run.report, run.measured, base, baselines)
        # decided on the node as it was before the run (its drain, if it had one, was lifted only
        # for the job)
        decision = gate.decide(info.state, info.reason, run.report.results, deep=True)
        if apply and decision.action is Action.DRAIN:
            gate.apply(client, node, decision, deep=True)
    finally:
        # the old drain back, unless the decision (carried out) drained the node anew or returns it
        keep = apply and decision is not None and decision.action is not Action.NONE
        deep.release(client, node, run, None if keep else old)
    applied = apply and decision.action is not Action.NONE
    return Outcome(run.report, decision, applied, run.job_id)

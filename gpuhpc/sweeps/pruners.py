"""Early stopping for sweeps: the ``pruner:`` of a sweep file and its decisions (stdlib only).

A pruner looks at the values of the sweep's metric that each trial reported per step
(:func:`gpuhpc.report`, ``report(step=s, loss=v)``) and names the running trials to stop.
The sweep driver asks it every round (:func:`gpuhpc.sweeps.control.prune`); a trial learns
it was pruned from :func:`gpuhpc.should_prune` (and from the checkpoint path's stop file,
:func:`gpuhpc.should_stop`), exits, and ends ``pruned``.

- ``median`` (Optuna's ``MedianPruner``): at its latest step *s* (from ``warmup_steps`` on,
  once ``min_trials`` trials have completed), a trial whose best value so far is worse than
  the median of the completed trials' values at step *s* is pruned;
- ``asha`` / ``successive_halving`` (Optuna's ``SuccessiveHalvingPruner``, asynchronous):
  rung *k* is step ``min_resource * reduction_factor ** (min_early_stopping_rate + k)``; a
  trial reaching a rung goes on only when its value there is in the best
  ``1/reduction_factor`` of the values that the trials promoted to that rung had reported
  there *by then* (the first trial at a rung always goes on);
- ``hyperband`` (Optuna's ``HyperbandPruner``, needs Optuna): the sweep's reports are replayed,
  in the order they were written, into an in-memory Optuna study.

The decisions are pure functions of the reported values and their times, so a restarted
driver takes the same ones again. Every value is the trial's first report for a step (a
trial resumed from a checkpoint may report a step twice).
"""
from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps.state import TrialState

TYPES = ("none", "median", "asha", "successive_halving", "hyperband")
#: each type's fields and their defaults (None: required)
FIELDS: dict[str, dict[str, Any]] = {
    "none": {},
    "median": {"warmup_steps": 0, "min_trials": 5},
    "asha": {"min_resource": 1, "reduction_factor": 4, "min_early_stopping_rate": 0},
    "hyperband": {"min_resource": 1, "max_resource": None, "reduction_factor": 3},
}
FIELDS["successive_halving"] = FIELDS["asha"]
#: every type: how long (seconds) a pruned trial may run on before its array task is cancelled
COMMON = {"grace": 30}
_MINIMUM = {"warmup_steps": 0, "min_trials": 1, "min_resource": 1, "max_resource": 1, "reduction_factor": 2,
            "min_early_stopping_rate": 0, "grace": 0}


def parse(value: Any, f: str = "pruner") -> dict[str, Any] | None:
    """A sweep file's ``pruner:`` (a type name, or a mapping with ``type`` and its fields) as a
    plain dict with every default filled in; None for ``none``. Bad input: UserInputError
    naming the field (exit 2)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, Mapping):
        raise UserInputError(f"expected a type ({', '.join(TYPES)}) or a mapping with type", field=f)
    kind = value.get("type")
    if kind not in TYPES:
        raise UserInputError(f"{kind!r} is not one of {', '.join(TYPES)}", field=f"{f}.type")
    if kind == "none":
        if len(value) > 1:
            raise UserInputError("pruner none takes no fields", field=f"{f}.{next(k for k in value if k != 'type')}")
        return None
    allowed = {**FIELDS[kind], **COMMON}
    out: dict[str, Any] = {"type": "asha" if kind == "successive_halving" else kind}
    for k, v in value.items():
        if k == "type":
            continue
        if k not in allowed:
            raise UserInputError(f"unknown field of a {kind} pruner (valid: type, {', '.join(allowed)})",
                                 field=f"{f}.{k}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
            raise UserInputError(f"expected a whole number, got {v!r}", field=f"{f}.{k}")
        if int(v) < _MINIMUM[k]:
            raise UserInputError(f"must be >= {_MINIMUM[k]}, got {v!r}", field=f"{f}.{k}")
        out[k] = int(v)
    for k, default in allowed.items():
        if k not in out:
            if default is None:
                raise UserInputError(f"a {kind} pruner needs {k} (the last step a trial reports)", field=f"{f}.{k}")
            out[k] = default
    if kind == "hyperband":
        if out["max_resource"] < out["min_resource"]:
            raise UserInputError(f"must be >= min_resource ({out['min_resource']})", field=f"{f}.max_resource")
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise UserInputError("the hyperband pruner needs Optuna", field=f"{f}.type",
                                 hint="pip install optuna (or gpuhpc[tpe]), or use median or asha") from None
    return out


# ---------------------------------------------------------------- what the pruners read
@dataclass
class TrialHistory:
    """One trial as a pruner sees it: its state and its reports of the sweep's metric, in the
    order written: (step, value, time)."""

    number: int
    state: TrialState
    reports: list[tuple[int, float, float]] = field(default_factory=list)

    def values(self) -> dict[int, tuple[float, float]]:
        """{step: (value, time)}: the first report of each step."""
        out: dict[int, tuple[float, float]] = {}
        for step, value, ts in self.reports:
            out.setdefault(step, (value, ts))
        return out

    @property
    def last_step(self) -> int | None:
        return self.reports[-1][0] if self.reports else None


def _worse(a: float, b: float, goal: str) -> bool:
    return a > b if goal == "minimize" else a < b


def decide(pruner: Mapping[str, Any] | None, goal: str, trials: Sequence[TrialHistory],
           candidates: Iterable[int]) -> dict[int, str]:
    """{trial number: why} for each of ``candidates`` (running trials) the pruner stops now."""
    if not pruner:
        return {}
    wanted = set(candidates)
    kind = pruner["type"]
    if kind == "median":
        return median(pruner, goal, trials, wanted)
    if kind == "asha":
        return asha(pruner, goal, trials, wanted)
    if kind == "hyperband":
        return hyperband(pruner, goal, trials, wanted)
    return {}


def median(cfg: Mapping[str, Any], goal: str, trials: Sequence[TrialHistory], wanted: set[int]) -> dict[int, str]:
    completed = [t.values() for t in trials if t.state == TrialState.COMPLETED and t.reports]
    out: dict[int, str] = {}
    if len(completed) < cfg.get("min_trials", 5):
        return out
    for t in trials:
        if t.number not in wanted or not t.reports:
            continue
        step = t.last_step
        if step is None or step < cfg.get("warmup_steps", 0):
            continue
        at = [c[step][0] for c in completed if step in c]
        if not at:
            continue
        med = statistics.median(at)
        vals = [v for v, _ in t.values().values()]
        best = min(vals) if goal == "minimize" else max(vals)
        if math.isnan(best) or _worse(best, med, goal):
            out[t.number] = (f"median pruner: best value {best:.6g} by step {step} is worse than the median "
                             f"{med:.6g} of {len(at)} completed trials at step {step}")
    return out


def rung_step(cfg: Mapping[str, Any], rung: int) -> int:
    return cfg.get("min_resource", 1) * cfg.get("reduction_factor", 4) ** (cfg.get("min_early_stopping_rate", 0) + rung)


def asha(cfg: Mapping[str, Any], goal: str, trials: Sequence[TrialHistory], wanted: set[int]) -> dict[int, str]:
    """Asynchronous successive halving, rung by rung in the order the rung values were written:
    a trial's value at a rung is its first report at or after the rung's step."""
    rf = cfg.get("reduction_factor", 4)
    sign = 1.0 if goal == "minimize" else -1.0
    eligible = {t.number: t for t in trials if t.reports}
    stopped: dict[int, str] = {}
    rung = 0
    while eligible:
        step = rung_step(cfg, rung)
        entries = []
        for t in eligible.values():
            got = next(((v, ts, s) for s, v, ts in t.reports if s >= step), None)
            if got is not None:
                entries.append((got[1], t.number, got[0], got[2]))
        if not entries:
            break
        entries.sort()
        seen: list[float] = []
        promoted: dict[int, TrialHistory] = {}
        for _, number, value, at in entries:
            key = sign * value
            bisect.insort(seen, key)
            k = max(0, len(seen) // rf - 1)
            if math.isnan(value) or key > seen[k]:
                stopped[number] = (f"asha pruner: value {value:.6g} at step {at} (rung {rung}, step {step}) is not in "
                                   f"the best 1/{rf} of the {len(seen)} trials there so far")
            else:
                promoted[number] = eligible[number]
        eligible = promoted
        rung += 1
    return {n: why for n, why in stopped.items() if n in wanted}


def hyperband(cfg: Mapping[str, Any], goal: str, trials: Sequence[TrialHistory], wanted: set[int]) -> dict[int, str]:
    """Optuna's HyperbandPruner over an in-memory study into which the sweep's reports are
    replayed in the order they were written (each trial asked for at its first report, told
    COMPLETE after its last when it completed, told PRUNED where the pruner says so)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = optuna.pruners.HyperbandPruner(min_resource=cfg.get("min_resource", 1),
                                            max_resource=cfg["max_resource"],
                                            reduction_factor=cfg.get("reduction_factor", 3))
    study = optuna.create_study(study_name="gpuhpc-sweep", direction=goal, pruner=pruner)
    events = []
    for t in trials:
        firsts: dict[int, tuple[float, float]] = {}
        for step, value, ts in t.reports:
            if step not in firsts:
                firsts[step] = (value, ts)
                events.append((ts, 0, t.number, step, value))
        if t.state == TrialState.COMPLETED and t.reports:
            events.append((t.reports[-1][2], 1, t.number, None, t.reports[-1][1]))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    live: dict[int, Any] = {}
    out: dict[int, str] = {}
    done: set[int] = set()
    for _, kind, number, step, value in events:
        if number in done:
            continue
        if kind == 1:
            if number in live:
                study.tell(live.pop(number), value)
            done.add(number)
            continue
        ot = live.get(number)
        if ot is None:
            ot = live[number] = study.ask()
        ot.report(value, step)
        if ot.should_prune():
            study.tell(live.pop(number), state=optuna.trial.TrialState.PRUNED)
            done.add(number)
            out[number] = f"hyperband pruner: value {value:.6g} at step {step}"
    return {n: why for n, why in out.items() if n in wanted}

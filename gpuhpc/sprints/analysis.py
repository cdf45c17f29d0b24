"""A sprint's figures from its trial records: pure functions, no I/O.

* ``$ per million samples`` of a configuration = price per GPU-hour x its GPUs / (throughput x 3600) x 10^6;
* scaling efficiency = throughput / (GPUs x the 1-GPU throughput at the same per-GPU batch size);
* a trial's throughput: the median of its reports after the warm-up ones (the sprint's
  ``warmup``), with their spread (lowest and highest) beside it;
* the recommendation, with a ``goal`` (N samples by a deadline): the cheapest configuration that
  finishes N samples in the time left (fewest GPU-hours when no price is known), the faster on a
  tie; none finishing in time names the fastest and how long it needs. Without a goal: the lowest
  $ per million samples (the highest throughput per GPU when no price is known);
* a bottleneck guess where throughput stops rising while utilisation is low: communication
  (spread slower than one leaf, or poor scaling across GPUs/nodes), CPU (the CPUs near full),
  else input (nothing else explains idle GPUs). With utilisation unknown the last is
  ``unknown``: idle GPUs are not known to be idle.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

LOW_UTIL = 70.0          # % GPU utilisation under which a plateau is a bottleneck
HIGH_CPU = 85.0          # % of the job's CPUs busy: CPU bound
PLATEAU = 1.10           # less than +10 % throughput from doubling the batch: a plateau
POOR_SCALING = 0.80


@dataclass
class TrialRecord:
    config: dict[str, Any]                  # batch_size, gpus_per_node, nodes, placement
    state: str = "completed"
    throughput: float | None = None         # the sprint's metric (samples/s)
    util_percent: float | None = None       # mean GPU utilisation
    util_source: str = ""                   # ledger | prometheus | reported
    cpu_percent: float | None = None        # CPU time / (CPUs x elapsed)
    memory_bytes: float | None = None       # peak GPU memory
    rate: Decimal | None = None             # price per GPU-hour
    job_id: str = ""
    trial: int = 0
    spread: tuple[float, float] | None = None   # lowest and highest report after the warm-up
    reports: int = 0                        # reports the throughput is the median of (0: one final value)

    @property
    def gpus(self) -> int:
        return int(self.config.get("nodes", 1)) * int(self.config.get("gpus_per_node", 1))

    @property
    def ok(self) -> bool:
        return self.state == "completed" and bool(self.throughput) and self.throughput > 0

    def label(self) -> str:
        c = self.config
        return (f"bs{c.get('batch_size', 1)} {c.get('nodes', 1)}x{c.get('gpus_per_node', 1)}gpu "
                f"{c.get('placement', 'one-leaf')}")


def throughput_of(history: list[float], warmup: int) -> tuple[float | None, tuple[float, float] | None, int]:
    """(median, (lowest, highest), reports used) of a trial's reports of the metric after the first
    ``warmup``; with no more than ``warmup`` reports, the last one alone (no spread, 0 used)."""
    steady = [v for v in history[warmup:] if v == v]          # NaN never reaches a median
    if not steady:
        return (history[-1] if history else None), None, 0
    return statistics.median(steady), (min(steady), max(steady)), len(steady)


@dataclass(frozen=True)
class Goal:
    """N samples in ``hours`` (the time left until the deadline when the result is made)."""
    samples: int
    hours: float
    deadline: str = ""                     # as written, for the reason


def hours_for(r: TrialRecord, goal: Goal) -> float | None:
    return goal.samples / r.throughput / 3600 if r.ok else None


def cost_for(r: TrialRecord, goal: Goal) -> Decimal | None:
    h = hours_for(r, goal)
    if h is None or r.rate is None:
        return None
    return (r.rate * r.gpus * Decimal(repr(h))).quantize(Decimal("0.01"))


def cost_per_million(r: TrialRecord) -> Decimal | None:
    if not r.ok or r.rate is None:
        return None
    return (r.rate * r.gpus * Decimal(1_000_000) / (Decimal(repr(r.throughput)) * 3600)).quantize(Decimal("0.0001"))


def _base_key(c: dict[str, Any]) -> Any:
    return c.get("batch_size", 1)


def scaling(records: list[TrialRecord]) -> dict[int, float | None]:
    """trial -> throughput / (GPUs x the best 1-GPU throughput at the same batch size)."""
    base: dict[Any, float] = {}
    for r in records:
        if r.ok and r.gpus == 1:
            k = _base_key(r.config)
            base[k] = max(base.get(k, 0.0), r.throughput)
    out: dict[int, float | None] = {}
    for r in records:
        b = base.get(_base_key(r.config))
        out[r.trial] = round(r.throughput / (r.gpus * b), 3) if r.ok and b else None
    return out


def recommend_for_goal(records: list[TrialRecord], goal: Goal) -> tuple[TrialRecord | None, str]:
    """The cheapest configuration that finishes ``goal.samples`` in ``goal.hours``."""
    done = [r for r in records if r.ok]
    if not done:
        return None, "no configuration completed with a throughput"
    fits = [r for r in done if hours_for(r, goal) <= goal.hours]
    by = f"{goal.samples:,} samples by {goal.deadline or f'{goal.hours:.1f} h from now'}"
    if not fits:
        fastest = max(done, key=lambda r: (r.throughput, -r.gpus, -r.trial))
        return None, (f"no configuration finishes {by} ({goal.hours:.1f} h left): the fastest, trial "
                      f"{fastest.trial} ({fastest.label()}), needs {hours_for(fastest, goal):.1f} h")
    priced = [r for r in fits if cost_for(r, goal) is not None]
    if priced:
        best = min(priced, key=lambda r: (cost_for(r, goal), hours_for(r, goal), r.trial))
        why = (f"cheapest configuration that finishes {by}: {hours_for(best, goal):.1f} h on {best.gpus} GPU(s), "
               f"{cost_for(best, goal)} at {best.rate}/GPU-hour")
    else:
        best = min(fits, key=lambda r: (hours_for(r, goal) * r.gpus, hours_for(r, goal), r.trial))
        why = (f"no price known: fewest GPU-hours that finish {by}: {hours_for(best, goal):.1f} h on "
               f"{best.gpus} GPU(s) = {hours_for(best, goal) * best.gpus:.1f} GPU-hours")
    others = len(fits) - 1
    return best, why + (f" ({others} other configuration(s) also finish in time)" if others else "")


def recommend(records: list[TrialRecord], goal: Goal | None = None) -> tuple[TrialRecord | None, str]:
    if goal is not None:
        return recommend_for_goal(records, goal)
    done = [r for r in records if r.ok]
    if not done:
        return None, "no configuration completed with a throughput"
    priced = [r for r in done if cost_per_million(r) is not None]
    best_thr = max(r.throughput for r in done)
    if priced:
        best = min(priced, key=lambda r: (cost_per_million(r), -r.throughput, r.trial))
        why = (f"lowest cost per million samples ({cost_per_million(best)} at {best.rate}/GPU-hour), "
               f"{best.throughput:.0f} samples/s = {100 * best.throughput / best_thr:.0f}% of the fastest")
    else:
        best = max(done, key=lambda r: (r.throughput / r.gpus, r.throughput, -r.trial))
        why = f"no price known: highest throughput per GPU ({best.throughput / best.gpus:.0f} samples/s/GPU)"
    eff = scaling(records).get(best.trial)
    if eff is not None and best.gpus > 1:
        why += f", scaling efficiency {eff:.2f}"
    if best.util_percent is not None:
        why += f", GPU utilisation {best.util_percent:.0f}%"
    return best, why


def _same_but(r: TrialRecord, records: list[TrialRecord], axis: str) -> list[TrialRecord]:
    return [o for o in records if o.ok and o is not r and all(o.config.get(k) == v for k, v in r.config.items()
                                                            if k != axis)]


def bottlenecks(records: list[TrialRecord]) -> list[dict[str, Any]]:
    """Where throughput stops rising while utilisation is low: which resource, and why."""
    eff = scaling(records)
    out = []
    for r in records:
        if not r.ok or (r.util_percent is not None and r.util_percent >= LOW_UTIL):
            continue
        util = f"GPU utilisation {r.util_percent:.0f}%" if r.util_percent is not None else "GPU utilisation unknown"
        guess, why = None, ""
        if r.config.get("placement") == "spread":
            twin = next((o for o in _same_but(r, records, "placement") if o.config.get("placement") == "one-leaf"), None)
            if twin and twin.throughput > r.throughput * 1.05:
                guess = "communication"
                why = (f"spread across leaves gives {r.throughput:.0f} samples/s, one leaf {twin.throughput:.0f} "
                       f"({100 * (1 - r.throughput / twin.throughput):.0f}% lost to the inter-leaf all-reduce)")
        if guess is None and r.gpus > 1 and eff.get(r.trial) is not None and eff[r.trial] < POOR_SCALING:
            guess = "CPU" if (r.cpu_percent or 0) >= HIGH_CPU else "communication"
            why = (f"scaling efficiency {eff[r.trial]:.2f} from 1 to {r.gpus} GPUs"
                   + (f", CPUs {r.cpu_percent:.0f}% busy" if guess == "CPU" else ""))
        if guess is None:
            smaller = sorted((o for o in _same_but(r, records, "batch_size")
                              if o.config.get("batch_size", 1) < r.config.get("batch_size", 1)),
                             key=lambda o: -o.config.get("batch_size", 1))
            if smaller and r.throughput < smaller[0].throughput * PLATEAU:
                # idle GPUs point at the input pipeline only when the GPUs are known to be idle
                guess = ("CPU" if (r.cpu_percent or 0) >= HIGH_CPU else
                         "input" if r.util_percent is not None else "unknown")
                why = (f"raising the batch from {smaller[0].config['batch_size']} gives {r.throughput:.0f} samples/s "
                       f"vs {smaller[0].throughput:.0f}" + (
                           f", CPUs {r.cpu_percent:.0f}% busy" if guess == "CPU" else
                           ": the input pipeline does not keep up" if guess == "input" else
                           ": a plateau, but with no GPU utilisation figure its cause is not known"))
        if guess is not None:
            out.append({"trial": r.trial, "config": r.label(), "bottleneck": guess, "why": f"{why}; {util}"})
    return out


@dataclass
class SprintResult:
    name: str
    metric: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] | None = None
    reason: str = ""
    bottlenecks: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sweep_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "metric": self.metric, "sweep_id": self.sweep_id, "rows": self.rows,
                "recommended": self.best, "reason": self.reason, "bottlenecks": self.bottlenecks,
                "notes": self.notes}


def analyse(name: str, metric: str, records: list[TrialRecord], goal: Goal | None = None) -> SprintResult:
    eff = scaling(records)
    rows = []
    for r in records:
        cpm = cost_per_million(r)
        goal_figs = {}
        if goal is not None:
            h, c = hours_for(r, goal), cost_for(r, goal)
            goal_figs = {"hours_for_goal": None if h is None else round(h, 2),
                         "cost_for_goal": None if c is None else float(c),
                         "finishes_in_time": None if h is None else h <= goal.hours}
        rows.append({"trial": r.trial, **r.config, "gpus": r.gpus, "state": r.state, "job_id": r.job_id,
                     "throughput": None if r.throughput is None else round(r.throughput, 3),
                     "throughput_low": None if r.spread is None else round(r.spread[0], 3),
                     "throughput_high": None if r.spread is None else round(r.spread[1], 3),
                     "reports": r.reports, **goal_figs,
                     "usd_per_million": None if cpm is None else float(cpm),
                     "scaling_efficiency": eff.get(r.trial),
                     "gpu_util_percent": None if r.util_percent is None else round(r.util_percent, 1),
                     "util_source": r.util_source,
                     "cpu_percent": None if r.cpu_percent is None else round(r.cpu_percent, 1),
                     "rate_per_gpu_hour": None if r.rate is None else float(r.rate)})
    best, reason = recommend(records, goal)
    return SprintResult(name, metric, rows, next((row for row in rows if best and row["trial"] == best.trial), None),
                        reason, bottlenecks(records))

"""Sprint files: a validated :class:`SprintSpec` (pydantic, frozen), and its sweep.

A sprint file (YAML)::

    name: toy
    command: python examples/sprints/toy_train.py --batch-size {batch_size} --gpus-per-node {gpus_per_node}
             --nodes {nodes} --placement {placement}
    axes:
      batch_size: [32, 64, 128]
      gpus_per_node: [1, 4]
      nodes: [1, 2]
      placement: [one-leaf, spread]
    gpu_type: h100                  # the price comes from the ledger's price book
    prices: {h100: 2.50}            # per GPU-hour, used only when the ledger has no price for gpu_type
    metric: samples_per_s           # what the command reports with gpuhpc.report(samples_per_s=...)
    budget: {trials: 24, gpu_hours: 10, cost: 25}
    resources: {partition: gpu, time: 2m}   # every trial's job (a sweep file's resources)
    template: single                # how a trial starts (default single: one process)
    multi_node_template: torchrun   # ... and a multi-node configuration when template is single (default)
    goal: {samples: 2000000000, deadline: 48h}   # the question: the cheapest configuration that
                                    # finishes N samples by the deadline (a duration from now, or
                                    # an ISO 8601 time with its zone: 2026-12-05T18:00+01:00)
    warmup: 1                       # reports at each trial's start left out of its throughput

Each axis is a grid parameter of the sweep. ``batch_size`` reaches the command as
``{batch_size}``; GPUs per node, nodes and placement are each configuration's own Slurm request
(:mod:`gpuhpc.sprints.shapes`, the sweep's per-trial ``resources_by``), and may appear as
placeholders too. ``request: false`` keeps the old way: one ``resources`` for every trial, the
axes reach only the command (which simulates that shape). Every bad field raises
:class:`UserInputError` (exit 2) naming it.
"""
from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from gpuhpc.errors import UserInputError
from gpuhpc.sprints.analysis import Goal

AXES = ("batch_size", "gpus_per_node", "nodes", "placement")
PLACEMENTS = ("one-leaf", "spread", "one-nvlink")


class Axes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    batch_size: tuple[int, ...] = (1,)
    gpus_per_node: tuple[int, ...] = (1,)
    nodes: tuple[int, ...] = (1,)
    placement: tuple[Literal["one-leaf", "spread", "one-nvlink"], ...] = ("one-leaf",)

    @field_validator("batch_size", "gpus_per_node", "nodes", "placement", mode="before")
    @classmethod
    def _a_list(cls, v: Any, info: ValidationInfo) -> Any:
        """One value is a list of one; a count is a whole number (YAML's ``true`` or ``"x"`` is
        no number of GPUs or nodes: refused, not read as 1 or parsed)."""
        v = v if isinstance(v, (list, tuple, dict, set)) else [v]
        if info.field_name != "placement":
            for x in v if isinstance(v, (list, tuple)) else ():
                if isinstance(x, bool) or not isinstance(x, int):
                    raise ValueError(f"{x!r} is not a whole number >= 1")
        return v

    @field_validator("batch_size", "gpus_per_node", "nodes")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("needs at least one value")
        if any(x < 1 for x in v):
            raise ValueError(f"{min(v)} is not a whole number >= 1")
        if len(set(v)) != len(v):
            raise ValueError("values repeat")
        return v


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int = Field(100, ge=1, le=1000)
    gpu_hours: float | None = Field(None, gt=0)    # the configurations' GPUs x the trial time limit
    cost: Decimal | None = Field(None, gt=0)       # the same, priced


class GoalSpec(BaseModel):
    """``goal:``: N samples by a deadline."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: int = Field(gt=0)
    deadline: str = Field(min_length=1, max_length=64)

    @field_validator("samples", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not a whole number of samples >= 1")
        return v


class SprintSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    command: str = Field(min_length=1)
    axes: Axes = Axes()
    gpu_type: str = Field("h100", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    prices: dict[str, Decimal] = {}
    metric: str = Field("samples_per_s", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    budget: Budget = Budget()
    resources: dict[str, Any] = {"partition": "cpu", "time": "5m"}
    parallelism: int = Field(16, ge=1)
    request: bool = True            # GPUs per node / nodes / placement as real Slurm requests
    template: Literal["single", "torchrun", "deepspeed", "mpi"] = "single"
    multi_node_template: Literal["torchrun", "deepspeed", "mpi"] = "torchrun"
    goal: GoalSpec | None = None
    warmup: int = Field(1, ge=0, le=1000)   # reports left out at each trial's start

    @field_validator("prices")
    @classmethod
    def _prices(cls, v: dict[str, Decimal]) -> dict[str, Decimal]:
        if any(p < 0 for p in v.values()):
            raise ValueError("a price is >= 0")
        return v

    @model_validator(mode="after")
    def _fits_budget(self) -> "SprintSpec":
        n = len(self.configurations())
        if n > self.budget.trials:
            raise ValueError(f"budget.trials: the axes make {n} configurations, the budget allows "
                             f"{self.budget.trials}")
        return self

    @property
    def folds_layout(self) -> bool:
        """One node has no placement: with real requests and neither ``{nodes}`` nor
        ``{placement}`` in the command, nodes and placement are one sweep parameter ``layout``
        (``1n``, ``2n-one-leaf``, ``2n-spread``) without the one-node repeats."""
        return (self.request and len(self.axes.placement) > 1 and 1 in self.axes.nodes
                and "{nodes}" not in self.command and "{placement}" not in self.command)

    def configurations(self) -> list[dict[str, Any]]:
        import itertools

        names = [a for a in AXES if getattr(self.axes, a)]
        out = [dict(zip(names, combo)) for combo in itertools.product(*(getattr(self.axes, a) for a in names))]
        if self.folds_layout:
            out = [c for c in out if c["nodes"] > 1 or c["placement"] == self.axes.placement[0]]
        return out

    def params_of(self, config: dict[str, Any]) -> dict[str, Any]:
        """A configuration's sweep parameters (:meth:`sweep_mapping`)."""
        out = {a: config[a] for a in self.sweep_axes()}
        if self.folds_layout:
            out[LAYOUT] = layout_of(config)
        return out

    def config_of(self, params: dict[str, Any]) -> dict[str, Any]:
        """A trial's configuration from its sweep parameters (axes with one value filled in)."""
        out = {a: vals[0] for a, vals in self.axes.model_dump().items()}
        out.update({k: v for k, v in params.items() if k in out})
        if LAYOUT in params:
            n, _, placement = str(params[LAYOUT]).partition("n")
            out["nodes"], out["placement"] = int(n), placement.lstrip("-") or self.axes.placement[0]
        return out

    def trial_seconds(self) -> int:
        from gpuhpc.jobs.spec import parse_duration

        return parse_duration(self.resources.get("time", "5m"), "resources.time")

    def worst_gpu_hours(self) -> float:
        """Every configuration's GPUs for the whole trial time limit."""
        return sum(c["nodes"] * c["gpus_per_node"] for c in self.configurations()) * self.trial_seconds() / 3600

    def swept_axes(self) -> list[str]:
        """The axes that are sweep parameters: those with several values, and any in ``command``."""
        return [a for a in AXES if "{" + a + "}" in self.command or len(getattr(self.axes, a)) > 1]

    def sweep_axes(self) -> list[str]:
        """The axes that are sweep parameters of their own (not folded into ``layout``)."""
        axes = self.swept_axes() if self.request else [a for a in AXES if "{" + a + "}" in self.command]
        return [a for a in axes if not (self.folds_layout and a in ("nodes", "placement"))]

    def template_for(self, nodes: int) -> str:
        """How a configuration of ``nodes`` nodes starts (``single`` runs on one node only)."""
        return self.multi_node_template if nodes > 1 and self.template == "single" else self.template

    def sweep_mapping(self, rules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """The sweep file this sprint runs as: a grid over the axes, maximising the metric;
        ``rules``: each configuration's own resources (:func:`gpuhpc.sprints.shapes.resource_rules`)."""
        params: dict[str, Any] = {a: {"values": list(getattr(self.axes, a))} for a in self.sweep_axes()}
        if self.folds_layout:
            params[LAYOUT] = {"values": list(dict.fromkeys(layout_of(c) for c in self.configurations()))}
        out = {"name": f"sprint-{self.name}", "command": self.command, "parameters": params, "method": "grid",
               "parallelism": self.parallelism, "resources": dict(self.resources), "template": self.template,
               "metric": {"name": self.metric, "goal": "maximize"}, "max_requeues": 1,
               "grace": min(60, max(1, self.trial_seconds() // 2))}    # the file has no grace: a 1m trial runs
        if rules:
            out["resources_by"] = rules
        return out


LAYOUT = "layout"

# the fix for a bad axis value, in the error's one line
AXIS_HINTS = {
    "batch_size": "a list of whole numbers >= 1, e.g. axes.batch_size: [32, 64]",
    "gpus_per_node": "a list of GPU counts >= 1 that a node holds, e.g. axes.gpus_per_node: [1, 2]",
    "nodes": "a list of node counts >= 1, e.g. axes.nodes: [1, 2]",
    "placement": "a list of one-leaf, spread, one-nvlink, e.g. axes.placement: [one-leaf, spread]",
}


def layout_of(config: dict[str, Any]) -> str:
    """``1n`` (one node: no placement), ``2n-one-leaf``, ``2n-spread``..."""
    return f"{config['nodes']}n" if config["nodes"] == 1 else f"{config['nodes']}n-{config['placement']}"


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def from_mapping(data: Any, source: str = "sprint file") -> SprintSpec:
    """Validate ``data`` (exit 2 naming the first bad field)."""
    if not isinstance(data, dict):
        raise UserInputError(f"{source} must be a YAML mapping", field="FILE", hint="see examples/sprints/toy.yaml")
    try:
        spec = SprintSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        field = _loc(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        if msg.startswith("budget.trials:"):
            field, msg = "budget.trials", msg.removeprefix("budget.trials: ")
        axis = field.split(".")[1].split("[")[0] if field.startswith("axes.") else ""
        raise UserInputError(msg, field=field or None, hint=AXIS_HINTS.get(axis, "see docs/sprints.md")) from None
    needs = ["batch_size"] if spec.request else list(AXES)        # the others are each trial's own request
    missing = [a for a in needs if len(getattr(spec.axes, a)) > 1 and "{" + a + "}" not in spec.command]
    if missing:
        raise UserInputError(f"axis {missing[0]} has several values but no {{{missing[0]}}} in command",
                             field=f"axes.{missing[0]}", hint=f"pass it to the program: --x {{{missing[0]}}}")
    if spec.request:        # what the axes ask for per configuration is not also a fixed resource
        multi = any(n > 1 for n in spec.axes.nodes)
        for key, fix in (("gpus", "put the counts in axes.gpus_per_node"), ("nodes", "put the counts in axes.nodes"),
                         *((k, "drop it: axes.placement picks each multi-node trial's nodes")
                           for k in ("nodelist", "switches") if multi)):
            if key in spec.resources:
                raise UserInputError("each configuration's own request sets it (request: true), so it would be "
                                     "overridden", field=f"resources.{key}", hint=f"{fix}, or request: false")
    if spec.request and "one-nvlink" in spec.axes.placement and spec.resources.get("constraint"):
        raise UserInputError("placement one-nvlink sets each multi-node trial's constraint ([nvl-a|nvl-b...])",
                             field="resources.constraint", hint="drop resources.constraint, or one-nvlink")
    goal_of(spec)                   # a deadline that is no time, or one in the past: exit 2 now
    if spec.budget.gpu_hours is not None and spec.worst_gpu_hours() > spec.budget.gpu_hours + 1e-9:
        raise UserInputError(f"the configurations may use {spec.worst_gpu_hours():.2f} GPU-hours (their GPUs x the "
                             f"trial time limit), the budget is {spec.budget.gpu_hours}", field="budget.gpu_hours",
                             hint="fewer axes values or a shorter resources.time")
    return spec


def goal_of(spec: SprintSpec, now: Any = None) -> Goal | None:
    """The sprint's goal with the hours left: ``goal.deadline`` is a duration from ``now`` (``48h``,
    ``2d``, Slurm's ``2-00:00:00``) or an ISO 8601 time with its zone. Exit 2 naming the field for
    a time without a zone, one in the past, or neither."""
    import datetime as dt

    from gpuhpc.jobs.spec import parse_duration

    if spec.goal is None:
        return None
    text = spec.goal.deadline.strip()
    now = now or dt.datetime.now(dt.timezone.utc)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        when = None
    if when is not None:
        if when.tzinfo is None:
            raise UserInputError(f"{text!r} has no time zone", field="goal.deadline",
                                 hint="add one, e.g. 2026-12-05T18:00+01:00 or ...Z, or write a duration: 48h")
        hours = (when - now).total_seconds() / 3600
        if hours <= 0:
            raise UserInputError(f"{text} is in the past", field="goal.deadline", hint="a later time, or a duration: 48h")
    else:
        hours = parse_duration(text, "goal.deadline") / 3600
    return Goal(spec.goal.samples, hours, text)


def load_file(path: str) -> SprintSpec:
    from gpuhpc.sweeps.spec import read_yaml

    return from_mapping(read_yaml(path), path)


def check_cost(spec: SprintSpec, rate: Decimal | None) -> None:
    """``budget.cost`` against the worst case at ``rate`` per GPU-hour (exit 2 when over)."""
    if spec.budget.cost is None or rate is None:
        return
    worst = Decimal(str(math.ceil(spec.worst_gpu_hours() * 1e6) / 1e6)) * rate
    if worst > spec.budget.cost:
        raise UserInputError(f"the configurations may cost {worst:.2f} (their GPUs x the trial time limit at "
                             f"{rate}/GPU-hour), the budget is {spec.budget.cost}", field="budget.cost",
                             hint="fewer axes values or a shorter resources.time")

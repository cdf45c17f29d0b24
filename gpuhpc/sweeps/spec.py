"""Sweep files: a typed, frozen, validated :class:`SweepSpec`, the search space and the trials.

A sweep file (YAML)::

    name: lr-search
    command: python train.py --lr {lr} --layers {layers} --opt {opt}
    parameters:
      lr:     {type: loguniform, low: 1.0e-5, high: 1.0e-1}
      layers: {type: int, low: 2, high: 12}
      opt:    {values: [adam, sgd]}
    method: random            # grid | random (seeded) | tpe (needs the optuna extra)
    seed: 7
    trials: 200
    parallelism: 16
    resources: {gpus: 1, gpu_type: 1g.10gb, partition: mig, time: 30m}   # a job file's keys
    metric: {name: loss, goal: minimize}
    max_requeues: 5
    pruner: {type: median, warmup_steps: 5, min_trials: 5}   # none (default) | median | asha | hyperband
    fail_fast: 10             # stop the sweep after 10 failed trials
    modules: [cuda/12.4]      # setup, modules, conda | venv, sbatch_args: as in a job file, for every trial
    venv: ~/envs/train

``command`` is a shell command line: each ``{param}`` is replaced by the trial's value,
``shlex.quote``d, so a value only ever reaches the program as one literal argument. ``{{``
and ``}}`` are literal braces. Every bad field raises :class:`UserInputError` (exit 2) naming
its path (``parameters.lr.low``); nothing is submitted.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import Resources, check_text

METHODS = ("grid", "random", "tpe")
PARAM_TYPES = ("uniform", "loguniform", "int", "values")
GOALS = ("minimize", "maximize")
TEMPLATES = ("single", "torchrun", "deepspeed", "mpi")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Value = str | int | float | bool


# Stdlib dataclasses, not pydantic, like gpuhpc.jobs.spec: `gpuhpc sweep run` and gpuhpc.sweep()
# are measured against raw sbatch and submitit, and pydantic's import and model building cost
# more than the sweep's own database work. Types are checked here, each error naming its field.
def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num(v: Any, field_name: str) -> float:
    if isinstance(v, str):          # YAML 1.1 reads 1e-5 (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            pass
    if not _is_num(v):
        raise UserInputError(f"expected a number, got {v!r}", field=field_name)
    return float(v)


def _int(v: Any, field_name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise UserInputError(f"expected an integer, got {v!r}", field=field_name)
    return v


def _str(v: Any, field_name: str) -> str:
    if not isinstance(v, str):
        raise UserInputError(f"expected a string, got {type(v).__name__}", field=field_name)
    return v


def _choice(v: Any, field_name: str, choices: Sequence[str]) -> str:
    if v not in choices:
        raise UserInputError(f"{v!r} is not one of {', '.join(choices)}", field=field_name)
    return v


def _mapping(v: Any, field_name: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise UserInputError(f"expected a mapping, got {type(v).__name__}", field=field_name)
    return v


def _known(data: Mapping[str, Any], cls: type, prefix: str, also: Sequence[str] = ()) -> None:
    valid = [f.name for f in dataclasses.fields(cls)] + list(also)
    bad = [k for k in data if k not in valid]
    if bad:
        raise UserInputError(f"unknown field (valid: {', '.join(valid)})", field=f"{prefix}{bad[0]}")


@dataclass(frozen=True)
class Param:
    """One parameter: a range (``uniform``, ``loguniform``, ``int``) or a list of ``values``."""

    type: str | None = None
    low: float | None = None
    high: float | None = None
    values: tuple[Value, ...] | None = None

    @classmethod
    def from_mapping(cls, data: Any, f: str) -> "Param":
        if isinstance(data, (list, tuple)):          # shorthand: opt: [adam, sgd]
            data = {"values": list(data)}
        data = _mapping(data, f)
        _known(data, cls, f"{f}.")
        kind = data.get("type")
        if kind is not None:
            _choice(kind, f"{f}.type", PARAM_TYPES)
        low = None if data.get("low") is None else _num(data["low"], f"{f}.low")
        high = None if data.get("high") is None else _num(data["high"], f"{f}.high")
        values = data.get("values")
        if values is not None:
            if not isinstance(values, (list, tuple)):
                raise UserInputError("expected a list", field=f"{f}.values")
            for i, v in enumerate(values):
                if not isinstance(v, (str, int, float, bool)):
                    raise UserInputError(f"a value is a string, number or boolean, not {type(v).__name__}",
                                         field=f"{f}.values[{i}]")
            values = tuple(values)
        return cls(type=kind, low=low, high=high, values=values)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "low": self.low, "high": self.high,
                "values": None if self.values is None else list(self.values)}

    @property
    def kind(self) -> str:
        return self.type or ("values" if self.values is not None else "")

    def grid_values(self) -> list[Value]:
        if self.kind == "values":
            return list(self.values or ())
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1))      # type: ignore[arg-type]
        return []

    def sample(self, rng: random.Random) -> Value:
        k = self.kind
        if k == "values":
            return rng.choice(list(self.values or ()))
        if k == "int":
            return rng.randint(int(self.low), int(self.high))          # type: ignore[arg-type]
        if k == "loguniform":
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))  # type: ignore[arg-type]
        return rng.uniform(self.low, self.high)                         # type: ignore[arg-type]


@dataclass(frozen=True)
class Metric:
    name: str
    goal: str = "minimize"


#: the default cap on a sweep's trials: a grid that multiplies out past it is refused (exit 2)
#: unless the file raises ``max_trials`` on purpose
MAX_TRIALS = 10_000


def _grid_len(p: "Param") -> int:
    if p.kind == "int":
        return int(p.high) - int(p.low) + 1          # type: ignore[arg-type]
    return len(p.values or ()) if p.kind == "values" else 0


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep (build it with :meth:`from_mapping` or :func:`load_file`)."""

    name: str
    parameters: dict[str, Param]
    metric: Metric
    command: str | None = None            # None: a Python-callable sweep (gpuhpc.sweep)
    method: str = "random"
    seed: int = 0
    trials: int | None = None
    parallelism: int = 16
    resources: dict[str, Any] = field(default_factory=dict)
    max_requeues: int = 5
    grace: int | str = 60
    template: str = "single"
    env: dict[str, str] = field(default_factory=dict)
    workdir: str | None = None
    chunk_size: int | None = None         # at most MaxArraySize; smaller forces more chunks
    max_queued: int | None = None         # trials queued at once (else from the cluster's limits)
    driver_partition: str | None = None   # the sweep driver's partition (default: cpu, when it exists)
    hold: bool = False                    # submit the arrays held (scontrol release them)
    after: tuple[str, ...] = ()           # job ids: the first arrays and the driver start once they COMPLETED
    max_trials: int = MAX_TRIALS          # a larger sweep is refused unless raised here on purpose
    # per-trial resources: [{when: {param: value, ...}, resources: {...}, template: T}, ...]; a
    # trial's job is ``resources`` updated by every rule whose ``when`` its parameters match, in
    # order (:meth:`resources_for`; the last matching ``template`` wins); trials of one shape share
    # an array (gpuhpc sprint uses it)
    resources_by: tuple[dict[str, Any], ...] = ()
    # early stopping (gpuhpc.sweeps.pruners): the pruner's fields with their defaults, None: none
    pruner: dict[str, Any] | None = None
    fail_fast: int | None = None          # stop the sweep (failed) after this many failed trials
    # every trial's environment setup on every node, as a job file's (gpuhpc.jobs.spec.setup_script_lines:
    # modules, then conda or venv, then the setup lines); sbatch_args go into resources.extra
    setup: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    conda: str | None = None
    venv: str | None = None

    # ------------------------------------------------------------ derived
    @property
    def res(self) -> Resources:
        return Resources.from_mapping(self.resources)

    def resources_for(self, params: Mapping[str, Value]) -> dict[str, Any]:
        """The resources (a job file's keys) of the trial with these parameters."""
        out = dict(self.resources)
        for rule in self.resources_by:
            if all(p in params and format_value(params[p]) == format_value(v) for p, v in rule["when"].items()):
                out.update(rule["resources"])
        return out

    def template_for(self, params: Mapping[str, Value]) -> str:
        """The job template of the trial with these parameters (``resources_by``, else ``template``)."""
        out = self.template
        for rule in self.resources_by:
            if rule.get("template") and all(p in params and format_value(params[p]) == format_value(v)
                                            for p, v in rule["when"].items()):
                out = rule["template"]
        return out

    @property
    def n_trials(self) -> int:
        if self.trials is not None:
            return self.trials
        return math.prod(_grid_len(p) for p in self.parameters.values())

    def _grid(self):
        names = list(self.parameters)
        return itertools.product(*(self.parameters[n].grid_values() for n in names))

    def placeholders(self) -> list[str]:
        return placeholders(self.command or "")

    def generate(self, start: int = 0, count: int | None = None) -> list[dict[str, Value]]:
        """Parameters of trials ``start .. start+count-1`` (grid or seeded random); the same
        sweep always gives the same list. tpe trials are asked for by the driver instead."""
        n = self.n_trials
        count = n - start if count is None else min(count, n - start)
        names = list(self.parameters)
        if self.method == "grid":
            combos = itertools.islice(self._grid(), start, start + count)
            return [dict(zip(names, c)) for c in combos]
        out = []
        for i in range(start, start + count):
            rng = random.Random(f"{self.seed}:{i}")      # trial i's values do not depend on the others
            out.append({name: self.parameters[name].sample(rng) for name in names})
        return out

    def render_command(self, params: Mapping[str, Value]) -> str:
        """``command`` with every ``{param}`` replaced by its shell-quoted value."""
        return render_command(self.command or "", params)

    # ------------------------------------------------------------ building
    @classmethod
    def from_mapping(cls, data: Any, *, python: bool = False, check: bool = True) -> "SweepSpec":
        """Validate a sweep file's mapping; raises UserInputError naming the field. ``check=False``
        only rebuilds a spec this module wrote (:func:`spec_from_json`)."""
        if not isinstance(data, Mapping):
            raise UserInputError("a sweep file must be a mapping", field="<sweep file>")
        _known(data, cls, "", also=("sbatch_args",))
        for req in ("name", "parameters", "metric"):
            if data.get(req) is None:
                raise UserInputError("missing", field=req)
        d = dict(data)
        params = _mapping(d.pop("parameters"), "parameters")
        metric = _mapping(d.pop("metric"), "metric")
        _known(metric, Metric, "metric.")
        if "name" not in metric:
            raise UserInputError("missing", field="metric.name")
        m = Metric(name=_str(metric["name"], "metric.name"),
                   goal=_choice(metric.get("goal", "minimize"), "metric.goal", GOALS))
        kw: dict[str, Any] = {"name": _str(d.pop("name"), "name"), "metric": m,
                              "parameters": {str(k): Param.from_mapping(v, f"parameters.{k}") for k, v in params.items()}}
        sbatch_args = d.pop("sbatch_args", None)
        for k, v in d.items():
            if v is None:
                continue
            if k in ("setup", "modules", "conda", "venv"):
                kw[k] = _environment_setup(k, v)
            elif k in ("command", "workdir", "driver_partition"):
                kw[k] = _str(v, k)
            elif k == "method":
                kw[k] = _choice(v, k, METHODS)
            elif k == "template":
                kw[k] = _choice(v, k, TEMPLATES)
            elif k in ("seed", "trials", "parallelism", "max_requeues", "chunk_size", "max_queued", "max_trials",
                       "fail_fast"):
                kw[k] = _int(v, k)
            elif k == "pruner":
                from gpuhpc.sweeps import pruners

                kw[k] = pruners.parse(v, k) if check else dict(v)
            elif k == "grace":
                kw[k] = v if isinstance(v, str) else _int(v, k)
            elif k == "after":
                from gpuhpc.jobs.spec import after_ids

                kw[k] = after_ids(v, "after")
            elif k == "hold":
                if not isinstance(v, bool):
                    raise UserInputError("expected true/false", field=k)
                kw[k] = v
            elif k == "resources":
                kw[k] = dict(_mapping(v, k))
            elif k == "resources_by":
                kw[k] = _resource_rules(v)
            elif k == "env":
                kw[k] = {str(ek): (str(ev) if _is_num(ev) else _str(ev, f"env.{ek}"))
                         for ek, ev in _mapping(v, k).items()}
        if sbatch_args is not None:              # named as in a job file: resources.extra
            from gpuhpc.jobs.spec import check_sbatch_args

            res = dict(kw.get("resources", {}))
            res["extra"] = [*check_sbatch_args(res.get("extra") or (), "resources.extra"),
                            *check_sbatch_args(sbatch_args, "sbatch_args")]
            kw["resources"] = res
        if kw.get("conda") is not None and kw.get("venv") is not None:
            raise UserInputError("conda and venv both given", field="venv", hint="activate one environment")
        spec = cls(**kw)
        if check:
            spec._check(python=python)
        return spec

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["parameters"] = {k: p.to_dict() for k, p in self.parameters.items()}
        out["metric"] = {"name": self.metric.name, "goal": self.metric.goal}
        out["resources_by"] = [dict(r) for r in self.resources_by]
        return out

    def _check(self, *, python: bool) -> None:
        """Every field, one section at a time, in the order the file reads (the first error wins)."""
        self._check_name()
        self._check_parameters()
        self._check_command(python=python)
        self._check_trials()
        self._check_limits()
        self._check_resources()
        self._check_env()

    def _check_name(self) -> None:
        """``name``: a sweep name (letters, digits, . _ -)."""
        if not _NAME_RE.match(self.name):
            raise UserInputError(f"{self.name!r} is not a valid sweep name", field="name",
                                 hint="letters, digits, . _ - (at most 100)")

    def _check_parameters(self) -> None:
        """``parameters``: at least one, each checked by :meth:`_check_parameter`."""
        if not self.parameters:
            raise UserInputError("no parameters", field="parameters")
        for pname, p in self.parameters.items():
            self._check_parameter(pname, p)

    def _check_parameter(self, pname: str, p: Param) -> None:
        """One parameter: a list of values, or a type with a finite, non-empty range (a grid needs
        values or int)."""
        f = f"parameters.{pname}"
        if not _PARAM_RE.match(pname):
            raise UserInputError("a parameter name must be an identifier", field=f)
        kind = p.kind
        if kind == "values" or p.values is not None:
            if p.type not in (None, "values"):
                raise UserInputError(f"a {p.type} parameter takes low and high, not values", field=f"{f}.values")
            if not p.values:
                raise UserInputError("empty list of values", field=f"{f}.values")
            if p.low is not None or p.high is not None:
                raise UserInputError("values and low/high are exclusive", field=f"{f}.low")
            for i, v in enumerate(p.values):
                if isinstance(v, float) and not math.isfinite(v):
                    raise UserInputError("not a finite number", field=f"{f}.values[{i}]")
                if isinstance(v, str) and "\x00" in v:
                    raise UserInputError("NUL is not allowed", field=f"{f}.values[{i}]")
            return
        if not kind:
            raise UserInputError("give a type (uniform, loguniform, int) with low and high, or values",
                                 field=f"{f}.type")
        for side in ("low", "high"):
            v = getattr(p, side)
            if v is None:
                raise UserInputError(f"a {kind} parameter needs {side}", field=f"{f}.{side}")
            if not math.isfinite(v):
                raise UserInputError("not a finite number", field=f"{f}.{side}")
        if p.low > p.high:                          # type: ignore[operator]
            raise UserInputError(f"low ({p.low:g}) > high ({p.high:g})", field=f"{f}.low")
        if kind in ("uniform", "loguniform") and p.low == p.high:
            raise UserInputError(f"empty range [{p.low:g}, {p.high:g}]", field=f"{f}.high")
        if kind == "loguniform" and p.low <= 0:     # type: ignore[operator]
            raise UserInputError("a loguniform range must be positive", field=f"{f}.low")
        if kind == "int":
            for side in ("low", "high"):
                if float(getattr(p, side)) != int(getattr(p, side)):
                    raise UserInputError("an int parameter needs whole numbers", field=f"{f}.{side}")
        if self.method == "grid" and kind != "int":
            raise UserInputError(f"a grid needs values for every parameter; {kind} has none",
                                 field=f"{f}.values", hint="list values, or use method: random")

    def _check_command(self, *, python: bool) -> None:
        """``command``: none in a Python sweep; else text whose placeholders name parameters, none
        where a text value would run as shell code."""
        if python:
            if self.command is not None:
                raise UserInputError("a Python sweep has no command", field="command")
        else:
            if self.command is None:
                raise UserInputError("missing command", field="command")
            check_text(self.command, "command", allow_empty=False)
            for ph in self.placeholders():
                if ph not in self.parameters:
                    raise UserInputError(f"placeholder {{{ph}}} has no parameter of that name", field="command",
                                         hint=f"parameters: {', '.join(self.parameters)}")
            for ph, context in quoting_contexts(self.command):
                p = self.parameters[ph]
                numeric = p.values is None or all(_is_num(v) and not isinstance(v, bool) for v in p.values)
                if context == "expansion" and not numeric:
                    raise UserInputError(f"placeholder {{{ph}}} is inside $(...), ${{...}} or backquotes, where "
                                         f"a text value would run as shell code", field="command",
                                         hint="move it out (e.g. v={" + ph + "}; ... \"$v\"), or use numbers only")

    def _check_trials(self) -> None:
        """``method``, ``trials`` and ``max_trials``: how many trials, and not more than the sweep allows."""
        if self.method == "tpe":
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise UserInputError("method tpe needs Optuna", field="method",
                                     hint="pip install 'gpuhpc[tpe]' (or optuna), or use random") from None
        if self.trials is not None and self.trials < 1:
            raise UserInputError("must be >= 1", field="trials")
        if self.method == "grid":
            size = math.prod(_grid_len(p) for p in self.parameters.values())
            if self.trials is not None and self.trials > size:
                raise UserInputError(f"the grid has {size} points, not {self.trials}", field="trials")
        elif self.trials is None:
            raise UserInputError(f"method {self.method} needs a number of trials", field="trials")
        if self.max_trials < 1:
            raise UserInputError("must be >= 1", field="max_trials")
        if self.n_trials > self.max_trials:
            what = "the grid multiplies out to" if self.method == "grid" and self.trials is None else "the sweep has"
            raise UserInputError(f"{what} {self.n_trials} trials, more than max_trials ({self.max_trials})",
                                 field="trials", hint=f"set max_trials: {self.n_trials} in the file if you mean it, "
                                                      "or fewer values / trials")

    def _check_limits(self) -> None:
        """``parallelism``, ``max_requeues``, ``chunk_size``, ``max_queued``, ``fail_fast`` and the
        metric's name."""
        if self.parallelism < 1:
            raise UserInputError(f"must be >= 1, got {self.parallelism}", field="parallelism")
        for name in ("max_requeues",):
            if getattr(self, name) < 0:
                raise UserInputError("must be >= 0", field=name)
        for name in ("chunk_size", "max_queued", "fail_fast"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserInputError("must be >= 1", field=name)
        if not _PARAM_RE.match(self.metric.name):
            raise UserInputError("a metric name must be an identifier", field="metric.name")

    def _check_resources(self) -> None:
        """``resources`` and ``resources_by``: the job file's checks, per rule; a Python sweep's
        image has its Python."""
        if "array" in self.resources:
            raise UserInputError("a sweep makes its own arrays", field="resources.array")
        Resources.from_mapping(self.resources)          # the job file's keys and checks
        for i, rule in enumerate(self.resources_by):
            f = f"resources_by[{i}]"
            for p, v in rule["when"].items():
                if p not in self.parameters:
                    raise UserInputError(f"{p!r} is not a parameter", field=f"{f}.when.{p}",
                                         hint=f"parameters: {', '.join(self.parameters)}")
            for key in ("array", "image"):
                if key in rule["resources"]:
                    raise UserInputError(f"{key} is not a per-trial resource", field=f"{f}.resources.{key}")
            try:
                Resources.from_mapping({**self.resources, **rule["resources"]}, prefix=f"{f}.resources.")
            except UserInputError as exc:       # a bad value: its field under this rule
                if not (exc.field or "").startswith("resources."):
                    raise
                raise UserInputError(exc.message.split(": ", 1)[-1], field=f"{f}.{exc.field}", hint=exc.hint) from None
        if self.command is None and self.res.image is not None and not self.res.image_python:
            import sys       # a Python sweep's trials unpickle and call the function with the image's python3

            v = sys.version_info
            raise UserInputError(f"cannot check that image {self.res.image} has Python {v.major}.{v.minor} with "
                                 "cloudpickle and gpuhpc, which a Python sweep's trials need inside it",
                                 field="resources.image_python", hint="declare it with image_python=True, or use a "
                                 "command sweep (docs/containers.md)")

    def _check_env(self) -> None:
        """``env`` values and the driver's partition."""
        for k, v in self.env.items():
            check_text(v, f"env.{k}")
        if self.driver_partition is not None:
            Resources(partition=self.driver_partition)

def _environment_setup(k: str, v: Any) -> Any:
    """``setup``, ``modules``, ``conda`` or ``venv``, checked as a job file's are."""
    from gpuhpc.jobs import spec as job_spec

    if k == "setup":
        return job_spec.check_setup(v, k)
    if k == "modules":
        return job_spec.check_modules(v, k)
    return job_spec.check_env_path(v, k)


def _resource_rules(v: Any) -> tuple[dict[str, Any], ...]:
    """``resources_by``: a list of ``{when: {param: value}, resources: {...}}``."""
    if not isinstance(v, (list, tuple)):
        raise UserInputError("expected a list of {when: {...}, resources: {...}}", field="resources_by")
    out = []
    for i, rule in enumerate(v):
        f = f"resources_by[{i}]"
        rule = _mapping(rule, f)
        bad = [k for k in rule if k not in ("when", "resources", "template")]
        if bad:
            raise UserInputError("unknown field (valid: when, resources, template)", field=f"{f}.{bad[0]}")
        when = dict(_mapping(rule.get("when", {}), f"{f}.when"))
        res = dict(_mapping(rule.get("resources", {}), f"{f}.resources"))
        out.append({"when": when, "resources": res})
        if rule.get("template") is not None:
            out[-1]["template"] = _choice(rule["template"], f"{f}.template", TEMPLATES)
    return tuple(out)


def placeholders(command: str) -> list[str]:
    """The ``{name}`` fields of a command (``{{``/``}}`` are literal braces)."""
    out = []
    try:
        parsed = list(string.Formatter().parse(command))
    except ValueError as exc:
        raise UserInputError(f"bad placeholder: {exc}", field="command", hint="write literal braces as {{ and }}") from None
    for _, field_name, spec, conv in parsed:
        if field_name is None:
            continue
        if not _PARAM_RE.match(field_name) or spec or conv:
            raise UserInputError(f"bad placeholder {{{field_name}}}", field="command",
                                 hint="{name} of a parameter; literal braces as {{ and }}")
        out.append(field_name)
    return out


def quoting_contexts(command: str) -> list[tuple[str, str]]:
    """Each placeholder of ``command`` with the shell context it sits in: ``plain``,
    ``double`` (inside "..."), ``single`` (inside '...') or ``expansion`` (inside ``$(...)``,
    ``$((...))``, ``${...}`` or backquotes, where a value would be parsed as shell code again)."""
    out: list[tuple[str, str]] = []
    stack = ["plain"]
    for literal, field_name, _, _ in string.Formatter().parse(command):
        i = 0
        while i < len(literal):
            ch, top = literal[i], stack[-1]
            if top == "single":
                if ch == "'":
                    stack.pop()
            elif ch == "\\":
                i += 1
            elif literal.startswith("$(", i) or literal.startswith("${", i):
                stack.append("cmd" if literal[i + 1] == "(" else "brace")
                i += 1
            elif ch == "`":
                if top == "tick":
                    stack.pop()
                else:
                    stack.append("tick")
            elif top == "double":
                if ch == '"':
                    stack.pop()
            elif top == "brace":
                if ch == "}":
                    stack.pop()
            elif ch == "'":
                stack.append("single")
            elif ch == '"':
                stack.append("double")
            elif ch == "(" and top == "cmd":
                stack.append("cmd")
            elif ch == ")" and top == "cmd":
                stack.pop()
            i += 1
        if field_name is not None:
            inner = any(c in ("cmd", "brace", "tick") for c in stack)
            out.append((field_name, "expansion" if inner else stack[-1]))
    return out


def _quote_in(text: str, context: str) -> str:
    """``text`` as one literal word in its shell context (see :func:`quoting_contexts`)."""
    if context == "double":             # inside "...": only \ $ ` " are special
        return "".join("\\" + c if c in '\\$`"' else c for c in text)
    if context == "single":             # inside '...': close, an escaped quote, reopen
        return text.replace("'", "'\\''")
    return shlex.quote(text)


def format_value(value: Value) -> str:
    """A parameter value as text: floats round-trip (repr), booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_command(command: str, params: Mapping[str, Value]) -> str:
    """``command`` with each placeholder replaced by its value as one literal word, quoted
    for where it stands: bare (``shlex.quote``), inside "..." or inside '...'. A placeholder
    inside ``$(...)``/backquotes takes only numbers (:meth:`SweepSpec._check`)."""
    contexts = iter(quoting_contexts(command))
    pieces = []
    for literal, field_name, _, _ in string.Formatter().parse(command):
        pieces.append(literal)
        if field_name is not None:
            pieces.append(_quote_in(format_value(params[field_name]), next(contexts)[1]))
    return "".join(pieces)


def read_yaml(path: str) -> Any:
    """The parsed YAML of a user's file (a sweep or sprint file); a missing, unreadable or
    malformed file is bad input naming FILE (exit 2)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            return yaml.safe_load(fh)
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file", field="FILE") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path}: cannot read: {exc}", field="FILE") from None
    except yaml.YAMLError as exc:
        raise UserInputError(f"{path}: not valid YAML: {' '.join(str(exc).split())}", field="FILE") from None


def load_file(path: str, *, overrides: Mapping[str, Any] | None = None) -> SweepSpec:
    """Read and validate a YAML sweep file (exit 2 on any problem)."""
    data = read_yaml(path)
    if isinstance(data, Mapping) and overrides:
        data = {**data, **overrides}
    return SweepSpec.from_mapping(data)


def spec_json(spec: SweepSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)


def spec_from_json(text: str) -> SweepSpec:
    return SweepSpec.from_mapping(json.loads(text), check=False)

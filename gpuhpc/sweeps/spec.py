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

``command`` is a shell command line: each ``{param}`` is replaced by the trial's value,
``shlex.quote``d, so a value only ever reaches the program as one literal argument. ``{{``
and ``}}`` are literal braces. Every bad field raises :class:`UserInputError` (exit 2) naming
its path (``parameters.lr.low``); nothing is submitted.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import re
import shlex
import string
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import Resources, check_text

METHODS = ("grid", "random", "tpe")
PARAM_TYPES = ("uniform", "loguniform", "int", "values")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
Value = str | int | float | bool


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=False)


class Param(_Frozen):
    """One parameter: a range (``uniform``, ``loguniform``, ``int``) or a list of ``values``."""

    type: Literal["uniform", "loguniform", "int", "values"] | None = None
    low: float | None = None
    high: float | None = None
    values: tuple[Value, ...] | None = None

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


class Metric(_Frozen):
    name: str
    goal: Literal["minimize", "maximize"] = "minimize"


class SweepSpec(_Frozen):
    """A validated sweep (build it with :meth:`from_mapping` or :func:`load_file`)."""

    name: str
    command: str | None = None            # None: a Python-callable sweep (gpuhpc.sweep)
    parameters: dict[str, Param]
    method: Literal["grid", "random", "tpe"] = "random"
    seed: int = 0
    trials: int | None = None
    parallelism: int = 16
    resources: dict[str, Any] = {}
    metric: Metric
    max_requeues: int = 5
    grace: int | str = 60
    template: Literal["single", "torchrun", "deepspeed", "mpi"] = "single"
    env: dict[str, str] = {}
    workdir: str | None = None
    chunk_size: int | None = None         # at most MaxArraySize; smaller forces more chunks
    max_queued: int | None = None         # trials queued at once (else from the cluster's limits)
    driver_partition: str | None = None   # the sweep driver's partition (default: cpu, when it exists)
    hold: bool = False                    # submit the arrays held (scontrol release them)

    # ------------------------------------------------------------ derived
    @property
    def res(self) -> Resources:
        return Resources.from_mapping(self.resources)

    @property
    def n_trials(self) -> int:
        if self.trials is not None:
            return self.trials
        return len(list(self._grid()))

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
    def from_mapping(cls, data: Any, *, python: bool = False) -> "SweepSpec":
        """Validate a sweep file's mapping; raises UserInputError naming the field."""
        if not isinstance(data, Mapping):
            raise UserInputError("a sweep file must be a mapping", field="<sweep file>")
        try:
            spec = cls.model_validate(dict(data))
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = [str(p) for p in err["loc"] if not str(p).startswith(("literal[", "function-"))]
            loc = [p for p in loc if p not in ("str", "int", "float", "bool")]
            field = ".".join(loc) or "<sweep file>"
            msg = err["msg"]
            if err["type"] == "extra_forbidden":
                msg = f"unknown field (valid: {', '.join(cls.model_fields)})" if len(loc) == 1 else "unknown field"
            raise UserInputError(msg, field=field) from None
        spec._check(python=python)
        return spec

    def _check(self, *, python: bool) -> None:
        if not _NAME_RE.match(self.name):
            raise UserInputError(f"{self.name!r} is not a valid sweep name", field="name",
                                 hint="letters, digits, . _ - (at most 100)")
        if not self.parameters:
            raise UserInputError("no parameters", field="parameters")
        for pname, p in self.parameters.items():
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
                continue
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
        if self.method == "tpe":
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise UserInputError("method tpe needs Optuna", field="method",
                                     hint="pip install 'gpuhpc[tpe]' (or optuna), or use random") from None
        if self.trials is not None and self.trials < 1:
            raise UserInputError("must be >= 1", field="trials")
        if self.method == "grid":
            size = len(list(self._grid()))
            if self.trials is not None and self.trials > size:
                raise UserInputError(f"the grid has {size} points, not {self.trials}", field="trials")
        elif self.trials is None:
            raise UserInputError(f"method {self.method} needs a number of trials", field="trials")
        if self.parallelism < 1:
            raise UserInputError(f"must be >= 1, got {self.parallelism}", field="parallelism")
        for name in ("max_requeues",):
            if getattr(self, name) < 0:
                raise UserInputError("must be >= 0", field=name)
        for name in ("chunk_size", "max_queued"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise UserInputError("must be >= 1", field=name)
        if not _PARAM_RE.match(self.metric.name):
            raise UserInputError("a metric name must be an identifier", field="metric.name")
        if "array" in self.resources:
            raise UserInputError("a sweep makes its own arrays", field="resources.array")
        Resources.from_mapping(self.resources)          # the job file's keys and checks
        for k, v in self.env.items():
            check_text(v, f"env.{k}")
        if self.driver_partition is not None:
            Resources(partition=self.driver_partition)


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


def format_value(value: Value) -> str:
    """A parameter value as text: floats round-trip (repr), booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def render_command(command: str, params: Mapping[str, Value]) -> str:
    pieces = []
    for literal, field_name, _, _ in string.Formatter().parse(command):
        pieces.append(literal)
        if field_name is not None:
            pieces.append(shlex.quote(format_value(params[field_name])))
    return "".join(pieces)


def load_file(path: str, *, overrides: Mapping[str, Any] | None = None) -> SweepSpec:
    """Read and validate a YAML sweep file (exit 2 on any problem)."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except FileNotFoundError:
        raise UserInputError(f"{path}: no such file", field="FILE") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserInputError(f"{path}: cannot read: {exc}", field="FILE") from None
    except yaml.YAMLError as exc:
        raise UserInputError(f"{path}: not valid YAML: {' '.join(str(exc).split())}", field="FILE") from None
    if isinstance(data, Mapping) and overrides:
        data = {**data, **overrides}
    return SweepSpec.from_mapping(data)


def spec_json(spec: SweepSpec) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True)


def spec_from_json(text: str) -> SweepSpec:
    data = json.loads(text)
    return SweepSpec.model_validate(data)


def chunks_of(items: Sequence[int], size: int) -> list[list[int]]:
    return [list(items[i:i + size]) for i in range(0, len(items), size)]

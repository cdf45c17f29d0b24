"""Typed, validated job descriptions: :class:`Resources` and :class:`JobSpec`.

Generic resource names (``gpus`` per node, ``gpu_type``, ``time`` ...) are translated to
sbatch options in exactly one place, :func:`sbatch_options`; both the script path (sbatch
templates) and the Python-callable path (submitit) use it.

Stdlib only: ``gpuhpc submit`` imports this on every call and must start fast.
"""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError, UserInputError

TEMPLATES = ("single", "torchrun", "deepspeed", "mpi")
MPI_TYPES = ("auto", "pmix", "pmi2")
#: The signal gpuhpc jobs get before preemption / the time limit. Not USR1: NCCL uses it.
SIGNAL = "USR2"
DEFAULT_GRACE_S = 60
DEFAULT_MAX_REQUEUES = 10

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")      # C0, DEL, C1, line/paragraph separators
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")      # partition, account, qos, gpu type
_NODELIST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,\[\]-]*$")
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.&|!*\[\]():-]+$")
_SWITCHES_RE = re.compile(r"^(off|[1-9][0-9]{0,3}(@[0-9][0-9:-]{0,15})?)$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MEM_RE = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)


# ---------------------------------------------------------------- validation helpers
def check_text(value: Any, field_name: str, *, allow_empty: bool = True) -> str:
    """A user string that may reach a script: any unicode, but no control characters
    (newline, tab, ESC, NUL ...). Everything else is quoted when rendered."""
    if not isinstance(value, str):
        raise UserInputError(f"expected a string, got {type(value).__name__}", field=field_name)
    if _CONTROL.search(value):
        bad = _CONTROL.search(value).group()  # type: ignore[union-attr]
        raise UserInputError(f"control character {bad!r} is not allowed", field=field_name,
                             hint="remove newlines, tabs and other control characters")
    if not allow_empty and not value:
        raise UserInputError("must not be empty", field=field_name)
    return value


def _check_re(value: Any, field_name: str, pattern: re.Pattern[str], what: str) -> str:
    value = check_text(value, field_name, allow_empty=False)
    if not pattern.match(value):
        raise UserInputError(f"{value!r} is not a valid {what}", field=field_name)
    return value


def _check_int(value: Any, field_name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool):
        raise UserInputError("expected an integer", field=field_name)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int):
        raise UserInputError(f"expected an integer, got {value!r}", field=field_name)
    if value < minimum:
        raise UserInputError(f"must be >= {minimum}, got {value}", field=field_name)
    return value


def parse_duration(value: Any, field_name: str = "time") -> int:
    """A job's time limit -> seconds: Slurm's formats (``120`` is minutes, ``2-12`` is 2 days 12
    hours, ``HH:MM:SS`` ...) or ``2h``/``90m``/``1h30m``/``1d`` (:mod:`gpuhpc.slurm.durations`)."""
    from gpuhpc.slurm.durations import parse_duration as _parse

    if not isinstance(value, int):
        value = check_text(value, field_name, allow_empty=False)
    seconds = _parse(value, field=field_name, shorthand=True)
    if seconds is None:
        raise UserInputError("a job needs a finite time limit", field=field_name, hint="e.g. 2h or 1-00:00:00")
    if seconds <= 0:
        raise UserInputError("must be positive", field=field_name)
    return seconds


def format_slurm_time(seconds: int) -> str:
    """Seconds -> sbatch ``--time`` (``D-HH:MM:SS``), rounded up to whole minutes."""
    from gpuhpc.slurm.durations import format_duration

    return format_duration(seconds, round_up_minutes=True)


def _check_mem(value: Any, field_name: str) -> str:
    text = check_text(str(value) if isinstance(value, int) else value, field_name, allow_empty=False)
    m = _MEM_RE.match(text.strip())
    if not m:
        raise UserInputError(f"cannot parse memory {value!r}", field=field_name, hint="use e.g. 64G, 500M, 64000")
    return f"{m.group(1)}{m.group(2).upper()}"


def _unknown(kind: str, data: Mapping[str, Any], valid: Sequence[str], prefix: str = "") -> None:
    bad = sorted(set(data) - set(valid))
    if bad:
        raise UserInputError(f"unknown {kind} parameter(s) {', '.join(map(repr, bad))}",
                             field=f"{prefix}{bad[0]}",
                             hint=f"valid: {', '.join(sorted(valid))}")


# ---------------------------------------------------------------- sbatch pass-through
#: sbatch options a job may pass through (``sbatch_args``, ``--sbatch-arg``, ``Resources.extra``):
#: name -> "value" (``--opt=VALUE``), "flag" (``--opt``) or "either". None of them changes the GPUs,
#: nodes, time, account, partition or QOS a job is charged for (the ledger reserves those).
#: Only full names: sbatch takes any unambiguous prefix (``--part`` is ``--partition``).
SBATCH_PASS_THROUGH: dict[str, str] = {
    "reservation": "value", "mail-type": "value", "mail-user": "value", "comment": "value",
    "begin": "value", "deadline": "value", "licenses": "value", "wckey": "value", "nice": "either",
    "priority": "value", "gres-flags": "value", "gpu-bind": "value", "gpu-freq": "value",
    "cpu-freq": "value", "mem-bind": "value", "distribution": "value", "hint": "value", "bb": "value",
    "bbf": "value", "delay-boot": "value", "mcs-label": "value", "network": "value", "power": "value",
    "profile": "value", "propagate": "either", "acctg-freq": "value", "core-spec": "value",
    "thread-spec": "value", "tmp": "value", "mincpus": "value", "contiguous": "flag",
    "sockets-per-node": "value", "cores-per-socket": "value", "threads-per-core": "value",
    "extra-node-info": "value", "oversubscribe": "flag", "overcommit": "flag", "spread-job": "flag",
    "use-min-nodes": "flag", "no-kill": "either", "kill-on-invalid-dep": "value", "reboot": "flag",
    "get-user-env": "either", "prefer": "value", "cluster-constraint": "value", "wait-all-nodes": "value",
    "batch": "value",
}
_GPUS = "gpus/gpu_type (GPUs per node) and tasks_per_node"
#: sbatch options gpuhpc sets itself (or that would bypass what it models and charges): option ->
#: the gpuhpc field to use instead. ``container-*`` (pyxis) is matched by prefix.
SBATCH_OWNED: dict[str, str] = {
    "gres": "gpus/gpu_type", "gpus": "gpus/gpu_type", "gpus-per-node": "gpus/gpu_type",
    "gpus-per-task": _GPUS, "gpus-per-socket": _GPUS, "tres-per-task": _GPUS, "ntasks-per-gpu": _GPUS,
    "cpus-per-gpu": "cpus_per_task", "mem-per-gpu": "mem", "mem-per-cpu": "mem", "mem": "mem",
    "partition": "partition", "account": "account", "qos": "qos", "time": "time", "time-min": "time",
    "array": "array", "output": "log_dir", "error": "log_dir", "input": "log_dir", "open-mode": "log_dir",
    "job-name": "name", "dependency": "dependency", "nodes": "nodes", "ntasks": "tasks_per_node",
    "ntasks-per-node": "tasks_per_node", "ntasks-per-core": "tasks_per_node",
    "ntasks-per-socket": "tasks_per_node", "cpus-per-task": "cpus_per_task", "exclusive": "exclusive",
    "requeue": "requeue/max_requeues", "no-requeue": "requeue/max_requeues", "signal": "grace",
    "container": "image", "chdir": "workdir", "wrap": "command", "export": "env", "export-file": "env",
    "constraint": "constraint", "nodelist": "nodelist", "nodefile": "nodelist", "exclude": "exclude",
    "switches": "switches", "hold": "hold", "parsable": "nothing (gpuhpc reads sbatch's job id)",
    "clusters": "--cluster (a cluster profile)", "uid": "nothing (run gpuhpc as that user)",
    "gid": "nothing (run gpuhpc as that user)", "wait": "Job.wait() or gpuhpc status",
    "test-only": "--dry-run",
}
_SBATCH_ARG_RE = re.compile(r"^--([a-z][a-z0-9-]*)(=(.*))?$", re.DOTALL)
#: what submitit writes unquoted into an #SBATCH line (it shlex.quotes the rest, which sbatch
#: does not read: sbatch's #SBATCH tokenizer knows double quotes only)
_SUBMITIT_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")


def parse_sbatch_arg(arg: Any, field_name: str) -> tuple[str, str | None]:
    """One pass-through sbatch option -> ``(name, value|None)``; raises UserInputError (the
    option gpuhpc owns and the field to use instead, a short option, an unknown option ...)."""
    text = check_text(arg, field_name, allow_empty=False)
    m = _SBATCH_ARG_RE.match(text)
    if not m:
        if re.match(r"^-[A-Za-z]", text):
            hint = "short options are not passed through: use the long name, e.g. --reservation=NAME"
        else:
            hint = "one option per item, e.g. --reservation=maint or --mail-type=END"
        raise UserInputError(f"{text!r} is not --long-option or --long-option=value", field=field_name, hint=hint)
    name, value = m.group(1), m.group(3)
    owner = SBATCH_OWNED.get(name) or ("image/mounts/container_workdir" if name.startswith("container-") else None)
    if owner:
        raise UserInputError(f"--{name} is gpuhpc's; use {owner}", field=field_name)
    kind = SBATCH_PASS_THROUGH.get(name)
    if kind is None:
        raise UserInputError(f"--{name} is not an sbatch option gpuhpc passes through", field=field_name,
                             hint=f"full names only; passed through: {', '.join(sorted(SBATCH_PASS_THROUGH))}")
    if kind == "value" and not value:
        raise UserInputError(f"--{name} needs a value", field=field_name, hint=f"--{name}=VALUE")
    if kind == "flag" and value is not None:
        raise UserInputError(f"--{name} takes no value", field=field_name, hint=f"--{name}")
    return name, value


def check_sbatch_args(args: Any, field_name: str = "sbatch_args") -> tuple[str, ...]:
    """A list of pass-through sbatch options (:data:`SBATCH_PASS_THROUGH`), checked; an option
    given twice keeps its last value (a ``--sbatch-arg`` overrides the job file's)."""
    if isinstance(args, str):
        args = [args]
    if not isinstance(args, (list, tuple)):
        raise UserInputError("expected a list of --option=value strings", field=field_name,
                             hint="e.g. sbatch_args: [--reservation=maint, --mail-type=END]")
    last: dict[str, str] = {}
    for i, arg in enumerate(args):
        name, _ = parse_sbatch_arg(arg, f"{field_name}[{i}]")
        last.pop(name, None)
        last[name] = arg
    return tuple(last.values())


# ---------------------------------------------------------------- environment setup
_MODULE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+/@:-]*$")
#: gpuhpc's own first line when modules are loaded: ``module`` where a non-login shell lacks it
MODULE_INIT = ('type module >/dev/null 2>&1 || for _gpuhpc_f in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; '
               'do if [ -r "$_gpuhpc_f" ]; then . "$_gpuhpc_f"; break; fi; done')
#: The shell function that runs the setup lines ($GPUHPC_SETUP, one per line) in the calling
#: shell, in order; the first that fails (non-zero status) is named on stderr and its status
#: returned. ``set -u`` is off meanwhile (conda's and Lmod's scripts are not written for it).
#: The job templates and Python mode (submitit's ``setup``) define it from this text.
SETUP_RUNNER = (
    '_gpuhpc_setup() { [ -n "${GPUHPC_SETUP:-}" ] || return 0; '
    'local _gpuhpc_l _gpuhpc_n=0 _gpuhpc_rc=0 _gpuhpc_u=+u; local -a _gpuhpc_ls; '
    'case $- in *u*) _gpuhpc_u=-u;; esac; set +u; '
    'mapfile -t _gpuhpc_ls <<<"$GPUHPC_SETUP"; '
    'for _gpuhpc_l in "${_gpuhpc_ls[@]}"; do _gpuhpc_n=$((_gpuhpc_n + 1)); eval "$_gpuhpc_l"; _gpuhpc_rc=$?; '
    'if [ "$_gpuhpc_rc" != 0 ]; then printf "gpuhpc[%s]: setup line %s failed (exit %s) on %s: %s\\n" '
    '"$(date -u +%H:%M:%S)" "$_gpuhpc_n" "$_gpuhpc_rc" "$(hostname)" "$_gpuhpc_l" >&2; break; fi; done; '
    'set "$_gpuhpc_u"; return "$_gpuhpc_rc"; }'
)


def check_setup_line(value: Any, field_name: str) -> str:
    """A setup line: the user's own shell, run as written, but one line (no newline, NUL or other
    control character) and no template syntax (``{{``, ``{%``)."""
    text = check_text(value, field_name)
    for mark in ("{{", "{%"):
        if mark in text:
            raise UserInputError(f"{mark!r} is not allowed in a setup line", field=field_name,
                                 hint="template syntax never reaches a job script; put it in a script you run")
    return text


def _str_list(value: Any, field_name: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)):
        raise UserInputError(f"expected a list of {what}", field=field_name)
    return tuple(value)


def check_setup(setup: Any, field_name: str = "setup") -> tuple[str, ...]:
    lines = _str_list(setup, field_name, "shell lines")
    return tuple(check_setup_line(line, f"{field_name}[{i}]") for i, line in enumerate(lines))


def check_modules(modules: Any, field_name: str = "modules") -> tuple[str, ...]:
    names = _str_list(modules, field_name, "module names")
    for i, name in enumerate(names):
        _check_re(name, f"{field_name}[{i}]", _MODULE_RE, "module name (e.g. cuda/12.4, gcc@12)")
    return names


def check_env_path(value: Any, field_name: str) -> str:
    text = check_text(value, field_name, allow_empty=False)
    if "{{" in text or "{%" in text:
        raise UserInputError("template syntax is not allowed", field=field_name)
    return text


def _shell_path(path: str) -> str:
    """A path for the shell, quoted; a leading ``~/`` is the job's ``$HOME``."""
    import shlex

    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


def setup_script_lines(modules: Sequence[str] = (), conda: str | None = None, venv: str | None = None,
                       setup: Sequence[str] = ()) -> list[str]:
    """THE order of a job's environment setup, as shell lines (values quoted): ``module load``
    each module, then the conda environment or the venv, then the user's setup lines."""
    import shlex

    lines: list[str] = []
    if modules:
        lines.append(MODULE_INIT)
        lines += [f"module load {shlex.quote(m)}" for m in modules]
    if conda:
        target = _shell_path(conda) if "/" in conda else shlex.quote(conda)
        lines.append(f'eval "$("${{CONDA_EXE:-conda}}" shell.bash hook)" && conda activate {target}')
    if venv:
        lines.append(f". {_shell_path(venv)}/bin/activate")
    lines += list(setup)
    return lines


# ---------------------------------------------------------------- notifications (notify:)
#: What a job's ``notify:`` can tell of: its end (any final state), a failure (any end but
#: COMPLETED) and the requeue cap (the template stopped requeueing it: FAILED, exit code 75).
NOTIFY_EVENTS = ("end", "fail", "requeue_cap")
#: Each event as Slurm 22.05's ``--mail-type`` (NONE, BEGIN, END, FAIL, REQUEUE, ALL, INVALID_DEPEND,
#: STAGE_OUT, TIME_LIMIT[_90|_80|_50], ARRAY_TASKS): a job that hits the requeue cap ends FAILED, so
#: its mail is Slurm's FAIL mail (only a webhook says which failure it was).
NOTIFY_MAIL_TYPES = {"end": "END", "fail": "FAIL", "requeue_cap": "FAIL"}
NOTIFY_KEYS = ("events", "mail", "webhook", "webhooks")
_MAIL_RE = re.compile(r"^[A-Za-z0-9._+-]+(@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)?$")


def check_webhook(url: Any, field_name: str) -> str:
    """A webhook URL: ``http://`` or ``https://`` with a host, no blank or control character. It is
    only ever POSTed to by :mod:`gpuhpc.jobs.notify` (urllib; never a shell, never a template)."""
    text = check_text(url, field_name, allow_empty=False)
    from urllib.parse import urlsplit

    bad = "a webhook is an http:// or https:// URL with a host, e.g. https://hooks.example.org/T/x"
    if len(text) > 2048 or any(c.isspace() for c in text):
        raise UserInputError(f"{text[:60]!r} is not a webhook URL", field=field_name, hint=bad)
    try:
        parts = urlsplit(text)
        parts.port                                  # noqa: B018  (a bad port raises ValueError)
    except ValueError:
        raise UserInputError(f"{text[:60]!r} is not a webhook URL", field=field_name, hint=bad) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserInputError(f"{text[:60]!r} is not a webhook URL", field=field_name, hint=bad)
    return text


@dataclass(frozen=True)
class Notify:
    """A job's ``notify:``: on which ``events`` (:data:`NOTIFY_EVENTS`, default all) to send Slurm's
    mail to ``mail`` (sbatch ``--mail-type``/``--mail-user``) and a JSON POST to each webhook
    (:mod:`gpuhpc.jobs.notify`, outside the job: a killed job script sends nothing)."""

    events: tuple[str, ...] = NOTIFY_EVENTS
    mail: str | None = None
    webhooks: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        on = self.events.split(",") if isinstance(self.events, str) else self.events
        if not isinstance(on, (list, tuple)) or not on:
            raise UserInputError("expected a list of events", field="notify.events", hint=f"of: {', '.join(NOTIFY_EVENTS)}")
        events: list[str] = []
        for i, ev in enumerate(on):
            ev = check_text(ev, f"notify.events[{i}]").strip()
            if ev not in NOTIFY_EVENTS:
                raise UserInputError(f"unknown event {ev!r}", field=f"notify.events[{i}]",
                                     hint=f"valid: {', '.join(NOTIFY_EVENTS)}")
            if ev not in events:
                events.append(ev)
        object.__setattr__(self, "events", tuple(events))
        if self.mail is not None:
            _check_re(self.mail, "notify.mail", _MAIL_RE, "mail address (user@example.org or a user name)")
        hooks = (self.webhooks,) if isinstance(self.webhooks, str) else self.webhooks
        if not isinstance(hooks, (list, tuple)):
            raise UserInputError("expected a list of URLs", field="notify.webhook")
        object.__setattr__(self, "webhooks", tuple(check_webhook(u, f"notify.webhook[{i}]") for i, u in enumerate(hooks)))
        if self.mail is None and not self.webhooks:
            raise UserInputError("nothing to notify: no mail and no webhook", field="notify",
                                 hint="e.g. notify: {mail: me@example.org, webhook: https://hooks.example.org/x}")

    @property
    def mail_type(self) -> str:
        """sbatch ``--mail-type`` for :attr:`events`."""
        return ",".join(sorted({NOTIFY_MAIL_TYPES[e] for e in self.events}))

    @classmethod
    def from_value(cls, value: Any) -> "Notify | None":
        """A job file's ``notify:`` mapping (``events``, ``mail``, ``webhook`` or ``webhooks``), a
        :class:`Notify`, or None."""
        if value is None or isinstance(value, Notify):
            return value
        if not isinstance(value, Mapping):
            raise UserInputError("expected a mapping (events, mail, webhook)", field="notify",
                                 hint="e.g. notify: {events: [fail, requeue_cap], webhook: https://hooks.example.org/x}")
        if True in value:           # YAML 1.1 (PyYAML) reads the key `on` as true
            raise UserInputError("YAML reads the key `on` as true", field="notify.events",
                                 hint="write events: [end, fail, requeue_cap]")
        _unknown("notify", value, NOTIFY_KEYS, "notify.")
        hooks = value.get("webhooks", value.get("webhook")) or ()
        if "webhook" in value and "webhooks" in value:
            raise UserInputError("webhook and webhooks both given", field="notify.webhooks", hint="one list of URLs")
        return cls(events=value["events"] if "events" in value else NOTIFY_EVENTS, mail=value.get("mail"), webhooks=hooks)


# ---------------------------------------------------------------- models
@dataclass(frozen=True)
class Resources:
    """What a job needs, in generic names. ``gpus`` is GPUs *per node*; ``gpu_type`` is a
    GPU model (``h100``) or a MIG profile (``1g.10gb``); ``time`` is a duration string
    (``2h``, ``90m``, ``01:30:00``) or minutes."""

    nodes: int = 1
    gpus: int = 0
    gpu_type: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | int = "1h"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    exclusive: bool = False
    tasks_per_node: int | None = None
    # a container image for the program's srun step (pyxis; docs/containers.md)
    image: str | None = None          # REGISTRY#REPO:TAG or REGISTRY#REPO@sha256:DIGEST
    mounts: tuple[str, ...] = ()      # SRC:DST[:ro]
    container_workdir: str | None = None    # default: the job's workdir
    image_python: bool = False        # the image has this Python (major.minor) with cloudpickle and submitit
    switches: str | None = None       # sbatch --switches N[@TIME]; "off": none (multi-node default: the fewest leaves)
    # sbatch options gpuhpc does not model (``--reservation=x``, ``--mail-type=END``): job files'
    # ``sbatch_args``, ``--sbatch-arg``; checked by :func:`check_sbatch_args`
    extra: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._validate("resources.")

    def _validate(self, p: str) -> None:
        _check_int(self.nodes, f"{p}nodes", minimum=1)
        _check_int(self.gpus, f"{p}gpus", minimum=0)
        if self.cpus_per_task is not None:
            _check_int(self.cpus_per_task, f"{p}cpus_per_task", minimum=1)
        if self.tasks_per_node is not None:
            _check_int(self.tasks_per_node, f"{p}tasks_per_node", minimum=1)
        if self.gpu_type is not None:
            _check_re(self.gpu_type, f"{p}gpu_type", _NAME_RE, "GPU type (e.g. h100, 1g.10gb)")
            if not self.gpus:
                raise UserInputError("gpu_type given but gpus is 0", field=f"{p}gpus",
                                     hint="set the number of GPUs per node, e.g. --gpus 1")
        if self.mem is not None:
            object.__setattr__(self, "mem", _check_mem(self.mem, f"{p}mem"))
        for name in ("partition", "account", "qos"):
            if getattr(self, name) is not None:
                _check_re(getattr(self, name), f"{p}{name}", _NAME_RE, name)
        for name in ("nodelist", "exclude"):
            if getattr(self, name) is not None:
                _check_re(getattr(self, name), f"{p}{name}", _NODELIST_RE, "node list")
        if self.constraint is not None:
            _check_re(self.constraint, f"{p}constraint", _CONSTRAINT_RE, "constraint")
        if not isinstance(self.exclusive, bool):
            raise UserInputError("expected true/false", field=f"{p}exclusive")
        if self.switches is not None and not _SWITCHES_RE.match(str(self.switches)):
            raise UserInputError(f"{self.switches!r} is not N or N@TIME", field=f"{p}switches",
                                 hint="e.g. 1@5:00 (one leaf switch, wait up to 5 minutes) or off")
        parse_duration(self.time, f"{p}time")
        object.__setattr__(self, "extra", check_sbatch_args(self.extra, f"{p}extra"))
        self._validate_container(p)

    def _validate_container(self, p: str) -> None:
        from gpuhpc.containers.image import check_container_workdir, check_mounts, parse_ref

        if self.image is not None:
            parse_ref(self.image, f"{p}image")
        object.__setattr__(self, "mounts", check_mounts(self.mounts or (), f"{p}mounts"))
        if self.container_workdir is not None:
            check_container_workdir(self.container_workdir, f"{p}container_workdir")
        if not isinstance(self.image_python, bool):
            raise UserInputError("expected true/false", field=f"{p}image_python")
        if self.image is None and (self.mounts or self.container_workdir or self.image_python):
            name = "mounts" if self.mounts else "container_workdir" if self.container_workdir else "image_python"
            raise UserInputError(f"{name} given without an image", field=f"{p}{name}",
                                 hint="add --image REGISTRY#REPO:TAG (container.image in a job file)")

    @property
    def time_s(self) -> int:
        return parse_duration(self.time)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], prefix: str = "resources.") -> "Resources":
        valid = [f.name for f in dataclasses.fields(cls)]
        _unknown("resource", data, valid, prefix)
        try:
            return cls(**dict(data))
        except UserInputError:
            raise


def check_fits(resources: Resources, nodes: Sequence[Any]) -> None:
    """Refuse, before anything is reserved or submitted, a GPU request that no node can hold
    (sbatch would only say "Requested node configuration is not available"): a GPU type the
    cluster (the partition, when one is named) does not have, more GPUs per node than its
    largest node has, or more such nodes than it has. ``nodes`` are ``scontrol show node``
    records (:class:`gpuhpc.slurm.parsers.NodeInfo`: ``name``, ``partitions``,
    ``gpus_total``). A request without GPUs is not checked."""
    if not resources.gpus:
        return
    where = f"partition {resources.partition}" if resources.partition else "this cluster"
    pool = [n for n in nodes if not resources.partition or resources.partition in n.partitions]
    types = sorted({t for n in pool for t, c in n.gpus_total.items() if c})
    if not types:
        raise UserInputError(f"{where} has no GPUs", field="gpus",
                             hint="drop --gpus, or pick a GPU partition" if resources.partition else "drop --gpus")
    if resources.gpu_type and resources.gpu_type not in types:
        raise UserInputError(f"{where} has no GPU type {resources.gpu_type!r}", field="gpu_type",
                             hint=f"it has: {', '.join(types)}")

    def count(n: Any) -> int:
        return n.gpus_total.get(resources.gpu_type, 0) if resources.gpu_type else sum(n.gpus_total.values())

    largest = max(pool, key=count)
    what = f"{resources.gpu_type} GPUs" if resources.gpu_type else "GPUs"
    if resources.gpus > count(largest):
        raise UserInputError(f"{resources.gpus} {what} per node requested; the largest node of {where} "
                             f"({largest.name}) has {count(largest)}", field="gpus",
                             hint="ask for fewer per node and more --nodes")
    fit = [n.name for n in pool if count(n) >= resources.gpus]
    if resources.nodes > len(fit):
        raise UserInputError(f"{resources.nodes} nodes with {resources.gpus} {what} each requested; "
                             f"{where} has {len(fit)}", field="nodes")


def check_fits_on(resources: Resources, client: Any) -> None:
    """:func:`check_fits` against ``client``'s nodes (one ``scontrol show node``, only for a
    request with GPUs), before the reservation and sbatch; Slurm cannot say: sbatch will."""
    if not resources.gpus:
        return
    try:
        nodes = client.nodes()
    except GpuhpcError:
        return
    check_fits(resources, nodes)


_ARRAY_RE = re.compile(r"^(\d+(-\d+(:\d+)?)?)(,\d+(-\d+(:\d+)?)?)*(%\d+)?$")


def array_size(array: str, field_name: str = "array") -> int:
    """The number of tasks of an sbatch ``--array`` value (``0-9%2`` -> 10, ``1,4-6`` -> 4,
    ``0-10:5`` -> 3); raises UserInputError for anything else."""
    text = check_text(array, field_name, allow_empty=False)
    if not _ARRAY_RE.match(text):
        raise UserInputError(f"{text!r} is not a job array", field=field_name, hint="e.g. 0-49%8 or 1,3,5-7")
    tasks: set[int] = set()
    for term in text.split("%", 1)[0].split(","):
        rng, _, step = term.partition(":")
        lo, _, hi = rng.partition("-")
        a, b = int(lo), int(hi or lo)
        if b < a or (step and int(step) < 1):
            raise UserInputError(f"bad range {term!r}", field=field_name)
        tasks.update(range(a, b + 1, int(step or 1)))
    if "%" in text and int(text.split("%", 1)[1]) < 1:
        raise UserInputError("the %N limit must be >= 1", field=field_name)
    return len(tasks)


def check_s3_url(url: Any, field_name: str) -> str:
    """``s3://BUCKET[/PREFIX]`` (checked here without boto3: the spec is on the CLI's start-up path)."""
    if not isinstance(url, str) or not url.startswith("s3://") or not url[5:].split("/", 1)[0] \
            or any(ord(c) < 32 or c.isspace() for c in url):
        raise UserInputError(f"not an S3 URL: {url!r}", field=field_name, hint="use s3://BUCKET/PREFIX/")
    return url


def _default_log_dir() -> str:
    env = getenv("GPUHPC_LOG_DIR")
    if env:
        return os.path.expanduser(env)
    from gpuhpc.fsutil import data_dir

    return os.path.join(data_dir(), "logs")


def default_log_dir() -> str:
    """``$GPUHPC_LOG_DIR``, else ``<gpuhpc data dir>/logs`` (``~/.local/share/gpuhpc/logs``)."""
    return _default_log_dir()


def safe_file_stem(name: str) -> str:
    """A job name made safe for a file name (``%x`` would put ``/`` and ``%`` in paths)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "job"
    return stem[:80]


# ---------------------------------------------------------------- dependencies (after=)
_JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?$")
AFTER_KINDS = ("ok", "any")


def after_ids(value: Any, field_name: str = "after") -> tuple[str, ...]:
    """The job ids a job waits for: one id (``123``, ``123_4`` for an array task), a
    comma-separated string of them, or a list of ids or job handles (anything with a
    ``job_id``); each checked (exit 2 naming ``field_name[i]``)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items: Any = value.split(",")
    elif isinstance(value, int) or hasattr(value, "job_id"):
        items = [value]
    elif isinstance(value, Mapping) or not hasattr(value, "__iter__"):
        raise UserInputError("expected a job id or a list of job ids", field=field_name, hint="e.g. [1234, 1235_2]")
    else:
        items = list(value)
    out: list[str] = []
    for i, item in enumerate(items):
        item = getattr(item, "job_id", item)
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise UserInputError(f"{item!r} is not a job id", field=f"{field_name}[{i}]", hint="e.g. 1234 or 1234_5")
        text = str(item).strip()
        if not _JOB_ID_RE.match(text):
            raise UserInputError(f"{text!r} is not a Slurm job id", field=f"{field_name}[{i}]",
                                 hint="digits, or digits_digits for an array task: 1234 or 1234_5")
        if text not in out:
            out.append(text)
    return tuple(out)


def after_dependency(after: Sequence[str] = (), after_any: Sequence[str] = ()) -> str | None:
    """sbatch's ``--dependency`` for ``after`` (afterok: start once each ended COMPLETED) and
    ``after_any`` (afterany: once each ended, however); None when both are empty."""
    parts = ([f"afterok:{':'.join(after)}"] if after else []) + ([f"afterany:{':'.join(after_any)}"] if after_any else [])
    return ",".join(parts) or None


@dataclass(frozen=True)
class JobSpec:
    """A batch job: a command (argv list) run through one of the job templates.

    ``command`` is an argv list; it is never given to a shell as a string. ``env`` values
    are exported literally. ``checkpoint_dir`` may contain ``%j`` (the job id)."""

    command: tuple[str, ...]
    resources: Resources = field(default_factory=Resources)
    name: str = "gpuhpc"
    template: str = "single"
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    grace: str | int = DEFAULT_GRACE_S
    max_requeues: int = DEFAULT_MAX_REQUEUES
    requeue: bool = True
    hold: bool = False
    dependency: str | None = None
    after: tuple[str, ...] = ()      # afterok on these job ids (rendered to --dependency)
    after_any: tuple[str, ...] = ()  # afterany on these
    mpi: str = "auto"
    snapshot: bool | None = None            # code snapshot (gpuhpc.jobs.snapshot); None: over SSH only
    snapshot_paths: tuple[str, ...] = ()    # extra files/directories for the code snapshot
    inputs: Mapping[str, str] = field(default_factory=dict)   # s3://bucket/prefix -> path in the job ($VARs ok)
    checkpoint: str | None = None           # s3://bucket/run-x/: checkpoints uploaded there, restored from there
    array: str | None = None          # sbatch --array (``0-49%8``, ``1,3,5-7``); each task is one job
    profile: str | None = None        # nsys | torch: every rank traced (gpuhpc.jobs.profile)
    profile_steps: str | None = None  # the step window START-STOP (default 10-20)
    # environment setup on every node before the program (setup_script_lines: modules, then
    # conda or venv, then the setup lines); docs/jobs.md, "Environment setup and Slurm options"
    setup: tuple[str, ...] = ()       # shell lines, run as written, one command line each
    modules: tuple[str, ...] = ()     # module load NAME
    conda: str | None = None          # a conda environment's name or path: conda activate
    venv: str | None = None           # a virtualenv's path: . PATH/bin/activate
    # mail and webhooks on end, failure, requeue cap (Notify, or a job file's mapping); docs/jobs.md
    notify: Any = None

    def __post_init__(self) -> None:
        cmd = self.command
        if isinstance(cmd, str):
            raise UserInputError("command must be a list of arguments, not a string", field="command",
                                 hint="e.g. ['python', 'train.py', '--lr', '3e-4']")
        cmd = tuple(cmd)
        if not cmd:
            raise UserInputError("no command given", field="command",
                                 hint="put the command after --, e.g. gpuhpc submit -- python train.py")
        for i, arg in enumerate(cmd):
            check_text(arg, f"command[{i}]")
        if not cmd[0]:
            raise UserInputError("empty program name", field="command[0]")
        object.__setattr__(self, "command", cmd)
        if isinstance(self.resources, Mapping):
            object.__setattr__(self, "resources", Resources.from_mapping(self.resources))
        if not isinstance(self.resources, Resources):
            raise UserInputError("expected a Resources", field="resources")
        check_text(self.name, "name", allow_empty=False)
        if len(self.name) > 200:
            raise UserInputError("longer than 200 characters", field="name")
        if self.template not in TEMPLATES:
            raise UserInputError(f"unknown template {self.template!r}", field="template",
                                 hint=f"valid: {', '.join(TEMPLATES)}")
        if self.mpi not in MPI_TYPES:
            raise UserInputError(f"unknown MPI type {self.mpi!r}", field="mpi", hint=f"valid: {', '.join(MPI_TYPES)}")
        if self.template == "single" and self.resources.nodes > 1:
            raise UserInputError(f"the single template runs one process on one node; {self.resources.nodes} "
                                 "nodes would leave all but the first idle", field="template",
                                 hint="use --template torchrun, deepspeed or mpi, or --nodes 1")
        env = dict(self.env or {})
        for k, v in env.items():
            if not isinstance(k, str) or not _ENV_KEY_RE.match(k):
                raise UserInputError(f"invalid environment variable name {k!r}", field=f"env.{k}")
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                v = str(v)
                env[k] = v
            check_text(v, f"env.{k}")
        object.__setattr__(self, "env", env)
        for name in ("workdir", "log_dir", "checkpoint_dir", "dependency"):
            if getattr(self, name) is not None:
                check_text(getattr(self, name), name, allow_empty=False)
        if self.array is not None:
            object.__setattr__(self, "array", str(self.array).strip())
            array_size(self.array)
        if self.dependency is not None and not re.fullmatch(r"[A-Za-z0-9_:,?+]+", self.dependency):
            raise UserInputError(f"invalid dependency {self.dependency!r}", field="dependency",
                                 hint="e.g. afterok:123")
        object.__setattr__(self, "after", after_ids(self.after, "after"))
        object.__setattr__(self, "after_any", after_ids(self.after_any, "after_any"))
        if (self.after or self.after_any) and self.dependency is not None:
            raise UserInputError("give after/after_any or a raw dependency, not both", field="after",
                                 hint="drop --dependency/-d, or write the whole dependency there")
        g = self.grace
        if isinstance(g, str) and g.strip().isdigit():       # bare number = seconds
            g = int(g.strip())
        g = g if isinstance(g, int) and not isinstance(g, bool) else parse_duration(g, "grace")
        _check_int(g, "grace", minimum=1)
        if g >= self.resources.time_s:
            raise UserInputError(f"grace ({g}s) must be shorter than the time limit ({self.resources.time_s}s)",
                                 field="grace")
        object.__setattr__(self, "grace", g)
        _check_int(self.max_requeues, "max_requeues", minimum=0)
        for name in ("requeue", "hold"):
            if not isinstance(getattr(self, name), bool):
                raise UserInputError("expected true/false", field=name)
        if self.snapshot is not None and not isinstance(self.snapshot, bool):
            raise UserInputError("expected true/false", field="snapshot")
        from gpuhpc.jobs import profile as _profile

        _profile.check(self.profile, self.profile_steps)
        paths = self.snapshot_paths
        if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
            raise UserInputError("expected a list of paths", field="snapshot_paths")
        for i, p in enumerate(paths):
            check_text(p, f"snapshot_paths[{i}]", allow_empty=False)
        object.__setattr__(self, "snapshot_paths", tuple(paths))
        if not isinstance(self.inputs, Mapping):
            raise UserInputError("expected a mapping of s3://URL: path", field="inputs",
                                 hint="e.g. inputs: {s3://bucket/ds/: $GPUHPC_SCRATCH/ds}")
        for url, dest in self.inputs.items():
            check_s3_url(url, f"inputs.{url}")
            if not isinstance(dest, str):
                raise UserInputError("expected a path", field=f"inputs.{url}")
            check_text(dest, f"inputs.{url}", allow_empty=False)
        object.__setattr__(self, "inputs", dict(self.inputs))
        if self.checkpoint is not None:
            check_s3_url(self.checkpoint, "checkpoint")
        object.__setattr__(self, "setup", check_setup(self.setup, "setup"))
        object.__setattr__(self, "modules", check_modules(self.modules, "modules"))
        for name in ("conda", "venv"):
            if getattr(self, name) is not None:
                check_env_path(getattr(self, name), name)
        if self.conda is not None and self.venv is not None:
            raise UserInputError("conda and venv both given", field="venv", hint="activate one environment")
        object.__setattr__(self, "notify", Notify.from_value(self.notify))
        if self.notify is not None:
            if self.notify.mail is not None:
                given = {parse_sbatch_arg(a, "sbatch_args")[0] for a in self.resources.extra} & {"mail-type", "mail-user"}
                if given:
                    raise UserInputError(f"notify.mail and --{sorted(given)[0]} in sbatch_args both given",
                                         field="notify.mail", hint="keep one: notify.mail sets --mail-type/--mail-user")
            if self.notify.webhooks and self.array is not None:
                raise UserInputError("webhooks for a job array are not sent", field="notify.webhook",
                                     hint="notify each array task from its own job, or use notify.mail (Slurm's mail)")

    @property
    def setup_lines(self) -> list[str]:
        """The job's environment setup as shell lines, in order (:func:`setup_script_lines`)."""
        return setup_script_lines(self.modules, self.conda, self.venv, self.setup)

    @property
    def grace_s(self) -> int:
        return int(self.grace)

    @property
    def array_size(self) -> int:
        """How many tasks ``array`` makes (1 without an array)."""
        return array_size(self.array) if self.array else 1

    @property
    def log_directory(self) -> str:
        return os.path.abspath(os.path.expanduser(self.log_dir)) if self.log_dir else _default_log_dir()

    @property
    def output_path(self) -> str:
        """``<log dir>/<safe name>-%j.out``; ``%`` in the directory is escaped for sbatch."""
        return os.path.join(self.log_directory.replace("%", "%%"), f"{safe_file_stem(self.name)}-%j.out")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "JobSpec":
        """Build from a YAML job file's mapping: the same names as the CLI options.

        Resource keys may sit at the top level (``gpus: 8``) or under ``resources:``."""
        if not isinstance(data, Mapping):
            raise UserInputError("a job file must be a mapping", field="<job file>")
        res_names = [f.name for f in dataclasses.fields(Resources)]
        spec_names = [f.name for f in dataclasses.fields(cls)]
        _unknown("job", data, [*spec_names, *res_names, "gpus_per_node", "container", "sbatch_args"], "")
        d = dict(data)
        res = dict(d.pop("resources", None) or {})
        if d.get("sbatch_args") is not None:      # named as in the job file (Resources.extra)
            res["extra"] = [*check_sbatch_args(res.get("extra") or (), "resources.extra"),
                            *check_sbatch_args(d["sbatch_args"], "sbatch_args")]
        d.pop("sbatch_args", None)
        if d.get("container") is not None:
            res.update(container_fields(d.pop("container")))
        d.pop("container", None)
        if "gpus_per_node" in d:
            res["gpus"] = d.pop("gpus_per_node")
        for k in res_names:
            if k in d:
                res[k] = d.pop(k)
        cmd = d.pop("command", None)
        if isinstance(cmd, str):
            raise UserInputError("command must be a list of arguments", field="command",
                                 hint='e.g. command: ["python", "train.py"]')
        return cls(command=tuple(cmd or ()), resources=Resources.from_mapping(res), **d)


# ---------------------------------------------------------------- the one translation
def tasks_per_node(spec: JobSpec) -> int:
    r = spec.resources
    if r.tasks_per_node:
        return r.tasks_per_node
    if spec.template in ("deepspeed", "mpi"):
        return max(1, r.gpus)
    return 1


def sbatch_options(resources: Resources, spec: JobSpec | None = None, *,
                   batch_signal: bool = True) -> list[tuple[str, str | None]]:
    """THE translation of generic names to sbatch long options: ``[(option, value|None)]``.

    ``batch_signal`` sends the warning signal to the batch shell (``B:``), whose trap
    forwards it to the training process group (script mode). The Python path (submitit)
    sets its own ``--signal`` on the job steps and passes ``spec=None``."""
    r = resources
    opts: list[tuple[str, str | None]] = []
    if spec is not None:
        opts.append(("job-name", spec.name))
    opts.append(("nodes", str(r.nodes)))
    if spec is not None:
        opts.append(("ntasks-per-node", str(tasks_per_node(spec))))
    elif r.tasks_per_node:
        opts.append(("ntasks-per-node", str(r.tasks_per_node)))
    if r.gpus:
        opts.append(("gres", f"gpu:{r.gpu_type}:{r.gpus}" if r.gpu_type else f"gpu:{r.gpus}"))
    if r.cpus_per_task:
        opts.append(("cpus-per-task", str(r.cpus_per_task)))
    if r.mem:
        opts.append(("mem", r.mem))
    opts.append(("time", format_slurm_time(r.time_s)))
    for name in ("partition", "account", "qos", "constraint", "nodelist", "exclude"):
        value = getattr(r, name)
        if value is not None:
            opts.append((name, value))
    if r.exclusive:
        opts.append(("exclusive", None))
    if r.switches and r.switches != "off":
        opts.append(("switches", r.switches))
    for i, arg in enumerate(r.extra):          # pass-through options, checked when Resources was made
        name, value = parse_sbatch_arg(arg, f"resources.extra[{i}]")
        if spec is None and value and not _SUBMITIT_PLAIN.match(value):
            raise UserInputError(f"--{name}'s value {value!r} cannot pass through submitit", field=f"resources.extra[{i}]",
                                 hint="a Python function's pass-through values are letters, digits and _@%+=:,./-")
        opts.append((name, value))
    if spec is not None and spec.notify is not None and spec.notify.mail is not None:
        opts.append(("mail-type", spec.notify.mail_type))
        opts.append(("mail-user", spec.notify.mail))
    if spec is not None:
        opts.append(("output", spec.output_path))
        opts.append(("open-mode", "append"))          # a requeued run appends to the same log
        if spec.requeue:
            opts.append(("requeue", None))
            opts.append(("signal", f"{'B:' if batch_signal else ''}{SIGNAL}@{spec.grace_s}"))
        else:
            opts.append(("no-requeue", None))
        if spec.workdir:
            opts.append(("chdir", spec.workdir))
        if spec.hold:
            opts.append(("hold", None))
        dependency = spec.dependency or after_dependency(spec.after, spec.after_any)
        if dependency:
            opts.append(("dependency", dependency))
        if spec.array:
            opts.append(("array", spec.array))
    return opts


# ---------------------------------------------------------------- containers (pyxis)
CONTAINER_KEYS = {"image": "image", "mounts": "mounts", "workdir": "container_workdir", "python": "image_python"}


def container_fields(data: Any, prefix: str = "container.") -> dict[str, Any]:
    """A job or sweep file's ``container:`` mapping (``image``, ``mounts``, ``workdir``,
    ``python``) or a bare image reference -> the :class:`Resources` fields."""
    if isinstance(data, str):
        data = {"image": data}
    if not isinstance(data, Mapping):
        raise UserInputError("expected a mapping (image, mounts, workdir, python) or an image reference",
                             field=prefix.rstrip("."))
    _unknown("container", data, list(CONTAINER_KEYS), prefix)
    if "image" not in data:
        raise UserInputError("no image given", field=f"{prefix}image", hint="e.g. image: nvcr.io#nvidia/pytorch:24.05-py3")
    return {CONTAINER_KEYS[k]: v for k, v in data.items()}


def container_srun_args(resources: Resources, workdir: str | None = None) -> list[str]:
    """THE translation of a job's container to pyxis' srun options (argv words, unquoted;
    ``[]`` without an image). ``--container-name`` comes separately (it holds $SLURM_JOB_ID)."""
    r = resources
    if r.image is None:
        return []
    args = [f"--container-image={r.image}"]
    if r.mounts:
        args.append(f"--container-mounts={','.join(r.mounts)}")
    wd = r.container_workdir or workdir
    if wd:
        args.append(f"--container-workdir={wd}")
    return args


def check_container_policy(resources: Resources) -> None:
    """Hold the job's image to the site's trust policy (exit 2; before anything is reserved or
    submitted). No image: nothing to check."""
    if resources.image is None:
        return
    from gpuhpc.containers.image import check_image

    check_image(resources.image, resources.partition, field="image")

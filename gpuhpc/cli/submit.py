"""``gpuhpc submit``: render a job template and sbatch it.

A plain click command; ``gpuhpc submit`` imports no rich (it must not be much slower than
``sbatch``).

    gpuhpc submit --gpus 8 --gpu-type h100 --nodes 2 --time 2h --partition gpu \\
        --account proj-x -- python train.py --lr 3e-4
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import click

from gpuhpc.cli.main import help_for

# CLI option -> (JobSpec/Resources field, where). "res" = Resources, "spec" = JobSpec.
_FIELDS: dict[str, tuple[str, str]] = {
    "gpus": ("gpus", "res"), "gpu_type": ("gpu_type", "res"), "nodes": ("nodes", "res"),
    "time": ("time", "res"), "partition": ("partition", "res"), "account": ("account", "res"),
    "qos": ("qos", "res"), "mem": ("mem", "res"), "cpus_per_task": ("cpus_per_task", "res"),
    "tasks_per_node": ("tasks_per_node", "res"), "constraint": ("constraint", "res"),
    "nodelist": ("nodelist", "res"), "exclude": ("exclude", "res"), "exclusive": ("exclusive", "res"),
    "switches": ("switches", "res"), "profile": ("profile", "spec"), "profile_steps": ("profile_steps", "spec"),
    "image": ("image", "res"), "mount": ("mounts", "res"), "container_workdir": ("container_workdir", "res"),
    "conda": ("conda", "spec"), "venv": ("venv", "spec"),
    "name": ("name", "spec"), "template": ("template", "spec"), "workdir": ("workdir", "spec"),
    "log_dir": ("log_dir", "spec"), "checkpoint_dir": ("checkpoint_dir", "spec"),
    "grace": ("grace", "spec"), "max_requeues": ("max_requeues", "spec"),
    "requeue": ("requeue", "spec"), "hold": ("hold", "spec"), "dependency": ("dependency", "spec"),
    "after": ("after", "spec"), "after_any": ("after_any", "spec"),
    "mpi": ("mpi", "spec"), "array": ("array", "spec"), "snapshot": ("snapshot", "spec"), "snapshot_path": ("snapshot_paths", "spec"),
}


_RES = "(resources, per node where it applies)"


def _options(f):
    """The options of ``gpuhpc submit``, in the order --help lists them."""
    o = click.option
    opts = [
        o("--gpus", type=int, metavar="N", help=f"GPUs per node {_RES}"),
        o("--gpu-type", metavar="TYPE", help="GPU model (h100) or MIG profile (1g.10gb)"),
        o("--nodes", "-N", type=int, metavar="N"),
        o("--time", "-t", metavar="DURATION", help="time limit: 2h, 90m, 1d, 02:00:00 (default 1h)"),
        o("--partition", "-p"),
        o("--account", "-A"),
        o("--qos"),
        o("--mem", help="memory per node: 64G"),
        o("--cpus-per-task", "-c", type=int, metavar="N"),
        o("--tasks-per-node", type=int, metavar="N",
          help="default: 1 (single, torchrun), GPUs per node (deepspeed, mpi)"),
        o("--constraint", "-C"),
        o("--nodelist", "-w"),
        o("--exclude", "-x"),
        o("--exclusive", is_flag=True, flag_value=True, default=None),
        o("--switches", metavar="N[@TIME]", help="leaf switches at most, waiting up to TIME (default for "
                                                 "multi-node jobs: the fewest the partition allows @5:00; off: none)"),
        o("--profile", type=click.Choice(("nsys", "torch")), help="trace every rank into <log dir>/profile "
                                                                  "(gpuhpc profile JOBID lists them)"),
        o("--profile-steps", metavar="START-STOP", help="the profiled step window (default 10-20; "
                                                        "gpuhpc.jobs.profile.step(i) in your loop)"),
        o("--image", metavar="REF", help="run the program in this container image (pyxis): "
                                         "REGISTRY#REPO:TAG or REGISTRY#REPO@sha256:DIGEST"),
        o("--mount", multiple=True, metavar="SRC:DST[:ro]", help="bind mount into the image (repeatable)"),
        o("--container-workdir", metavar="DIR", help="working directory in the image (default: --workdir)"),
        o("--file", "-f", metavar="JOB.yaml", help="YAML job file with the same option names"),
        o("--name", "-J"),
        o("--template", type=click.Choice(("single", "torchrun", "deepspeed", "mpi"))),
        o("--mpi", type=click.Choice(("auto", "pmix", "pmi2")), help="MPI plugin for the mpi template"),
        o("--env", "-e", multiple=True, metavar="KEY=VALUE", help="export in the job (repeatable)"),
        o("--module", multiple=True, metavar="NAME", help="module load NAME before the program (repeatable)"),
        o("--conda", metavar="ENV", help="activate this conda environment (a name or a path) before the program"),
        o("--venv", metavar="PATH", help="activate this virtualenv (PATH/bin/activate) before the program"),
        o("--setup", multiple=True, metavar="LINE", help="a shell line run before the program on every node, "
                                                         "after --module/--conda/--venv (repeatable)"),
        o("--sbatch-arg", multiple=True, metavar="--OPT[=VALUE]",
          help="an sbatch option gpuhpc does not model, e.g. --sbatch-arg=--reservation=maint (repeatable)"),
        o("--notify", multiple=True, metavar="KEY=VALUE",
          help="mail=ADDR, webhook=URL (repeatable) and events=end,fail,requeue_cap (default: all): Slurm's mail, "
               "and a JSON POST from python -m gpuhpc.jobs.notify (repeatable)"),
        o("--workdir", "-D"),
        o("--log-dir", metavar="DIR", help="where %j.out logs go (default ~/.local/share/gpuhpc/logs)"),
        o("--checkpoint-dir", metavar="DIR", help="shared checkpoint dir; %j = job id"),
        o("--grace", metavar="DURATION", help="SIGUSR2 this long before the time limit (default 60s)"),
        o("--max-requeues", type=int, metavar="N", help="cap on requeues (default 10)"),
        o("--no-requeue", "requeue", is_flag=True, flag_value=False, default=None),
        o("--hold", is_flag=True, flag_value=True, default=None),
        o("--dependency", "-d", help="a raw sbatch dependency (afterok:123); or use --after"),
        o("--after", metavar="JOB[,JOB]", help="start once these jobs ended COMPLETED (afterok)"),
        o("--after-any", metavar="JOB[,JOB]", help="start once these jobs ended, however (afterany)"),
        o("--after-sweep", metavar="SWEEP_ID", help="start once the sweep finished; $GPUHPC_BEST_PARAMS holds "
                                                  "its best trial's parameters (JSON) in the job"),
        o("--array", "-a", metavar="INDEXES",
          help="a job array (0-49%8: 50 tasks, 8 at a time); the ledger holds every task"),
        o("--snapshot/--no-snapshot", default=None,
          help="run from a code snapshot of this git repo (tracked files, uncommitted changes; "
               ".gpuhpcignore excludes); default: on over SSH (--cluster), off locally"),
        o("--snapshot-path", multiple=True, metavar="PATH",
          help="also put PATH (file or directory) in the snapshot (repeatable)"),
        o("--dry-run", is_flag=True, help="print the sbatch script; submit nothing"),
        o("--json", "json_out", is_flag=True, help="print {job_id, log} as JSON"),
        click.argument("command", nargs=-1, type=click.UNPROCESSED),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _load_file(path: str) -> dict[str, Any]:
    from gpuhpc.errors import UserInputError

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UserInputError(f"cannot read job file: {exc.strerror}", field="--file") from exc
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserInputError(f"invalid YAML: {str(exc).splitlines()[0]}", field=path) from exc
    if not isinstance(data, dict):
        raise UserInputError("a job file must be a mapping of option: value", field=path)
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build_spec(ns: SimpleNamespace):
    """Job file first, then the flags that were given on the command line."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.jobs.spec import JobSpec

    data: dict[str, Any] = _load_file(ns.file) if ns.file else {}
    for opt, (fld, _) in _FIELDS.items():
        value = getattr(ns, opt, None)
        if value is not None:
            if "resources" in data and isinstance(data["resources"], dict) and _FIELDS[opt][1] == "res":
                data["resources"][fld] = value
            else:
                data[fld] = value
    if ns.env:
        env = dict(data.get("env") or {})
        for item in ns.env:
            if "=" not in item:
                raise UserInputError(f"expected KEY=VALUE, got {item!r}", field="--env")
            k, v = item.split("=", 1)
            env[k] = v
        data["env"] = env
    from gpuhpc.jobs.spec import check_modules, check_sbatch_args, check_setup

    for opt, fld, check in (("setup", "setup", check_setup), ("module", "modules", check_modules),
                            ("sbatch_arg", "sbatch_args", check_sbatch_args)):
        items = getattr(ns, opt, None)
        if items:           # after the job file's; an --sbatch-arg overrides the file's value of its option
            old = data.get(fld)
            data[fld] = [*([old] if isinstance(old, str) else old or []), *check(list(items), "--" + opt.replace("_", "-"))]
    if getattr(ns, "notify", None):
        data["notify"] = _notify_items(data.get("notify"), ns.notify)
    cmd = list(ns.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd:
        data["command"] = cmd
    if getattr(ns, "after_sweep", None) is not None:
        data = _after_sweep(data, ns.after_sweep)
    return JobSpec.from_mapping(data)


def _notify_items(base: Any, items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``--notify KEY=VALUE`` items on top of the job file's ``notify:`` mapping: ``mail=`` and
    ``events=`` replace the file's, each ``webhook=`` adds a URL."""
    from gpuhpc.errors import UserInputError

    out: dict[str, Any] = dict(base) if isinstance(base, dict) else {}
    if base is not None and not isinstance(base, dict):
        raise UserInputError("expected a mapping (events, mail, webhook)", field="notify")
    hooks = out.pop("webhooks", out.pop("webhook", None))
    hooks = [hooks] if isinstance(hooks, str) else list(hooks or [])
    for item in items:
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if not sep or key not in ("mail", "webhook", "events"):
            raise UserInputError(f"expected mail=ADDR, webhook=URL or events=EVENTS, got {item!r}", field="--notify",
                                 hint="e.g. --notify webhook=https://hooks.example.org/x --notify events=fail,requeue_cap")
        if key == "webhook":
            hooks.append(value)
        else:
            out[key] = value
    if hooks:
        out["webhooks"] = hooks
    return out


def _after_sweep(data: dict[str, Any], sweep_id: str) -> dict[str, Any]:
    """``--after-sweep ID``: the job waits for the sweep's end (afterok on its driver, which ends
    when every trial has; a sweep without a driver: afterany on each of its arrays) and its
    command runs behind ``python -m gpuhpc.sweeps.best ID``, which puts the best trial's
    parameters in ``$GPUHPC_BEST_PARAMS`` (JSON) and ``$GPUHPC_BEST_PARAMS_FILE`` at the job's start."""
    from gpuhpc.errors import GpuhpcError, UserInputError
    from gpuhpc.jobs.spec import after_ids

    sweep_id = str(sweep_id).strip()
    if not sweep_id.isdigit():
        raise UserInputError(f"{sweep_id!r} is not a sweep id", field="--after-sweep", hint="e.g. --after-sweep 12")
    from gpuhpc.sweeps import store
    from gpuhpc.sweeps.api import Sweep

    try:
        sw = Sweep.load(sweep_id)
    except UserInputError:                  # "no sweep N": a missing thing, exit 1
        raise GpuhpcError(f"sweep {sweep_id} not found", hint="gpuhpc sweep status ID lists one") from None
    info = sw.info()
    data = dict(data)
    if info.get("driver_job_id"):
        data["after"] = [*after_ids(data.get("after"), "after"), str(info["driver_job_id"])]
    else:
        arrays = sorted({str(ch["job_id"]).split("_", 1)[0] for ch in info.get("chunks") or () if ch.get("job_id")})
        if not arrays:
            raise GpuhpcError(f"sweep {sw.id} has submitted no job to wait for",
                              hint=f"gpuhpc sweep status {sw.id}")
        data["after_any"] = [*after_ids(data.get("after_any"), "after_any"), *arrays]
    cmd = list(data.get("command") or [])
    if cmd:
        data["command"] = [sys.executable, "-m", "gpuhpc.sweeps.best", str(sw.id), "--", *cmd]
    env = dict(data.get("env") or {})
    env.setdefault("GPUHPC_DB_URL", store.db_url())
    from gpuhpc.config import getenv

    if getenv("GPUHPC_SWEEP_ROOT"):
        env.setdefault("GPUHPC_SWEEP_ROOT", getenv("GPUHPC_SWEEP_ROOT"))
    data["env"] = env
    return data


@click.command("submit", context_settings={"allow_interspersed_args": False},
               help="Render a job template (job-templates/) and submit it with sbatch. Put the command "
                    "after --. Options override a --file job file.",
               short_help=help_for("submit"),
               epilog="Jobs get --requeue and --signal=B:USR2@GRACE: on preemption or near the time limit "
                      "the program receives SIGUSR2, checkpoints to $GPUHPC_CHECKPOINT_DIR and exits; the "
                      "job requeues itself (docs/jobs.md).")
@_options
def submit(**params: Any) -> int:
    ns = SimpleNamespace(**{k: (v or None) if isinstance(v, tuple) else v for k, v in params.items()})
    spec = build_spec(ns)
    if ns.dry_run:
        from gpuhpc.jobs.script_mode import with_profile
        from gpuhpc.jobs.render import render

        sys.stdout.write(render(with_profile(spec)))
        return 0
    from gpuhpc.jobs.script_mode import submit_spec

    job = submit_spec(spec)
    if ns.json_out:
        import json

        sys.stdout.write(json.dumps({"job_id": job.job_id, "name": spec.name, "log": job._log_path}) + "\n")
    else:
        sys.stdout.write(f"{job.job_id}\n")
        sys.stderr.write(f"submitted job {job.job_id} ({spec.template}); log: {job._log_path}\n")
    snap = getattr(job, "snapshot", None)
    if snap is not None:
        sys.stderr.write(snap.summary() + "\n")
    return 0


def run(argv: list[str]) -> int:
    """``gpuhpc submit ARGV`` (everything after ``submit``): submit, print, return the exit code.
    Raises GpuhpcError (bad options: UserInputError)."""
    from gpuhpc.cli.main import invoke

    return invoke(submit, argv, "gpuhpc submit")


if __name__ == "__main__":
    from gpuhpc.cli.main import run_guarded

    sys.exit(run_guarded(lambda: run(sys.argv[1:])))

"""``gpuhpc shell``: an interactive allocation with the resources a job gets, for debugging.

    gpuhpc shell --gpus 1 --partition gpu --time 30m          # $SHELL -l on the node
    gpuhpc shell -f job.yaml -- python -m pdb train.py          # the job file's resources
    gpuhpc shell --gpus 1 --image nvcr.io#nvidia/pytorch:24.05-py3   # bash -l in the image

The resource options are ``gpuhpc submit``'s own click options (one definition, in
``gpuhpc/cli/submit.py``), read into a :class:`~gpuhpc.jobs.spec.JobSpec` by its ``build_spec``,
translated by :func:`~gpuhpc.jobs.spec.sbatch_options` and checked as a submission is (the
site's image policy, the fit on the partition, the ledger's hold) before ``salloc``
(:mod:`gpuhpc.slurm.interactive`) runs the command in one ``srun --pty`` step on the allocation.
"""
from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import click

from gpuhpc.cli.main import help_for
from gpuhpc.cli.submit import build_spec, submit

#: ``gpuhpc submit``'s options that ``gpuhpc shell`` takes (the same click objects, so the same
#: names, types and help): resources, the container, the job file, the name, environment,
#: pass-through options and the working directory.
SHARED_OPTIONS = ("gpus", "gpu_type", "nodes", "time", "partition", "account", "qos", "mem", "cpus_per_task",
                  "tasks_per_node", "constraint", "nodelist", "exclude", "exclusive", "switches", "image", "mount",
                  "container_workdir", "file", "name", "env", "sbatch_arg", "workdir")
DEFAULT_NAME = "gpuhpc-shell"
#: What a batch job gets that an interactive allocation has no use for (its log, requeue and
#: the checkpoint signal to a batch shell): left out of salloc's options.
BATCH_ONLY = frozenset({"output", "open-mode", "requeue", "no-requeue", "signal"})


def _params() -> list[click.Parameter]:
    by_name = {p.name: p for p in submit.params}
    return [
        *(by_name[n] for n in SHARED_OPTIONS),
        click.Option(["--dry-run"], is_flag=True, help="print the salloc command line; allocate nothing"),
        click.Argument(["command"], nargs=-1, type=click.UNPROCESSED),
    ]


def default_command(runner, image: str | None) -> list[str]:
    """The user's login shell (``$SHELL -l`` where the runner knows it), else ``bash -l``; in an
    image always ``bash -l`` (the host's shell path need not exist there)."""
    shell = None if image else (runner.getenv("SHELL") or None)
    return [shell or "bash", "-l"]


def shell_spec(ns: SimpleNamespace, command: list[str]):
    """The job file and the flags read as ``gpuhpc submit`` reads them, with ``command``. The
    grace period is the submit default's but a shell gets no checkpoint signal: 1 s, so that any
    time limit is valid. A multi-node allocation without a template gets torchrun's task layout
    (one task per node) instead of the single template's refusal."""
    from gpuhpc.errors import UserInputError

    fields = {**vars(ns), "command": command, "grace": 1, "name": ns.name or DEFAULT_NAME}
    try:
        return build_spec(SimpleNamespace(**fields))
    except UserInputError as exc:
        if exc.field != "template" or ns.template is not None:
            raise
    return build_spec(SimpleNamespace(**{**fields, "template": "torchrun"}))


def salloc_options(spec) -> list[tuple[str, str | None]]:
    """The job's sbatch options (:func:`~gpuhpc.jobs.spec.sbatch_options`, the one translation)
    less the batch-only ones; an option salloc does not take is refused (exit 2) naming the field."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.jobs.spec import parse_sbatch_arg, sbatch_options
    from gpuhpc.slurm.interactive import SALLOC_OPTIONS

    extra = {parse_sbatch_arg(a, "sbatch_args")[0] for a in spec.resources.extra}
    out = []
    for opt, value in sbatch_options(spec.resources, spec, batch_signal=False):
        if opt in BATCH_ONLY:
            continue
        if opt not in SALLOC_OPTIONS:
            field = "sbatch_args" if opt in extra else opt.replace("-", "_")
            raise UserInputError(f"an interactive allocation (salloc) has no --{opt}", field=field,
                                 hint="drop it for gpuhpc shell; gpuhpc submit takes it")
        out.append((opt, value))
    return out


def shell_argv(spec) -> list[str]:
    """The ``salloc ... srun --pty ... -- COMMAND`` argv for ``spec`` (nothing runs)."""
    from gpuhpc.jobs.spec import container_srun_args
    from gpuhpc.slurm.interactive import salloc_pty

    return salloc_pty(salloc_options(spec), spec.command,
                      step_options=container_srun_args(spec.resources, spec.workdir))


def dry_run_line(spec, argv: list[str]) -> str:
    """What ``--dry-run`` prints: the argv, shell-quoted, behind ``env KEY=VALUE`` for ``--env``."""
    import shlex

    env = [f"{k}={v}" for k, v in sorted(spec.env.items())]
    return shlex.join([*(["env", *env] if env else []), *argv])


def run_shell(spec, *, client=None) -> int:
    """The checks a submission passes, then the interactive allocation; its exit status."""
    from gpuhpc.jobs.admission import check_after, reserve
    from gpuhpc.jobs.handle import slurm_client
    from gpuhpc.jobs.script_mode import with_fewest_switches
    from gpuhpc.jobs.spec import check_container_policy, check_fits_on
    from gpuhpc.slurm.interactive import check_terminal, run_on_terminal

    c = slurm_client(client)
    check_terminal(c.runner)                       # over SSH without a pty: exit 2, nothing held
    check_container_policy(spec.resources)         # the site's registries and digest pins (exit 2)
    if spec.after or spec.after_any:
        check_after(c, spec.after, spec.after_any)
    spec = with_fewest_switches(spec, c)
    argv = shell_argv(spec)
    check_fits_on(spec.resources, c)               # no node can hold it: exit 2
    hold = reserve(spec.resources, spec.name, c)   # the ledger's hold (exit 3 over budget)
    attached: list[str] = []

    def attach(job_id: str) -> None:
        attached.append(job_id)
        if hold is not None:
            hold.attach_job(job_id)

    try:
        rc = run_on_terminal(argv, c.runner, env=dict(spec.env), on_job_id=attach)
    except BaseException:
        if hold is not None and not attached:
            hold.release()
        raise
    if hold is not None and not attached:          # salloc refused it: nothing ran, nothing to charge
        hold.release()
    return rc


@click.command("shell", params=_params(), context_settings={"allow_interspersed_args": False},
               short_help=help_for("shell"),
               help="An interactive allocation with the resources a job gets (the options and job file of "
                    "gpuhpc submit), checked as a submission is: salloc, then the command (default: your "
                    "$SHELL -l; in an --image, bash -l) in one srun --pty step on the first node. Put the "
                    "command after --. The allocation ends with the command.")
def shell(**params: Any) -> int:
    from gpuhpc.transport import default_runner

    ns = SimpleNamespace(**{k: (v or None) if isinstance(v, tuple) else v for k, v in params.items()})
    ns.template = None
    cmd = list(ns.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    runner = None
    if not cmd:
        runner = default_runner()
        cmd = default_command(runner, ns.image)
    spec = shell_spec(ns, cmd)
    argv = shell_argv(spec)             # an option salloc does not take: exit 2 before anything runs
    if ns.dry_run:
        sys.stdout.write(dry_run_line(spec, argv) + "\n")
        return 0
    from gpuhpc.slurm.client import SlurmClient

    return run_shell(spec, client=SlurmClient(runner or default_runner()))


def run(argv: list[str]) -> int:
    """``gpuhpc shell ARGV`` (everything after ``shell``): its exit status. Raises GpuhpcError."""
    from gpuhpc.cli.main import invoke

    return invoke(shell, argv, "gpuhpc shell")

"""gpuhpc command line: one click group whose commands load lazily (click's documented
``LazyGroup`` pattern, as hatch does). Commands stay thin: parse, call the Python API, render.

Start-up: ``gpuhpc CMD ...`` imports only the module of ``CMD`` (:data:`COMMANDS`), and
``gpuhpc --help`` lists :data:`COMMANDS` without importing any of them. Heavy imports
(pydantic, sqlalchemy, jinja2, rich) happen inside command functions.

Adding a command: write it with click in a module under ``gpuhpc/cli/`` and add one line to
:data:`COMMANDS` (name -> ``"module:attribute"``, one-line help); tests/unit/test_cli_errors.py
checks the line against the command.
"""
from __future__ import annotations

import importlib
import sys

import click

HELP = "GPU Slurm clusters: build them (conf, ansible), use them (submit, jobs, sweeps), pay for them (ledger)."

# Top-level command -> ("module:attribute" under gpuhpc.cli, its one-line help), in the order
# `gpuhpc --help` lists them. The help is printed from here, so `--help` imports no command.
COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("submit:submit", "Submit a command as a batch job (gpuhpc submit --help for the options)."),
    "jobs": ("jobs:jobs", "Your jobs: state, elapsed time and GPU-hours so far."),
    "status": ("jobs:status", "One job's state (raw Slurm state kept), restarts, resources and log file."),
    "logs": ("jobs:logs", "Print a job's output (the --output file, found via scontrol or the log dir)."),
    "cancel": ("jobs:cancel", "Cancel job(s) (scancel)."),
    "shell": ("shell:shell", "An interactive allocation with the resources a job gets (salloc + srun --pty), for debugging."),
    "conf": ("conf:conf", "Cluster spec -> Slurm config files (slurm.conf, gres.conf, ...)."),
    "cluster": ("cluster:cluster", "Inspect the Slurm cluster."),
    "db": ("db:db", "Ledger database: migrations."),
    "ledger": ("ledger:ledger", "Cost ledger: ingest usage, prices, accounts, Slurm sync."),
    "report": ("report:report", "Cost reports."),
    "quota": ("quota:quota", "Quotas: GPU-hours and/or money per period."),
    "topology": ("topology:topology", "Fabric topology: topology.conf from ibnetdiscover, synthetic fabrics."),
    "node": ("node:node_group", "GPU node inventory: gres.conf lines, node sizing checks."),
    "stage": ("stage:stage", "Stage data and checkpoints to/from S3 (GPUHPC_S3_ENDPOINT_URL, AWS_* credentials)."),
    "sweep": ("sweep:sweep", "Hyper-parameter sweeps: job arrays that split to fit the cluster, run detached, resume."),
    "placement": ("placement:placement_cmd", "The leaf switches a job spanned against the fewest it could have had."),
    "profile": ("profile:profile", "A profiled job's traces (one per rank and restart) and the command that opens them."),
    "sprint": ("sprint:sprint", "Profiling sprint: throughput, utilisation and $/throughput across batch size and placement."),
    "report-metric": ("report_metric:report_metric",
                      "Record a metric from inside a job or sweep trial (gpuhpc.report for shells)."),
    "cmdserver": ("cmdserver:cmdserver",
                  "The opt-in command server behind the compiled gpuhpc client (fast scripted submission)."),
    "power": ("power:power", "Elastic capacity: Slurm's resume/suspend programs for cloud nodes, the reconciler."),
    "image": ("image:image", "Container images: pin a tag to its digest; the node image cache."),
    "completion": ("completion:completion", "Print the shell completion script: eval \"$(gpuhpc completion bash)\"."),
}


def help_for(name: str) -> str:
    """The one-line help of the top-level command ``name`` (its module passes it to click)."""
    return COMMANDS[name][1]


_state = {"debug": False}           # --debug of the command running now (reset by main())


def debugging() -> bool:
    """Whether ``--debug`` was given (``GPUHPC_DEBUG`` is read by :func:`run_guarded`)."""
    return _state["debug"]


def run_guarded(call, debug=lambda: False) -> int:
    """Run ``call()`` and map gpuhpc's errors to exit codes: a ``GpuhpcError`` prints one line
    (``error: ...``) and returns its code (2 = bad input), Ctrl-C returns 130, any other
    exception prints one line and returns 1. With ``--debug``/``GPUHPC_DEBUG`` the exception
    propagates with its traceback. Every command runs under it (:func:`gpuhpc.cli.main.main`)."""
    import sys

    from gpuhpc.config import getenv
    from gpuhpc.errors import GpuhpcError

    try:
        return call() or 0
    except GpuhpcError as exc:
        if debug() or getenv("GPUHPC_DEBUG"):
            raise
        sys.stderr.write(f"error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as exc:        # a bug: one line, the traceback only on request
        if debug() or getenv("GPUHPC_DEBUG"):
            raise
        sys.stderr.write(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for a traceback)\n")
        return 1


def columns() -> int:
    """The terminal's width as shutil.get_terminal_size() finds it (``COLUMNS`` first), without
    importing shutil."""
    import os
    import sys

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


class LazyGroup(click.Group):
    """A group that knows its commands' names and one-line help (``lazy``) and imports a
    command's module on first use."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *(n for n in super().list_commands(ctx) if n not in self.lazy)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, _, attr = self.lazy[cmd_name][0].partition(":")
        return getattr(importlib.import_module(f"gpuhpc.cli.{module}"), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, help_) in self.lazy.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str):
        from click.shell_completion import CompletionItem

        items = [CompletionItem(n, help=h) for n, (_, h) in self.lazy.items() if n.startswith(incomplete)]
        return items + click.Command.shell_complete(self, ctx, incomplete)

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        # the help's width from COLUMNS or the terminal, without click's shutil import
        extra.setdefault("terminal_width", max(40, min(columns(), 100)))
        return super().make_context(info_name, args, parent=parent, **extra)


def _set_debug(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    _state["debug"] = bool(value)


def _select_cluster(ctx: click.Context, param: click.Parameter, name: str | None) -> None:
    """``--cluster NAME``: every command's runner (gpuhpc.transport.default_runner) goes to the
    profile NAME; an unknown name exits 2 listing the profiles."""
    if name is None or ctx.resilient_parsing:
        return
    import os

    from gpuhpc.config import cluster_profile

    cluster_profile(name)
    os.environ["GPUHPC_CLUSTER"] = name


@click.group(cls=LazyGroup, lazy=COMMANDS, name="gpuhpc", help=HELP, no_args_is_help=True)
@click.option("--debug", is_flag=True, is_eager=True, expose_value=False, callback=_set_debug,
              help="Show tracebacks (also GPUHPC_DEBUG=1).")
@click.option("--cluster", metavar="NAME", expose_value=False, callback=_select_cluster,
              help="Run on the cluster profile NAME ([clusters.NAME] in ~/.config/gpuhpc/config.toml; "
                   "also GPUHPC_CLUSTER).")
def cli() -> None:
    """The root group (its options only)."""


def input_error(exc: click.UsageError, prog_name: str = "gpuhpc"):
    """click's usage error as gpuhpc's :class:`~gpuhpc.errors.UserInputError` (one line, exit 2)."""
    from gpuhpc.errors import UserInputError

    where = exc.ctx.command_path if exc.ctx is not None else prog_name
    return UserInputError(exc.format_message(), hint=f"see {where} --help")


def invoke(command: click.Command, args: list[str], prog_name: str = "gpuhpc") -> int:
    """Run a click ``command`` on ``args`` and return its exit code: a command's return value
    (an int) or 0; click's usage errors raise :class:`gpuhpc.errors.UserInputError` (exit 2,
    one line); ``--help`` returns 0; Ctrl-C returns 130."""
    try:
        rv = command.main(args=list(args), prog_name=prog_name, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:      # a group without a command: its help, exit 2
        sys.stderr.write(exc.ctx.get_help() + "\n")
        return 2
    except click.UsageError as exc:
        raise input_error(exc, prog_name) from None
    except click.Abort as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            sys.stderr.write("interrupted\n")
            return 130
        sys.stderr.write("aborted\n")
        return 1
    return rv if isinstance(rv, int) and not isinstance(rv, bool) else 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``[--debug] [--cluster NAME] COMMAND ARGS...``; returns the exit code.
    Errors print one line (``error: ...``) and exit 2 (bad input), 1 (failure) or 3 (quota);
    the traceback only with ``--debug``."""
    args = list(sys.argv[1:] if argv is None else argv)
    _state["debug"] = False
    return run_guarded(lambda: invoke(cli, args), debugging)


if __name__ == "__main__":
    sys.exit(main())

"""gpuhpc command line. Commands stay thin: parse, call the Python API, render.

Start-up: ``gpuhpc CMD ...`` imports only the module of ``CMD`` (:data:`COMMANDS`), and
``gpuhpc --help`` prints :data:`COMMANDS` without importing any of them. A command-group
module either exposes ``register(app)`` (typer) or, for the commands that must start fast
(``submit``, ``jobs``, ``status``, ``logs``, ``cancel``: typer builds pydantic adapters for
every parameter), ``main(argv, debug)`` with one argparse parser per command
(:mod:`gpuhpc.cli._args`). Heavy imports (pydantic, sqlalchemy, jinja2, rich) happen inside
command functions.
"""
from __future__ import annotations

import sys

from gpuhpc.cli import columns, run_guarded

HELP = "GPU Slurm clusters: build them (conf, ansible), use them (submit, jobs, sweeps), pay for them (ledger)."

# Top-level command -> (module under gpuhpc.cli, the one-line help its register() gives it), in the
# order `gpuhpc --help` lists them. A test (tests/unit/test_cli_errors.py) checks this table against
# what the modules register, so add a command here when a module registers a new one.
COMMANDS: dict[str, tuple[str, str]] = {
    "submit": ("submit", "Submit a command as a batch job (gpuhpc submit --help for the options)."),
    "jobs": ("jobs", "Your jobs: state, elapsed time and GPU-hours so far."),
    "status": ("jobs", "One job's state (raw Slurm state kept), restarts, resources and log file."),
    "logs": ("jobs", "Print a job's output (the --output file, found via scontrol or the log dir)."),
    "cancel": ("jobs", "Cancel job(s) (scancel)."),
    "conf": ("conf", "Cluster spec -> Slurm config files (slurm.conf, gres.conf, ...)."),
    "cluster": ("cluster", "Inspect the Slurm cluster."),
    "db": ("ledger", "Ledger database: migrations."),
    "ledger": ("ledger", "Cost ledger: ingest usage, prices, accounts, Slurm sync."),
    "report": ("ledger", "Cost reports."),
    "quota": ("ledger", "Quotas: GPU-hours and/or money per period."),
    "topology": ("topology", "Fabric topology: topology.conf from ibnetdiscover, synthetic fabrics."),
    "node": ("node", "GPU node inventory: gres.conf lines, node sizing checks."),
    "stage": ("stage", "Stage data and checkpoints to/from S3 (GPUHPC_S3_ENDPOINT_URL, AWS_* credentials)."),
    "sweep": ("sweep", "Hyper-parameter sweeps: job arrays that split to fit the cluster, run detached, resume."),
    "report-metric": ("report_metric", "Record a metric from inside a job or sweep trial (gpuhpc.report for shells)."),
    "cmdserver": ("cmdserver", "The opt-in command server behind the compiled gpuhpc client (fast scripted submission)."),
}

USAGE = "Usage: gpuhpc [OPTIONS] COMMAND [ARGS]..."
_OPTIONS = (("--debug", "Show tracebacks (also GPUHPC_DEBUG=1)."),
            ("--cluster NAME", "Run on the cluster profile NAME ([clusters.NAME] in ~/.config/gpuhpc/config.toml; "
                               "also GPUHPC_CLUSTER)."),
            ("--help", "Show this message and exit."))


def _wrap(text: str, width: int, indent: int) -> str:
    """``text`` in lines of at most ``width`` columns, continuation lines indented."""
    lines, line = [], ""
    for word in text.split():
        if line and indent + len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return ("\n" + " " * indent).join(lines)


def help_text(width: int | None = None) -> str:
    """``gpuhpc --help``: the root options and :data:`COMMANDS`, no module imported."""
    width = max(40, min(columns() if width is None else width, 100))
    out = [USAGE, "", "  " + _wrap(HELP, width, 2), "", "Options:"]
    col = max(len(o) for o, _ in _OPTIONS) + 4
    out += [f"  {o:<{col - 2}}{_wrap(h, width, col)}" for o, h in _OPTIONS]
    out += ["", "Commands:"]
    col = max(len(n) for n in COMMANDS) + 4
    out += [f"  {n:<{col - 2}}{_wrap(h, width, col)}" for n, (_, h) in COMMANDS.items()]
    return "\n".join(out) + "\n"


def _usage_error(message: str) -> int:
    """A root usage error, worded as typer words its own (exit 2)."""
    sys.stderr.write(f"{USAGE}\nTry 'gpuhpc --help' for help.\n\nError: {message}\n")
    return 2


def _select_cluster(name: str, debug: bool) -> int:
    """``--cluster NAME``: every command's runner (gpuhpc.transport.default_runner) goes to the
    profile NAME; an unknown name exits 2 listing the profiles."""
    import os

    def check() -> int:
        from gpuhpc.config import cluster_profile

        cluster_profile(name)
        os.environ["GPUHPC_CLUSTER"] = name
        return 0

    return run_guarded(check, lambda: debug)


def build_app(names):
    """A typer app holding the commands ``names`` registered by their modules."""
    import importlib

    import typer

    app = typer.Typer(name="gpuhpc", help=HELP, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False)

    @app.callback()
    def _group() -> None:           # keeps the app a group: `gpuhpc CMD ...`, never a lone command
        pass

    for module in dict.fromkeys(COMMANDS[n][0] for n in names):
        mod = importlib.import_module(f"gpuhpc.cli.{module}")
        if hasattr(mod, "register"):
            mod.register(app)
    return app


def main(argv: list[str] | None = None) -> int:
    """Console entry point: ``[--debug] [--help] COMMAND ARGS...``; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = False
    while args and args[0].startswith("-"):
        opt = args.pop(0)
        if opt == "--debug":
            debug = True
        elif opt == "--cluster" or opt.startswith("--cluster="):
            if opt == "--cluster" and not args:
                return _usage_error("Option '--cluster' requires an argument.")
            code = _select_cluster(opt.partition("=")[2] if "=" in opt else args.pop(0), debug)
            if code:
                return code
        elif opt == "--help":
            sys.stdout.write(help_text())
            return 0
        else:
            return _usage_error(f"No such option: {opt}")
    if not args:                    # like typer's no_args_is_help: the help, exit 2
        sys.stderr.write(help_text())
        return 2
    name = args[0]
    if name not in COMMANDS:
        return _usage_error(f"No such command '{name}'.")
    if name in ("sweep", "report"):     # their state is on the cluster: run there (gpuhpc.cli._oncluster)
        from gpuhpc.cli import _oncluster

        code = _oncluster.main(args, debug)
        if code is not None:
            return code
    import importlib

    mod = importlib.import_module(f"gpuhpc.cli.{COMMANDS[name][0]}")
    if not hasattr(mod, "register"):    # an argparse module (no typer): main(argv, debug)
        return mod.main(args, debug)
    return _run_typer(name, args, debug)


def _run_typer(name: str, args: list[str], debug: bool) -> int:
    import typer

    app = build_app([name])

    def _call() -> int:
        try:
            # without standalone mode typer *returns* the exit code of typer.Exit (and 130 for a
            # Ctrl-C, which it turns into Exit(130)); commands themselves return None
            rv = app(args=args, prog_name="gpuhpc", standalone_mode=False)
        except SystemExit as exc:
            return int(exc.code or 0) if not isinstance(exc.code, str) else 1
        except typer.Exit as exc:
            return exc.exit_code
        except typer.Abort:
            sys.stderr.write("aborted\n")
            return 1
        except typer.TyperException as exc:     # usage errors (typer vendors click): exit 2
            if not hasattr(exc, "show"):
                raise
            exc.show()
            return exc.exit_code
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        if code == 130:
            sys.stderr.write("interrupted\n")
        return code

    return run_guarded(_call, lambda: debug)


if __name__ == "__main__":
    sys.exit(main())

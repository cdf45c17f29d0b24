"""gpuhpc command line. Commands stay thin: parse, call the Python API, render.

Each command group lives in its own module exposing ``register(app)``; heavy imports
(pydantic, sqlalchemy, jinja2, rich) happen inside command functions so that
``gpuhpc submit`` starts fast.
"""
from __future__ import annotations

import importlib
import os
import sys

import typer

from gpuhpc.cli import run_guarded

app = typer.Typer(
    name="gpuhpc",
    help="GPU Slurm clusters: build them (conf, ansible), use them (submit, jobs, sweeps), pay for them (ledger).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# command-group modules under gpuhpc.cli; each defines register(app)
_GROUPS = ("conf", "cluster", "submit", "jobs", "ledger", "topology", "node", "stage", "cmdserver")

_debug = False


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks.", envvar="GPUHPC_DEBUG")) -> None:
    global _debug
    _debug = debug


for _name in _GROUPS:
    try:
        _mod = importlib.import_module(f"gpuhpc.cli.{_name}")
    except ModuleNotFoundError as _exc:  # a group not written yet
        if _exc.name != f"gpuhpc.cli.{_name}":
            raise
        continue
    _mod.register(app)


def _is_click_exception(exc: Exception) -> bool:
    bases = tuple(b for b in (getattr(typer, "TyperException", None),) if b is not None)
    try:
        import click

        bases += (click.ClickException,)
    except ImportError:
        pass
    return isinstance(exc, bases) and hasattr(exc, "show") and hasattr(exc, "exit_code")


def main(argv: list[str] | None = None) -> int:
    """Console entry point: runs the app and maps errors to exit codes."""
    def _call() -> int:
        # without standalone mode typer *returns* the exit code of typer.Exit (and 130 for a
        # Ctrl-C, which it turns into Exit(130)); commands themselves return None
        rv = app(args=argv, prog_name="gpuhpc", standalone_mode=False)
        code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        if code == 130:
            sys.stderr.write("interrupted\n")
        return code

    try:
        return run_guarded(_call, lambda: _debug)
    except SystemExit as exc:  # typer.Exit inside commands
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    except Exception as exc:  # click usage errors and friends (typer >= 0.2x vendors click)
        if isinstance(exc, typer.Exit):
            return exc.exit_code
        if isinstance(exc, typer.Abort):
            sys.stderr.write("aborted\n")
            return 1
        if _is_click_exception(exc):
            exc.show()
            return exc.exit_code  # UsageError -> 2
        if _debug or os.environ.get("GPUHPC_DEBUG"):
            raise
        sys.stderr.write(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for a traceback)\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""argparse for the commands that must start fast (``submit``, ``jobs``, ``status``, ``logs``,
``cancel``): typer builds pydantic adapters for every parameter, which costs more than these
commands' own work. Bad input exits 2 with one line, like the rest of the CLI."""
from __future__ import annotations

import argparse


class ArgParser(argparse.ArgumentParser):
    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(prog=prog, **kwargs)

    def error(self, message: str):
        from gpuhpc.errors import UserInputError

        raise UserInputError(message, hint=f"see {self.prog} --help")


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | int:
    """``parser.parse_args(argv)``, or the exit code when it printed --help (0)."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1

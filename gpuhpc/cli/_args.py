"""argparse for the commands that must start fast (``submit``, ``jobs``, ``status``, ``logs``,
``cancel``): typer builds pydantic adapters for every parameter, which costs more than these
commands' own work. Bad input exits 2 with one line, like the rest of the CLI."""
from __future__ import annotations

import argparse

from gpuhpc.cli import columns


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        # argparse builds a formatter for every add_argument; its default width comes from
        # shutil, whose import (archive modules) costs more than the rest of parsing
        super().__init__(prog, width=max(40, columns()) - 2)


class ArgParser(argparse.ArgumentParser):
    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
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

"""The CLI's rich consoles: data to stdout, diagnostics to stderr. Only gpuhpc.cli uses rich."""
from __future__ import annotations

import functools
import json
import sys
from typing import Any


@functools.cache
def console():
    from rich.console import Console

    return Console()


@functools.cache
def err_console():
    from rich.console import Console

    return Console(stderr=True)


def print_json(data: Any) -> None:
    """Plain JSON on stdout (no rich markup), for scripts."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def warn(message: str) -> None:
    err_console().print(f"[yellow]warning:[/] {message}", highlight=False, markup=True, soft_wrap=True)

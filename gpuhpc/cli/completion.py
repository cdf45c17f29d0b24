"""``gpuhpc completion SHELL``: the shell completion script, click's own
(``_GPUHPC_COMPLETE=bash_source gpuhpc`` prints the same). Command names come from
:data:`gpuhpc.cli.main.COMMANDS` without importing the commands; a command's options and
subcommands from its module."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.main import help_for


@click.command("completion", short_help=help_for("completion"))
@click.argument("shell", type=click.Choice(("bash", "zsh", "fish")))
def completion(shell: str) -> None:
    """Print the completion script for SHELL. Enable it with
    eval "$(gpuhpc completion bash)" in ~/.bashrc (zsh: ~/.zshrc;
    fish: gpuhpc completion fish > ~/.config/fish/completions/gpuhpc.fish)."""
    from click.shell_completion import get_completion_class

    from gpuhpc.cli.main import cli

    comp = get_completion_class(shell)(cli, {}, "gpuhpc", "_GPUHPC_COMPLETE")
    sys.stdout.write(comp.source())

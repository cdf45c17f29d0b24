"""click's shell completion for gpuhpc: bash gets command names (from the table, no command
imported), a group's subcommands and a command's options."""
from __future__ import annotations

import os
import subprocess
import sys


def _complete(words: str) -> list[str]:
    """What bash completion offers after ``words`` (the last one being completed)."""
    parts = words.split(" ")
    env = {**os.environ, "_GPUHPC_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(len(parts) - 1)}
    res = subprocess.run([sys.executable, "-m", "gpuhpc"], capture_output=True, text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    return [line.split(",", 1)[1] for line in res.stdout.splitlines()]


def test_bash_completes_commands_subcommands_and_options():
    assert {"status", "submit", "sweep"} <= set(_complete("gpuhpc s"))
    assert "jobs" not in _complete("gpuhpc s")
    assert {"run", "status", "best"} <= set(_complete("gpuhpc sweep "))
    assert {"--gpus", "--gpu-type"} <= set(_complete("gpuhpc submit --gp"))
    assert "--json" in _complete("gpuhpc status --j")


def test_the_completion_script_is_clicks():
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "completion", "bash"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and "_GPUHPC_COMPLETE=bash_complete" in res.stdout
    same = subprocess.run([sys.executable, "-m", "gpuhpc"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "_GPUHPC_COMPLETE": "bash_source"})
    assert same.stdout == res.stdout

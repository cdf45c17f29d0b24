"""The gpuhpc CLI as a subprocess, for tests (tests/ is on sys.path through its conftest.py):
the one definition. (The laptop suite's ``laptop.gpuhpc`` runs it over SSH, and the quota
suite's ``gpuhpc_as`` as another user: those are their own.)"""
from __future__ import annotations

import os
import subprocess
import sys


def gpuhpc(*args: str, env: dict | None = None, timeout: float = 120, cwd=None,
           unset: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``python -m gpuhpc ARGS`` in this environment plus ``env``, less the variables named in
    ``unset``; its output captured as text."""
    full = {**os.environ, **(env or {})}
    for name in unset:
        full.pop(name, None)
    return subprocess.run([sys.executable, "-m", "gpuhpc", *args], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=cwd)

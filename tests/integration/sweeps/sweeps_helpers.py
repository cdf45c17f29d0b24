"""Helpers for the sweeps integration tests (a uniquely named module)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
PY = sys.executable


def gpuhpc(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "gpuhpc", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def write_sweep(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def run_sweep(path: Path) -> int:
    res = gpuhpc("sweep", "run", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["sweep_id"]


def results(sid: int) -> list[dict]:
    res = gpuhpc("sweep", "results", str(sid), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def report_cmd(expr: str) -> str:
    """Shell: report ``loss`` = the arithmetic ``expr`` (bash $((...)), over shell variables)."""
    return f"{PY} -m gpuhpc report-metric loss $(( {expr} ))"


def research_quota(monkeypatch, gpu_hours: float) -> None:
    """The ledger on (SQLite in the test's data dir): account research, root in it, a monthly
    GPU-hour quota."""
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    for argv in (["db", "upgrade"], ["ledger", "account", "add", "research"],
                 ["ledger", "user", "add", "root", "--account", "research", "--default"],
                 ["quota", "set", "research", "--gpu-hours", str(gpu_hours), "--period", "month"]):
        res = gpuhpc(*argv)
        assert res.returncode == 0, (argv, res.stderr)

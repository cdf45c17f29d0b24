"""The gpuhpc data dir and ledger for integration tests (tests/ is on sys.path through its
conftest.py): one definition each, used by the jobs and sweeps suites."""
from __future__ import annotations

from pathlib import Path

from cli_helpers import gpuhpc


def private_data_dir(tmp_path: Path, monkeypatch, *unset: str) -> Path:
    """``GPUHPC_DATA_DIR`` (logs, checkpoints, the SQLite ledger, sweeps) in the test's own
    dir, the ledger off unless the test opts in (:func:`research_quota`), and ``unset``
    (``GPUHPC_LOG_DIR``...) removed so that nothing points outside it."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(data))
    for k in unset:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    return data


def research_quota(monkeypatch, gpu_hours: float) -> None:
    """Turn the ledger on (SQLite under the test's GPUHPC_DATA_DIR) with account ``research``,
    user root in it, and a monthly GPU-hour quota on it."""
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    monkeypatch.delenv("GPUHPC_DB_URL", raising=False)
    for argv in (["db", "upgrade"], ["ledger", "account", "add", "research"],
                 ["ledger", "user", "add", "root", "--account", "research", "--default"],
                 ["quota", "set", "research", "--gpu-hours", str(gpu_hours), "--period", "month"]):
        res = gpuhpc(*argv)
        assert res.returncode == 0, (argv, res.stderr)

"""Where the embedded ledger lives (stdlib only, cheap to import)."""
from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """``$GPUHPC_DATA_DIR``, else ``$XDG_DATA_HOME/gpuhpc``, else ``~/.local/share/gpuhpc``."""
    env = os.environ.get("GPUHPC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "gpuhpc"


def default_db_path() -> Path:
    return data_dir() / "ledger.db"


def metrics_dir() -> Path:
    """``$GPUHPC_METRICS_DIR``, else ``<data dir>/metrics``."""
    env = os.environ.get("GPUHPC_METRICS_DIR")
    if env:
        return Path(env).expanduser()
    return data_dir() / "metrics"


def db_url() -> str:
    """``$GPUHPC_DB_URL`` or the embedded SQLite file (which may not exist yet)."""
    url = os.environ.get("GPUHPC_DB_URL", "").strip()
    return url or f"sqlite:///{default_db_path()}"

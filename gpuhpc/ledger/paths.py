"""Where the embedded ledger lives (cheap to import)."""
from __future__ import annotations

from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.fsutil import data_dir

__all__ = ["data_dir", "default_db_path", "metrics_dir", "configured_db_url", "db_url"]


def default_db_path() -> Path:
    return data_dir() / "ledger.db"


def metrics_dir() -> Path:
    """``$GPUHPC_METRICS_DIR``, else ``<data dir>/metrics``."""
    env = getenv("GPUHPC_METRICS_DIR")
    if env:
        return Path(env).expanduser()
    return data_dir() / "metrics"


def configured_db_url() -> str:
    """``$GPUHPC_DB_URL``, else the site config's ``[ledger] db_url`` (``/etc/gpuhpc/config.toml``,
    written by the gpuhpc_login role), else ""."""
    url = (getenv("GPUHPC_DB_URL") or "").strip()
    if not url:
        from gpuhpc.config import site_setting

        url = site_setting("ledger", "db_url").strip()
    return url


def db_url() -> str:
    """:func:`configured_db_url`, else the embedded SQLite file (which may not exist yet)."""
    return configured_db_url() or f"sqlite:///{default_db_path()}"

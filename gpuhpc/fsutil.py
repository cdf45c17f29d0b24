"""Small filesystem helpers shared across gpuhpc: the data and cache directories, atomic writes,
bundled template folders."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def data_dir() -> Path:
    """gpuhpc's per-user data directory (ledger, logs, checkpoints, metrics):
    ``$GPUHPC_DATA_DIR``, else platformdirs' user data dir (``$XDG_DATA_HOME/gpuhpc``, else
    ``~/.local/share/gpuhpc`` on Linux)."""
    env = os.environ.get("GPUHPC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir     # ~2 ms after what submit imports anyway

    return Path(user_data_dir("gpuhpc", appauthor=False))


def cache_dir() -> Path:
    """``$GPUHPC_CACHE_DIR``, else platformdirs' user cache dir (``~/.cache/gpuhpc`` on Linux)."""
    env = os.environ.get("GPUHPC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("gpuhpc", appauthor=False))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int | None = 0o644) -> Iterator[Path]:
    """A temporary path next to ``path`` to write (or download) into; when the block ends
    without an error it is renamed over ``path`` (with ``mode``), else removed. Readers see
    the old content or the new, never a partial file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o644, *,
                 fsync: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` atomically (see :func:`atomic_path`);
    ``fsync`` flushes it to disk before the rename (checkpoints, state that must survive a crash)."""
    with atomic_path(path, mode) as tmp:
        with open(tmp, "wb" if isinstance(data, bytes) else "w") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())


def bundled_dir(name: str) -> Path:
    """A template directory shipped with gpuhpc (``job-templates``, ``slurm-conf``): the
    checkout's top-level one when running from a checkout (or an editable install), else the
    copy a wheel carries in ``gpuhpc/_data/`` (see setup.py)."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / name
    return checkout if checkout.is_dir() else package / "_data" / name

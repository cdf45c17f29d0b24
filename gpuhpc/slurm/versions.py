"""The local Slurm tools' version without a subprocess per process: ``sinfo --version`` once per
``sinfo`` binary (its resolved path, size and mtime), remembered in the user's cache directory
(``$XDG_CACHE_HOME/gpuhpc/slurm-version.json``). An upgrade replaces the binary, so the key
changes and the next call asks ``sinfo`` again. Nothing here is needed for correctness: an
unreadable or unwritable cache only costs the subprocess."""
from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuhpc" / "slurm-version.json"


def local_version(path_env: str | None, ask: Callable[[], str]) -> tuple[int, int, int]:
    """The version of the ``sinfo`` found on ``path_env`` (a PATH); ``ask()`` runs
    ``sinfo --version`` when the cache does not know that binary."""
    from gpuhpc.slurm.parsers import parse_version

    exe = shutil.which("sinfo", path=path_env)
    key = None
    if exe:
        try:
            real = os.path.realpath(exe)
            st = os.stat(real)
            key = f"{real}:{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            key = None
    cache = _cache_file()
    known: dict[str, str] = {}
    if key:
        try:
            known = json.loads(cache.read_text())
            if isinstance(known, dict) and isinstance(known.get(key), str):
                return parse_version(known[key])
        except (OSError, ValueError):
            known = {}
    version = parse_version(ask())
    if key:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            known = {k: v for k, v in known.items() if isinstance(v, str) and not k.startswith(key.split(":")[0] + ":")}
            known[key] = ".".join(map(str, version))
            tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, cache)
        except OSError:
            pass
    return version

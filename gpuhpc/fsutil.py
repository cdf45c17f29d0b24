"""Small filesystem helpers shared across gpuhpc."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename:
    readers see the old content or the new, never a partial file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def bundled_dir(name: str) -> Path:
    """A template directory shipped with gpuhpc (``job-templates``, ``slurm-conf``): the
    checkout's top-level one when running from a checkout (or an editable install), else the
    copy a wheel carries in ``gpuhpc/_data/`` (see setup.py)."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / name
    return checkout if checkout.is_dir() else package / "_data" / name

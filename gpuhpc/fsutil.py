"""Small filesystem helpers shared across gpuhpc: the data and cache directories, atomic writes,
bundled template folders, a file's sha256."""
from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpuhpc.config import getenv


def data_dir() -> Path:
    """gpuhpc's per-user data directory (ledger, logs, checkpoints, metrics):
    ``$GPUHPC_DATA_DIR``, else platformdirs' user data dir (``$XDG_DATA_HOME/gpuhpc``, else
    ``~/.local/share/gpuhpc`` on Linux). Created 0700 when missing (job logs, checkpoints and
    pickled calls are private); an existing one is left as its owner made it."""
    env = getenv("GPUHPC_DATA_DIR")
    if env:
        path = Path(env).expanduser()
    else:
        from platformdirs import user_data_dir     # ~2 ms after what submit imports anyway

        path = Path(user_data_dir("gpuhpc", appauthor=False))
    try:
        os.makedirs(path, 0o700, exist_ok=True)
    except OSError:
        pass            # a read-only home: the caller's own write says so
    return path


def cache_dir() -> Path:
    """``$GPUHPC_CACHE_DIR``, else platformdirs' user cache dir (``~/.cache/gpuhpc`` on Linux)."""
    env = getenv("GPUHPC_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("gpuhpc", appauthor=False))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int | None = 0o600) -> Iterator[Path]:
    """A temporary path next to ``path`` to write (or download) into; when the block ends
    without an error it is renamed over ``path`` (with ``mode``, default 0600: pass 0o644 for
    a file others must read), else removed. Readers see the old content or the new, never a
    partial file. The temporary file is made with O_EXCL|O_NOFOLLOW and its mode set through
    a descriptor, so a link planted in the directory is never followed."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    made = os.fstat(fd)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if mode is not None:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != (made.st_dev, made.st_ino):
                    raise PermissionError(f"{tmp} was replaced while being written")
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | os.PathLike[str], data: str | bytes, mode: int = 0o600, *,
                 fsync: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` atomically: a new file next to it
    (``mkstemp``: O_CREAT|O_EXCL|O_NOFOLLOW), written, ``fchmod``-ed to ``mode`` (default 0600:
    pass 0o644 for a file others must read) and renamed over ``path``, all through the one
    descriptor (no name is re-opened, no link followed). ``fsync`` flushes it to disk before
    the rename (checkpoints, state that must survive a crash)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w", closefd=True) as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            if fsync:
                os.fsync(fh.fileno())
        os.replace(name, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


def check_root_dir(path: str | os.PathLike[str], *, create: int | None = 0o755) -> Path:
    """A directory that only this user (root, for the hooks and cron jobs that call this)
    may write: created with mode ``create`` when missing (None: must exist), else refused
    with PermissionError if it is a symbolic link, not a directory, owned by another user or
    writable by group or others (someone could plant files or links in it). Lock, slot and
    map files live only in such a directory."""
    import stat

    target = Path(path)
    if create is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(target, create)
        except FileExistsError:
            pass
    st = os.lstat(target)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{target} must be a directory owned by uid {os.geteuid()} that group "
                              "and others cannot write (not a symbolic link); remove it or fix its owner and mode")
    return target


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The hex sha256 of the file at ``path`` (read in chunks: any size)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def bundled_dir(name: str) -> Path:
    """A template directory shipped with gpuhpc (``job-templates``, ``slurm-conf``): the
    checkout's top-level one when running from a checkout (or an editable install), else the
    copy a wheel carries in ``gpuhpc/_data/`` (see setup.py)."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / name
    return checkout if checkout.is_dir() else package / "_data" / name


def private_dir_beside(path: str | os.PathLike[str], *, create: bool = True) -> Path | None:
    """A directory of this user only (0700, not a symbolic link) beside ``path``, for when another
    user holds ``path``'s name in a shared parent (a per-user cache directory made first by someone
    else, to deny its owner the cache): the first ``NAME.*`` there that this user owns with no
    access for group or others, else a new one (``mkdtemp``: a name nobody can take first; with
    ``create=False``, None)."""
    import glob
    import stat

    target = Path(path)
    for cand in sorted(target.parent.glob(glob.escape(target.name) + ".*")):
        try:
            st = os.lstat(cand)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            return cand
    return Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent)) if create else None

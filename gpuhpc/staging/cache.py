"""A node-local (NVMe) cache for S3 datasets: the first job on a node downloads, the others
wait on a lock and reuse it; a changed object (new ETag) is fetched again.

The cache is per user, so that no other user can plant files or symlinks that a job then
reads, and no other user's umask decides who may write:

* by default ``${GPUHPC_SCRATCH_ROOT:-/tmp}/gpuhpc-cache-<uid>``;
* on a site that provisions a shared cache root (``GPUHPC_NODE_CACHE_ROOT``, for example
  ``/local/gpuhpc-cache``, owned by root, mode 1777 or 0711), ``<root>/<uid>``.

Either way the user's directory must be a real directory (not a symlink), owned by the user,
with mode 0700 (no access for group or others); gpuhpc creates it so (``mkdir`` 0700, then
``fchmod`` through an ``O_NOFOLLOW`` descriptor) and refuses to use one that is not. When
another user holds the default directory's name (made it first, or put a symlink or a file
there: a denial of service on the victim's cache), it is never used nor followed: the cache goes
to a private directory beside it (``NAME.XXXXXXXX``, :func:`gpuhpc.fsutil.private_dir_beside`,
reused by later jobs) and one line on stderr names the taken path and the fix. A directory the
user owns with a lax mode, or a root given explicitly, is refused, naming the path and the fix.
Files in it are opened with ``O_NOFOLLOW``.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpuhpc.config import getenv
from gpuhpc.errors import StagingError
from gpuhpc.fsutil import private_dir_beside, sha256_file

if TYPE_CHECKING:
    from gpuhpc.staging.s3 import S3Stager, S3Url


class UnsafeCacheError(StagingError):
    """The cache directory (or a file in it) could be controlled by another user."""


def _refuse(path: Path, problem: str, fix: str) -> UnsafeCacheError:
    return UnsafeCacheError(f"refusing to use node cache {path}: {problem}", hint=fix)


def check_private_dir(path: Path, uid: int | None = None) -> None:
    """Raise :class:`UnsafeCacheError` unless ``path`` is a directory (not a symlink) owned by
    ``uid`` (default: this process's effective uid) with no access for group or others."""
    uid = os.geteuid() if uid is None else uid
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"it is a symlink (to {os.readlink(path)})",
                      f"remove it (rm {path}); gpuhpc creates the directory itself")
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "it is not a directory", f"remove it (rm {path})")
    if st.st_uid != uid:
        raise _refuse(path, f"it is owned by uid {st.st_uid}, not by you (uid {uid})",
                      "have its owner or root remove it, or set GPUHPC_SCRATCH_ROOT to a directory of your own")
    if st.st_mode & 0o077:
        raise _refuse(path, f"its mode is {stat.S_IMODE(st.st_mode):04o}: other users can reach it",
                      f"chmod 700 {path} if nothing in it came from another user, else remove it")


def _check_shared_root(root: Path) -> None:
    """A site-provisioned root: a real directory that only root (or sticky mode) protects."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        raise _refuse(root, "GPUHPC_NODE_CACHE_ROOT does not exist",
                      "the site creates it (root-owned, mode 1777 or 0711), or unset GPUHPC_NODE_CACHE_ROOT") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(root, "GPUHPC_NODE_CACHE_ROOT is not a directory (or is a symlink)",
                      "point GPUHPC_NODE_CACHE_ROOT at the real directory")
    if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        raise _refuse(root, f"GPUHPC_NODE_CACHE_ROOT (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) "
                      "lets other users replace your directory in it",
                      "the site makes it root-owned with mode 1777 (sticky) or 0711")


def default_cache_root(env: dict[str, str] | None = None) -> Path:
    """This user's cache directory (not created): see the module docstring."""
    env = os.environ if env is None else env
    uid = os.geteuid()
    shared = getenv("GPUHPC_NODE_CACHE_ROOT", env)
    if shared:
        return Path(shared) / str(uid)
    return Path(getenv("GPUHPC_SCRATCH_ROOT", env)) / f"gpuhpc-cache-{uid}"


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` with mode 0700 (whatever the umask) unless it exists, then check it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        raise _refuse(path, "its parent directory does not exist",
                      "create it, or set GPUHPC_SCRATCH_ROOT to node-local storage that exists") from None
    else:
        try:                        # mkdir's mode went through the umask; never chmod through a link
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            pass                    # replaced since: check_private_dir says how
        else:
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    check_private_dir(path)
    return path


def foreign_owner(path: Path) -> int | None:
    """The uid of another user who holds ``path`` (a directory, symlink or file), else None."""
    try:
        uid = os.lstat(path).st_uid
    except FileNotFoundError:
        return None
    return None if uid == os.geteuid() else uid


def _open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symlink; a missing file raises FileNotFoundError."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "it is a symlink", f"remove it (rm {path})") from None
        raise StagingError(f"cannot open {path}: {exc.strerror}") from exc


class NodeCache:
    """The user's node-local cache of S3 prefixes and objects.

    * **Keyed by the objects' ETags**: an entry serves a URL only while S3 lists the same keys
      with the same ETags (one LIST per fetch); anything else is fetched again.
    * **Verified**: each file's size and modification time are recorded when the download
      completes and checked on every hit, so a truncated, rewritten or deleted file is found
      and the entry fetched again. ``verify="full"`` (``GPUHPC_CACHE_VERIFY=full``) also
      records and checks SHA-256 (reads everything again on a hit: as slow as a copy).
    * **One download**: a per-entry ``flock``; jobs asking at once wait for the first.
    * **LRU by size**: before a download, least recently used entries (not in use) are removed
      until the new one fits ``max_bytes`` (``GPUHPC_NODE_CACHE_MAX_GB``, default 80% of the
      file system the cache is on).
    """

    def __init__(self, stager: S3Stager, root: str | Path | None = None, *, max_bytes: int | None = None,
                 verify: str | None = None) -> None:
        self.stager = stager
        self._shared = None if root else getenv("GPUHPC_NODE_CACHE_ROOT")
        self._default = not root
        self.root = Path(root) if root else default_cache_root()
        self.max_bytes = max_bytes
        self.verify = verify or getenv("GPUHPC_CACHE_VERIFY")
        self.notes: list[str] = []          # what happened (damaged entries, evictions): for the job log

    def _prepare(self) -> Path:
        if self._shared:
            _check_shared_root(Path(self._shared))
        try:
            return ensure_private_dir(self.root)
        except UnsafeCacheError:
            owner = foreign_owner(self.root) if self._default else None
            if owner is None:
                raise
        taken, self.root = self.root, private_dir_beside(self.root)
        self._default = False
        check_private_dir(self.root)
        sys.stderr.write(f"gpuhpc: not using node cache {taken}: uid {owner} made it, not you; using {self.root} "
                         f"instead (have root remove {taken})\n")
        return self.root

    def fetch(self, url: S3Url) -> tuple[Path, bool]:
        """Return (local path, downloaded?) for an S3 prefix or object."""
        root = self._prepare()
        slot = root / hashlib.sha256(str(url).encode()).hexdigest()[:24]
        listed = list(self.stager.list(url))
        objects = {o.key: o.etag for o in listed}
        need = sum(getattr(o, "size", 0) or 0 for o in listed)
        lock = root / f"{slot.name}.lock"
        fd = _open_nofollow(lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.path.islink(slot):
                raise _refuse(slot, "it is a symlink", f"remove it (rm {slot})")
            marker = slot / ".gpuhpc-complete"
            record = self._read_marker(marker)
            if record and record.get("objects") == objects:
                problem = self._damage(slot / "data", record)
                if problem is None:
                    os.utime(fd)                    # last used: the LRU order
                    return slot / "data", False
                self.notes.append(f"cache entry for {url} is damaged ({problem}): fetching it again")
            if slot.exists():
                shutil.rmtree(slot)
            self._evict(root, need, keep=slot.name)
            self.stager.pull(url, slot / "data")
            files = self._record(slot / "data")
            wfd = _open_nofollow(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            with os.fdopen(wfd, "w") as fh:
                fh.write(json.dumps({"url": str(url), "objects": objects, "files": files,
                                     "bytes": sum(f[0] for f in files.values())}, sort_keys=True))
            os.utime(fd)
            return slot / "data", True
        finally:
            os.close(fd)

    # ------------------------------------------------------------ verification
    def _record(self, data: Path) -> dict[str, list]:
        out: dict[str, list] = {}
        for p in sorted(data.rglob("*")):
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                out[p.relative_to(data).as_posix()] = [st.st_size, st.st_mtime_ns,
                                                       sha256_file(p) if self.verify == "full" else None]
        return out

    def _damage(self, data: Path, record: dict) -> str | None:
        """None when every recorded file is there, unchanged; else what is wrong."""
        files = record.get("files")
        if not isinstance(files, dict):
            return "no file list (an older cache entry)"
        for rel, (size, mtime_ns, sha) in files.items():
            try:
                st = os.lstat(data / rel)
            except FileNotFoundError:
                return f"{rel} is missing"
            if not stat.S_ISREG(st.st_mode):
                return f"{rel} is not a regular file"
            if st.st_size != size:
                return f"{rel} has {st.st_size} bytes, not {size}"
            if st.st_mtime_ns != mtime_ns:
                return f"{rel} was modified after the download"
            if self.verify == "full" and sha and sha256_file(data / rel) != sha:
                return f"{rel} does not match its SHA-256"
        return None

    # ------------------------------------------------------------ eviction
    def _limit(self, root: Path) -> int:
        if self.max_bytes is not None:
            return self.max_bytes
        gb = getenv("GPUHPC_NODE_CACHE_MAX_GB")       # a bad value: UserInputError naming it
        if gb is not None:
            return int(gb * 1024 ** 3)
        st = os.statvfs(root)
        return int(st.f_blocks * st.f_frsize * 0.8)

    def _evict(self, root: Path, need: int, keep: str) -> None:
        """Remove least recently used entries (never one in use) until ``need`` more bytes fit."""
        limit = self._limit(root)
        entries = []
        for lock in root.glob("*.lock"):
            name = lock.name[:-5]
            if name == keep:
                continue
            record = self._read_marker(root / name / ".gpuhpc-complete") or {}
            size = record.get("bytes") if isinstance(record.get("bytes"), int) else _tree_size(root / name)
            entries.append((os.lstat(lock).st_mtime_ns, name, size))
        total = sum(e[2] for e in entries)
        for _used, name, size in sorted(entries):
            if total + need <= limit:
                break
            try:
                fd = _open_nofollow(root / f"{name}.lock", os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue                            # in use by another job: keep it
                if os.path.islink(root / name):
                    continue
                shutil.rmtree(root / name, ignore_errors=True)
                total -= size
                self.notes.append(f"evicted {name} ({size / 2**20:.0f} MB, least recently used)")
            finally:
                os.close(fd)

    @staticmethod
    def _read_marker(marker: Path) -> dict | None:
        try:
            fd = _open_nofollow(marker, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with os.fdopen(fd) as fh:
            try:
                data = json.load(fh)
            except ValueError:
                return None
        return data if isinstance(data, dict) else None


def _tree_size(path: Path) -> int:
    if not path.is_dir() or path.is_symlink():
        return 0
    return sum(os.lstat(p).st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())

"""Code snapshots: the job runs the code as it was when it was submitted, not whatever
happens to be on the cluster.

On submit from a git repository, its tracked files (as they are in the working tree, so
uncommitted changes included), its untracked files that git does not ignore, and optional
extra paths are packed into a tar.gz and copied (SFTP over an SSH runner, a plain copy on a
local one: the same :class:`~gpuhpc.transport.Runner` calls) to
``<remote_dir>/snapshots/<sha256>``, unpacked there and marked complete. The name is the
digest of every file's path, mode and content, so an identical snapshot is found there and
never uploaded twice. ``.gpuhpcignore`` at the repository root excludes paths (gitignore-like
patterns: ``data/``, ``*.ckpt``, ``/notes.txt``). A snapshot over ``snapshot_max_mb`` (the
profile's, else ``GPUHPC_SNAPSHOT_MAX_MB``, else 100) is refused, naming its largest files.

When: by default over a remote runner (the laptop) only; ``snapshot: true`` / ``--snapshot``
turns it on for a local one, ``--no-snapshot`` off.
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError, UserInputError

DEFAULT_MAX_MB = 100
_COMPLETE = ".gpuhpc-complete"


@dataclass(frozen=True)
class Snapshot:
    """A packed (not yet uploaded) snapshot: ``files`` as (relative path, absolute path, mode, size)."""

    repo: Path
    files: tuple[tuple[str, str, int, int], ...]
    digest: str

    @property
    def size(self) -> int:
        return sum(f[3] for f in self.files)


@dataclass(frozen=True)
class Uploaded:
    """Where a snapshot is on the cluster and whether this call sent it."""

    digest: str
    path: str
    files: int
    size: int
    uploaded: bool

    def summary(self) -> str:
        return (f"code snapshot {self.digest[:12]}: {self.files} files, {self.size / 2**20:.1f} MB, "
                f"{'uploaded' if self.uploaded else 'already on the cluster'} ({self.path})")


def git_root(start: str | os.PathLike[str]) -> Path | None:
    """The top of the git work tree holding ``start``, or None (not in one, or no git)."""
    try:
        res = subprocess.run(["git", "-C", str(start), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else None


def _git_files(repo: Path) -> list[str]:
    res = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, timeout=60, check=False)
    if res.returncode != 0:
        raise GpuhpcError(f"git ls-files failed in {repo}: {res.stderr.decode(errors='replace').strip()}")
    return sorted({p for p in res.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def read_ignore(repo: Path) -> list[str]:
    try:
        text = (repo / ".gpuhpcignore").read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def ignored(rel: str, patterns: list[str]) -> bool:
    """gitignore-like: ``dir/`` a directory anywhere, ``/x`` anchored at the root, a pattern
    with a ``/`` matched against the whole path, one without against every path component."""
    parts = rel.split("/")
    for pat in patterns:
        directory = pat.endswith("/")
        p = pat.strip("/")
        if not p:
            continue
        anchored = pat.startswith("/") or "/" in p
        if anchored:
            if fnmatch.fnmatchcase(rel, p) or any(fnmatch.fnmatchcase("/".join(parts[:i]), p)
                                                  for i in range(1, len(parts))):
                return True
            continue
        comps = parts[:-1] if directory else parts
        if any(fnmatch.fnmatchcase(c, p) for c in comps):
            return True
    return False


def collect(start: str | os.PathLike[str] = ".", extra: list[str] | tuple[str, ...] = (),
            max_mb: int = DEFAULT_MAX_MB) -> Snapshot | None:
    """The snapshot of the git repository holding ``start`` plus ``extra`` paths (files or
    directories; inside the repository they keep their place, outside it they go to its top
    under their own name); None outside a git repository with no extra paths."""
    repo = git_root(start)
    if repo is None and not extra:
        return None
    base = repo or Path(start).resolve()
    patterns = read_ignore(base)
    chosen: dict[str, str] = {}
    if repo is not None:
        for rel in _git_files(repo):
            chosen[rel] = str(repo / rel)
    for i, item in enumerate(extra):
        src = Path(item).expanduser().resolve()
        if not src.exists():
            raise UserInputError(f"{item} does not exist", field=f"snapshot_paths[{i}]")
        try:
            top = src.relative_to(base).as_posix()
        except ValueError:
            top = src.name
        found = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file() or p.is_symlink())
        for p in found:
            chosen[top if p == src else f"{top}/{p.relative_to(src).as_posix()}"] = str(p)
    files = []
    for rel in sorted(chosen):
        if rel == ".gpuhpcignore" or ignored(rel, patterns) or ".." in rel.split("/"):
            continue
        path = chosen[rel]
        try:
            st = os.stat(path)        # a symlink counts as what it points to
        except FileNotFoundError:     # deleted in the work tree (an uncommitted change too)
            continue
        if not os.path.isfile(path):
            continue
        files.append((rel, path, 0o755 if st.st_mode & 0o111 else 0o644, st.st_size))
    total = sum(f[3] for f in files)
    limit = max_mb * 1024 * 1024
    if total > limit:
        largest = sorted(files, key=lambda f: -f[3])[:5]
        raise UserInputError(
            f"code snapshot of {base} is {total / 2**20:.1f} MB, over the {max_mb} MB limit; largest: "
            + ", ".join(f"{f[0]} ({f[3] / 2**20:.1f} MB)" for f in largest),
            field="snapshot",
            hint="exclude them in .gpuhpcignore (or stage data through S3: inputs:), or raise snapshot_max_mb")
    h = hashlib.sha256()
    for rel, path, mode, _size in files:
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0" + str(mode).encode() + b"\0")
        h.update(_file_digest(path).encode() + b"\n")
    return Snapshot(base, tuple(files), h.hexdigest())


def _file_digest(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def pack(snap: Snapshot, dest: str) -> None:
    """A reproducible tar.gz of the snapshot (sorted, no owners, no times)."""
    import tarfile

    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        for rel, path, mode, _size in snap.files:
            info = tarfile.TarInfo(rel)
            info.size = os.path.getsize(path)
            info.mode, info.mtime = mode, 0
            with open(path, "rb") as fh:
                tar.addfile(info, fh)


def remote_base(runner: Any) -> str:
    """Where snapshots and Python-mode calls live where the runner runs: the profile's
    ``remote_dir``, else ``GPUHPC_REMOTE_DIR``, else ``~/.cache/gpuhpc`` there."""
    settings = getattr(runner, "settings", {}) or {}
    base = settings.get("remote_dir") or getenv("GPUHPC_REMOTE_DIR")
    if base.startswith("~/"):
        base = base[2:]
    return base if base.startswith("/") else posixpath.join(runner.home(), base)


def max_mb(runner: Any) -> int:
    settings = getattr(runner, "settings", {}) or {}
    if settings.get("snapshot_max_mb"):
        return int(settings["snapshot_max_mb"])
    return getenv("GPUHPC_SNAPSHOT_MAX_MB")          # DEFAULT_MAX_MB when unset


# The unpack step, run where the job will run: positional arguments, never interpolated.
_UNPACK = ('set -e; d="$1"; t="$2"; tmp="$d.tmp.$$"; mkdir -p "$tmp"; tar -xzf "$t" -C "$tmp"; '
           f': > "$tmp/{_COMPLETE}"; if [ -e "$d/{_COMPLETE}" ]; then rm -rf "$tmp"; '
           'else rm -rf "$d"; mv "$tmp" "$d"; fi; rm -f "$t"')


def upload(snap: Snapshot, runner: Any) -> Uploaded:
    """Make the snapshot present where ``runner`` runs (once: its digest names it)."""
    target = posixpath.join(remote_base(runner), "snapshots", snap.digest)
    if runner.exists(posixpath.join(target, _COMPLETE)):
        return Uploaded(snap.digest, target, len(snap.files), snap.size, False)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="gpuhpc-snap-") as tmp:
        local = os.path.join(tmp, "snapshot.tar.gz")
        pack(snap, local)
        tar = f"{target}.{os.getpid()}.tar.gz"
        runner.put_file(local, tar, 0o600)
    res = runner.run(["sh", "-c", _UNPACK, "gpuhpc-unpack", target, tar], timeout=300)
    if not res.ok:
        raise GpuhpcError(f"unpacking the code snapshot in {target} failed: {(res.stderr or res.stdout).strip()}")
    return Uploaded(snap.digest, target, len(snap.files), snap.size, True)


def wanted(setting: bool | None, runner: Any) -> bool:
    """None (the default): snapshot only when submitting over a remote runner."""
    return (not runner.is_local) if setting is None else bool(setting)


def workdir_in(snap: Snapshot, uploaded: Uploaded, cwd: str | None = None) -> str:
    """Where the job starts: the snapshot's copy of the submitting directory."""
    try:
        rel = Path(cwd or os.getcwd()).resolve().relative_to(snap.repo).as_posix()
    except ValueError:
        rel = "."
    return uploaded.path if rel == "." else posixpath.join(uploaded.path, rel)

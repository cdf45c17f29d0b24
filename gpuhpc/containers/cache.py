"""The node image cache (docs/containers.md): an image pinned by digest is imported once per node
into the node's scratch, as the squashfs file enroot makes (``enroot import -o``), and every later
job of the same user on that node starts from that file (``--container-image=/…/DIGEST.sqsh``)
instead of pulling and compressing the image again.

- **Where:** ``[containers] node_cache_dir`` of the site config (the node's scratch, e.g.
  ``/scratch/gpuhpc-images``), one directory per uid (mode 0700): ``DIR/UID/HEX.sqsh``, HEX the
  manifest digest's. Without ``node_cache_dir`` nothing is cached (pyxis imports per job).
  ``DIR`` must be root's (or this user's), sticky if others may write it. When another user
  holds the name ``DIR/UID`` (made it first, or put a symlink there: a denial of service on the
  victim's cache), it is never used nor followed: the user's images go to a private
  ``DIR/UID.XXXXXXXX`` beside it (:func:`gpuhpc.fsutil.private_dir_beside`, reused by later jobs)
  and the job's log says so in one line. Root's ``DIR/shared`` held by anyone else is refused.
- **Once:** an exclusive ``flock`` on ``DIR/UID/.lock`` around the check and the import: jobs of
  one user starting together on a node wait for the first import, then reuse it.
- **Shared:** with ``node_cache_shared = true`` root's imports (``gpuhpc image prefetch`` run as
  root) go to ``DIR/shared`` (mode 0755, files 0644) and every user's jobs start from a file
  there before looking in their own directory; a file there counts only if root owns it and
  nobody else can write it or its directory.
- **Size:** ``node_cache_limit_gb`` (default: none); after an import the least recently used
  files (a use touches the file) are removed until the cache fits, never the one just imported.
- **Record:** ``DIR/UID/imports.jsonl`` gets one line per import and eviction (what ``gpuhpc
  image cache`` shows); each use says on stderr (the job's log) whether it imported or reused.

Only pinned references are cached (a tag may move: it is pulled per job as before).
``python -m gpuhpc.containers.cache ensure REF`` prints the file to use (the job scripts call it);
in a job on several nodes it first fills every node of the job (one srun step, one task per node).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuhpc.containers.image import ImageRef, parse_ref
from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.fsutil import private_dir_beside

LOG = "imports.jsonl"


@dataclass(frozen=True)
class CacheSettings:
    """``[containers] node_cache_dir`` / ``node_cache_limit_gb`` of the site config."""

    root: str | None = None
    limit_bytes: int | None = None
    shared: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.root)


def settings(env: Mapping[str, str] | None = None) -> CacheSettings:
    """The node cache's settings from the site config (``GPUHPC_SITE_CONFIG``, else
    ``/etc/gpuhpc/config.toml``); the node and the submit host read the same file."""
    from gpuhpc import config

    path = config.site_config_path(os.environ if env is None else env)
    table = config.read_file(path, "site").get("containers", {})
    root = table.get("node_cache_dir") or None
    if root is not None and not os.path.isabs(root):
        raise UserInputError(f"{root!r} is not an absolute path", field=f"{path}: containers.node_cache_dir")
    limit = table.get("node_cache_limit_gb") or 0
    if limit < 0:
        raise UserInputError("must be a number of GB (0: no limit)", field=f"{path}: containers.node_cache_limit_gb")
    return CacheSettings(root, limit * 1024**3 if limit else None, bool(table.get("node_cache_shared", False)))


def user_dir(s: CacheSettings, uid: int | None = None) -> Path:
    """This user's cache directory; root's is the shared one when the site shares (``shared``).
    For this user, when another user holds its name: the private one beside it, if there is one."""
    me = os.geteuid()
    uid = me if uid is None else uid
    d = _named_dir(s, uid)
    if uid == me and d.name != "shared" and _foreign_owner(d) is not None:
        return private_dir_beside(d, create=False) or d
    return d


def _named_dir(s: CacheSettings, uid: int) -> Path:
    return Path(s.root or "/nonexistent") / ("shared" if s.shared and uid == 0 else str(uid))


def _foreign_owner(p: Path) -> int | None:
    """The uid of another user who holds ``p`` (a directory, symlink or file), else None."""
    try:
        uid = os.lstat(p).st_uid
    except OSError:
        return None
    return None if uid == os.geteuid() else uid


def _root_only(p: Path) -> bool:
    """Owned by root and writable by nobody else (not a symlink): what a shared entry must be."""
    try:
        st = os.lstat(p)
    except OSError:
        return False
    return st.st_uid == 0 and not st.st_mode & 0o022 and not os.path.islink(p)


def shared_entry(s: CacheSettings, ref: ImageRef) -> Path | None:
    """The shared cache's file of ``ref`` (``node_cache_shared``: imported by root, e.g. with
    ``gpuhpc image prefetch``, read by every user), if it is there and only root can change it."""
    if not s.shared:
        return None
    p = Path(s.root or "/nonexistent") / "shared" / entry_name(ref)
    return p if _root_only(p.parent) and _root_only(p) and p.is_file() else None


def entry_name(ref: ImageRef) -> str:
    if not ref.pinned or ref.digest is None:
        raise UserInputError(f"{ref} is not pinned by digest: only pinned images are cached", field="image",
                             hint=f"pin it: gpuhpc image pin {ref}")
    return ref.digest.split(":", 1)[1] + ".sqsh"


# the site's registry credentials, root's only (the gpuhpc_containers role's
# gpuhpc_containers_site_config_dir/.credentials: root's ENROOT_CONFIG_PATH, docs/containers.md)
SITE_CREDENTIALS = "/etc/enroot/site/.credentials"


def site_login(registry: str, path: str | None = None) -> str | None:
    """Root's login for ``registry`` in the site's credentials (netrc ``machine HOST login USER
    password …``), else None. enroot 4.1.2 reads its ``.credentials`` only for a reference that
    names the user (``docker://USER@REGISTRY#REPO``): root's imports (``gpuhpc image prefetch``)
    name it, so that a private image is pulled with the site's token."""
    if os.geteuid() != 0:
        return None
    try:
        words = Path(path or SITE_CREDENTIALS).read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    host = registry.rsplit(":", 1)[0] if registry.count(":") == 1 else registry     # enroot drops the port
    for i in range(len(words) - 3):
        if words[i] == "machine" and words[i + 1] == host and words[i + 2] == "login":
            return words[i + 3]
    return None


def enroot_import(ref: ImageRef, dest: Path) -> None:
    """``enroot import -o DEST docker://REF`` (enroot's settings are its enroot.conf's); as root,
    with the site's login for the registry when it has one (:func:`site_login`)."""
    login = site_login(ref.registry)
    uri = f"docker://{login}@{ref}" if login else f"docker://{ref}"
    res = subprocess.run(["enroot", "import", "--output", str(dest), uri], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0:
        tail = " / ".join(res.stdout.strip().splitlines()[-3:])
        raise GpuhpcError(f"enroot import of {ref} failed (exit {res.returncode}): {tail}")


def _record(d: Path, event: str, **fields: object) -> None:
    line = json.dumps({"time": round(time.time(), 3), "event": event, "host": socket.gethostname(),
                       "job": os.environ.get("SLURM_JOB_ID"), **fields}, sort_keys=True)
    fd = os.open(d / LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _private_dir(d: Path, mode: int = 0o700) -> None:
    """``d`` made with ``mode`` (never through a symlink) unless it exists, then checked: a real
    directory of this user, no more open than ``mode``, in a parent only root (or this user, or
    the sticky bit) lets others change."""
    d.parent.mkdir(parents=True, exist_ok=True)
    top = os.stat(d.parent)
    if top.st_uid not in (0, os.geteuid()) or (top.st_mode & 0o022 and not top.st_mode & 0o1000):
        raise GpuhpcError(f"node image cache {d.parent} (uid {top.st_uid}, mode {top.st_mode & 0o7777:04o}) lets "
                          "other users replace your directory in it: the site makes it root's, mode 1777 or 0755")
    try:
        os.mkdir(d, mode)
    except FileExistsError:
        pass
    else:
        try:
            fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            pass                                    # replaced since: the check below says how
        else:
            try:
                os.fchmod(fd, mode)                 # mkdir's mode went through the umask
            finally:
                os.close(fd)
    st = os.lstat(d)
    if os.path.islink(d) or not os.path.isdir(d) or st.st_uid != os.geteuid():
        raise GpuhpcError(f"node image cache {d} is not a directory of yours (uid {st.st_uid} made it): "
                          f"have root remove it")
    if st.st_mode & 0o777 & ~mode:
        raise GpuhpcError(f"node image cache {d} has mode {st.st_mode & 0o777:04o}: chmod {mode:o} {d} if nothing "
                          "in it came from another user, else remove it")


def entries(d: Path) -> list[dict]:
    """The cached images in ``d``, least recently used first: {file, bytes, last_used}."""
    out = []
    for p in d.glob("*.sqsh"):
        st = p.stat()
        out.append({"file": str(p), "bytes": st.st_size, "last_used": st.st_mtime})
    return sorted(out, key=lambda e: e["last_used"])


def evict(d: Path, limit: int | None, keep: str = "") -> list[str]:
    """Remove the least recently used files until the cache holds at most ``limit`` bytes
    (``keep`` stays). Call with the cache's lock held."""
    if limit is None:
        return []
    current = entries(d)
    total = sum(e["bytes"] for e in current)
    gone = []
    for e in current:
        if total <= limit:
            break
        if Path(e["file"]).name == keep:
            continue
        Path(e["file"]).unlink(missing_ok=True)
        total -= e["bytes"]
        gone.append(e["file"])
        _record(d, "evict", file=e["file"], bytes=e["bytes"])
    return gone


def ensure(ref: ImageRef, s: CacheSettings, *, importer: Callable[[ImageRef, Path], None] | None = None,
           say: Callable[[str], None] | None = None) -> tuple[Path, bool]:
    """(the squashfs file of ``ref`` in this user's cache on this node, whether it was imported
    now). Imports it once (``importer``, default :func:`enroot_import`, under the cache's lock)
    when missing; marks it used."""
    importer = importer or enroot_import
    say = say or (lambda m: sys.stderr.write(f"gpuhpc: {m}\n"))
    if os.geteuid() != 0 and (shared := shared_entry(s, ref)) is not None:
        say(f"image {ref} reused from the shared node cache ({shared})")
        return shared, False
    d = _named_dir(s, os.geteuid())
    if d.name != "shared" and (owner := _foreign_owner(d)) is not None:
        taken, d = d, private_dir_beside(d) or d
        say(f"not using node cache {taken}: uid {owner} made it, not you; using {d} instead (have root remove {taken})")
    _private_dir(d, 0o755 if d.name == "shared" else 0o700)
    name = entry_name(ref)
    path = d / name
    fd = os.open(d / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if path.is_file():
            os.utime(path)
            say(f"image {ref} reused from the node cache ({path})")
            return path, False
        tmp = d / f".{name}.{os.getpid()}.tmp"
        tmp.unlink(missing_ok=True)
        t0 = time.monotonic()
        try:
            importer(ref, tmp)
            if d.name == "shared":
                os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        took = time.monotonic() - t0
        _record(d, "import", image=str(ref), file=str(path), bytes=path.stat().st_size, seconds=round(took, 2))
        say(f"image {ref} imported into the node cache in {took:.1f} s ({path})")
        for gone in evict(d, s.limit_bytes, keep=name):
            say(f"evicted {gone} (least recently used; node_cache_limit_gb)")
        return path, True
    finally:
        os.close(fd)


def imports(d: Path) -> list[dict]:
    """The records of ``d``'s imports.jsonl (a torn or foreign line is skipped)."""
    out = []
    try:
        text = (d / LOG).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def job_image(image: str, *, fill_job_nodes: bool = True) -> str:
    """What a job step passes to ``--container-image``: the cached file for a pinned ``image``
    when the site has a node cache, else ``image`` unchanged. In a job on several nodes, every
    node of the job is filled first (the same path everywhere)."""
    ref = parse_ref(image)
    s = settings()
    if not s.enabled or not ref.pinned:
        return image
    nodes = os.environ.get("SLURM_JOB_NODELIST", "")
    if fill_job_nodes and int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1 and nodes:
        out = prefetch(image, nodes, within_job=True)        # each node's "imported"/"reused" line, in the log
        sys.stderr.write("".join(f"{line}\n" for line in out.splitlines() if line.startswith("gpuhpc: ")))
    path, _ = ensure(ref, s)
    return str(path)


def step_argv(container_args: list[str], argv: list[str]) -> list[str]:
    """The srun step that runs ``argv`` in a job's image on this node (a sweep's trial):
    ``container_args`` are :func:`gpuhpc.jobs.spec.container_srun_args`' words; the image comes
    from the node cache when the site has one, and the step's container is named after the job."""
    from gpuhpc.slurm import commands

    opts = []
    for word in container_args:
        if word.startswith("--container-image="):
            word = "--container-image=" + job_image(word.split("=", 1)[1], fill_job_nodes=False)
        opts.append(word)
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        opts.append(f"--container-name=gpuhpc-{job}")
    cpus = os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("SLURM_CPUS_ON_NODE") or "1"
    return commands.srun_step([f"--cpus-per-task={cpus}", *opts], argv)


def shell_image_option(image: str) -> str | None:
    """The job script's ``--container-image`` word (shell, quoted) that takes ``image`` from
    the node cache at run time, falling back to ``image`` itself if the cache fails; None when
    the site has no node cache or ``image`` is a tag (pyxis pulls it per job)."""
    import shlex

    if not settings().enabled or not parse_ref(image).pinned:
        return None
    q = shlex.quote(image)
    return f'"--container-image=$("$GPUHPC_PYTHON" -m gpuhpc.containers.cache ensure {q} || printf %s {q})"'


def prefetch(image: str, nodes: str, *, partition: str | None = None, within_job: bool = False,
             client: object | None = None) -> str:
    """Import ``image`` into the node cache of every node in ``nodes`` (a hostlist): one srun
    step, one task per node, each running ``ensure``. Returns the steps' output."""
    from gpuhpc.hostlist import expand
    from gpuhpc.slurm import commands
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport import default_runner

    ref = parse_ref(image, "REF")
    entry_name(ref)
    count = len(expand(nodes))
    argv = commands.srun_per_node(nodes, count, [sys.executable, "-m", "gpuhpc.containers.cache", "ensure", "--here",
                                                 str(ref)], partition=partition, within_job=within_job)
    c = client if isinstance(client, SlurmClient) else SlurmClient(default_runner())
    res = c.run(argv, check=False)
    if res.returncode != 0:
        raise GpuhpcError(f"prefetch of {ref} on {nodes} failed: {(res.stderr or res.stdout).strip()[-300:]}")
    return res.stdout + res.stderr


def main(argv: list[str]) -> int:
    """``ensure [--here] REF``: print the file to give --container-image (REF itself when not cached)."""
    if len(argv) not in (2, 3) or argv[0] != "ensure" or (len(argv) == 3 and argv[1] != "--here"):
        sys.stderr.write("usage: python -m gpuhpc.containers.cache ensure [--here] REF\n")
        return 2
    try:
        print(job_image(argv[-1], fill_job_nodes=len(argv) == 2))
    except GpuhpcError as exc:
        sys.stderr.write(f"gpuhpc: node image cache: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

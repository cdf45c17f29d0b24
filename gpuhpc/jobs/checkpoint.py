"""The checkpoint/requeue contract, from the program's side (stdlib only).

Script mode (``gpuhpc submit``): before a preemption or the time limit your program gets
SIGUSR2; write a checkpoint to ``$GPUHPC_CHECKPOINT_DIR`` and exit; the job template
requeues the job. On restart ``$GPUHPC_RESTART_COUNT`` > 0 and
``$GPUHPC_LATEST_CHECKPOINT`` names the newest checkpoint::

    from gpuhpc.jobs import checkpoint as ckpt
    state = load(ckpt.latest_checkpoint()) if ckpt.latest_checkpoint() else fresh()
    ckpt.install_signal_handler()            # sets ckpt.stop_requested() on SIGUSR2
    for step in ...:
        ...
        if step % k == 0 or ckpt.stop_requested():
            local = os.path.join(ckpt.scratch_dir(), f"step-{step}.pt"); save(local)
            ckpt.save_atomic(local)          # temp name + rename in the checkpoint dir
        if ckpt.stop_requested():
            sys.exit(0)

Python mode (``gpuhpc.submit(fn, ...)``): subclass :class:`Checkpointable`; keep your
progress on ``self``; on SIGUSR2 the object (with its state) is pickled and the job is
requeued; on restart ``__call__`` runs again on the restored object.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_stop = False


# ---------------------------------------------------------------- environment
def checkpoint_dir() -> Path:
    """``$GPUHPC_CHECKPOINT_DIR`` (set by the job templates), else ``./checkpoints``."""
    return Path(os.environ.get("GPUHPC_CHECKPOINT_DIR") or Path.cwd() / "checkpoints")


def scratch_dir() -> Path:
    """``$GPUHPC_SCRATCH``: per-job node-local directory (removed when the job ends)."""
    env = os.environ.get("GPUHPC_SCRATCH")
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return Path(tempfile.mkdtemp(prefix="gpuhpc-scratch-"))


def restart_count() -> int:
    """How many times this job was requeued (``$GPUHPC_RESTART_COUNT`` / ``$SLURM_RESTART_COUNT``)."""
    raw = os.environ.get("GPUHPC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    return int(raw) if raw.isdigit() else 0


def latest_checkpoint(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """The newest *complete* checkpoint: the ``latest`` link if present, else the newest
    visible entry; a sharded step directory counts only with a complete manifest
    (:func:`is_complete`).

    Without ``directory`` the job's ``$GPUHPC_LATEST_CHECKPOINT`` is trusted when set."""
    if directory is None:
        env = os.environ.get("GPUHPC_LATEST_CHECKPOINT")
        if env and os.path.exists(env) and is_complete(env):
            return Path(env)
        directory = checkpoint_dir()
    d = Path(directory)
    link = d / "latest"
    if link.exists() and is_complete(link.resolve()):
        return link.resolve()
    try:
        entries = [p for p in d.iterdir() if not p.name.startswith(".") and p.name != "latest"]
    except FileNotFoundError:
        return None
    entries = [p for p in entries if is_complete(p)]
    return max(entries, key=lambda p: p.stat().st_mtime_ns, default=None)


# ---------------------------------------------------------------- atomic save
def _fsync_tree(path: Path) -> None:
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in paths:
        with open(p, "rb") as fh:
            os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def save_atomic(src: str | os.PathLike[str] | bytes, name: str | None = None, *,
                directory: str | os.PathLike[str] | None = None, update_latest: bool = True) -> Path:
    """Put a checkpoint into the shared checkpoint dir atomically; returns its final path.

    ``src`` is a file or directory (usually written under :func:`scratch_dir` first, on
    node-local NVMe) or raw ``bytes``. It is copied to a temporary name inside the
    destination directory, fsynced, then renamed to ``name``; readers never see a partial
    checkpoint. The ``latest`` symlink is then switched to it (also by rename)."""
    dest_dir = Path(directory) if directory is not None else checkpoint_dir()
    dest_dir.mkdir(parents=True, exist_ok=True)
    if name is None:
        if isinstance(src, bytes):
            raise ValueError("name is required when saving bytes")
        name = Path(src).name
    if not name or name in (".", "..", "latest") or "/" in name or name.startswith("."):
        raise ValueError(f"invalid checkpoint name {name!r}")
    final = dest_dir / name
    tmp = dest_dir / f".tmp-{name}.{_host_pid()}"
    if tmp.is_dir():
        shutil.rmtree(tmp)
    try:
        if isinstance(src, bytes):
            with open(tmp, "wb") as fh:
                fh.write(src)
                fh.flush()
                os.fsync(fh.fileno())
        elif Path(src).is_dir():
            shutil.copytree(src, tmp, symlinks=True)
            _fsync_tree(tmp)
        else:
            shutil.copy2(src, tmp)
            _fsync_tree(tmp)
        if final.is_dir() and not final.is_symlink():
            old = dest_dir / f".old-{name}.{_host_pid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    if update_latest:
        _point_latest(dest_dir, name)
    _fsync_dir(dest_dir)
    return final


def _host_pid() -> str:
    """Qualifies temporary names: PIDs repeat across nodes that share a directory."""
    return f"{socket.gethostname()}.{os.getpid()}"


def _point_latest(dest_dir: Path, name: str) -> None:
    link_tmp = dest_dir / f".latest.{_host_pid()}"
    link_tmp.unlink(missing_ok=True)
    os.symlink(name, link_tmp)
    os.replace(link_tmp, dest_dir / "latest")


# ---------------------------------------------------------------- sharded checkpoints
MANIFEST = "MANIFEST.json"
_SHARDED = ".sharded"            # marks a step directory as sharded: complete only with a manifest


class IncompleteCheckpoint(RuntimeError):
    """Rank 0 gave up waiting for every rank's shard; ``latest`` was not moved."""


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in files:
        if p != path:
            h.update(str(p.relative_to(path)).encode() + b"\0")
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _run_id() -> str:
    job = os.environ.get("GPUHPC_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "nojob"
    return f"{job}.{restart_count()}"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}.{_host_pid()}")
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_shard(src: str | os.PathLike[str] | bytes, step: int, *, rank: int | None = None,
               world_size: int | None = None, name: str | None = None,
               directory: str | os.PathLike[str] | None = None, timeout: float | None = None) -> Path:
    """Save this rank's shard of checkpoint ``step``; rank 0 then commits the checkpoint.

    Every rank calls it with its own shard (a file or directory under :func:`scratch_dir`,
    or ``bytes``). The shard is copied into ``<checkpoint dir>/step-<step:08d>/`` under a
    temporary name qualified by host and PID, fsynced and renamed to ``name`` (default
    ``rank-<rank:05d>`` plus the source's suffix); the rank then records the shard's size and
    sha256 in ``.shard-<rank>.json``. Rank 0 waits (at most ``timeout``,
    ``$GPUHPC_SHARD_TIMEOUT``, default 300 s) until every rank of this run recorded its shard,
    writes ``MANIFEST.json`` (world size, shards, checksums) and only then points ``latest``
    at the step. A save that a killed rank left half done has no manifest: it never becomes
    ``latest`` and :func:`latest_checkpoint` skips it. A step that is already committed is
    not rewritten (its path is returned). Raises :class:`IncompleteCheckpoint` on rank 0
    after the timeout. Returns the step directory."""
    from gpuhpc.jobs import ranks

    r = ranks.rank() if rank is None else rank
    world = ranks.world_size() if world_size is None else world_size
    base = Path(directory) if directory is not None else checkpoint_dir()
    sdir = base / step_dir_name(step)
    if (sdir / MANIFEST).exists():
        return sdir
    if name is None:
        if isinstance(src, bytes):
            name = f"rank-{r:05d}.bin"
        else:
            p = Path(src)
            name = f"rank-{r:05d}{p.suffix if p.is_file() else ''}"
    sdir.mkdir(parents=True, exist_ok=True)
    marker = sdir / _SHARDED
    if not marker.exists():
        marker.touch()
    final = save_atomic(src, name, directory=sdir, update_latest=False)
    _write_json(sdir / f".shard-{r:05d}.json",
                {"rank": r, "world_size": world, "file": name, "host": socket.gethostname(),
                 "bytes": _size(final), "sha256": _sha256(final), "run": _run_id()})
    if r == 0:
        commit(step, world, directory=base, timeout=timeout)
    return sdir


def commit(step: int, world_size: int, *, directory: str | os.PathLike[str] | None = None,
           timeout: float | None = None) -> Path:
    """Rank 0's half of :func:`save_shard`: wait for all shards, write the manifest, move ``latest``."""
    base = Path(directory) if directory is not None else checkpoint_dir()
    sdir = base / step_dir_name(step)
    env_t = os.environ.get("GPUHPC_SHARD_TIMEOUT", "")
    limit = timeout if timeout is not None else (float(env_t) if env_t else 300.0)
    run = _run_id()
    deadline = time.monotonic() + limit
    while True:
        shards = []
        for r in range(world_size):
            try:
                rec = json.loads((sdir / f".shard-{r:05d}.json").read_text())
            except (OSError, ValueError):
                break
            if rec.get("run") != run or rec.get("world_size") != world_size:
                break               # left over from an earlier, interrupted run of this step
            shards.append(rec)
        if len(shards) == world_size:
            break
        if time.monotonic() > deadline:
            raise IncompleteCheckpoint(
                f"step {step}: {len(shards)} of {world_size} shards after {limit:.0f}s; "
                f"{sdir} is not committed and latest is unchanged")
        time.sleep(0.05)
    for rec in shards:
        if _size(sdir / rec["file"]) != rec["bytes"]:
            raise IncompleteCheckpoint(f"step {step}: shard {rec['file']} changed size; not committed")
    _write_json(sdir / MANIFEST, {
        "format": 1, "step": step, "world_size": world_size, "run": run,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shards": [{k: rec[k] for k in ("rank", "file", "host", "bytes", "sha256")} for rec in shards]})
    _fsync_dir(sdir)
    _point_latest(base, sdir.name)
    _fsync_dir(base)
    for p in sdir.iterdir():         # temporary names of ranks killed in earlier attempts
        if p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    return sdir


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_complete(path: str | os.PathLike[str], *, verify: bool = False) -> bool:
    """A plain checkpoint (file, or a directory without the sharded marker) is complete; a
    sharded step directory is complete when its manifest lists ``world_size`` shards that are
    all present with their recorded sizes (and, with ``verify``, checksums)."""
    p = Path(path)
    if not p.is_dir() or not (p / _SHARDED).exists():
        return p.exists()
    m = read_manifest(p)
    if m is None or len(m.get("shards", ())) != m.get("world_size"):
        return False
    for s in m["shards"]:
        f = p / s["file"]
        if not f.exists() or _size(f) != s["bytes"] or (verify and _sha256(f) != s["sha256"]):
            return False
    return True


def shard_path(checkpoint: str | os.PathLike[str], rank: int | None = None) -> Path:
    """This rank's shard in a committed step directory (from its manifest)."""
    from gpuhpc.jobs import ranks

    r = ranks.rank() if rank is None else rank
    m = read_manifest(checkpoint)
    if m is None:
        raise FileNotFoundError(f"{checkpoint} has no {MANIFEST}")
    for s in m["shards"]:
        if s["rank"] == r:
            return Path(checkpoint) / s["file"]
    raise FileNotFoundError(f"{checkpoint} has no shard for rank {r} (world size {m['world_size']})")


# ---------------------------------------------------------------- signal
def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
    global _stop
    _stop = True


def install_signal_handler(*signals: int) -> None:
    """Set :func:`stop_requested` when SIGUSR2 (default) arrives; check it between steps."""
    for sig in signals or (signal.SIGUSR2,):
        signal.signal(sig, _on_signal)


def stop_requested() -> bool:
    """True once SIGUSR2 arrived, or once the job script asked every rank to stop (its request
    file in ``$GPUHPC_STOP_DIR``: that also covers a signal that came before this process had
    installed its handler)."""
    if _stop:
        return True
    stop_dir = os.environ.get("GPUHPC_STOP_DIR")
    return bool(stop_dir) and os.path.exists(os.path.join(stop_dir, "requested"))


# ---------------------------------------------------------------- Python mode
class Checkpointable:
    """Base class for callables submitted with :func:`gpuhpc.submit` that survive
    preemption and time limits.

    Implement ``__call__(*args, **kwargs)``; keep progress on ``self`` (update it with
    single assignments, e.g. ``self.state = (step, value)``, so a snapshot is never half
    written). On SIGUSR2 :meth:`checkpoint` is called, the object is pickled with its
    current attributes and the job is requeued (at most ``max_requeues`` times); on
    restart ``__call__`` is called again, with the same arguments, on the restored object.
    ``self.restarts`` tells how many times the job was requeued so far.
    """

    restarts: int = 0

    def checkpoint(self, *args: Any, **kwargs: Any) -> bool | None:
        """The user hook, called on SIGUSR2 before the object is pickled. Make ``self``
        consistent (or save big state with :func:`save_atomic`). Return ``False`` to end
        the job instead of requeueing it."""
        return None


# ---------------------------------------------------------------- shell entry point
def main(argv: list[str] | None = None) -> int:
    """``python -m gpuhpc.jobs.checkpoint save-shard SRC STEP`` (the job templates' shell
    function ``gpuhpc_save_shard``) and ``latest`` (prints the newest complete checkpoint)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["save-shard"] and len(args) == 3 and args[2].isdigit():
        try:
            print(save_shard(args[1], int(args[2])))
        except IncompleteCheckpoint as exc:
            print(f"gpuhpc_save_shard: {exc}", file=sys.stderr)
            return 1
        return 0
    if args == ["latest"]:
        p = latest_checkpoint()
        print(p if p is not None else "")
        return 0
    print("usage: python -m gpuhpc.jobs.checkpoint save-shard SRC STEP | latest", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

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

import os
import shutil
import signal
import tempfile
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
    """The newest checkpoint: the ``latest`` link if present, else the newest visible entry.

    Without ``directory`` the job's ``$GPUHPC_LATEST_CHECKPOINT`` is trusted when set."""
    if directory is None:
        env = os.environ.get("GPUHPC_LATEST_CHECKPOINT")
        if env and os.path.exists(env):
            return Path(env)
        directory = checkpoint_dir()
    d = Path(directory)
    link = d / "latest"
    if link.exists():
        return link.resolve()
    try:
        entries = [p for p in d.iterdir() if not p.name.startswith(".") and p.name != "latest"]
    except FileNotFoundError:
        return None
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
    tmp = dest_dir / f".tmp-{name}.{os.getpid()}"
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
            old = dest_dir / f".old-{name}.{os.getpid()}"
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
        link_tmp = dest_dir / f".latest.{os.getpid()}"
        link_tmp.unlink(missing_ok=True)
        os.symlink(name, link_tmp)
        os.replace(link_tmp, dest_dir / "latest")
    _fsync_dir(dest_dir)
    return final


# ---------------------------------------------------------------- signal
def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
    global _stop
    _stop = True


def install_signal_handler(*signals: int) -> None:
    """Set :func:`stop_requested` when SIGUSR2 (default) arrives; check it between steps."""
    for sig in signals or (signal.SIGUSR2,):
        signal.signal(sig, _on_signal)


def stop_requested() -> bool:
    return _stop


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

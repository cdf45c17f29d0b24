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
            ckpt.save_atomic(local)          # temp name + rename, .gpuhpc-latest, keep the last 3
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

from gpuhpc.config import getenv
from gpuhpc.jobs import ckpt_formats

_stop = False


# ---------------------------------------------------------------- environment
def checkpoint_dir() -> Path:
    """``$GPUHPC_CHECKPOINT_DIR`` (set by the job templates), else ``./checkpoints``."""
    return Path(getenv("GPUHPC_CHECKPOINT_DIR") or Path.cwd() / "checkpoints")


def scratch_dir() -> Path:
    """``$GPUHPC_SCRATCH``: per-job node-local directory (removed when the job ends)."""
    env = getenv("GPUHPC_SCRATCH")
    if env:
        Path(env).mkdir(parents=True, exist_ok=True)
        return Path(env)
    return Path(tempfile.mkdtemp(prefix="gpuhpc-scratch-"))


def restart_count() -> int:
    """How many times this job was requeued (``$GPUHPC_RESTART_COUNT`` / ``$SLURM_RESTART_COUNT``)."""
    raw = os.environ.get("GPUHPC_RESTART_COUNT") or os.environ.get("SLURM_RESTART_COUNT") or "0"
    return int(raw) if raw.isdigit() else 0


# The pointer to the newest complete checkpoint: a hidden symlink whose name no framework uses
# (DeepSpeed writes a `latest` *file* holding its tag into its save dir). gpuhpc before 2026-12
# wrote a `latest` symlink: it is still read (a symlink only), and removed at the next save.
POINTER = ".gpuhpc-latest"
_LEGACY_POINTER = "latest"
_TMP = ".gpuhpc-tmp."            # every temporary name: .gpuhpc-tmp.<job>.<restart>.<host>.<pid>.<what>
SAVED = ".gpuhpc-saved"          # the names save_atomic committed, oldest first (keep-last-N)
DEFAULT_KEEP = 3


def _pointer(d: Path) -> Path | None:
    """Where the pointer (else a legacy ``latest`` symlink, never a ``latest`` file) leads."""
    for link in (d / POINTER, d / _LEGACY_POINTER):
        if link.is_symlink() and link.exists():
            return link.resolve()
    return None


def latest_checkpoint(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """The newest *complete* checkpoint (:func:`complete_checkpoints`'s last), or None.

    Where the ``.gpuhpc-latest`` link points (an older ``latest`` symlink is read too) unless a
    framework completed a newer save since the link moved (torch DCP's ``.metadata``,
    DeepSpeed's ``latest`` file, a Trainer's ``trainer_state.json``, :func:`commit`'s marker:
    :mod:`gpuhpc.jobs.ckpt_formats`); without a link, the newest complete entry. A save cut
    off before its framework's mark, a sharded step without a complete manifest, an empty
    directory and a DeepSpeed ``latest`` file itself are never returned.

    Without ``directory`` the job's ``$GPUHPC_LATEST_CHECKPOINT`` is trusted when set."""
    if directory is None:
        env = getenv("GPUHPC_LATEST_CHECKPOINT")
        if env and os.path.exists(env) and is_complete(env):
            return Path(env)
        directory = checkpoint_dir()
    found = complete_checkpoints(directory)
    return found[-1] if found else None


def complete_checkpoints(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """The complete checkpoints of ``directory`` (default: :func:`checkpoint_dir`), oldest first
    by when each save completed; the pointer's target (``.gpuhpc-latest``) ranks as completed
    when the pointer moved, and only a framework-marked save completed later ranks above it."""
    d = Path(directory) if directory is not None else checkpoint_dir()
    try:
        entries = [p for p in d.iterdir() if not p.name.startswith(".") and p.name != _LEGACY_POINTER]
    except FileNotFoundError:
        return []
    ctx = ckpt_formats.SaveDir.of(d)
    saved = _saved_names(d)
    ranked: list[tuple[int, int, str, Path]] = []
    for p in entries:
        v = _verdict(p, ctx, saved)
        if v is not None and v.complete:
            ranked.append((v.done_at, 1 if v.marked else 0, p.name, p))
    target = _pointer(d)
    if target is not None and is_complete(target):
        link = d / POINTER if (d / POINTER).is_symlink() else d / _LEGACY_POINTER
        try:
            moved = link.lstat().st_mtime_ns
        except OSError:
            moved = 0
        # the pointer wins ties and every unmarked entry (a stray newer file is not a checkpoint)
        ranked = [r for r in ranked if r[3].resolve() != target and r[1] and r[0] > moved]
        return [target, *(r[3] for r in sorted(ranked, key=lambda r: (r[0], r[2])))]
    ranked.sort(key=lambda r: (r[0], r[1], r[2]))
    return [r[3] for r in ranked]


def _saved_names(d: Path) -> set[str]:
    try:
        return {n for n in (d / SAVED).read_text().splitlines() if n}
    except OSError:
        return set()


def _verdict(p: Path, ctx: "ckpt_formats.SaveDir", saved: set[str]) -> "ckpt_formats.Verdict | None":
    """How complete ``p`` (an entry of a checkpoint dir) is: gpuhpc's own saves first (a sharded
    step by its manifest; what save_atomic renamed into place and listed is complete), then the
    framework rules."""
    if p.is_dir() and (p / _SHARDED).exists():
        ok = _sharded_complete(p)
        return ckpt_formats.Verdict("sharded", ok, _mtime_ns(p) if ok else 0)
    if p.name in saved and p.exists():
        return ckpt_formats.Verdict("plain", True, _mtime_ns(p))
    return ckpt_formats.classify(p, ctx)


def _mtime_ns(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return 0


def keep_count(keep: int | None = None) -> int:
    """How many checkpoints a save keeps: ``keep``, else ``$GPUHPC_KEEP_CHECKPOINTS``, else
    :data:`DEFAULT_KEEP`; 0 keeps all."""
    if keep is not None:
        if keep < 0:
            raise ValueError(f"keep must be 0 (all) or more, not {keep}")
        return keep
    env = getenv("GPUHPC_KEEP_CHECKPOINTS")
    return env if env is not None and env >= 0 else DEFAULT_KEEP


# ---------------------------------------------------------------- atomic save
_CHUNK = 4 << 20


class _Copied:
    """What :func:`_copy` wrote: bytes and the sha256 :func:`_sha256` would compute."""

    def __init__(self) -> None:
        self.size = 0
        self.hash = hashlib.sha256()


def _copy_file(src: Path, dst: Path, out: _Copied, h: Any) -> None:
    """Copy ``src`` to a new ``dst``, hashing the bytes as they pass (no read-back of the
    written shard: on a parallel file system that would double the traffic inside the grace
    window), and fsync it."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while True:
            chunk = fin.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            fout.write(chunk)
            out.size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    shutil.copystat(src, dst)


def _copy(src: Path, dst: Path) -> _Copied:
    """Copy a file or a directory tree to ``dst``; every file fsynced, the hash computed while
    writing (the same value as :func:`_sha256` of the copy)."""
    out = _Copied()
    if not src.is_dir():
        _copy_file(src, dst, out, out.hash)
        return out
    dst.mkdir()
    files = []
    for root, dirs, names in os.walk(src):
        rel = Path(root).relative_to(src)
        for d in list(dirs):
            s = Path(root) / d
            if s.is_symlink():                      # kept as a link, not followed (as copytree)
                dirs.remove(d)
                os.symlink(os.readlink(s), dst / rel / d)
            else:
                (dst / rel / d).mkdir()
        files += [rel / n for n in names]
    for rel in sorted(files):              # the order _sha256 hashes in
        s = src / rel
        if s.is_symlink():
            os.symlink(os.readlink(s), dst / rel)
            if not (dst / rel).is_file():
                continue
            out.hash.update(str(rel).encode() + b"\0")  # a link to a file counts its content
            with open(s, "rb") as fh:
                for chunk in iter(lambda: fh.read(_CHUNK), b""):
                    out.hash.update(chunk)
                    out.size += len(chunk)
            continue
        out.hash.update(str(rel).encode() + b"\0")
        _copy_file(s, dst / rel, out, out.hash)
    for root, _dirs, _names in os.walk(dst):
        _fsync(Path(root))
    return out


def _fsync(path: Path) -> None:
    """fsync a file or a directory; one that cannot be opened or synced is left as it is."""
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
                directory: str | os.PathLike[str] | None = None, update_latest: bool = True,
                keep: int | None = None) -> Path:
    """Put a checkpoint into the shared checkpoint dir atomically; returns its final path.

    ``src`` is a file or directory (usually written under :func:`scratch_dir` first, on
    node-local NVMe) or raw ``bytes``. It is copied to a temporary name inside the
    destination directory (every file fsynced), then renamed to ``name``; readers never see a
    partial checkpoint. The ``.gpuhpc-latest`` symlink is then switched to it (also by
    rename, after the directory is fsynced), and of the checkpoints saved this way into the
    directory the newest ``keep`` are kept (:func:`keep_count`: ``$GPUHPC_KEEP_CHECKPOINTS``,
    default 3; 0 keeps all), and the one this run resumed from; entries gpuhpc did not save are
    never removed. Temporaries that
    earlier runs of this job left behind are removed too."""
    final, _ = _save(src, name, Path(directory) if directory is not None else checkpoint_dir())
    if update_latest:
        dest_dir = final.parent
        _point_latest(dest_dir, final.name)
        _record_and_prune(dest_dir, final.name, keep_count(keep))
        clean(dest_dir, earlier_runs_only=True)
    return final


def _save(src: str | os.PathLike[str] | bytes, name: str | None, dest_dir: Path) -> tuple[Path, _Copied]:
    dest_dir.mkdir(parents=True, exist_ok=True)
    if name is None:
        if isinstance(src, bytes):
            raise ValueError("name is required when saving bytes")
        name = Path(src).name
    if (not name or name in (".", "..", _LEGACY_POINTER) or "/" in name or name.startswith(".")
            or any(ord(c) < 32 for c in name)):
        raise ValueError(f"invalid checkpoint name {name!r}")
    final = dest_dir / name
    tmp = dest_dir / _tmp_name(name)
    _remove(tmp)
    try:
        if isinstance(src, bytes):
            copied = _Copied()
            with open(tmp, "xb") as fh:
                fh.write(src)
                fh.flush()
                os.fsync(fh.fileno())
            copied.hash.update(src)
            copied.size = len(src)
        else:
            copied = _copy(Path(src), tmp)
        if final.is_dir() and not final.is_symlink():
            old = dest_dir / _tmp_name(f"old-{name}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        _remove(tmp)
        raise
    _fsync(dest_dir)             # the rename is durable before anything points at it
    return final, copied


def _job_id() -> str:
    return getenv("GPUHPC_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "nojob"


def _tmp_name(what: str) -> str:
    """A temporary name that says whose it is: job, restart (run), host and PID (PIDs repeat
    across nodes that share a directory), so that a job removes only its own leftovers."""
    return f"{_TMP}{_job_id()}.{restart_count()}.{socket.gethostname()}.{os.getpid()}.{what}"


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _point_latest(dest_dir: Path, name: str) -> None:
    link_tmp = dest_dir / _tmp_name("latest")
    link_tmp.unlink(missing_ok=True)
    os.symlink(name, link_tmp)
    os.replace(link_tmp, dest_dir / POINTER)
    _fsync(dest_dir)
    legacy = dest_dir / _LEGACY_POINTER
    if legacy.is_symlink():          # gpuhpc's own former pointer (DeepSpeed's is a file)
        legacy.unlink(missing_ok=True)


def _record_and_prune(dest_dir: Path, name: str, keep: int) -> None:
    """Append ``name`` to the directory's list of saved checkpoints and remove the oldest
    beyond ``keep`` (0: none)."""
    try:
        names = [n for n in (dest_dir / SAVED).read_text().splitlines() if n and n != name]
    except OSError:
        names = []
    names.append(name)
    drop = names[:-keep] if keep and len(names) > keep else []
    spare = _resumed_from()
    kept = [n for n in drop if (dest_dir / n).resolve() == spare]
    for old in drop:
        if old not in kept:
            _remove(dest_dir / old)
    _write_text(dest_dir / SAVED, "".join(f"{n}\n" for n in kept + names[len(drop):]))


def _resumed_from() -> Path | None:
    """The checkpoint this run started from (``$GPUHPC_LATEST_CHECKPOINT``): pruning spares it,
    the last one known to load, until the next run."""
    env = getenv("GPUHPC_LATEST_CHECKPOINT")
    return Path(env).resolve() if env else None


def clean(directory: str | os.PathLike[str] | None = None, *, earlier_runs_only: bool = False,
          committed_step: int | None = None) -> list[Path]:
    """Remove what saves of *this job* left behind in the checkpoint dir: temporaries
    (``.gpuhpc-tmp.<job>.…``, also inside step directories) and sharded step directories that
    this job started and never committed (no manifest). Other jobs' files are never touched.

    At the start of a run (the job template calls ``python -m gpuhpc.jobs.checkpoint clean``)
    everything of this job goes: none of its processes is running. After a save,
    ``earlier_runs_only`` spares this run's temporaries, and uncommitted steps go only when
    below ``committed_step`` (a later one may be in progress). Returns what was removed."""
    base = Path(directory) if directory is not None else checkpoint_dir()
    job, run = _job_id(), str(restart_count())
    mine = f"{_TMP}{job}."
    removed: list[Path] = []

    def stale_tmp(p: Path) -> bool:
        if not p.name.startswith(mine):
            return False
        return not earlier_runs_only or p.name[len(mine):].split(".", 1)[0] != run

    try:
        entries = list(base.iterdir())
    except FileNotFoundError:
        return removed
    for p in entries:
        if stale_tmp(p):
            _remove(p)
            removed.append(p)
            continue
        if not p.name.startswith("step-") or not (p / _SHARDED).exists():
            continue
        if _marker_job(p) == job and not (p / MANIFEST).exists():
            step = p.name[5:]
            if not earlier_runs_only or (committed_step is not None and step.isdigit()
                                         and int(step) < committed_step):
                _remove(p)
                removed.append(p)
                continue
        try:
            inner = list(p.iterdir())
        except OSError:
            continue
        for q in inner:
            if stale_tmp(q):
                _remove(q)
                removed.append(q)
    return removed


def _marker_job(step_dir: Path) -> str | None:
    try:
        return (step_dir / _SHARDED).read_text().strip() or None
    except OSError:
        return None


def _prune_steps(base: Path, committed: Path, keep: int) -> None:
    """Keep the newest ``keep`` committed sharded step directories (by step number)."""
    if not keep:
        return
    steps = []
    for p in base.iterdir():
        n = p.name[5:]
        if p.name.startswith("step-") and n.isdigit() and (p / MANIFEST).exists() and (p / _SHARDED).exists():
            steps.append((int(n), p))
    steps.sort()
    spare = _resumed_from()
    for _, p in steps[:-keep]:
        if p != committed and p.resolve() != spare:
            _remove(p)


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
    job = getenv("GPUHPC_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "nojob"
    return f"{job}.{restart_count()}"


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(_tmp_name(path.name))
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    _write_text(path, json.dumps(data, indent=1, sort_keys=True))


def save_shard(src: str | os.PathLike[str] | bytes, step: int, *, rank: int | None = None,
               world_size: int | None = None, name: str | None = None,
               directory: str | os.PathLike[str] | None = None, timeout: float | None = None,
               keep: int | None = None) -> Path:
    """Save this rank's shard of checkpoint ``step``; rank 0 then commits the checkpoint.

    Every rank calls it with its own shard (a file or directory under :func:`scratch_dir`,
    or ``bytes``). The shard is copied into ``<checkpoint dir>/step-<step:08d>/`` under a
    temporary name qualified by job, run, host and PID, fsynced and renamed to ``name``
    (default ``rank-<rank:05d>`` plus the source's suffix); the rank then records the shard's
    size and sha256 (computed while copying: the shard is not read back) in
    ``.shard-<rank>.json``. Rank 0 waits (at most ``timeout``, ``$GPUHPC_SHARD_TIMEOUT``,
    default 300 s) until every rank of this run recorded its shard, writes ``MANIFEST.json``
    (world size, shards, checksums) and only then points ``.gpuhpc-latest`` at the step; it
    then keeps the newest ``keep`` committed steps (:func:`keep_count`) and removes this job's
    leftovers (:func:`clean`). A save that a killed rank left half done has no manifest: it never becomes
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
    if not marker.exists():          # names the job that started the step (clean())
        _write_text(marker, f"{_job_id()}\n")
    _, copied = _save(src, name, sdir)
    _write_json(sdir / f".shard-{r:05d}.json",
                {"rank": r, "world_size": world, "file": name, "host": socket.gethostname(),
                 "bytes": copied.size, "sha256": copied.hash.hexdigest(), "run": _run_id()})
    if r == 0:
        commit_step(step, world, directory=base, timeout=timeout, keep=keep)
    return sdir


def commit(path: str | os.PathLike[str] | int, world_size: int | None = None, **kwargs: Any) -> Path:
    """``gpuhpc.commit(dir)``: mark a checkpoint directory that your own code (or a framework
    gpuhpc does not know) finished writing as complete, and make it the newest.

    Call it once, on one rank (rank 0), after every rank's part of the save is written (after
    the framework's save returned on every rank, e.g. after a barrier). Every file in ``dir`` is
    fsynced, then ``dir/.gpuhpc-committed`` is written (a temporary name renamed into place) and
    the ``.gpuhpc-latest`` pointer in ``dir``'s parent is moved to it: the resume path
    (:func:`latest_checkpoint`, ``$GPUHPC_LATEST_CHECKPOINT``) and the S3 uploader take it, and
    never a directory still being written. Nothing is copied or pruned. Returns ``dir``.

    (``commit(step, world_size, ...)``, rank 0's half of :func:`save_shard`, is
    :func:`commit_step`; that call form still works.)"""
    if isinstance(path, int) and not isinstance(path, bool):
        if world_size is None:
            raise TypeError("commit(step, world_size): world_size is required (or pass a directory)")
        return commit_step(path, world_size, **kwargs)
    if world_size is not None or kwargs:
        raise TypeError("commit(dir) takes only the directory")
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"commit: {d} is not a directory (save a single file with save_atomic)")
    if d.name.startswith(".") or d.name == _LEGACY_POINTER:
        raise ValueError(f"commit: {d.name!r} is not a checkpoint name (hidden, or DeepSpeed's tag file)")
    for root, _dirs, names in os.walk(d):
        for n in names:
            f = Path(root) / n
            if f.is_symlink() or n == ckpt_formats.COMMITTED:
                continue
            _fsync(f)
        _fsync(Path(root))
    _write_json(d / ckpt_formats.COMMITTED,
                {"job": _job_id(), "run": _run_id(), "host": socket.gethostname(),
                 "committed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
    _fsync(d)
    _point_latest(d.parent, d.name)
    return d


def commit_step(step: int, world_size: int, *, directory: str | os.PathLike[str] | None = None,
                timeout: float | None = None, keep: int | None = None) -> Path:
    """Rank 0's half of :func:`save_shard`: wait for all shards, write the manifest, move the
    pointer, keep the newest ``keep`` steps, remove this job's leftovers."""
    base = Path(directory) if directory is not None else checkpoint_dir()
    sdir = base / step_dir_name(step)
    env_t = getenv("GPUHPC_SHARD_TIMEOUT")
    limit = timeout if timeout is not None else (env_t if env_t is not None else 300.0)
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
    _fsync(sdir)
    _point_latest(base, sdir.name)
    for p in sdir.iterdir():         # temporary names of ranks killed in earlier attempts
        if p.name.startswith((_TMP, ".tmp-", ".old-")):
            _remove(p)
    _prune_steps(base, sdir, keep_count(keep))
    clean(base, earlier_runs_only=True, committed_step=step)
    return sdir


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    try:
        return json.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def is_complete(path: str | os.PathLike[str], *, verify: bool = False) -> bool:
    """Is ``path`` a complete checkpoint? A sharded step directory (``save_shard``) when its
    manifest lists ``world_size`` shards that are all present with their recorded sizes (and,
    with ``verify``, checksums); what :func:`save_atomic` renamed into place; otherwise by its
    framework's completion mark (:mod:`gpuhpc.jobs.ckpt_formats`: torch DCP's ``.metadata``,
    DeepSpeed's ``latest`` naming the tag, a Trainer's ``trainer_state.json``, :func:`commit`'s
    marker); a plain file, or a non-empty directory without any framework's shape, is complete."""
    p = Path(path)
    if p.is_dir() and (p / _SHARDED).exists():
        return _sharded_complete(p, verify=verify)
    v = _verdict(p, ckpt_formats.SaveDir.of(p.parent), _saved_names(p.parent))
    return v is not None and v.complete


def _sharded_complete(p: Path, *, verify: bool = False) -> bool:
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
    stop_dir = getenv("GPUHPC_STOP_DIR")
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
    function ``gpuhpc_save_shard``), ``save SRC [NAME]`` (``gpuhpc_save_checkpoint``),
    ``commit DIR`` (:func:`commit`), ``clean`` (the job template, before the program starts) and
    ``latest`` (prints the newest complete checkpoint)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["save"] and len(args) in (2, 3):
        try:
            print(save_atomic(args[1], args[2] if len(args) == 3 else None))
        except ValueError as exc:
            print(f"gpuhpc_save_checkpoint: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"gpuhpc_save_checkpoint: {exc}", file=sys.stderr)
            return 1
        return 0
    if args == ["clean"]:
        for p in clean():
            print(f"gpuhpc: removed {p.name}, left by an earlier run of this job", file=sys.stderr)
        return 0
    if args[:1] == ["save-shard"] and len(args) == 3 and args[2].isdigit():
        try:
            print(save_shard(args[1], int(args[2])))
        except IncompleteCheckpoint as exc:
            print(f"gpuhpc_save_shard: {exc}", file=sys.stderr)
            return 1
        return 0
    if args[:1] == ["commit"] and len(args) == 2:
        try:
            print(commit(args[1]))
        except ValueError as exc:
            print(f"gpuhpc commit: {exc}", file=sys.stderr)
            return 2
        return 0
    if args == ["latest"]:
        p = latest_checkpoint()
        print(p if p is not None else "")
        return 0
    print("usage: python -m gpuhpc.jobs.checkpoint save-shard SRC STEP | save SRC [NAME] | commit DIR | clean | latest",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

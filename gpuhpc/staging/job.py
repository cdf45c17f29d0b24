"""The job side of ``inputs:`` and ``checkpoint: s3://...`` (a job spec's S3 fields).

``gpuhpc submit`` puts this in front of the user's command when the spec has either::

    python -m gpuhpc.staging.job [--input s3://b/ds/=$GPUHPC_SCRATCH/ds ...] [--checkpoint s3://b/run-x/] -- CMD...

Before CMD starts:

* each input is fetched into the user's node cache (:class:`~gpuhpc.staging.cache.NodeCache`:
  ETag-keyed, verified, one download per node while other jobs wait, LRU by size) and its
  destination (``$VAR`` expanded in the job) becomes a symlink to the cached copy;
* with a checkpoint URL and no complete checkpoint in ``$GPUHPC_CHECKPOINT_DIR`` (a new node,
  node-local storage), the newest *complete* checkpoint in S3 is downloaded there and
  ``GPUHPC_LATEST_CHECKPOINT`` set for CMD.

While CMD runs, a background thread uploads each new complete checkpoint that lands in
``$GPUHPC_CHECKPOINT_DIR`` (they land atomically: :func:`gpuhpc.jobs.checkpoint.save_atomic`)
to ``<url>/<name>/``, then writes ``<url>/<name>/.gpuhpc-manifest.json`` last: a checkpoint
without its manifest (an upload cut off midway) is never restored. After CMD exits, the last
checkpoint is uploaded before the job ends. CMD shares this process's group, which the
job template signals (SIGUSR2 before a preemption): this process outlives CMD. Only the first task (``SLURM_PROCID`` 0) restores and uploads checkpoints.

Credentials come from boto3's chain (environment, ``~/.aws``, instance roles): nothing here
writes them anywhere. Output is plain lines on stderr (no progress bars in jobs).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError, StagingError, UserInputError
from gpuhpc.staging.s3 import S3Stager, S3Url

MANIFEST = ".gpuhpc-manifest.json"


def _log(msg: str) -> None:
    sys.stderr.write(f"gpuhpc[{time.strftime('%H:%M:%S')}]: {msg}\n")
    sys.stderr.flush()


# ---------------------------------------------------------------- inputs
def stage_inputs(stager: S3Stager, inputs: list[tuple[str, str]], cache=None) -> dict[str, Path]:
    from gpuhpc.staging.cache import NodeCache

    cache = cache or NodeCache(stager)
    out = {}
    for url_text, dest_text in inputs:
        url = S3Url.parse(url_text, "inputs")
        dest = Path(os.path.expandvars(dest_text)).expanduser()
        gets = stager.gets
        t0 = time.monotonic()
        path, fetched = cache.fetch(url)
        for note in cache.notes:
            _log(note)
        cache.notes.clear()
        if dest.exists() and not dest.is_symlink() and dest.is_dir():
            raise StagingError(f"input destination {dest} exists and is a directory")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f".{dest.name}.{socket.gethostname()}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(path, tmp)
        os.replace(tmp, dest)               # atomic: tasks of one job on a node may all do this
        _log(f"input {url} -> {dest}: {'downloaded' if fetched else 'cache hit'} "
             f"({stager.gets - gets} GETs, {time.monotonic() - t0:.2f}s)")
        out[url_text] = path
    return out


# ---------------------------------------------------------------- checkpoints
def _files(path: Path) -> dict[str, Path]:
    if path.is_file():
        return {path.name: path}
    return {p.relative_to(path).as_posix(): p for p in sorted(path.rglob("*")) if p.is_file()}


def upload_checkpoint(stager: S3Stager, local: Path, url: S3Url) -> None:
    """Upload one complete checkpoint (file or directory) to ``url/<name>/``; manifest last."""
    from gpuhpc.fsutil import sha256_file

    base = url.child(local.name)
    files = _files(local)
    meta = {}
    for rel, p in files.items():
        stager.push(p, S3Url(base.bucket, base.child(rel).key))
        meta[rel] = {"size": p.stat().st_size, "sha256": sha256_file(p)}
    manifest = {"name": local.name, "kind": "file" if local.is_file() else "dir", "files": meta,
                "mtime_ns": local.stat().st_mtime_ns, "uploaded": time.time(),
                "job_id": os.environ.get("SLURM_JOB_ID", ""), "host": socket.gethostname()}
    stager.put_bytes(json.dumps(manifest, sort_keys=True).encode(), S3Url(base.bucket, base.child(MANIFEST).key))


def complete_checkpoints(stager: S3Stager, url: S3Url) -> list[dict]:
    """Manifests of the checkpoints under ``url`` whose every file is there with its size,
    newest first."""
    objs = {o.key: o for o in stager.list(url)}
    out = []
    for key in [k for k in objs if k.endswith("/" + MANIFEST)]:
        try:
            manifest = json.loads(stager.get_bytes(S3Url(url.bucket, key)))
        except (StagingError, ValueError):
            continue
        prefix = key[: -len(MANIFEST)]
        if all(objs.get(prefix + rel) is not None and objs[prefix + rel].size == f["size"]
               for rel, f in manifest.get("files", {}).items()):
            manifest["prefix"] = prefix
            out.append(manifest)
    return sorted(out, key=lambda m: (m.get("mtime_ns", 0), m.get("uploaded", 0)), reverse=True)


def restore_checkpoint(stager: S3Stager, url: S3Url, ckdir: Path) -> Path | None:
    """Download the newest complete checkpoint into ``ckdir`` (atomically) unless ``ckdir``
    has a complete one already; returns the checkpoint to resume from (or None)."""
    from gpuhpc.jobs import checkpoint as ck

    have = ck.latest_checkpoint(ckdir)
    if have is not None:
        return have
    found = complete_checkpoints(stager, url)
    if not found:
        return None
    m = found[0]
    scratch = Path(getenv("GPUHPC_SCRATCH") or ckdir) / f".gpuhpc-restore-{os.getpid()}"
    stager.pull(S3Url(url.bucket, m["prefix"]), scratch)
    (scratch / MANIFEST).unlink(missing_ok=True)
    src = scratch / m["name"] if m.get("kind") == "file" else scratch
    final = ck.save_atomic(src, m["name"], directory=ckdir)
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    os.utime(final, ns=(m.get("mtime_ns") or time.time_ns(),) * 2, follow_symlinks=False)
    _log(f"checkpoint {m['name']} restored from {url} (written by job {m.get('job_id') or '?'} on {m.get('host')})")
    return final


class Uploader(threading.Thread):
    """Uploads each new complete checkpoint of ``ckdir`` to ``url`` (polling; never blocks the
    training process)."""

    def __init__(self, stager: S3Stager, url: S3Url, ckdir: Path, every: float = 2.0) -> None:
        super().__init__(name="gpuhpc-ckpt-upload", daemon=True)
        self.stager, self.url, self.ckdir, self.every = stager, url, ckdir, every
        self.stop = threading.Event()
        self.done: dict[str, int] = {}          # name -> mtime_ns uploaded
        self.lock = threading.Lock()
        self.failures = 0

    def seed(self) -> None:
        """Checkpoints already in S3 are not uploaded again."""
        for m in complete_checkpoints(self.stager, self.url):
            self.done.setdefault(m["name"], m.get("mtime_ns", 0))

    def sync(self) -> None:
        from gpuhpc.jobs import checkpoint as ck

        with self.lock:
            try:
                entries = [p for p in self.ckdir.iterdir() if not p.name.startswith(".") and p.name != "latest"]
            except FileNotFoundError:
                return
            for p in sorted(entries, key=lambda e: e.stat().st_mtime_ns):
                try:
                    mtime = p.stat().st_mtime_ns
                    if self.done.get(p.name) == mtime or not ck.is_complete(p):
                        continue
                    t0 = time.monotonic()
                    upload_checkpoint(self.stager, p, self.url)
                    self.done[p.name] = mtime
                    _log(f"checkpoint {p.name} uploaded to {self.url} ({time.monotonic() - t0:.1f}s)")
                except FileNotFoundError:
                    continue                       # replaced meanwhile: the next round sees the new one
                except GpuhpcError as exc:
                    self.failures += 1
                    _log(f"checkpoint {p.name}: upload failed, retrying: {exc.one_line()}")

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.sync()


# ---------------------------------------------------------------- the wrapper
def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m gpuhpc.staging.job")
    p.add_argument("--input", action="append", default=[], metavar="S3URL=DEST")
    p.add_argument("--checkpoint", metavar="S3URL")
    p.add_argument("command", nargs=argparse.REMAINDER)
    ns = p.parse_args(argv)
    cmd = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not cmd:
        p.error("no command after --")
    try:
        inputs = []
        for item in ns.input:
            url, sep, dest = item.partition("=")
            if not sep or not dest:
                raise UserInputError(f"expected S3URL=DEST, got {item!r}", field="inputs")
            inputs.append((url, dest))
        stager = S3Stager.from_env()
        if inputs:
            stage_inputs(stager, inputs)
        uploader = None
        env = dict(os.environ)
        first = os.environ.get("SLURM_PROCID", "0") in ("", "0")
        if ns.checkpoint and first:
            url = S3Url.parse(ns.checkpoint, "checkpoint")
            ckdir = Path(getenv("GPUHPC_CHECKPOINT_DIR") or "checkpoints")
            ckdir.mkdir(parents=True, exist_ok=True)
            latest = restore_checkpoint(stager, url, ckdir)
            if latest is not None:
                env["GPUHPC_LATEST_CHECKPOINT"] = str(latest)
            uploader = Uploader(stager, url, ckdir, getenv("GPUHPC_CHECKPOINT_SYNC_S"))
            uploader.seed()
            uploader.start()
    except GpuhpcError as exc:
        _log(f"error: {exc.one_line()}")
        return 2 if isinstance(exc, UserInputError) else 1
    # the job template sends SIGUSR2 to this process (the program's leader): pass it on to CMD;
    # SIGTERM reaches the whole process group. Stay alive through them, so that the last
    # checkpoint is uploaded after CMD exits
    started: list = []

    def forward(signum, frame):  # noqa: ARG001
        if signum == signal.SIGUSR2 and started and started[0].poll() is None:
            started[0].send_signal(signum)

    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        signal.signal(sig, forward)
    try:
        child = subprocess.Popen(cmd, env=env)
        started.append(child)
    except OSError as exc:
        _log(f"error: cannot run {cmd[0]}: {exc.strerror}")
        return 127
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    if uploader is not None:
        uploader.stop.set()
        uploader.join(timeout=60)
        uploader.sync()                 # the checkpoint written just before the exit
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())

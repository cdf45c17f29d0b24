"""A coordinated stop: every rank of a job stops after the *same* step (stdlib only).

A preemption or time-limit warning (SIGUSR2) does not reach every rank at the same instant,
and a rank that leaves the training loop one step before its peers leaves them waiting in
the next collective until the job is killed. :func:`should_stop` makes the ranks agree::

    import gpuhpc
    for step in range(start + 1, total + 1):
        train_one_step()
        stop = gpuhpc.should_stop(step)           # call it on every rank, at the same steps
        if step % k == 0 or stop:
            save_shard(...)                       # gpuhpc.jobs.checkpoint.save_shard
        if stop:
            sys.exit(0)                           # the job template requeues the job

It agrees in one of two ways:

* **torch.distributed initialised** (``torch`` already imported by your program): an
  ``all_reduce(MAX)`` of each rank's local flag, so all ranks see the same answer at the same
  step. One tiny collective per call; call it every *n* steps (the same steps on every rank)
  if that matters.
* **otherwise**, a small protocol in the shared checkpoint directory, in
  ``$GPUHPC_STOP_DIR`` (``<checkpoint dir>/.gpuhpc-stop/<job id>.<restart>``):

  1. A rank that sees a request (its own SIGUSR2/SIGTERM, or the ``requested`` file that
     another rank or the job script wrote) at step *s* writes ``requested`` and
     ``at-<rank>`` = *s*, and carries on (it may be one step ahead of a peer that has not
     looked yet, and that peer needs it for the next collective).
  2. At its next call the rank waits until ``decision`` exists. The rank that finds every
     rank's ``at-`` file present (at the latest, the last one to announce) writes
     ``decision`` = max(at-*) + 1 (the same value whoever writes it).
  3. Every rank returns ``True`` at step ``decision`` and ``False`` before it.

  So no rank is ever past the decided step, and ranks that exchange a collective every step
  cannot deadlock (each is at most one step ahead of another when it announces). The wait
  is bounded (``timeout``, ``$GPUHPC_STOP_TIMEOUT``, default 120 s): a peer that died makes
  the survivors stop where they are, and their shards then never form a complete checkpoint
  (see :func:`gpuhpc.jobs.checkpoint.save_shard`), so ``latest`` is not moved.

  The files must be visible to all ranks promptly: a local or parallel file system (Lustre,
  GPFS, BeeGFS, WekaFS) is; NFS caches directory lookups unless mounted with
  ``lookupcache=positive``/``actimeo=0``.

Shell jobs: the job templates export ``gpuhpc_should_stop STEP`` (returns 0 when the job
should stop after STEP), which runs ``python -m gpuhpc.jobs.coord should-stop STEP`` once a
stop was requested (a file test before that). The job script writes ``requested`` itself
when it gets SIGUSR2, so a shell rank only has to survive the signal (``trap '' USR2``).

Rank and world size come from ``RANK``/``WORLD_SIZE`` (torchrun, the deepspeed template),
else ``SLURM_PROCID``/``SLURM_NTASKS``, else 0/1.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpuhpc.config import getenv
from gpuhpc.jobs.ranks import rank, world_size

DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 0.05


def stop_dir() -> Path:
    """``$GPUHPC_STOP_DIR`` (set by the job templates), else
    ``<checkpoint dir>/.gpuhpc-stop/<job id>.<restart count>``."""
    env = getenv("GPUHPC_STOP_DIR")
    if env:
        return Path(env)
    from gpuhpc.jobs.checkpoint import checkpoint_dir, restart_count

    job = getenv("GPUHPC_JOB_ID") or os.environ.get("SLURM_JOB_ID") or "nojob"
    return checkpoint_dir() / ".gpuhpc-stop" / f"{job}.{restart_count()}"


def _write(path: Path, text: str) -> None:
    """Create ``path`` with ``text`` atomically (temp name, fsync, rename)."""
    tmp = path.with_name(f".{path.name}.{os.uname().nodename}.{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    return int(raw) if raw.lstrip("-").isdigit() else None


def request_stop(directory: str | os.PathLike[str] | None = None, why: str = "requested") -> None:
    """Ask every rank to stop (what a SIGUSR2 does); the job script calls this on SIGUSR2."""
    d = Path(directory) if directory is not None else stop_dir()
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "requested").exists():
        _write(d / "requested", f"{why} by rank {rank()} on {os.uname().nodename}\n")


class StopCoordinator:
    """The state behind :func:`should_stop` (one per process; see the module docstring)."""

    def __init__(self, *, rank: int | None = None, world_size: int | None = None,
                 directory: str | os.PathLike[str] | None = None, timeout: float | None = None) -> None:
        self.rank = globals()["rank"]() if rank is None else rank
        self.world_size = globals()["world_size"]() if world_size is None else world_size
        self.dir = Path(directory) if directory is not None else stop_dir()
        self.timeout = timeout if timeout is not None else getenv("GPUHPC_STOP_TIMEOUT")      # DEFAULT_TIMEOUT_S
        self.local = False          # this process got SIGUSR2/SIGTERM
        self.stop_step: int | None = None
        self._announced: int | None = None
        self._installed = False
        self._cleaned = False

    # ---------------------------------------------------------- local signal
    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        self.local = True

    def install(self, *signals: int) -> None:
        """Set the local flag on SIGUSR2 and SIGTERM (default). Only from the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals or (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        self._installed = True

    def _local_flag(self) -> bool:
        from gpuhpc.jobs import checkpoint

        return self.local or checkpoint.stop_requested()

    # ---------------------------------------------------------- agreement
    def should_stop(self, step: int) -> bool:
        if self.stop_step is not None:
            return step >= self.stop_step
        if not self._installed:
            self.install()
        dist = _torch_dist()
        if dist is not None:
            return self._all_reduce(dist, step)
        if self.world_size <= 1:
            if self._local_flag() or (self.dir / "requested").exists():
                self.stop_step = step
                return True
            return False
        return self._files(step)

    def _all_reduce(self, dist: Any, step: int) -> bool:
        import torch

        flag = self._local_flag() or (self.dir / "requested").exists()
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", _own_cuda_index(torch))
        t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        if flag:    # in the stop handshake: a peer that never comes fails it within the grace
            dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True).wait(stop_timeout())
        else:       # the run's own (long) timeout: a slow evaluation is not a hang
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if int(t.item()):
            self.stop_step = step
            return True
        return False

    def _clean_stale(self) -> None:
        """Rank 0, once: remove the protocol dirs of earlier runs of this job."""
        self._cleaned = True
        if self.rank != 0 or not self.dir.parent.is_dir():
            return
        import shutil

        for p in self.dir.parent.iterdir():
            if p.name != self.dir.name and not p.name.startswith("."):
                shutil.rmtree(p, ignore_errors=True)

    def _decide(self) -> None:
        # any rank may decide (the value is the same for all): a rank waiting here must not
        # depend on one that is already in the next collective
        if (self.dir / "decision").exists():
            return
        steps = [_read_int(self.dir / f"at-{r}") for r in range(self.world_size)]
        if all(s is not None for s in steps):
            _write(self.dir / "decision", f"{max(steps) + 1}\n")   # type: ignore[type-var]

    def _files(self, step: int) -> bool:
        if not self._cleaned:
            self._clean_stale()
        if self._announced is None:
            if not (self._local_flag() or (self.dir / "requested").exists()):
                return False
            self.dir.mkdir(parents=True, exist_ok=True)
            if self._local_flag():
                request_stop(self.dir, "signal")
            _write(self.dir / f"at-{self.rank}", f"{step}\n")
            self._announced = step
            self._decide()
            decision = _read_int(self.dir / "decision")
            if decision is None:
                return False              # carry on one step: a peer may need us for a collective
        deadline = time.monotonic() + self.timeout
        while True:
            self._decide()
            decision = _read_int(self.dir / "decision")
            if decision is not None:
                break
            if time.monotonic() > deadline:
                print(f"gpuhpc: rank {self.rank}: no stop decision within {self.timeout:.0f}s "
                      f"(a peer died?); stopping after step {step}", file=sys.stderr, flush=True)
                self.stop_step = step
                return True
            time.sleep(_POLL_S)
        if step > decision:       # cannot happen when every rank calls at the same steps
            print(f"gpuhpc: rank {self.rank} is at step {step}, past the agreed stop step {decision}",
                  file=sys.stderr, flush=True)
        if step >= decision:
            self.stop_step = step
            return True
        return False


def _own_cuda_index(torch: Any) -> int:
    """The rank's own GPU: ``cuda:LOCAL_RANK`` as torchrun and DeepSpeed's launcher mean it
    (modulo the visible devices: one when a task is bound to its GPU), not ``current_device()``,
    which is GPU 0 in a script that never called ``set_device``."""
    raw = os.environ.get("LOCAL_RANK", "").strip()
    count = torch.cuda.device_count()
    if raw.isdigit() and count > 0:
        return int(raw) % count
    return torch.cuda.current_device()


def _torch_dist() -> Any | None:
    """``torch.distributed`` if the program imported and initialised it (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # noqa: BLE001  (a half-imported torch)
        return None
    return None


DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0       # torch's own default for NCCL
DEFAULT_STOP_TIMEOUT_S = 45.0              # three quarters of the default 60 s grace


def _seconds(name: str, default_s: float) -> Any:
    import datetime

    raw = os.environ.get(name, "")
    try:
        seconds = float(raw) if raw else default_s
    except ValueError:
        seconds = default_s
    if not seconds > 0:
        seconds = default_s
    return datetime.timedelta(seconds=seconds)


def collective_timeout(default_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> Any:
    """The run's collective timeout for ``init_process_group(timeout=...)``: a
    ``datetime.timedelta`` of ``$GPUHPC_COLLECTIVE_TIMEOUT_S`` (the job templates set 600 s,
    torch's default, unless you set it). Long on purpose: with
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` a collective that outlasts it kills the job, and an
    evaluation, a compilation or rank 0 writing a checkpoint is a stall, not a hang. The short
    timeout is :func:`stop_timeout`'s, inside the stop handshake only."""
    return _seconds("GPUHPC_COLLECTIVE_TIMEOUT_S", default_s)


def stop_timeout(default_s: float = DEFAULT_STOP_TIMEOUT_S) -> Any:
    """The stop handshake's timeout: a ``datetime.timedelta`` of
    ``$GPUHPC_STOP_COLLECTIVE_TIMEOUT_S`` (the job templates set three quarters of the grace
    period, at least 10 s), so that a peer that died fails the handshake while the job can still
    be requeued. :func:`should_stop`'s all-reduce waits this long once a stop was requested; use
    it for the collectives of the save that follows, e.g.
    ``dist.barrier(async_op=True).wait(stop_timeout())``."""
    return _seconds("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S", default_s)


_coordinator: StopCoordinator | None = None


def coordinator() -> StopCoordinator:
    global _coordinator
    if _coordinator is None:
        _coordinator = StopCoordinator()
    return _coordinator


def should_stop(step: int) -> bool:
    """``True`` on every rank, at the same step, once any rank was asked to stop.

    Call it on every rank after each step (or every *n* steps, the same on all ranks).
    The first call installs a SIGUSR2/SIGTERM handler (from the main thread)."""
    return coordinator().should_stop(step)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpuhpc.jobs.coord should-stop STEP`` (exit 0: stop after STEP; 1: carry
    on) and ``request`` (what the job script does on SIGUSR2). Stateless between calls: the
    ``at-<rank>`` file is this rank's memory."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["request"] and len(args) == 1:
        request_stop(why="job script signal")
        return 0
    if args[:1] != ["should-stop"] or len(args) != 2 or not args[1].lstrip("-").isdigit():
        print("usage: python -m gpuhpc.jobs.coord should-stop STEP | request", file=sys.stderr)
        return 2
    step = int(args[1])
    c = StopCoordinator()
    c._installed = True           # a shell rank has no signal of its own here
    c._cleaned = True
    c._announced = _read_int(c.dir / f"at-{c.rank}")
    return 0 if c.should_stop(step) else 1


if __name__ == "__main__":
    sys.exit(main())

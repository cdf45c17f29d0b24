"""The Python API: ``gpuhpc.sweep(fn, space, ...)`` and the :class:`Sweep` handle.

    sweep = gpuhpc.sweep(train, {"lr": {"type": "loguniform", "low": 1e-5, "high": 1e-1},
                                 "layers": {"type": "int", "low": 2, "high": 12}},
                         trials=50, method="random", resources={"gpus": 1, "time": "30m"},
                         metric={"name": "loss", "goal": "minimize"}, parallelism=8)
    sweep.wait(); sweep.best(); sweep.results()
    gpuhpc.Sweep.load(sweep.id).resume()

Each trial runs ``fn(**params)`` in an array task of the same machinery as ``gpuhpc sweep run``
(chunks that fit MaxArraySize, the checkpoint → requeue → resume contract, state from sacct).
A number ``fn`` returns is the trial's metric; it may also call :func:`gpuhpc.report`.
``fn`` may be a :class:`gpuhpc.Checkpointable`: it checkpoints into ``$GPUHPC_CHECKPOINT_DIR``,
the trial's own directory, and a requeued trial resumes from there.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.sweeps.state import SweepStatus, TrialState


class DriverGone(GpuhpcError):
    """The sweep's driver died: nothing submits or follows its trials (exit 1)."""


class StateUnreachable(GpuhpcError):
    """The sweep database kept failing (a PostgreSQL restart that did not end, a locked or
    full SQLite file) for longer than :func:`retrying` waits (exit 1)."""


def _transient(exc: BaseException) -> bool:
    """A database error that a moment may cure: an ``OperationalError`` or ``InterfaceError``
    of sqlite3, psycopg or SQLAlchemy (a server restarting, a lost connection, "database is
    locked", "database or disk is full")."""
    seen = 0
    while exc is not None and seen < 5:
        if type(exc).__name__ in ("OperationalError", "InterfaceError"):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def retrying(fn: Callable[[], Any], what: str, budget: float | None = None) -> Any:
    """``fn()``, retried with a growing pause (1 s, doubling, at most 30 s) while the sweep
    database fails transiently (:func:`_transient`), for at most ``budget`` seconds
    (``GPUHPC_SWEEP_DB_RETRY``, default 300); then :class:`StateUnreachable`, one line. Each
    retry says so on stderr once per error kind."""
    import sys

    if budget is None:
        from gpuhpc.config import getenv

        budget = getenv("GPUHPC_SWEEP_DB_RETRY")
    start = time.monotonic()
    pause = 1.0
    said: set[str] = set()
    while True:
        try:
            return fn()
        except Exception as exc:
            if not _transient(exc):
                raise
            line = " ".join(str(exc).split())[:200]
            left = budget - (time.monotonic() - start)
            if left <= 0:
                raise StateUnreachable(f"{what}: the sweep database kept failing for {budget:.0f}s: "
                                       f"{type(exc).__name__}: {line}",
                                       hint="check the database (GPUHPC_DB_URL), then run the command again") from None
            kind = type(exc).__name__ + line[:40]
            if kind not in said:
                said.add(kind)
                sys.stderr.write(f"gpuhpc: {what}: the sweep database failed ({type(exc).__name__}: {line}); "
                                 f"retrying for up to {left:.0f}s\n")
                sys.stderr.flush()
            time.sleep(min(pause, max(0.1, left)))
            pause = min(30.0, pause * 2)


class Sweep:
    """A sweep in the gpuhpc database (CLI or Python made)."""

    def __init__(self, sweep_id: int, *, client=None, url: str | None = None) -> None:
        self.id = int(sweep_id)
        self._client = client
        self._url = url
        #: why the driver is pending for good (squeue's Reason), as :meth:`follow` last saw it
        self.driver_stuck: str | None = None
        self._said: set[str] = set()
        self.refreshed = False          # the last follow() asked Slurm itself (no driver follows the sweep)

    def __repr__(self) -> str:
        return f"Sweep({self.id})"

    @classmethod
    def load(cls, sweep_id: int | str, *, client=None, url: str | None = None) -> "Sweep":
        from gpuhpc.sweeps import store

        if not str(sweep_id).isdigit():
            raise UserInputError(f"{sweep_id!r} is not a sweep id", field="ID")
        store.sweep_info(int(sweep_id), url=url)         # exists?
        return cls(int(sweep_id), client=client, url=url)

    @property
    def client(self):
        if self._client is None:
            from gpuhpc.slurm.client import SlurmClient

            self._client = SlurmClient()
        return self._client

    # ------------------------------------------------------------ state
    def refresh(self) -> dict[str, int]:
        from gpuhpc.sweeps.refresh import refresh

        return refresh(self.id, client=self.client, url=self._url)

    def follow(self) -> dict[str, int]:
        """Trials per state: what the sweep's driver last wrote while it runs (no Slurm query
        of our own: one refresher per sweep), else a refresh. Raises :class:`DriverGone`
        (exit 1, with the command that restarts it) when the driver died."""
        from gpuhpc.sweeps import control, store

        info = store.sweep_info(self.id, url=self._url)
        if info["driver_job_id"] and info["status"] == SweepStatus.RUNNING.value:
            gone, stuck = control.driver_check(self.id, client=self.client, url=self._url)
            if gone:
                raise DriverGone(gone)
            self.driver_stuck = stuck
            self.refreshed = False
            return store.counts_of(self.id, url=self._url)
        self.driver_stuck = None
        self.refreshed = True
        return self.refresh()

    def info(self) -> dict[str, Any]:
        from gpuhpc.sweeps import store

        return store.sweep_info(self.id, url=self._url)

    def rows(self, refresh: bool = True) -> list[dict[str, Any]]:
        """One dict per trial, in trial order (trial, params, state, metrics, job_id, restarts, gpu_hours)."""
        from gpuhpc.sweeps import store

        if refresh:
            self.refresh()
        return store.trial_rows(self.id, url=self._url)

    def done(self) -> bool:
        counts = self.refresh()
        info = self.info()
        total = sum(counts.values())
        return total >= info["n_trials"] and all(TrialState(s).is_terminal for s in counts)

    def wait(self, timeout: float | None = None, poll: float = 3.0) -> bool:
        """Block until every trial has finished; True when all completed (or were pruned).
        Raises TimeoutError.
        A driver pending for a reason it never leaves by itself (PartitionTimeLimit...) is said
        on stderr, once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # a database restart (or a locked or full SQLite file) while waiting is waited out
            counts, info = retrying(lambda: (self.follow(), self.info()), f"sweep {self.id}")
            if self.driver_stuck and self.driver_stuck not in self._said:     # once: never a silent hang
                import sys

                self._said.add(self.driver_stuck)
                sys.stderr.write(f"gpuhpc: {self.driver_stuck}\n")
                sys.stderr.flush()
            total = sum(counts.values())
            if info["status"] in (SweepStatus.CANCELLED.value, SweepStatus.BLOCKED.value, SweepStatus.FAILED.value) and \
                    not any(counts.get(s.value) for s in (TrialState.PENDING, TrialState.RUNNING, TrialState.REQUEUED)):
                return False
            if total >= info["n_trials"] and all(TrialState(s).is_terminal for s in counts):
                # a pruned trial was stopped on purpose (the sweep's pruner): not a failure
                return counts.get(TrialState.COMPLETED.value, 0) + counts.get(TrialState.PRUNED.value, 0) == total
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"sweep {self.id} not finished after {timeout}s: {counts}")
            # asking Slurm ourselves (no driver): again when a running trial is expected to end
            # (gpuhpc.sweeps.pacing), at most every poll; a driver's database rows cost no query
            pause = poll
            if self.refreshed:
                from gpuhpc.sweeps import pacing
                from gpuhpc.sweeps.refresh import pace_of

                pause = pacing.pause(pace_of(self.id), poll)
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic() + 0.01))
            time.sleep(pause)

    def best(self) -> dict[str, Any] | None:
        from gpuhpc.sweeps import store

        return store.best(self.rows(), self.info()["spec"].metric.goal)

    def results(self, refresh: bool = True) -> list[Any]:
        """What ``fn`` returned, in trial order (None for a trial that did not finish). For a
        command sweep: the metrics dict of each trial."""
        import cloudpickle

        rows = self.rows(refresh)
        info = self.info()
        if info["kind"] != "python":
            return [r["metrics"] or None for r in rows]
        out = []
        for r in rows:
            p = Path(info["directory"]) / "trials" / str(r["trial"]) / "result.pkl"
            out.append(cloudpickle.loads(p.read_bytes()) if r["state"] == TrialState.COMPLETED.value and p.exists() else None)
        return out

    def resume(self) -> list[int]:
        """Resubmit failed, cancelled and never-started trials (never a finished one)."""
        from gpuhpc.sweeps import control

        return control.resume(self.id, client=self.client, url=self._url)

    def cancel(self) -> list[str]:
        from gpuhpc.sweeps import control

        return control.cancel(self.id, client=self.client, url=self._url)


def sweep(fn: Callable[..., Any], space: Mapping[str, Any], *, trials: int | None = None, method: str = "random",
          resources: Mapping[str, Any] | Any = None, metric: str | Mapping[str, str] | None = None,
          parallelism: int = 16, seed: int = 0, name: str | None = None, max_requeues: int = 5,
          chunk_size: int | None = None, max_queued: int | None = None, hold: bool = False, client=None,
          url: str | None = None, pruner: str | Mapping[str, Any] | None = None,
          fail_fast: int | None = None, after: Any = None) -> Sweep:
    """Run ``fn(**params)`` for ``trials`` points of ``space`` (the sweep file's ``parameters``:
    ``{"lr": {"type": "loguniform", "low": 1e-5, "high": 0.1}, "opt": ["adam", "sgd"]}``) as
    Slurm arrays; returns at once with a :class:`Sweep`. ``gpuhpc.sweep`` is
    :func:`gpuhpc.remote.sweeps.sweep`, which adds ``cluster="NAME"`` (from a laptop: the
    sweep runs on that cluster profile through a driver job). ``after=[job_or_id, ...]``: the
    trials start once those jobs ended COMPLETED (docs/jobs.md, "Pipelines and many calls")."""
    import dataclasses

    import cloudpickle

    from gpuhpc.sweeps import submission
    from gpuhpc.sweeps.spec import SweepSpec

    if not callable(fn):
        raise UserInputError(f"{fn!r} is not callable", field="fn")
    if not isinstance(space, Mapping):
        raise UserInputError("space must be a mapping of parameter -> range or values", field="space")
    params = {k: ({"values": list(v)} if isinstance(v, (list, tuple)) else v) for k, v in space.items()}
    if resources is not None and not isinstance(resources, Mapping):
        resources = {f.name: getattr(resources, f.name) for f in dataclasses.fields(resources)}
    if isinstance(metric, str):
        metric = {"name": metric}
    data = {"name": name or getattr(fn, "__name__", "sweep").strip("<>") or "sweep", "parameters": params,
            "method": method, "seed": seed, "parallelism": parallelism, "resources": dict(resources or {}),
            "metric": dict(metric or {"name": "objective"}), "max_requeues": max_requeues,
            "chunk_size": chunk_size, "max_queued": max_queued, "hold": hold, "after": after, "pruner": pruner,
            "fail_fast": fail_fast}
    if trials is not None:
        data["trials"] = trials
    spec = SweepSpec.from_mapping(data, python=True)
    c = client
    if c is None:
        from gpuhpc.slurm.client import SlurmClient

        c = SlurmClient()
    if not c.runner.is_local:
        raise UserInputError("a Python sweep can only be submitted where gpuhpc runs Slurm commands locally",
                             field="fn", hint="use gpuhpc sweep run FILE with a command")
    sid = submission.create(spec, kind="python", client=c, url=url, payload=cloudpickle.dumps(fn))
    return Sweep(sid, client=c, url=url)

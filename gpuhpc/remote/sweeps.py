"""A sweep started from a laptop: ``gpuhpc.sweep(fn, space, ..., cluster="NAME")``.

The sweep runs on the cluster, where its database, files and trial arrays are, and is made
there exactly once, before the call returns:

1. the cluster's Python is checked (:func:`gpuhpc.jobs.remote.check_python`), the code
   snapshot of the repository this runs in is uploaded and ``(fn, space, kwargs)`` is pickled
   here and copied over SFTP;
2. one command over the runner, ``python -m gpuhpc.remote.sweeps create PICKLE`` in the
   snapshot's copy of this directory with ``driver_env``, calls
   :func:`gpuhpc.sweeps.api.sweep` there -- exactly what ``gpuhpc.sweep`` does on the login
   node: the sweep's rows, its first arrays and, when trials are left, the engine's own
   requeueable driver job -- and prints the sweep id (a refusal there comes back as the same
   error, exit code included);
3. a Python-mode job over SSH (``driver_resources``) runs :class:`SweepDriver`, which only
   *follows* that sweep id (stored in its pickle) and returns the outcome. submitit runs the
   pickled call again after a requeue (a preemption, a node failure, ``scontrol requeue``):
   the rerun follows the same sweep and never starts another.

:class:`RemoteSweep` has the id at once and reads the outcome back over SFTP. Above both
jobs and sweeps: neither imports this.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gpuhpc.errors import GpuhpcError, QuotaExceeded, UserInputError

# the line of the cluster's answer (its other output is the engine's notes)
ANSWER = "gpuhpc-remote-sweep: "


def sweep(fn: Callable[..., Any], space: Mapping[str, Any], *, cluster: str | None = None,
          driver_resources: Mapping[str, Any] | None = None, driver_env: Mapping[str, str] | None = None,
          **kwargs: Any) -> Any:
    """``gpuhpc.sweep``: :func:`gpuhpc.sweeps.api.sweep` (the same keyword arguments) here, or
    with ``cluster="NAME"`` (from a laptop) on that cluster profile (``driver_env`` for the
    environment of everything of the sweep there; ``driver_resources``, default 12 h, for the
    job that follows it), returning a :class:`RemoteSweep` (``id``, ``wait``, ``best``,
    ``results``, ``cancel``)."""
    from gpuhpc.sweeps.api import sweep as sweep_here

    inspect.signature(sweep_here).bind(fn, space, **kwargs)      # a wrong keyword: TypeError, here
    if cluster is None:
        if driver_resources is not None or driver_env is not None:
            raise UserInputError("driver_resources and driver_env are for a sweep on a cluster",
                                 field="cluster", hint='add cluster="NAME"')
        return sweep_here(fn, space, **kwargs)
    for name in ("client", "url"):
        if kwargs.get(name) is not None:
            raise UserInputError("a sweep on a cluster uses the cluster's own", field=name,
                                 hint=f"drop {name}=, or drop cluster=")
    return sweep_on_cluster(fn, space, cluster=cluster, driver_resources=driver_resources, env=driver_env,
                            kwargs=kwargs)


class SweepDriver:
    """Runs on the cluster as one Python-mode job: follows the sweep ``sweep_id`` (made before
    this job was submitted) until every trial has ended and returns its id, whether every trial
    completed, the best trial and the results. A rerun after a requeue follows the same sweep."""

    def __init__(self, sweep_id: int, env: dict[str, str] | None = None) -> None:
        self.sweep_id, self.env = int(sweep_id), dict(env or {})

    def __call__(self) -> dict[str, Any]:
        os.environ.update(self.env)
        from gpuhpc.sweeps.api import Sweep

        sw = Sweep.load(self.sweep_id)
        print(f"gpuhpc: following sweep {sw.id} (run {int(os.environ.get('SLURM_RESTART_COUNT') or 0) + 1})",
              flush=True)
        ok = sw.wait()
        return {"sweep_id": sw.id, "all_completed": ok, "best": sw.best(), "results": sw.results()}


class RemoteSweep:
    """A sweep started from a laptop (``gpuhpc.sweep(..., cluster="NAME")``): ``id`` is the
    sweep's id in the cluster's database (``gpuhpc --cluster NAME sweep status ID``); the job
    that follows it runs on the cluster; ``wait``/``best``/``results`` read its outcome over SFTP."""

    def __init__(self, job: Any, sweep_id: int, env: dict[str, str] | None = None) -> None:
        self.job = job
        self.id = int(sweep_id)
        self.env = dict(env or {})
        self._out: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RemoteSweep({self.id}, driver job {self.job.job_id})"

    def _outcome(self, timeout: float | None = None) -> dict[str, Any]:
        if self._out is None:
            self._out = self.job.result(timeout)
        return self._out

    def wait(self, timeout: float | None = None) -> bool:
        return self._outcome(timeout)["all_completed"]

    def best(self) -> dict[str, Any] | None:
        return self._outcome()["best"]

    def results(self) -> list[Any]:
        return self._outcome()["results"]

    def cancel(self) -> None:
        """Cancel the sweep on the cluster (``gpuhpc sweep cancel ID`` there: its trials and its
        engine driver) and the job that follows it."""
        from gpuhpc.jobs.remote import run_gpuhpc

        try:
            res = run_gpuhpc(self.job.client.runner, ["sweep", "cancel", str(self.id)], env=self.env or None,
                             timeout=300)
            if not res.ok:
                sys.stderr.write(res.stderr)
        finally:
            self.job.cancel()


def sweep_on_cluster(fn: Any, space: Any, *, cluster: str, kwargs: dict[str, Any],
                     driver_resources: Any = None, env: dict[str, str] | None = None) -> RemoteSweep:
    """Make the sweep on the cluster profile ``cluster`` (one command there, :func:`create_there`),
    then submit the job that follows it (Python mode over SSH)."""
    from gpuhpc.jobs.api import submit
    from gpuhpc.transport.ssh import shared_runner

    runner = shared_runner({**os.environ, "GPUHPC_CLUSTER": cluster})     # the one submit() uses
    env = dict(env or {})
    sid = create_there(runner, fn, space, kwargs, env)
    res = dict(driver_resources or {"time": "12h"})
    base = f"{kwargs.get('name') or getattr(fn, '__name__', 'sweep')}".strip("<>").replace("<", "") or "sweep"
    try:
        job = submit(SweepDriver(sid, env), resources=res, cluster=cluster, name=f"{base}-s{sid}-follow")
    except BaseException:
        sys.stderr.write(f"gpuhpc: sweep {sid} runs on the cluster, but the job that follows it was not submitted; "
                         f"follow it with: gpuhpc --cluster {cluster} sweep wait {sid}\n")
        raise
    return RemoteSweep(job, sid, env)


def create_there(runner: Any, fn: Any, space: Any, kwargs: dict[str, Any], env: dict[str, str]) -> int:
    """The sweep made on the cluster by one command over ``runner`` (``python -m
    gpuhpc.remote.sweeps create PICKLE``, in the snapshot's copy of this directory, the snapshot
    on ``PYTHONPATH``, with ``env``); returns its id. The error it raises there is raised here
    (UserInputError exits 2, QuotaExceeded 3); nothing is left of the pickle."""
    import tempfile

    import cloudpickle

    from gpuhpc.jobs import remote, snapshot

    python = remote.check_python(runner)            # before anything is sent
    snap = snapshot.collect(".", (), snapshot.max_mb(runner))
    cwd, run_env = None, dict(env)
    if snap is not None:
        up = snapshot.upload(snap, runner)
        cwd = snapshot.workdir_in(snap, up)
        run_env = {"GPUHPC_SNAPSHOT": up.path, "PYTHONPATH": up.path, **run_env}
    with tempfile.TemporaryDirectory(prefix="gpuhpc-sweep-") as tmp:
        local = os.path.join(tmp, "sweep.pkl")
        try:
            with open(local, "wb") as fh:
                cloudpickle.dump((fn, space, kwargs), fh)
        except Exception as exc:  # noqa: BLE001 - pickling user objects raises anything
            raise UserInputError(f"cannot pickle the sweep: {type(exc).__name__}: {exc}", field="fn",
                                 hint="pass objects cloudpickle can serialise (no open files, locks, sockets)") from exc
        staged = remote.stage_file(runner, local, "sweep-calls")
    argv = [python, "-m", "gpuhpc.remote.sweeps", "create", staged]
    if cwd:
        argv = ["env", "-C", cwd, *argv]
    try:
        res = runner.run(argv, env=run_env, timeout=600)
    finally:
        runner.run(["rm", "-f", "--", staged], timeout=60)
    if res.stderr:
        sys.stderr.write(res.stderr)
    return answer(res.stdout, res.stderr, res.returncode, python)


def answer(stdout: str, stderr: str, returncode: int, what: str = "python") -> int:
    """The sweep id in the cluster's answer line, or the error it carries raised here."""
    line = next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(ANSWER)), None)
    if line is None:
        detail = (stderr.strip().splitlines() or [f"exit {returncode}"])[-1]
        raise GpuhpcError(f"the sweep could not be made on the cluster (with {what}): {detail}")
    data = json.loads(line[len(ANSWER):])
    if "sweep_id" in data:
        return int(data["sweep_id"])
    kind = {"UserInputError": UserInputError, "QuotaExceeded": QuotaExceeded}.get(data.get("kind"))
    if kind is UserInputError:
        err: GpuhpcError = UserInputError(data["message"], hint=data.get("hint"))
        err.field = data.get("field")
    elif kind is QuotaExceeded:
        err = QuotaExceeded(data["message"], hint=data.get("hint"))
    else:
        err = GpuhpcError(data["message"], hint=data.get("hint"))
    raise err


def create_here(path: str) -> int:
    """On the cluster: make the sweep the pickled ``(fn, space, kwargs)`` at ``path`` describes
    (:func:`gpuhpc.sweeps.api.sweep`, a local runner); returns its id."""
    import pickle

    from gpuhpc.sweeps.api import sweep as sweep_here

    with open(path, "rb") as fh:
        fn, space, kwargs = pickle.load(fh)
    return sweep_here(fn, space, **kwargs).id


def main(argv: list[str]) -> int:
    """``python -m gpuhpc.remote.sweeps create PICKLE``: one answer line (``ANSWER`` + JSON: the
    sweep id, or the error's kind, message, field and hint) and the error's exit code."""
    if len(argv) != 2 or argv[0] != "create":
        sys.stderr.write("usage: python -m gpuhpc.remote.sweeps create PICKLE\n")
        return 2
    try:
        out: dict[str, Any] = {"sweep_id": create_here(argv[1])}
        code = 0
    except GpuhpcError as exc:
        kind = next((k.__name__ for k in (QuotaExceeded, UserInputError) if isinstance(exc, k)), "GpuhpcError")
        out = {"kind": kind, "message": exc.message, "hint": exc.hint, "field": getattr(exc, "field", None)}
        code = exc.exit_code
    except Exception as exc:  # noqa: BLE001 - unpickling user code raises anything: one line back
        out = {"kind": "GpuhpcError", "message": f"{type(exc).__name__}: {exc}", "hint": None}
        code = 1
    sys.stdout.write(ANSWER + json.dumps(out) + "\n")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

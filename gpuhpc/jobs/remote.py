"""Python mode from a laptop: ``gpuhpc.submit(fn, ..., cluster="NAME")``.

submitit cannot submit over SSH (it runs ``sbatch`` itself, locally). Here gpuhpc does
submitit's local half and leaves the cluster half to submitit, unchanged, so a job behaves
as in local Python mode (checkpoint on SIGUSR2, requeue, the same result file):

1. the cluster's Python is asked for its version (and whether it can import gpuhpc and
   submitit) -- a different minor version than this one is refused before anything is sent;
2. the call is pickled here (cloudpickle, as submitit does: closures and ``__main__``
   functions by value) and copied over SFTP with the code snapshot (on ``PYTHONPATH``
   and the working directory of the job, so functions of the repository's modules load);
3. the sbatch script is submitit's own (:func:`submitit.slurm.slurm._make_sbatch_string`,
   the parameters from the one translation :func:`gpuhpc.jobs.submitit_adapters.submitit_params`),
   submitted through :class:`~gpuhpc.slurm.SlurmClient` over the runner;
4. the pickle is renamed ``<job id>_submitted.pkl`` (submitit's job waits for it) and the
   result, ``<job id>_0_result.pkl``, is read back over SFTP by ``Job.result()``.

Below :mod:`gpuhpc.jobs.python_mode` (which calls it for ``cluster=``); a sweep from a laptop, which
needs both jobs and sweeps, is :mod:`gpuhpc.remote.sweeps`, a layer above both.
"""
from __future__ import annotations

import os
import posixpath
import shlex
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from gpuhpc.errors import GpuhpcError, JobFailed, TransportError, UserInputError

_PROBE = "import sys; print('%d.%d' % sys.version_info[:2]); import submitit, gpuhpc, cloudpickle"


@dataclass(frozen=True)
class RemoteCall:
    folder: str
    result: str
    log: str


def python_of(runner: Any) -> str:
    return (getattr(runner, "settings", {}) or {}).get("python") or "python3"


def check_python(runner: Any) -> str:
    """The cluster's Python, once its minor version is this one's and it can import gpuhpc,
    submitit and cloudpickle; else UserInputError (nothing has been sent)."""
    python = python_of(runner)
    res = runner.run([python, "-c", _PROBE], timeout=60)
    mine = "%d.%d" % sys.version_info[:2]
    theirs = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
    if res.returncode == 127 or not theirs:
        raise UserInputError(f"the cluster has no Python at {python!r}", field="python",
                             hint="set python = \"/path/to/python\" in the cluster profile")
    if theirs != mine:
        raise UserInputError(f"Python {mine} here but {theirs} on the cluster ({python}): a pickled call "
                             "would not load there", field="python",
                             hint=f"use Python {theirs} here, or point the profile's python at a {mine} on the cluster")
    if not res.ok:
        missing = (res.stderr.strip().splitlines() or ["?"])[-1]
        raise UserInputError(f"the cluster's Python ({python}) cannot run gpuhpc jobs: {missing}", field="python",
                             hint="install gpuhpc (with submitit and cloudpickle) there, or set the profile's python")
    return python


def submit(target: Any, args: tuple, kwargs: dict, *, params: dict[str, Any], timeout_min: int,
           max_requeues: int, client: Any, snapshot_setting: bool | None = True,
           reserve=None) -> tuple[str, RemoteCall]:
    """Submit ``target(*args, **kwargs)`` over ``client``'s (remote) runner; ``reserve`` wraps
    the sbatch call (the ledger's hold). Returns (job id, where its files are)."""
    import tempfile

    from submitit.core.utils import DelayedSubmission
    from submitit.slurm.slurm import _make_sbatch_string

    from gpuhpc.jobs import snapshot

    runner = client.runner
    python = check_python(runner)
    snap = snapshot.collect(".", (), snapshot.max_mb(runner)) if snapshot_setting is not False else None
    base = snapshot.remote_base(runner)
    folder = posixpath.join(base, "submitit", uuid.uuid4().hex)
    delayed = DelayedSubmission(target, *args, **kwargs)
    delayed.set_timeout(timeout_min, max_requeues)
    with tempfile.TemporaryDirectory(prefix="gpuhpc-call-") as tmp:
        local = os.path.join(tmp, "call.pkl")
        try:
            delayed.dump(local)
        except Exception as exc:  # noqa: BLE001 - pickling user objects raises anything
            raise UserInputError(f"cannot pickle the call: {type(exc).__name__}: {exc}", field="fn",
                                 hint="pass objects cloudpickle can serialise (no open files, locks, sockets)") from exc
        staged = posixpath.join(folder, f"{uuid.uuid4().hex}.pkl")
        runner.put_file(local, staged, 0o600)
    # the cluster's Python runs gpuhpc's helpers in the job (as a script-mode job's GPUHPC_PYTHON)
    setup = [*(params.get("setup") or []), f"export GPUHPC_PYTHON={shlex.quote(python)}"]
    if snap is not None:
        up = snapshot.upload(snap, runner)
        workdir = snapshot.workdir_in(snap, up)
        setup += [f"export GPUHPC_SNAPSHOT={shlex.quote(up.path)}",
                  f'export PYTHONPATH={shlex.quote(up.path)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
                  f"cd {shlex.quote(workdir)}"]
    text = _make_sbatch_string(command=f"{shlex.quote(python)} -u -m submitit.core._submit {shlex.quote(folder)}",
                               folder=folder, **{**params, "setup": setup})

    def do_submit() -> str:
        return client.submit_script(text)

    job_id = reserve(do_submit) if reserve is not None else do_submit()
    res = runner.run(["mv", "--", staged, posixpath.join(folder, f"{job_id}_submitted.pkl")], timeout=60)
    if not res.ok:
        client.cancel(job_id)
        raise GpuhpcError(f"job {job_id} cancelled: its pickled call could not be put in place: {res.stderr.strip()}")
    return job_id, RemoteCall(folder, posixpath.join(folder, f"{job_id}_0_result.pkl"),
                              posixpath.join(folder, f"{job_id}_0_log.out"))


def load_result(runner: Any, call: RemoteCall, job_id: str) -> Any:
    """The callable's return value (read over SFTP); its exception becomes JobFailed."""
    import pickle

    try:
        data = runner.read_bytes(call.result)
    except TransportError:
        raise JobFailed(f"job {job_id} left no result ({call.result})", hint=f"gpuhpc logs {job_id}") from None
    outcome, value = pickle.loads(data)
    if outcome == "success":
        return value
    last = [ln for ln in str(value).strip().splitlines() if ln.strip()][-1:] or ["?"]
    raise JobFailed(f"job {job_id} raised {last[0].strip()}", hint=f"gpuhpc logs {job_id}")


# ---------------------------------------------------------------- commands whose state is on the cluster
def run_gpuhpc(runner: Any, args: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None,
               timeout: float | None = None) -> Any:
    """``gpuhpc ARGS`` where ``runner`` runs, with the profile's Python: the commands whose
    state lives on the cluster (a sweep's database and trial files, the ledger, Prometheus)
    run there, as on the login node, instead of reaching into that state over SSH. Returns
    the :class:`~gpuhpc.transport.CommandResult` (its output and exit code are the command's);
    a cluster that cannot run gpuhpc is a one-line GpuhpcError."""
    python = python_of(runner)
    argv = [python, "-m", "gpuhpc", *args]
    if cwd:
        argv = ["env", "-C", cwd, *argv]
    res = runner.run(argv, env=env, timeout=timeout)
    if res.returncode in (126, 127) or "No module named gpuhpc" in res.stderr:
        detail = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        raise GpuhpcError(f"the cluster cannot run gpuhpc with {python}: {detail}",
                          hint="install gpuhpc there, or set python = \"/path/to/python\" in the cluster profile")
    return res


def stage_file(runner: Any, local: str, kind: str) -> str:
    """Copy the local file ``local`` to ``<remote_dir>/<kind>/<sha256>-<name>`` where ``runner``
    runs (content-addressed: an identical file is not copied again); returns that path."""
    import hashlib

    from gpuhpc.jobs import snapshot

    with open(local, "rb") as fh:
        digest = hashlib.file_digest(fh, "sha256").hexdigest()
    path = posixpath.join(snapshot.remote_base(runner), kind, f"{digest[:16]}-{os.path.basename(local)}")
    if not runner.exists(path):
        runner.makedirs(posixpath.dirname(path))
        runner.put_file(local, path, 0o600)
    return path

"""Submit jobs and follow them: :func:`submit` and the :class:`Job` handle.

Two modes share the resource translation (:func:`gpuhpc.jobs.spec.sbatch_options`), the
quota reservation and the handle:

- script mode: ``submit(JobSpec(...))`` (what ``gpuhpc submit`` calls) renders a job
  template and runs ``sbatch`` through :class:`~gpuhpc.slurm.SlurmClient`;
- Python mode: ``submit(fn, *args, resources=Resources(...))`` runs ``fn`` through
  submitit; :class:`~gpuhpc.jobs.checkpoint.Checkpointable` callables survive preemption
  and time limits.
"""
from __future__ import annotations

import contextlib
import contextvars
import getpass
import os
import posixpath
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpuhpc.errors import GpuhpcError, JobFailed, SlurmError, UserInputError
from gpuhpc.jobs.spec import (DEFAULT_GRACE_S, DEFAULT_MAX_REQUEUES, JobSpec, Resources,
                              check_fits_on, check_text, default_log_dir, parse_duration, sbatch_options)
from gpuhpc.jobs.spec import check_container_policy, container_srun_args
from gpuhpc.jobs.spec import AFTER_KINDS, after_dependency, after_ids
from gpuhpc.slurm.state import JobState, SlurmState

_JOB_ID = re.compile(r"^\d+(_\d+)?$")


def check_job_id(job_id: Any) -> str:
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise UserInputError(f"{text!r} is not a Slurm job id", field="job_id", hint="e.g. 1234 or 1234_5")
    return text


def _client(client=None):
    if client is not None:
        return client
    from gpuhpc.slurm.client import SlurmClient

    return SlurmClient()


def check_after(client, after: tuple[str, ...] = (), after_any: tuple[str, ...] = ()) -> None:
    """Every job a new one waits for is known to Slurm (slurmctld, else slurmdbd): Slurm 22.05
    takes a dependency on an unknown job id as already satisfied, so a mistyped id would start
    the job at once. An afterok on a job that already ended otherwise than COMPLETED could never
    be satisfied: refused as well. GpuhpcError (exit 1), before anything is reserved or
    submitted. One ``scontrol show job`` per id (a ``sacct`` for one slurmctld has forgotten)."""
    for kind, ids in (("ok", after), ("any", after_any)):
        for job_id in ids:
            rec = client.show_job(job_id)
            if rec:
                states = [SlurmState.parse(rec.get("JobState", "")).state]
            else:
                rows = [a for a in client.accounting(job_ids=[job_id])
                        if a.job_id == job_id or ("_" not in job_id and a.array_job_id == job_id)]
                if not rows:
                    raise GpuhpcError(f"job {job_id} not found", hint="check the id (gpuhpc status ID); "
                                                                      "nothing was submitted")
                states = [r.state.state for r in rows]
            bad = next((st for st in states if st.is_finished and st is not JobState.COMPLETED), None)
            if kind == "ok" and bad is not None:
                raise GpuhpcError(f"job {job_id} ended {bad.value}: a job after it (afterok) would never start",
                                  hint="wait for any end instead (--after-any, after_kind='any'); "
                                       "nothing was submitted")


# ---------------------------------------------------------------- quota
def _reserve(resources: Resources, name: str, client, array_size: int = 1) -> Any:
    """The ledger's pre-submit hold (None when the ledger is not in use). A user who may not
    write the ledger (it belongs to the admin) gets the published budget snapshot instead: the
    budgets are shown, a job that cannot fit is refused (exit 3), Slurm's limits bind."""
    import os

    from gpuhpc.ledger import hooks

    url = hooks.ledger_in_use()
    off = os.environ.get("GPUHPC_LEDGER", "").strip().lower() in ("off", "0", "false", "no")
    if off:
        return None
    req = hooks.ChargeRequest(
        cluster="", user=getpass.getuser(), account=resources.account,
        partition=resources.partition, qos=resources.qos, gpu_type=resources.gpu_type,
        gpus=resources.total_gpus, time_limit_s=resources.time_s, array_size=array_size, job_name=name,
    )
    if url is not None and hooks.writable(url):
        import dataclasses

        try:
            cluster = client.cluster_name() or "default"
        except GpuhpcError:
            cluster = "default"
        req = dataclasses.replace(req, cluster=cluster)
    import sys

    account = resources.account or os.environ.get("SBATCH_ACCOUNT") or os.environ.get("SLURM_ACCOUNT")
    hold, lines = hooks.reserve_or_snapshot(req, account)     # a reader's role, a database down: the snapshot
    for line in lines:
        sys.stderr.write(f"budget: {line}\n")
    return hold


def _with_reservation(resources: Resources, name: str, client, do_submit: Callable[[], str],
                      array_size: int = 1) -> str:
    res = _reserve(resources, name, client, array_size)
    try:
        job_id = do_submit()
    except BaseException:
        if res is not None:
            res.release()
        raise
    if res is not None:
        res.attach_job(job_id)
    return job_id


# ---------------------------------------------------------------- script mode
def submit_spec(spec: JobSpec, *, client=None, reserve: bool = True) -> "Job":
    """Render ``spec`` and sbatch it (after the quota reservation). Returns a :class:`Job`.
    ``reserve=False``: the caller has already reserved it (a sweep holds all its chunks in one
    transaction, :mod:`gpuhpc.sweeps.engine`) and records the job id itself."""
    from gpuhpc.jobs.render import render

    check_container_policy(spec.resources)     # the site's registries and digest pins (exit 2)
    c = _client(client)
    if spec.after or spec.after_any:
        check_after(c, spec.after, spec.after_any)      # a mistyped id would start at once (exit 1)
    runner = getattr(c, "runner", None)
    if runner is None:                      # a client without one runs here
        from gpuhpc.transport.local import LocalRunner

        runner = LocalRunner()
    spec, upload = _prepare_remote(spec, runner)
    spec = _with_staging(spec, runner)
    spec = with_fewest_switches(spec, c)
    spec = with_profile(spec)
    script = render(spec)
    if runner.is_local:
        os.makedirs(spec.log_directory, exist_ok=True)
    else:
        runner.makedirs(spec.log_directory)
    check_fits_on(spec.resources, c)
    uploaded = None
    if upload is not None:
        spec, uploaded = upload()
        script = render(spec)
    job_id = _with_reservation(spec.resources, spec.name, c, lambda: c.submit_script(script),
                               spec.array_size) if reserve else c.submit_script(script)
    job = Job(job_id, client=c, name=spec.name,
              log_path=spec.output_path.replace("%%", "\0").replace("%j", job_id).replace("\0", "%"))
    job.snapshot = uploaded
    return job


def with_profile(spec: JobSpec) -> JobSpec:
    """``profile: nsys|torch``: the command behind the per-rank wrapper (gpuhpc.jobs.profile);
    the same spec again when it is already wrapped or not profiled."""
    if spec.profile is None or spec.command[1:3] == ("-m", "gpuhpc.jobs.profile"):
        return spec
    import dataclasses

    from gpuhpc.jobs import profile

    return dataclasses.replace(spec, command=profile.wrap(spec.command, spec.profile, spec.profile_steps,
                                                          spec.log_directory, spec.env.get("GPUHPC_PYTHON")))


def with_fewest_switches(spec: JobSpec, client) -> JobSpec:
    """A multi-node job without ``switches`` asks Slurm for the fewest leaf switches its
    partition's nodes allow (``--switches=N@5:00``, from ``scontrol show topology`` and the
    partition); unchanged when the cluster has no tree topology or Slurm cannot say."""
    r = spec.resources
    if r.nodes < 2 or r.switches is not None:
        return spec
    import dataclasses

    from gpuhpc.hostlist import expand
    from gpuhpc.topology.placement import DEFAULT_WAIT, fewest_leaves, leaf_nodes

    try:
        leaves = leaf_nodes(client.topology())
        if not leaves:
            return spec
        part = next((p for p in client.partitions() if (p.name == r.partition if r.partition else p.default)), None)
    except (GpuhpcError, AttributeError):
        return spec
    best = fewest_leaves(leaves, r.nodes, expand(part.nodes) if part is not None and part.nodes else None)
    if not best:
        return spec
    return dataclasses.replace(spec, resources=dataclasses.replace(r, switches=f"{best}@{DEFAULT_WAIT}"))


def _with_staging(spec: JobSpec, runner) -> JobSpec:
    """``inputs:`` / ``checkpoint: s3://...``: the command runs behind gpuhpc.staging.job, which
    pulls the inputs into the node cache first and syncs checkpoints with S3. On a local
    runner the URLs and credentials are tried first (one LIST each): a bad bucket or no
    credentials is refused before anything is submitted."""
    if not spec.inputs and not spec.checkpoint:
        return spec
    import dataclasses
    import sys

    if spec.template == "torchrun":
        raise UserInputError("inputs and an S3 checkpoint are not supported with the torchrun template yet",
                             field="template", hint="use --template single, deepspeed or mpi, or "
                                                    "`gpuhpc stage pull --cache` in your script")
    if runner.is_local:
        from gpuhpc.staging.s3 import S3Stager, S3Url

        stager = S3Stager.from_env()
        for url in [*spec.inputs, *([spec.checkpoint] if spec.checkpoint else [])]:
            field = "checkpoint" if url == spec.checkpoint else f"inputs.{url}"
            first = next(iter(stager.list(S3Url.parse(url, field))), None)    # credentials, bucket
            if first is None and url in spec.inputs:
                raise UserInputError(f"nothing at {url}", field=field, hint="check the bucket and prefix")
        python = sys.executable
    else:
        from gpuhpc.jobs.remote import python_of

        python = python_of(runner)
    wrap = [python, "-m", "gpuhpc.staging.job"]
    for url, dest in spec.inputs.items():
        wrap += ["--input", f"{url}={dest}"]
    if spec.checkpoint:
        wrap += ["--checkpoint", spec.checkpoint]
    return dataclasses.replace(spec, command=(*wrap, "--", *spec.command))


def _prepare_remote(spec: JobSpec, runner) -> tuple[JobSpec, Callable[[], tuple[JobSpec, Any]] | None]:
    """What can refuse the job before anything reaches the cluster: the code snapshot is
    collected (too big: UserInputError) and, over SSH, remote default log and checkpoint dirs chosen.
    Returns the spec and the step that uploads the snapshot (None: no snapshot), to run after
    the checks that ask Slurm and before sbatch; it returns the spec that runs from the
    snapshot and the :class:`~gpuhpc.jobs.snapshot.Uploaded` record."""
    if runner.is_local and not spec.snapshot:   # the login node's fast path: nothing to import
        return spec, None
    import dataclasses

    from gpuhpc.jobs import snapshot
    from gpuhpc.jobs.remote import python_of

    if not runner.is_local:         # defaults on the cluster, not in this machine's data dir
        base = snapshot.remote_base(runner)
        spec = dataclasses.replace(spec, log_dir=spec.log_dir or posixpath.join(base, "logs"),
                                   checkpoint_dir=spec.checkpoint_dir or posixpath.join(base, "checkpoints", "%j"),
                                   env={"GPUHPC_PYTHON": python_of(runner), **spec.env})    # the cluster's, not ours
    if not snapshot.wanted(spec.snapshot, runner):
        return spec, None
    snap = snapshot.collect(".", spec.snapshot_paths, snapshot.max_mb(runner))
    if snap is None:
        return spec, None

    def upload() -> tuple[JobSpec, Any]:
        up = snapshot.upload(snap, runner)
        return dataclasses.replace(spec, workdir=spec.workdir or snapshot.workdir_in(snap, up),
                                   env={"GPUHPC_SNAPSHOT": up.path, **spec.env}), up

    return spec, upload


# ---------------------------------------------------------------- Python mode
class _SubmititCallable:
    """Adapter submitit pickles: runs a :class:`Checkpointable`'s ``__call__``, calls its
    ``checkpoint`` hook on SIGUSR2 and asks submitit to requeue (capped)."""

    def __init__(self, fn: Any, max_requeues: int) -> None:
        self.fn = fn
        self.max_requeues = max_requeues

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import signal

        from gpuhpc.jobs.checkpoint import restart_count

        try:
            self.fn.restarts = restart_count()
        except AttributeError:
            pass
        signal.signal(signal.SIGTERM, lambda signum, frame: self._save_on_term(args, kwargs))
        return self.fn(*args, **kwargs)

    def _save_on_term(self, args: tuple, kwargs: dict) -> None:
        """SIGTERM (scontrol requeue, scancel, the end of a grace period): Slurm kills the
        job KillWait seconds later with no SIGUSR2. Snapshot the state where submitit
        restarts from, then stop making progress that would be lost."""
        import time

        from submitit import JobEnvironment
        from submitit.core import utils

        try:
            env = JobEnvironment()
            if env.global_rank == 0:
                path = env.paths.submitted_pickle
                current = utils.DelayedSubmission.load(path)
                if self.fn.checkpoint(*args, **kwargs) is not False:
                    new = utils.DelayedSubmission(self, *args, **kwargs)
                    new.set_timeout(current._timeout_min, current._timeout_countdown)
                    with utils.temporary_save_path(path) as tmp:
                        new.dump(tmp)
                    print("gpuhpc: SIGTERM: state saved; waiting to be stopped", flush=True)
        except Exception as exc:  # never die in a signal handler
            print(f"gpuhpc: SIGTERM: could not save state: {exc}", flush=True)
        time.sleep(120)

    def checkpoint(self, *args: Any, **kwargs: Any):
        from submitit.helpers import DelayedSubmission

        from gpuhpc.jobs.checkpoint import restart_count

        if self.fn.checkpoint(*args, **kwargs) is False:
            return None
        if restart_count() >= self.max_requeues:
            _at_requeue_cap(self.max_requeues)
            return None
        return DelayedSubmission(self, *args, **kwargs)


class _SubmititPlain:
    """Adapter submitit pickles for a plain callable (not a :class:`Checkpointable`): at a
    preemption's SIGUSR2 submitit requeues the job and the call starts again from the beginning,
    at most ``max_requeues`` times; at the time limit it is not requeued (it would only run out
    of time again), as submitit does with a plain function."""

    def __init__(self, fn: Any, max_requeues: int, time_s: int) -> None:
        self.fn = fn
        self.max_requeues = max_requeues
        self.time_s = time_s
        self.started = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.started = time.time()
        return self.fn(*args, **kwargs)

    def checkpoint(self, *args: Any, **kwargs: Any):
        from submitit.helpers import DelayedSubmission

        from gpuhpc.jobs.checkpoint import restart_count

        if restart_count() >= self.max_requeues:
            _at_requeue_cap(self.max_requeues)
            return None
        # submitit's own test (SignalHandler.has_timed_out): the time limit, not a preemption
        if time.time() - self.started >= min(self.time_s * 0.8, self.time_s - 600):
            return None
        return DelayedSubmission(self, *args, **kwargs)


def _at_requeue_cap(max_requeues: int) -> None:
    """As the script templates: stopped with work left and not requeued is a failure, FAILED
    with exit code 75 and a ``requeue cap reached`` line; the job is made non-requeueable."""
    from gpuhpc.jobs.checkpoint import restart_count

    print(f"gpuhpc: requeue cap reached: already requeued {restart_count()} times (max_requeues {max_requeues}), "
          f"not requeueing; the program stopped early, so the job ends FAILED with exit code {os.EX_TEMPFAIL}",
          flush=True)
    _forbid_requeue()
    _exit_code_at_exit(os.EX_TEMPFAIL)


def _exit_code_at_exit(code: int) -> None:
    """Make this process exit with ``code`` once submitit has recorded the call's end (its
    UncompletedJobError result, which ``job.result()`` raises) and the interpreter exits."""
    import atexit

    def _exit() -> None:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    atexit.register(_exit)


def _forbid_requeue() -> None:
    """At the requeue cap, make the running job non-requeueable, as the script templates do:
    otherwise a preemption (PreemptMode=REQUEUE) would requeue it past the cap."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        return
    from gpuhpc.errors import GpuhpcError

    try:
        _client().update_job(job_id, Requeue="0")
    except GpuhpcError as exc:
        print(f"gpuhpc: could not mark job {job_id} non-requeueable: {exc}", flush=True)


def _submitit_params(resources: Resources, name: str, grace: int, scratch_root: str | None,
                     requeue: bool = True, checkpoint_dir: str | None = None,
                     user_setup: tuple[str, ...] = ()) -> dict:
    """submitit parameters from THE sbatch translation (no second mapping). ``requeue``
    (the default, as script mode's): ``--requeue``, so a preemption or a spot reclaim (its node
    set DOWN) requeues the call; False: ``--no-requeue``, the user's explicit opt-out.
    As script mode's template: one checkpoint directory per job (``checkpoint_dir``, ``%j`` the
    job id, default :func:`~gpuhpc.jobs.render.default_checkpoint_dir`), the same across its
    requeues, and the node's NCCL profile with the collective timeouts."""
    import shlex

    from gpuhpc.jobs.render import collective_timeout_s, default_checkpoint_dir, stop_timeout_s

    ckpt = check_text(checkpoint_dir or default_checkpoint_dir(), "checkpoint_dir")
    additional: dict[str, Any] = {}
    for opt, value in sbatch_options(resources, None, batch_signal=False):
        additional[opt] = True if value is None else value
    additional["requeue" if requeue else "no_requeue"] = True
    minutes = -(-resources.time_s // 60)
    setup = [
        'export GPUHPC_JOB_ID="$SLURM_JOB_ID"',
        'export GPUHPC_RUN_ID="$SLURM_JOB_ID"',            # the same across requeues (docs/jobs.md)
        'export GPUHPC_RESTART_COUNT="${SLURM_RESTART_COUNT:-0}"',
        'export GPUHPC_SCRATCH="${GPUHPC_SCRATCH_ROOT:-/tmp}/gpuhpc-$SLURM_JOB_ID"',
        'mkdir -p -- "$GPUHPC_SCRATCH"',
        "trap 'rm -rf -- \"$GPUHPC_SCRATCH\"' EXIT",
        # the job's own checkpoint dir: jobs from one directory never share .gpuhpc-latest or prune
        # each other's checkpoints (./checkpoints, checkpoint_dir()'s fallback, was shared)
        f"_gpuhpc_ckpt={shlex.quote(ckpt)}; _gpuhpc_pat='%j'",
        'export GPUHPC_CHECKPOINT_DIR="${_gpuhpc_ckpt//"$_gpuhpc_pat"/$SLURM_JOB_ID}"',
        'mkdir -p -- "$GPUHPC_CHECKPOINT_DIR"',
        # the node's NCCL/IB profile; each of its lines keeps a value already set
        '_gpuhpc_profile="${GPUHPC_NCCL_PROFILE:-/etc/gpuhpc/nccl.env}"',
        'if [ -r "$_gpuhpc_profile" ]; then . "$_gpuhpc_profile"; fi',
        f'export GPUHPC_COLLECTIVE_TIMEOUT_S="${{GPUHPC_COLLECTIVE_TIMEOUT_S:-{collective_timeout_s(grace)}}}"',
        f'export GPUHPC_STOP_COLLECTIVE_TIMEOUT_S="${{GPUHPC_STOP_COLLECTIVE_TIMEOUT_S:-{stop_timeout_s(grace)}}}"',
        'export TORCH_NCCL_ASYNC_ERROR_HANDLING="${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}"',
    ]
    if user_setup:          # the caller's setup lines (submit(fn, setup=[...])): then, as a script job's, in order
        from gpuhpc.jobs.spec import SETUP_RUNNER

        setup += [f"export GPUHPC_SETUP={shlex.quote(chr(10).join(user_setup))}", SETUP_RUNNER, "_gpuhpc_setup || exit"]
    params = {"time": minutes, "signal_delay_s": grace, "job_name": name, "setup": setup,
              "additional_parameters": additional}
    if resources.image is not None:             # the call's srun step in the image (pyxis)
        params["srun_args"] = container_srun_args(resources)
    return params


def _python_name_and_grace(name: str | None, fn: Callable[..., Any], grace: int | str,
                           resources: Resources) -> tuple[str, int]:
    """A Python-mode job's name (default: the function's) and grace in seconds, both checked."""
    if name is None:
        name = getattr(fn, "__name__", None) or type(fn).__name__
    name = check_text(name, "name", allow_empty=False)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", name):
        raise UserInputError(f"job name {name!r} must match [A-Za-z0-9._-]+ in Python mode", field="name")
    grace_s = grace if isinstance(grace, int) else parse_duration(grace, "grace")
    if grace_s >= resources.time_s:
        raise UserInputError("grace must be shorter than the time limit", field="grace")
    return name, grace_s


def _submit_callable(fn: Callable[..., Any], args: tuple, kwargs: dict, *, resources: Resources,
                     name: str | None, max_requeues: int, grace: int | str, folder: str | None,
                     client, requeue: bool = True, setup: tuple[str, ...] = (), dependency: str | None = None) -> "Job":
    import submitit

    from gpuhpc.jobs.checkpoint import Checkpointable

    if not callable(fn):
        raise UserInputError(f"{fn!r} is not callable", field="fn")
    name, grace_s = _python_name_and_grace(name, fn, grace, resources)
    if resources.image is not None:
        check_container_policy(resources)
        if not resources.image_python:
            v = sys.version_info
            raise UserInputError(f"cannot check that image {resources.image} has Python {v.major}.{v.minor} with "
                                 "cloudpickle and submitit, which a Python function needs to run inside it",
                                 field="image_python", hint="declare it with Resources(image_python=True), "
                                 "or submit a command (gpuhpc submit --image) instead")
    folder = folder or os.path.join(default_log_dir(), "submitit", "%j")
    if not isinstance(requeue, bool):
        raise UserInputError("expected true/false", field="requeue")
    max_requeues = max_requeues if requeue else 0        # opted out: never requeued, not even at a signal
    target: Any = fn
    if isinstance(fn, Checkpointable):
        target = _SubmititCallable(fn, max_requeues)
    else:
        target = _SubmititPlain(fn, max_requeues, resources.time_s)
    c = _client(client)
    if not c.runner.is_local:
        if resources.image is not None:      # the pickled call runs with the cluster's Python, checked on the host
            raise UserInputError("a Python function in a container image cannot be submitted over SSH yet",
                                 field="image", hint="submit a command (gpuhpc submit --image) instead")
        # submitit runs sbatch itself, locally: over SSH gpuhpc does its local half
        # (gpuhpc.jobs.remote) and submitit runs the call on the cluster as it does here
        from gpuhpc.jobs import remote

        check_fits_on(resources, c)
        from gpuhpc.jobs import snapshot     # checkpoints on the cluster, not in this machine's data dir

        params = _submitit_params(resources, name, grace_s, None, requeue,
                                  posixpath.join(snapshot.remote_base(c.runner), "checkpoints", "%j"), user_setup=setup)
        if dependency:
            params["additional_parameters"]["dependency"] = dependency
        job_id, call = remote.submit(target, args, kwargs, params=params, timeout_min=params["time"],
                                     max_requeues=max_requeues, client=c,
                                     reserve=lambda do: _with_reservation(resources, name, c, do))
        job = Job(job_id, client=c, name=name, log_path=call.log)
        job.remote_call = call
        return job
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_requeues,
                                      python="python3" if resources.image is not None else None)
    params = _submitit_params(resources, name, grace_s, None, requeue, user_setup=setup)
    if dependency:
        params["additional_parameters"]["dependency"] = dependency
    executor.update_parameters(**params)
    holder: dict[str, Any] = {}

    def do_submit() -> str:
        try:
            sjob = executor.submit(target, *args, **kwargs)
        except Exception as exc:  # submitit raises plain exceptions around sbatch
            raise SlurmError(f"submitting {name} failed", stderr=str(exc)) from exc
        holder["job"] = sjob
        return str(sjob.job_id)

    check_fits_on(resources, c)
    job_id = _with_reservation(resources, name, c, do_submit)
    sjob = holder["job"]
    return Job(job_id, client=c, name=name, submitit_job=sjob, log_path=str(sjob.paths.stdout))


def submit(fn_or_spec: Callable[..., Any] | JobSpec, *args: Any, resources: Resources | dict | None = None,
           name: str | None = None, max_requeues: int = DEFAULT_MAX_REQUEUES,
           grace: int | str = DEFAULT_GRACE_S, folder: str | None = None, client=None,
           cluster: str | None = None, requeue: bool = True, setup: Any = None, after: Any = None, after_kind: str = "ok",
           **kwargs: Any) -> "Job":
    """Submit a :class:`JobSpec` (script mode) or a Python callable (through submitit).

    ``gpuhpc.submit(fn, *args, resources=Resources(gpus=8, time="2h"), **kwargs)`` runs
    ``fn(*args, **kwargs)`` on the cluster; make ``fn`` a :class:`Checkpointable` to
    survive preemption and time limits (requeued at most ``max_requeues`` times; it gets
    SIGUSR2 ``grace`` seconds before the time limit). Every job is requeueable by default, so a
    preemption or a spot reclaim requeues it; ``requeue=False`` opts out (a JobSpec: its own
    ``requeue`` field). ``cluster="NAME"`` submits over SSH to the cluster profile NAME (from a
    laptop; the result comes back over SFTP). ``after=[job_or_id, ...]`` starts it only once
    those jobs ended COMPLETED (``after_kind="any"``: once they ended, however); an id Slurm does
    not know is refused (exit 1). Inside ``with gpuhpc.batch():`` a call is collected and goes
    out, with the block's other calls, as one job array when the block ends."""
    if after_kind not in AFTER_KINDS:
        raise UserInputError(f"unknown after_kind {after_kind!r}", field="after_kind", hint="ok or any")
    ids = after_ids(after, "after")
    from gpuhpc.jobs.spec import check_setup

    setup_lines = check_setup(setup, "setup")      # shell lines before the call (exit 2), as JobSpec.setup
    if cluster is not None and client is None:
        from gpuhpc.slurm.client import SlurmClient
        from gpuhpc.transport.ssh import shared_runner

        client = SlurmClient(shared_runner({**os.environ, "GPUHPC_CLUSTER": cluster}))
    if isinstance(fn_or_spec, JobSpec):
        if args or kwargs:
            raise UserInputError("a JobSpec takes no extra arguments", field="args")
        if _BATCH.get() is not None:
            raise UserInputError("gpuhpc.batch() collects Python calls, not a JobSpec", field="fn",
                                 hint="submit the JobSpec outside the block, or give it array=")
        if ids:
            import dataclasses

            fn_or_spec = dataclasses.replace(fn_or_spec, **{"after" if after_kind == "ok" else "after_any": ids})
        if setup_lines:
            import dataclasses

            fn_or_spec = dataclasses.replace(fn_or_spec, setup=(*fn_or_spec.setup, *setup_lines))
        return submit_spec(fn_or_spec, client=client)
    if isinstance(resources, dict):          # a plain mapping: unknown names list the valid ones
        resources = Resources.from_mapping(resources)
    opts = {"resources": resources or Resources(), "name": name, "max_requeues": max_requeues, "grace": grace,
            "folder": folder, "client": client, "requeue": requeue, "after": ids, "after_kind": after_kind}
    pending = _BATCH.get()
    if pending is not None and setup_lines:
        raise UserInputError("setup lines are not taken inside gpuhpc.batch() yet", field="setup",
                             hint="submit the call outside the block, or put the lines in the function")
    if pending is not None:
        return pending.add(fn_or_spec, args, kwargs, opts)
    dependency = None
    if ids:
        client = _client(client)
        check_after(client, *((ids, ()) if after_kind == "ok" else ((), ids)))
        dependency = after_dependency(*((ids, ()) if after_kind == "ok" else ((), ids)))
    return _submit_callable(fn_or_spec, args, kwargs, setup=setup_lines, resources=opts["resources"], name=name,
                            max_requeues=max_requeues, grace=grace, folder=folder, client=client,
                            requeue=requeue, dependency=dependency)


def _short_time(text: str) -> str:
    """scontrol's ``00:01:02`` as squeue prints it (``1:02``; ``1:01:02``, ``1-01:01:02`` kept)."""
    if "-" in text or text.count(":") != 2:
        return text
    if text.startswith("00:"):
        text = text[3:]
    return text[1:] if len(text) > 4 and text[0] == "0" and text[2] == ":" else text


# ---------------------------------------------------------------- the handle
class Job:
    """A submitted job. ``state`` is a :class:`JobState`; ``slurm_state`` keeps the raw
    string Slurm printed. PREEMPTED, REQUEUED and NODE_FAIL are never "finished": a
    requeueable job comes back."""

    def __init__(self, job_id: str, *, client=None, name: str | None = None,
                 submitit_job: Any = None, log_path: str | None = None) -> None:
        self.job_id = check_job_id(job_id)
        self._client = client
        self.name = name
        self.submitit_job = submitit_job
        self._log_path = log_path
        self.snapshot = None            # where the code snapshot is (gpuhpc.jobs.snapshot.Uploaded)
        self.remote_call = None         # Python mode over SSH: where its files are (gpuhpc.jobs.remote)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, name={self.name!r})"

    @property
    def client(self):
        if self._client is None:
            self._client = _client()
        return self._client

    # ------------------------------------------------------------ state
    def info(self) -> dict[str, Any]:
        """State and accounting facts: from squeue while the job is known there, else sacct."""
        rows = [r for r in self.client.queue(job_ids=[self.job_id]) if r.job_id == self.job_id]
        if rows:
            r = rows[0]
            return {"job_id": self.job_id, "name": r.name, "state": r.state.state.value,
                    "raw_state": r.state.raw, "reason": r.reason, "elapsed": r.elapsed,
                    "time_limit": r.time_limit, "nodes": r.nodes, "nodelist": r.nodelist,
                    "partition": r.partition, "account": r.account, "user": r.user,
                    "tres_per_node": r.tres_per_node, "source": "squeue"}
        acct = [a for a in self.client.accounting(job_ids=[self.job_id]) if a.job_id == self.job_id]
        if acct:
            a = acct[-1]
            return {"job_id": self.job_id, "name": a.name, "state": a.state.state.value,
                    "raw_state": a.state.raw, "reason": "", "elapsed_s": a.elapsed_s,
                    "time_limit": a.time_limit, "nodelist": a.nodelist, "partition": a.partition,
                    "account": a.account, "user": a.user, "exit_code": a.exit_code,
                    "gpus": a.gpus, "source": "sacct"}
        return {"job_id": self.job_id, "state": JobState.UNKNOWN.value, "raw_state": "", "source": "none"}

    def status(self) -> dict[str, Any]:
        """:meth:`info` plus ``restarts``, ``finished`` and ``log`` (what ``gpuhpc status``
        prints), asking Slurm one question: slurmctld (``scontrol show job``) while it knows the
        job, else slurmdbd (one ``sacct --duplicates``: state and restarts from the same rows).
        Raises GpuhpcError when neither knows the job."""
        client = self.client
        rec = client.show_job(self.job_id)
        if rec:
            info = self._info_from_record(rec)
            info["restarts"] = self.restarts(rec)
            info["finished"] = self._done(JobState(info["state"]), rec)
            info["log"] = self.log_path(rec)
        else:
            runs = [a for a in client.accounting(job_ids=[self.job_id], duplicates=True) if a.job_id == self.job_id]
            if not runs:
                raise GpuhpcError(f"job {self.job_id} not found in squeue or sacct")
            a = runs[-1]
            info = {"job_id": self.job_id, "name": a.name, "state": a.state.state.value,
                    "raw_state": a.state.raw, "reason": "", "elapsed_s": a.elapsed_s,
                    "time_limit": a.time_limit, "nodelist": a.nodelist, "partition": a.partition,
                    "account": a.account, "user": a.user, "exit_code": a.exit_code,
                    "gpus": a.gpus, "source": "sacct"}
            info["restarts"] = len(runs) - 1
            # slurmctld has forgotten it: no requeue can bring it back
            info["finished"] = a.state.state.is_finished or a.state.state in (JobState.PREEMPTED, JobState.NODE_FAIL)
            info["log"] = self._known_log_path()
        if rec and "Minutes" in (rec.get("Reason") or ""):      # held by a budget: in words
            from gpuhpc.ledger import budget

            try:
                limit = int(rec.get("TimeLimit_s") or 0) or None
            except ValueError:
                limit = None
            if limit is None:
                from gpuhpc.slurm.durations import reported_seconds

                try:
                    limit = reported_seconds(rec.get("TimeLimit", "")) or None
                except GpuhpcError:
                    limit = None
            text = budget.explain_reason(rec.get("Reason"), account=rec.get("Account"),
                                         user=(rec.get("UserId") or "").split("(", 1)[0] or None,
                                         partition=rec.get("Partition"), tres_per_node=rec.get("TresPerNode"),
                                         nodes=int(rec.get("NumNodes", "1").split("-")[0] or 1),
                                         time_limit_s=limit)
            if text:
                info["budget"] = text
        return info

    def _info_from_record(self, rec: dict[str, str]) -> dict[str, Any]:
        """:meth:`info`'s fields from the job's ``scontrol show job`` record (times as squeue
        prints them)."""
        st = SlurmState.parse(rec.get("JobState", ""))
        nodes = (rec.get("NumNodes") or "1").split("-")[0]
        nodelist = rec.get("NodeList", "")
        return {"job_id": self.job_id, "name": rec.get("JobName", ""), "state": st.state.value, "raw_state": st.raw,
                "reason": rec.get("Reason", ""), "elapsed": _short_time(rec.get("RunTime", "")),
                "time_limit": _short_time(rec.get("TimeLimit", "")), "nodes": int(nodes) if nodes.isdigit() else 1,
                "nodelist": "" if nodelist == "(null)" else nodelist, "partition": rec.get("Partition", ""),
                "account": rec.get("Account", ""), "user": (rec.get("UserId") or "").split("(", 1)[0],
                "tres_per_node": rec.get("TresPerNode", "N/A"), "source": "slurmctld"}

    @property
    def slurm_state(self) -> SlurmState:
        info = self.info()
        return SlurmState(JobState(info["state"]), info.get("raw_state", ""))

    @property
    def state(self) -> JobState:
        return self.slurm_state.state

    def restarts(self, rec: dict[str, str] | None = None) -> int:
        """How many times the job was requeued (``rec``: its ``scontrol show job`` record, when
        the caller has it)."""
        if rec and rec.get("Restarts", "").isdigit():
            return int(rec["Restarts"])
        return self.client.restarts(self.job_id)

    def done(self) -> bool:
        return self._done(self.state)

    def _done(self, st: JobState, rec: dict[str, str] | None = None) -> bool:
        if st.is_finished:
            return True
        if st in (JobState.PREEMPTED, JobState.NODE_FAIL):
            rec = rec or self.client.show_job(self.job_id)      # not requeueable (cap reached)
            return bool(rec) and rec.get("Requeue") == "0"
        return False

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> JobState:
        """Block until the job is finished; returns the final state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} still {self.state.value} after {timeout}s")
            time.sleep(poll)
        return self.state

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then return the callable's result (Python mode) or None (script mode).
        Raises :class:`JobFailed` when the job did not complete."""
        final = self.wait(timeout)
        if self.submitit_job is not None:
            return self.submitit_job.result()
        if self.remote_call is not None:
            from gpuhpc.jobs.remote import load_result

            return load_result(self.client.runner, self.remote_call, self.job_id)
        if final is not JobState.COMPLETED:
            raise JobFailed(f"job {self.job_id} ended {final.value}", hint=f"gpuhpc logs {self.job_id}")
        return None

    def cancel(self) -> None:
        self.client.cancel(self.job_id)

    # ------------------------------------------------------------ logs
    def log_path(self, rec: dict[str, str] | None = None) -> str | None:
        """StdOut= from ``scontrol show job`` (``rec``, when the caller has it) while Slurm knows
        the job, else the path recorded at submission, else a ``*-<id>.out`` file in the default
        log dir."""
        rec = rec or self.client.show_job(self.job_id)
        if rec and rec.get("StdOut"):
            return rec["StdOut"]
        return self._known_log_path()

    def _known_log_path(self) -> str | None:
        """:meth:`log_path` without asking Slurm: the path recorded at submission, else a
        ``*-<id>.out`` file in the default log dir."""
        if self._log_path:
            return self._log_path
        d = default_log_dir()
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(f"-{self.job_id}.out"))
        except FileNotFoundError:
            names = []
        if names:
            return os.path.join(d, names[0])
        sub = os.path.join(d, "submitit", self.job_id, f"{self.job_id}_0_log.out")
        return sub if os.path.exists(sub) else None

    def logs(self) -> str:
        """The job's output; a separate stderr file (submitit jobs) is appended."""
        rec = self.client.show_job(self.job_id)
        paths = [self.log_path(rec)]
        if rec and rec.get("StdErr") and rec.get("StdErr") != rec.get("StdOut"):
            paths.append(rec["StdErr"])
        elif self.submitit_job is not None:
            paths.append(str(self.submitit_job.paths.stderr))
        return "".join(self.read_text(p) for p in paths if p)

    def follow_log(self, poll: float = 0.5, check_every: float = 3.0) -> Iterator[bytes]:
        """The job's output as it grows, until the job is finished: each poll reads only the
        bytes after the last read (locally, or over SSH through the job's runner)."""
        path, offset, last_check = None, 0, 0.0
        while True:
            path = path or self.log_path()
            if path:
                chunk = self.client.runner.read_from(path, offset)
                if chunk:
                    offset += len(chunk)
                    yield chunk
            now = time.monotonic()
            if now - last_check > check_every:
                last_check = now
                if self.done():
                    if path:                        # what was written before the end
                        chunk = self.client.runner.read_from(path, offset)
                        if chunk:
                            yield chunk
                    return
            time.sleep(poll)

    def read_text(self, path: str) -> str:
        """Read a log file where the job's Slurm client runs (locally, or over SSH when
        GPUHPC_SSH_HOST is set); a file that does not exist yet reads as empty."""
        from gpuhpc.errors import TransportError

        try:
            return self.client.runner.read_file(path)
        except TransportError:
            return ""


# ---------------------------------------------------------------- many calls: map_array, batch
#: the open ``gpuhpc.batch()`` block of this thread/task (None outside one); set and reset by
#: :func:`batch` only, so nothing outlives the block
_BATCH: contextvars.ContextVar["_Batch | None"] = contextvars.ContextVar("gpuhpc_batch", default=None)


def _submit_calls(calls: list[tuple[Callable[..., Any], tuple, dict]], *, resources: Resources | dict | None,
                  name: str | None, max_requeues: int, grace: int | str, folder: str | None, client,
                  requeue: bool, after: tuple[str, ...] = (), after_kind: str = "ok",
                  parallelism: int | None = None) -> list["Job"]:
    """``calls`` as job arrays through submitit (one array, or one per MaxArraySize calls), the
    ledger holding each array's tasks; returns one :class:`Job` per call, in order (ids
    ``ARRAY_TASK``). The checks :func:`_submit_callable` makes, once for all calls."""
    import submitit

    from gpuhpc.jobs.checkpoint import Checkpointable

    if isinstance(resources, dict):
        resources = Resources.from_mapping(resources)
    resources = resources or Resources()
    for fn, _, _ in calls:
        if not callable(fn):
            raise UserInputError(f"{fn!r} is not callable", field="fn")
    if not calls:
        return []
    if parallelism is not None and (isinstance(parallelism, bool) or not isinstance(parallelism, int)
                                    or parallelism < 1):
        raise UserInputError(f"expected a positive whole number, got {parallelism!r}", field="parallelism")
    name, grace_s = _python_name_and_grace(name, calls[0][0], grace, resources)
    if not isinstance(requeue, bool):
        raise UserInputError("expected true/false", field="requeue")
    if resources.image is not None:
        raise UserInputError("map_array and batch() do not run Python functions in a container image yet",
                             field="image", hint="submit each call with gpuhpc.submit(..., resources=...)")
    c = _client(client)
    if not c.runner.is_local:
        raise UserInputError("map_array and batch() submit through submitit where Slurm runs; over SSH "
                             "(cluster=) they are not supported", field="cluster",
                             hint="submit each call with gpuhpc.submit(fn, ..., cluster=...), or run them "
                                  "as a sweep (gpuhpc.sweep(..., cluster=...))")
    max_requeues = max_requeues if requeue else 0
    dep_ids = (after, ()) if after_kind == "ok" else ((), after)
    if after:
        check_after(c, *dep_ids)
    check_fits_on(resources, c)
    try:
        size = int(c.config().get("MaxArraySize") or 1001)
    except (GpuhpcError, ValueError):
        size = 1001
    folder = folder or os.path.join(default_log_dir(), "submitit", "%j")
    params = _submitit_params(resources, name, grace_s, None, requeue)
    dependency = after_dependency(*dep_ids)
    if dependency:
        params["additional_parameters"]["dependency"] = dependency
    out: list[Job] = []
    for start in range(0, len(calls), size):
        part = calls[start:start + size]
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_requeues)
        executor.update_parameters(**params, array_parallelism=min(parallelism or len(part), len(part)))
        holder: list[Any] = []

        def do_submit(part=part, executor=executor, holder=holder) -> str:
            try:
                with executor.batch():
                    for fn, args, kwargs in part:
                        target = _SubmititCallable(fn, max_requeues) if isinstance(fn, Checkpointable) \
                            else _SubmititPlain(fn, max_requeues, resources.time_s)
                        holder.append(executor.submit(target, *args, **kwargs))
            except Exception as exc:  # submitit raises plain exceptions around sbatch
                raise SlurmError(f"submitting {name} ({len(part)} calls) failed", stderr=str(exc)) from exc
            return str(holder[0].job_id).split("_", 1)[0]

        _with_reservation(resources, name, c, do_submit, array_size=len(part))
        out += [Job(str(sj.job_id), client=c, name=name, submitit_job=sj, log_path=str(sj.paths.stdout))
                for sj in holder]
    return out


def map_array(fn: Callable[..., Any], iterable: Any, *iterables: Any, resources: Resources | dict | None = None,
              name: str | None = None, max_requeues: int = DEFAULT_MAX_REQUEUES, grace: int | str = DEFAULT_GRACE_S,
              folder: str | None = None, client=None, requeue: bool = True, after: Any = None,
              after_kind: str = "ok", parallelism: int | None = None) -> list["Job"]:
    """``fn(x)`` for each ``x`` of ``iterable`` (``fn(x, y, ...)`` with more iterables, zipped, as
    submitit's ``executor.map_array``) as ONE Slurm job array (one array per MaxArraySize calls
    when there are more), at most ``parallelism`` tasks running at once. Returns the jobs in the
    order of the inputs: ``[j.result() for j in jobs]``, or :func:`gpuhpc.as_completed`."""
    if after_kind not in AFTER_KINDS:
        raise UserInputError(f"unknown after_kind {after_kind!r}", field="after_kind", hint="ok or any")
    if isinstance(iterable, (str, bytes, Mapping)) or not hasattr(iterable, "__iter__"):
        raise UserInputError("expected an iterable of inputs (a list, a range ...)", field="iterable")
    calls = [(fn, tuple(args), {}) for args in zip(iterable, *iterables)]
    return _submit_calls(calls, resources=resources, name=name, max_requeues=max_requeues, grace=grace,
                         folder=folder, client=client, requeue=requeue, after=after_ids(after, "after"),
                         after_kind=after_kind, parallelism=parallelism)


class _Batch:
    """The calls of one ``gpuhpc.batch()`` block: every ``gpuhpc.submit`` in it hands back a
    handle whose id is set when the block ends and the calls go out as one array."""

    def __init__(self, parallelism: int | None) -> None:
        self.parallelism = parallelism
        self.calls: list[tuple[Callable[..., Any], tuple, dict]] = []
        self.handles: list[Job] = []
        self.opts: dict[str, Any] | None = None

    def add(self, fn: Callable[..., Any], args: tuple, kwargs: dict, opts: dict[str, Any]) -> "Job":
        if not callable(fn):
            raise UserInputError(f"{fn!r} is not callable", field="fn")
        if self.opts is None:
            self.opts = opts
        else:
            diff = next((k for k in opts if k != "name" and opts[k] != self.opts[k]), None)
            if diff is not None:
                raise UserInputError(f"every call in a gpuhpc.batch() block goes out in one array, with the same "
                                     f"{diff}: this one differs", field=diff,
                                     hint="submit calls with other options outside the block")
        job = Job("0", client=opts["client"], name=opts["name"])
        job.job_id = None           # type: ignore[assignment]  # set when the block ends
        self.calls.append((fn, args, kwargs))
        self.handles.append(job)
        return job

    def flush(self) -> None:
        if not self.calls:
            return
        opts = dict(self.opts or {})
        jobs = _submit_calls(self.calls, **opts, parallelism=self.parallelism)
        for handle, job in zip(self.handles, jobs):
            handle.job_id, handle._client, handle.name = job.job_id, job.client, job.name
            handle.submitit_job, handle._log_path = job.submitit_job, job._log_path


@contextlib.contextmanager
def batch(*, parallelism: int | None = None) -> Iterator[_Batch]:
    """``with gpuhpc.batch(): jobs = [gpuhpc.submit(fn, x, resources=r) for x in xs]``: the calls
    submitted in the block go out as ONE job array when it ends (as submitit's
    ``executor.batch()``); each handle's ``job_id`` is ``None`` until then. Every call needs the
    same options (resources, after, ...); an exception in the block submits nothing."""
    if _BATCH.get() is not None:
        raise UserInputError("gpuhpc.batch() blocks do not nest", field="batch")
    pending = _Batch(parallelism)
    token = _BATCH.set(pending)
    try:
        yield pending
    finally:
        _BATCH.reset(token)
    pending.flush()

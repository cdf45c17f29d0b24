"""What submitit runs for a Python-mode job, and how it is asked to.

- :class:`SubmititCallable` and :class:`SubmititPlain`: the objects submitit pickles around
  the user's callable (a :class:`~gpuhpc.jobs.checkpoint.Checkpointable` or a plain function):
  its checkpoint hook at SIGUSR2/SIGTERM and the requeue cap, as the script templates do;
- :func:`submitit_params`: submitit's parameters from THE sbatch translation
  (:func:`gpuhpc.jobs.spec.sbatch_options`) and the job's setup lines (ids, scratch, the
  checkpoint directory, the node's NCCL profile);
- :func:`python_name_and_grace`: a Python-mode job's name and grace, checked.

Used by :mod:`gpuhpc.jobs.python_mode` (here and over SSH, :mod:`gpuhpc.jobs.remote`).
"""
from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.jobs.spec import Resources, check_text, container_srun_args, parse_duration, sbatch_options


class SubmititCallable:
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


class SubmititPlain:
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
    from gpuhpc.slurm.client import SlurmClient

    try:
        SlurmClient().update_job(job_id, Requeue="0")
    except GpuhpcError as exc:
        print(f"gpuhpc: could not mark job {job_id} non-requeueable: {exc}", flush=True)


def submitit_params(resources: Resources, name: str, grace: int, scratch_root: str | None,
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


def python_name_and_grace(name: str | None, fn: Callable[..., Any], grace: int | str,
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

"""The public entry points for jobs: :func:`submit` and the names ``gpuhpc`` exports.

Two modes share the resource translation (:func:`gpuhpc.jobs.spec.sbatch_options`), the
checks before sbatch (:mod:`gpuhpc.jobs.admission`: the jobs waited for, the ledger's hold)
and the :class:`~gpuhpc.jobs.handle.Job` handle (:mod:`gpuhpc.jobs.handle`):

- script mode (:mod:`gpuhpc.jobs.script_mode`): ``submit(JobSpec(...))`` (what
  ``gpuhpc submit`` calls) renders a job template and runs ``sbatch`` through
  :class:`~gpuhpc.slurm.SlurmClient`;
- Python mode (:mod:`gpuhpc.jobs.python_mode`): ``submit(fn, *args, resources=Resources(...))``
  runs ``fn`` through submitit (what it pickles: :mod:`gpuhpc.jobs.submitit_adapters`);
  :class:`~gpuhpc.jobs.checkpoint.Checkpointable` callables survive preemption and time
  limits; :func:`map_array` and :func:`batch` send many calls as one job array.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from gpuhpc.errors import JobFailed, UserInputError
from gpuhpc.jobs.admission import check_after
from gpuhpc.jobs.handle import Job, check_job_id, slurm_client
from gpuhpc.jobs.python_mode import batch, map_array, open_batch, submit_callable
from gpuhpc.jobs.script_mode import submit_spec, with_fewest_switches, with_profile
from gpuhpc.jobs.spec import (AFTER_KINDS, DEFAULT_GRACE_S, DEFAULT_MAX_REQUEUES, JobSpec, Resources,
                              after_dependency, after_ids)

__all__ = ["Job", "JobFailed", "batch", "check_after", "check_job_id", "map_array", "submit", "submit_spec",
           "with_fewest_switches", "with_profile"]


def submit(fn_or_spec: Callable[..., Any] | JobSpec, *args: Any, resources: Resources | dict | None = None,
           name: str | None = None, max_requeues: int = DEFAULT_MAX_REQUEUES,
           grace: int | str = DEFAULT_GRACE_S, folder: str | None = None, client=None,
           cluster: str | None = None, requeue: bool = True, setup: Any = None, after: Any = None, after_kind: str = "ok",
           notify: Any = None, **kwargs: Any) -> Job:
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
    out, with the block's other calls, as one job array when the block ends. ``notify={"mail": ...,
    "webhook": ..., "events": [...]}`` (or a :class:`~gpuhpc.jobs.spec.Notify`) is a job file's
    ``notify:``: Slurm's mail and webhooks on end, failure and the requeue cap, checked alike."""
    if after_kind not in AFTER_KINDS:
        raise UserInputError(f"unknown after_kind {after_kind!r}", field="after_kind", hint="ok or any")
    ids = after_ids(after, "after")
    from gpuhpc.jobs.spec import check_setup

    setup_lines = check_setup(setup, "setup")      # shell lines before the call (exit 2), as JobSpec.setup
    from gpuhpc.jobs.spec import Notify

    notify = Notify.from_value(notify)              # as a job file's notify: (exit 2 naming notify.*)
    if cluster is not None and client is None:
        from gpuhpc.slurm.client import SlurmClient
        from gpuhpc.transport.ssh import shared_runner

        client = SlurmClient(shared_runner({**os.environ, "GPUHPC_CLUSTER": cluster}))
    if isinstance(fn_or_spec, JobSpec):
        if args or kwargs:
            raise UserInputError("a JobSpec takes no extra arguments", field="args")
        if open_batch() is not None:
            raise UserInputError("gpuhpc.batch() collects Python calls, not a JobSpec", field="fn",
                                 hint="submit the JobSpec outside the block, or give it array=")
        if ids:
            import dataclasses

            fn_or_spec = dataclasses.replace(fn_or_spec, **{"after" if after_kind == "ok" else "after_any": ids})
        if setup_lines:
            import dataclasses

            fn_or_spec = dataclasses.replace(fn_or_spec, setup=(*fn_or_spec.setup, *setup_lines))
        if notify is not None:
            if fn_or_spec.notify is not None:
                raise UserInputError("notify given twice: in the JobSpec and to submit()", field="notify",
                                     hint="keep one")
            import dataclasses

            fn_or_spec = dataclasses.replace(fn_or_spec, notify=notify)     # JobSpec's own checks run again
        return submit_spec(fn_or_spec, client=client)
    if isinstance(resources, dict):          # a plain mapping: unknown names list the valid ones
        resources = Resources.from_mapping(resources)
    opts = {"resources": resources or Resources(), "name": name, "max_requeues": max_requeues, "grace": grace,
            "folder": folder, "client": client, "requeue": requeue, "after": ids, "after_kind": after_kind}
    pending = open_batch()
    if pending is not None and setup_lines:
        raise UserInputError("setup lines are not taken inside gpuhpc.batch() yet", field="setup",
                             hint="submit the call outside the block, or put the lines in the function")
    if pending is not None and notify is not None:
        raise UserInputError("notify is not taken inside gpuhpc.batch() yet", field="notify",
                             hint="submit the call outside the block")
    if pending is not None:
        return pending.add(fn_or_spec, args, kwargs, opts)
    dependency = None
    if ids:
        client = slurm_client(client)
        check_after(client, *((ids, ()) if after_kind == "ok" else ((), ids)))
        dependency = after_dependency(*((ids, ()) if after_kind == "ok" else ((), ids)))
    return submit_callable(fn_or_spec, args, kwargs, setup=setup_lines, resources=opts["resources"], name=name,
                           max_requeues=max_requeues, grace=grace, folder=folder, client=client,
                           requeue=requeue, dependency=dependency, notify=notify)

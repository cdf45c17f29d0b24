"""Python mode: ``fn(*args)`` run on the cluster through submitit.

- :func:`submit_callable`: one call, one job (here, or over SSH through :mod:`gpuhpc.jobs.remote`);
- :func:`map_array` and :func:`batch`: many calls as one job array (:func:`submit_calls`);
  :class:`BatchedCalls` holds the calls of an open ``gpuhpc.batch()`` block
  (:func:`open_batch` returns it).

What submitit pickles and its parameters are in :mod:`gpuhpc.jobs.submitit_adapters`; the
checks before sbatch in :mod:`gpuhpc.jobs.admission`.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import posixpath
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gpuhpc.errors import GpuhpcError, SlurmError, UserInputError
from gpuhpc.jobs.admission import check_after, with_reservation
from gpuhpc.jobs.handle import Job, slurm_client
from gpuhpc.jobs.spec import (AFTER_KINDS, DEFAULT_GRACE_S, DEFAULT_MAX_REQUEUES, Notify, Resources, after_dependency,
                              after_ids, check_container_policy, check_fits_on, default_log_dir, parse_sbatch_arg)
from gpuhpc.jobs.submitit_adapters import SubmititCallable, SubmititPlain, python_name_and_grace, submitit_params


def submit_callable(fn: Callable[..., Any], args: tuple, kwargs: dict, *, resources: Resources,
                     name: str | None, max_requeues: int, grace: int | str, folder: str | None,
                     client, requeue: bool = True, setup: tuple[str, ...] = (), dependency: str | None = None,
                     notify: Notify | None = None) -> Job:
    import submitit

    from gpuhpc.jobs.checkpoint import Checkpointable

    if not callable(fn):
        raise UserInputError(f"{fn!r} is not callable", field="fn")
    name, grace_s = python_name_and_grace(name, fn, grace, resources)
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
    mail = notify_mail_options(notify, resources)
    target: Any = fn
    if isinstance(fn, Checkpointable):
        target = SubmititCallable(fn, max_requeues)
    else:
        target = SubmititPlain(fn, max_requeues, resources.time_s)
    c = slurm_client(client)
    if not c.runner.is_local:
        if resources.image is not None:      # the pickled call runs with the cluster's Python, checked on the host
            raise UserInputError("a Python function in a container image cannot be submitted over SSH yet",
                                 field="image", hint="submit a command (gpuhpc submit --image) instead")
        # submitit runs sbatch itself, locally: over SSH gpuhpc does its local half
        # (gpuhpc.jobs.remote) and submitit runs the call on the cluster as it does here
        from gpuhpc.jobs import remote

        check_fits_on(resources, c)
        from gpuhpc.jobs import snapshot     # checkpoints on the cluster, not in this machine's data dir

        params = submitit_params(resources, name, grace_s, None, requeue,
                                 posixpath.join(snapshot.remote_base(c.runner), "checkpoints", "%j"), user_setup=setup)
        if dependency:
            params["additional_parameters"]["dependency"] = dependency
        params["additional_parameters"].update(mail)
        job_id, call = remote.submit(target, args, kwargs, params=params, timeout_min=params["time"],
                                     max_requeues=max_requeues, client=c,
                                     reserve=lambda do: with_reservation(resources, name, c, do))
        job = Job(job_id, client=c, name=name, log_path=call.log)
        job.remote_call = call
        register_webhooks(job_id, name, notify, c.runner)
        return job
    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=max_requeues,
                                      python="python3" if resources.image is not None else None)
    params = submitit_params(resources, name, grace_s, None, requeue, user_setup=setup)
    if dependency:
        params["additional_parameters"]["dependency"] = dependency
    params["additional_parameters"].update(mail)
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
    job_id = with_reservation(resources, name, c, do_submit)
    sjob = holder["job"]
    register_webhooks(job_id, name, notify, c.runner)
    return Job(job_id, client=c, name=name, submitit_job=sjob, log_path=str(sjob.paths.stdout))


def notify_mail_options(notify: Notify | None, resources: Resources) -> dict[str, str]:
    """A Python call's ``notify=`` mail as sbatch options (``--mail-type``/``--mail-user``), as a
    job file's ``notify.mail``; mail also given in ``Resources(extra=...)`` is refused."""
    if notify is None or notify.mail is None:
        return {}
    given = {parse_sbatch_arg(a, "resources.extra")[0] for a in resources.extra} & {"mail-type", "mail-user"}
    if given:
        raise UserInputError(f"notify.mail and --{sorted(given)[0]} in resources.extra both given", field="notify.mail",
                             hint="keep one: notify.mail sets --mail-type/--mail-user")
    return {"mail-type": notify.mail_type, "mail-user": notify.mail}


def register_webhooks(job_id: str, name: str, notify: Notify | None, runner: Any) -> None:
    """``notify=``'s webhooks, sent by :mod:`gpuhpc.jobs.notify` outside the job (as script mode's)."""
    if notify is not None and notify.webhooks:
        from gpuhpc.jobs.notify import register

        register(job_id, name, notify, runner)


# ---------------------------------------------------------------- many calls: map_array, batch
#: the open ``gpuhpc.batch()`` block of this thread/task (None outside one); set and reset by
#: :func:`batch` only, so nothing outlives the block
_BATCH: contextvars.ContextVar["BatchedCalls | None"] = contextvars.ContextVar("gpuhpc_batch", default=None)


def submit_calls(calls: list[tuple[Callable[..., Any], tuple, dict]], *, resources: Resources | dict | None,
                 name: str | None, max_requeues: int, grace: int | str, folder: str | None, client,
                 requeue: bool, after: tuple[str, ...] = (), after_kind: str = "ok",
                 parallelism: int | None = None) -> list[Job]:
    """``calls`` as job arrays through submitit (one array, or one per MaxArraySize calls), the
    ledger holding each array's tasks; returns one :class:`Job` per call, in order (ids
    ``ARRAY_TASK``). The checks :func:`submit_callable` makes, once for all calls."""
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
    name, grace_s = python_name_and_grace(name, calls[0][0], grace, resources)
    if not isinstance(requeue, bool):
        raise UserInputError("expected true/false", field="requeue")
    if resources.image is not None:
        raise UserInputError("map_array and batch() do not run Python functions in a container image yet",
                             field="image", hint="submit each call with gpuhpc.submit(..., resources=...)")
    c = slurm_client(client)
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
    params = submitit_params(resources, name, grace_s, None, requeue)
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
                        target = SubmititCallable(fn, max_requeues) if isinstance(fn, Checkpointable) \
                            else SubmititPlain(fn, max_requeues, resources.time_s)
                        holder.append(executor.submit(target, *args, **kwargs))
            except Exception as exc:  # submitit raises plain exceptions around sbatch
                raise SlurmError(f"submitting {name} ({len(part)} calls) failed", stderr=str(exc)) from exc
            return str(holder[0].job_id).split("_", 1)[0]

        with_reservation(resources, name, c, do_submit, array_size=len(part))
        out += [Job(str(sj.job_id), client=c, name=name, submitit_job=sj, log_path=str(sj.paths.stdout))
                for sj in holder]
    return out


def map_array(fn: Callable[..., Any], iterable: Any, *iterables: Any, resources: Resources | dict | None = None,
              name: str | None = None, max_requeues: int = DEFAULT_MAX_REQUEUES, grace: int | str = DEFAULT_GRACE_S,
              folder: str | None = None, client=None, requeue: bool = True, after: Any = None,
              after_kind: str = "ok", parallelism: int | None = None) -> list[Job]:
    """``fn(x)`` for each ``x`` of ``iterable`` (``fn(x, y, ...)`` with more iterables, zipped, as
    submitit's ``executor.map_array``) as ONE Slurm job array (one array per MaxArraySize calls
    when there are more), at most ``parallelism`` tasks running at once. Returns the jobs in the
    order of the inputs: ``[j.result() for j in jobs]``, or :func:`gpuhpc.as_completed`."""
    if after_kind not in AFTER_KINDS:
        raise UserInputError(f"unknown after_kind {after_kind!r}", field="after_kind", hint="ok or any")
    if isinstance(iterable, (str, bytes, Mapping)) or not hasattr(iterable, "__iter__"):
        raise UserInputError("expected an iterable of inputs (a list, a range ...)", field="iterable")
    calls = [(fn, tuple(args), {}) for args in zip(iterable, *iterables)]
    return submit_calls(calls, resources=resources, name=name, max_requeues=max_requeues, grace=grace,
                        folder=folder, client=client, requeue=requeue, after=after_ids(after, "after"),
                        after_kind=after_kind, parallelism=parallelism)


def open_batch() -> "BatchedCalls | None":
    """The ``gpuhpc.batch()`` block open in this thread/task (None outside one)."""
    return _BATCH.get()


class BatchedCalls:
    """The calls of one ``gpuhpc.batch()`` block, not submitted yet: every ``gpuhpc.submit`` in
    the block adds its call here (:meth:`add`) and gets a handle with no id; when the block ends
    (:meth:`flush`) the calls go out as one array and each handle gets its id."""

    def __init__(self, parallelism: int | None) -> None:
        self.parallelism = parallelism
        self.calls: list[tuple[Callable[..., Any], tuple, dict]] = []
        self.handles: list[Job] = []
        self.opts: dict[str, Any] | None = None

    def add(self, fn: Callable[..., Any], args: tuple, kwargs: dict, opts: dict[str, Any]) -> Job:
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
        jobs = submit_calls(self.calls, **opts, parallelism=self.parallelism)
        for handle, job in zip(self.handles, jobs):
            handle.job_id, handle._client, handle.name = job.job_id, job.client, job.name
            handle.submitit_job, handle._log_path = job.submitit_job, job._log_path


@contextlib.contextmanager
def batch(*, parallelism: int | None = None) -> Iterator[BatchedCalls]:
    """``with gpuhpc.batch(): jobs = [gpuhpc.submit(fn, x, resources=r) for x in xs]``: the calls
    submitted in the block go out as ONE job array when it ends (as submitit's
    ``executor.batch()``); each handle's ``job_id`` is ``None`` until then. Every call needs the
    same options (resources, after, ...); an exception in the block submits nothing."""
    if _BATCH.get() is not None:
        raise UserInputError("gpuhpc.batch() blocks do not nest", field="batch")
    pending = BatchedCalls(parallelism)
    token = _BATCH.set(pending)
    try:
        yield pending
    finally:
        _BATCH.reset(token)
    pending.flush()

"""Script mode: a :class:`~gpuhpc.jobs.spec.JobSpec` (what ``gpuhpc submit`` builds) rendered
into a job template and sbatched through :class:`~gpuhpc.slurm.SlurmClient`.

:func:`submit_spec` runs the steps in order: the site's container policy, the jobs it waits
for, the code snapshot and remote defaults (:func:`prepare_remote`), S3 staging
(:func:`with_staging`), the fewest leaf switches (:func:`with_fewest_switches`), the profiler
wrapper (:func:`with_profile`), the fit on the partition, the ledger's hold, ``sbatch``.
"""
from __future__ import annotations

import os
import posixpath
from collections.abc import Callable
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.jobs.admission import check_after, with_reservation
from gpuhpc.jobs.handle import Job, slurm_client
from gpuhpc.jobs.spec import JobSpec, check_container_policy, check_fits_on


def submit_spec(spec: JobSpec, *, client=None, reserve: bool = True) -> Job:
    """Render ``spec`` and sbatch it (after the quota reservation). Returns a :class:`Job`.
    ``reserve=False``: the caller has already reserved it (a sweep holds all its chunks in one
    transaction, :mod:`gpuhpc.sweeps.submission`) and records the job id itself."""
    from gpuhpc.jobs.render import render

    check_container_policy(spec.resources)     # the site's registries and digest pins (exit 2)
    c = slurm_client(client)
    if spec.after or spec.after_any:
        check_after(c, spec.after, spec.after_any)      # a mistyped id would start at once (exit 1)
    runner = getattr(c, "runner", None)
    if runner is None:                      # a client without one runs here
        from gpuhpc.transport.local import LocalRunner

        runner = LocalRunner()
    spec, upload = prepare_remote(spec, runner)
    spec = with_staging(spec, runner)
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
    job_id = with_reservation(spec.resources, spec.name, c, lambda: c.submit_script(script),
                               spec.array_size) if reserve else c.submit_script(script)
    job = Job(job_id, client=c, name=spec.name,
              log_path=spec.output_path.replace("%%", "\0").replace("%j", job_id).replace("\0", "%"))
    job.snapshot = uploaded
    if spec.notify is not None and spec.notify.webhooks:      # sent by gpuhpc.jobs.notify, outside the job
        from gpuhpc.jobs.notify import register

        register(job_id, spec.name, spec.notify, runner)
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


def with_staging(spec: JobSpec, runner) -> JobSpec:
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


def prepare_remote(spec: JobSpec, runner) -> tuple[JobSpec, Callable[[], tuple[JobSpec, Any]] | None]:
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

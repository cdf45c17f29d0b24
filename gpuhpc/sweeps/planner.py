"""The submission planner: how many waiting trials may go out now and in which arrays.

- the limits come from the controller (``MaxArraySize``, ``MaxJobCount``) and the user's
  association/QOS (``MaxSubmitJobs``) through :meth:`SlurmClient.submit_limits`
  (:func:`submit_limits`, :func:`plan_submission`);
- trials go out in chunks of at most ``MaxArraySize`` tasks of one shape (:func:`shape_groups`),
  each ``--array=0-(k-1)%T`` with a parameter file: never ``--array=1000-1999``
  (:func:`trial_spec`, the chunk's job spec);
- parallelism P holds whatever the chunking: :func:`slots_in_use` is what the arrays may run now.
"""
from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.sweeps.spec import SweepSpec


def needs_driver(spec: SweepSpec) -> bool:
    """Does the sweep need its driver whatever fits at once: tpe asks for trials as others
    finish, a pruner and ``fail_fast`` decide from the trials' progress each round."""
    return spec.method == "tpe" or spec.pruner is not None or spec.fail_fast is not None


def trial_container(spec: SweepSpec, directory: Path, kind: str) -> list[str]:
    """pyxis' options for trials in the sweep's image (trial.py starts each in an srun step there;
    ``[]`` without an image), with the sweep directory mounted at its own path: the trials'
    checkpoints and metrics files, a Python sweep's function, marks and results. A Python sweep
    whose directory pyxis cannot mount is refused (exit 2); a command sweep's trials then go without."""
    import dataclasses

    from gpuhpc.containers.image import check_mount
    from gpuhpc.jobs.spec import container_srun_args

    if spec.res.image is None:
        return []
    try:
        mount: tuple[str, ...] = (check_mount(f"{directory}:{directory}", "sweep directory"),)
    except UserInputError:
        if kind == "python":
            raise UserInputError(f"the sweep directory {directory} cannot be mounted into the image (pyxis takes "
                                 "no commas, colons or blanks in a path)", field="GPUHPC_DATA_DIR",
                                 hint="a data directory without those") from None
        mount = ()
    return container_srun_args(dataclasses.replace(spec.res, mounts=(*spec.res.mounts, *mount)))


def submit_limits(client, spec: SweepSpec, fresh: bool = False):
    """The submission limits, asked once per client (the driver asks afresh each round)."""
    cached = None if fresh else getattr(client, "_gpuhpc_sweep_limits", None)
    if cached is None:
        r = spec.res
        cached = client.submit_limits(getpass.getuser(), r.account, r.qos)
        if cached.max_submit_jobs is None and r.qos:
            # slurmctld lists a QOS's per-user limit only once the user has a job in it (then
            # with the count); before, the count is 0 and the limit is in slurmdbd's record
            try:
                got = client.sacctmgr_list("qos", f"name={r.qos}", fields=("MaxSubmitJobsPerUser",))
            except GpuhpcError:
                got = []
            if got and got[0].get("MaxSubmitJobsPerUser", "").isdigit():
                import dataclasses

                cached = dataclasses.replace(cached, max_submit_jobs=int(got[0]["MaxSubmitJobsPerUser"]))
        try:
            client._gpuhpc_sweep_limits = cached
        except AttributeError:
            pass
    return cached


class Plan:
    """How many trials go out now and in chunks of what size."""

    def __init__(self, now: int, chunk: int, limits: Any) -> None:
        self.now, self.chunk, self.limits = now, chunk, limits


def concurrently(calls: dict[str, Any]) -> dict[str, Any]:
    """Run independent calls (Slurm queries: a process each) in threads; their results by
    name, the first exception re-raised."""
    import threading

    out: dict[str, Any] = {}
    errors: list[BaseException] = []

    def one(name: str, fn) -> None:
        try:
            out[name] = fn()
        except BaseException as exc:        # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=item) for item in list(calls.items())[1:]]
    for th in threads:
        th.start()
    first = next(iter(calls.items()), None)
    if first is not None:
        one(*first)
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return out


def needs_records(len_waiting: int, limits: Any) -> bool:
    return len_waiting > (100 if limits is None else min(100, limits.max_job_count // 20))


def plan_submission(spec: SweepSpec, client, *, len_waiting: int, queued_by_sweep: int = 0,
                    fresh: bool = False, records: int | None = None) -> Plan:
    """``now``: how many of ``len_waiting`` trials may be queued at once: the sweep's
    ``max_queued``, the user's MaxSubmitJobs less the jobs already queued, MaxJobCount less the
    jobs slurmctld holds; ``chunk``: at most MaxArraySize (and the sweep's ``chunk_size``)."""
    limits = submit_limits(client, spec, fresh)
    # between fresh answers (the driver asks at most once a minute) the user's count and the
    # record count move with the sweep's own queued trials
    cache = getattr(client, "_gpuhpc_sweep_counts", None)
    if fresh or cache is None:
        cache = {"queued": queued_by_sweep, "records": records}
        try:
            client._gpuhpc_sweep_counts = cache
        except AttributeError:
            pass
    delta = queued_by_sweep - cache["queued"]
    chunk = min(limits.max_array_size, spec.chunk_size or limits.max_array_size)
    room = len_waiting
    if spec.max_queued is not None:
        room = min(room, spec.max_queued - queued_by_sweep)
    if limits.max_submit_jobs is not None:
        room = min(room, limits.max_submit_jobs - (limits.submitted + delta) - 1)     # one left for the driver
    if needs_records(len_waiting, limits):
        # slurmctld refuses ("temporarily unable to accept job") an array whose tasks would
        # take it past MaxJobCount; finished and cancelled tasks count until MinJobAge
        if records is None and cache.get("records") is None:
            cache["records"], cache["queued"], delta = client.job_records(), queued_by_sweep, 0
        held = records if records is not None else cache["records"] + max(0, delta)
        room = min(room, limits.max_job_count - held - max(10, limits.max_job_count // 100))
    return Plan(max(0, room), max(1, chunk), limits)


def check_shapes(spec: SweepSpec, shapes: Sequence[tuple[dict[str, Any], str]], client, root: Path) -> None:
    """Each distinct per-trial (resources, template) (``resources_by``) fits the cluster's nodes
    (one ``scontrol show node``) and makes a valid chunk job; else exit 2, nothing written."""
    from gpuhpc.jobs.spec import Resources, check_fits

    distinct = {json.dumps(s, sort_keys=True): s for s in shapes}
    res = [(Resources.from_mapping(r), t) for r, t in distinct.values()]
    if any(r.gpus for r, _ in res):
        try:
            nodes = client.nodes()
        except GpuhpcError:
            nodes = None
        for r, _ in res:
            if nodes is not None and r.gpus:
                check_fits(r, nodes)
    for r, t in res:
        trial_spec(spec, 0, root / "0", 0, 1, 1, res=r, template=t)


def shape_groups(spec: SweepSpec, waiting: list, size: int) -> tuple[list[list], list]:
    """``waiting`` [(number, params json)] in groups of at most ``size`` trials of one shape
    (:meth:`SweepSpec.resources_for`, :meth:`SweepSpec.template_for`), and each group's
    (Resources, template) (None: the sweep's own)."""
    if not spec.resources_by:
        plain = [waiting[i:i + size] for i in range(0, len(waiting), size)]
        return plain, [None] * len(plain)
    from gpuhpc.jobs.spec import Resources

    by: dict[str, list] = {}
    for row in waiting:
        p = row[1] if isinstance(row[1], dict) else json.loads(row[1])
        by.setdefault(json.dumps([spec.resources_for(p), spec.template_for(p)], sort_keys=True), []).append(row)
    groups, shapes = [], []
    for key, rows in by.items():
        res, template = json.loads(key)
        for i in range(0, len(rows), size):
            groups.append(rows[i:i + size])
            shapes.append((Resources.from_mapping(res), template))
    return groups, shapes


def trial_spec(spec: SweepSpec, sid: int, directory: Path, number: int, k: int, throttle: int, res=None,
                template: str | None = None, dependency: str | None = None):
    """The JobSpec of one chunk: the ``single`` template (checkpoint → requeue → resume) around
    ``python -m gpuhpc.sweeps.trial DIR CHUNK`` as an array ``0-(k-1)%T`` (``T``: the sweep's
    free slots when it was submitted; raised later by :func:`balance`)."""
    import dataclasses

    from gpuhpc.jobs.spec import JobSpec

    env = dict(spec.env)
    env.update({"GPUHPC_SWEEP_ID": str(sid)})
    return JobSpec(
        command=(sys.executable, "-m", "gpuhpc.sweeps.trial", str(directory), str(number)),
        # the trial runner is gpuhpc's Python on the host; it runs the trial in the image (trial.py)
        resources=dataclasses.replace(res or spec.res, image=None, mounts=(), container_workdir=None,
                                      image_python=False),
        name=f"{spec.name}-s{sid}-c{number}", template=template or spec.template,
        env=env,
        workdir=spec.workdir or os.getcwd(), log_dir=str(directory / "logs"),
        checkpoint_dir=str(directory / "jobs" / "%j"), grace=spec.grace, max_requeues=spec.max_requeues,
        array=f"0-{k - 1}%{max(1, min(throttle, k))}", hold=spec.hold, dependency=dependency,
        setup=spec.setup, modules=spec.modules, conda=spec.conda, venv=spec.venv)


def slots_in_use(live: Sequence[tuple[int, str | None, int]], throttles: dict[int, int]) -> int:
    """How many trials the sweep's arrays may run now: each array's ``%N``, or fewer when it
    has fewer trials left (a chunk whose throttle is unknown counts all its trials)."""
    return sum(min(throttles.get(cid, left), left) for cid, _, left in live)

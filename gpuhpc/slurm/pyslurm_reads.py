"""The pyslurm transport: jobs, nodes, partitions and accounting read through Slurm's C API
in-process (pyslurm, built against the running Slurm), as the same records the text and JSON
parsers return. The only module that imports pyslurm; :class:`gpuhpc.slurm.client.SlurmClient`
calls it only after :func:`available_version` matched the running Slurm's major.minor.

pyslurm reads the process's ``SLURM_CONF`` when it is imported (one cluster per process)."""
from __future__ import annotations

import importlib.util
import re
import sys

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def available_version() -> tuple[int, int, int] | None:
    """pyslurm's version when it is installed and imports (its major.minor is the Slurm API it
    was built for), else None. Costs nothing when it is not installed."""
    if "pyslurm" not in sys.modules and importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        import pyslurm
    except Exception:                   # noqa: BLE001 - a libslurm it cannot load, no slurm.conf, ...
        return None
    m = _VERSION.search(str(getattr(pyslurm, "__version__", "") or pyslurm.version()))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def _pyslurm():
    import pyslurm

    return pyslurm


def _rpc(what: str, load):
    """Call a pyslurm loader; its errors become SlurmError (as a failed command's would)."""
    from gpuhpc.errors import SlurmError

    try:
        return load()
    except Exception as exc:            # noqa: BLE001 - pyslurm.RPCError and friends
        raise SlurmError(f"pyslurm {what} failed: {exc}") from exc


def _s(value) -> str:
    return "" if value is None else str(value)


def _gres_text(gres: dict | None) -> str:
    """pyslurm's {"gpu:h100": 2} (or {"gpu": {"h100": 2}}) back to ``gpu:h100:2`` for parse_gres."""
    parts = []
    for key, value in (gres or {}).items():
        if isinstance(value, dict):
            parts += [f"{key}:{t}:{n}" for t, n in value.items()]
        else:
            parts.append(f"{key}:{value}")
    return ",".join(parts)


def queue(*, user: str | None = None, job_ids=()) -> list:
    """``pyslurm.Jobs.load()`` -> QueueRow s as ``squeue --array`` rows (see parse_squeue_json)."""
    from gpuhpc.slurm.parsers import queue_rows, squeue_clock
    from gpuhpc.slurm.state import SlurmState

    pyslurm = _pyslurm()
    wanted = {str(j) for j in job_ids}
    rows = []
    for job in _rpc("Jobs.load", lambda: pyslurm.Jobs.load()).values():
        raw = str(job.id)
        array_id, task, waiting = job.array_id, job.array_task_id, job.array_tasks_waiting
        common = dict(
            name=_s(job.name), state=SlurmState.parse(_s(job.state)), elapsed=squeue_clock(job.run_time or 0),
            time_limit=_minutes(job.time_limit), nodes=int(job.num_nodes or 0),
            tres_per_node=_per_node(job.gres_per_node), partition=_s(job.partition), user=_s(job.user_name),
            account=_s(job.account), nodelist=_s(job.allocated_nodes), reason=_s(job.state_reason) or "None",
            qos=_s(job.qos),
        )
        rows += queue_rows(raw, array_id, task, waiting, common, user=user, wanted=wanted)
    return rows


def _minutes(value) -> str:
    """A time limit in minutes (None or "UNLIMITED": none) as squeue's %l prints it."""
    from gpuhpc.slurm.parsers import squeue_clock

    if value is None or isinstance(value, str):
        return "UNLIMITED"
    return squeue_clock(int(value) * 60)


def _per_node(gres: dict | None) -> str:
    """pyslurm's {"gres/gpu:h100": 1} per node as squeue's %b prints it (``gres/gpu:h100:1``; N/A)."""
    parts = [f"{k if k.startswith('gres/') else 'gres/' + k}:{v}" for k, v in (gres or {}).items()]
    return ",".join(parts) or "N/A"


def nodes() -> list:
    """``pyslurm.Nodes.load()`` -> NodeInfo s as ``scontrol show node`` gives them."""
    from gpuhpc.slurm.parsers import NodeInfo, gpus_from_tres, parse_gres

    pyslurm = _pyslurm()
    out = []
    for node in _rpc("Nodes.load", lambda: pyslurm.Nodes.load()).values():
        alloc = {k: str(v) for k, v in (node.allocated_tres or {}).items()}
        out.append(NodeInfo(
            name=node.name, state=_s(node.state) or "UNKNOWN", cpus=int(node.total_cpus or 0),
            cpus_alloc=int(node.allocated_cpus or 0), real_memory_mb=int(node.real_memory or 0),
            alloc_memory_mb=int(node.allocated_memory or 0), partitions=tuple(node.partitions or ()),
            gpus_total=parse_gres(_gres_text(node.configured_gres)), gpus_alloc=gpus_from_tres(alloc),
            features=tuple(node.available_features or ()), reason=_s(node.reason),
        ))
    return out


def partitions() -> list:
    """``pyslurm.Partitions.load()`` -> PartitionInfo s as ``scontrol show partition`` gives them."""
    from gpuhpc.slurm.durations import format_duration
    from gpuhpc.slurm.parsers import PartitionInfo

    pyslurm = _pyslurm()
    out = []
    for p in _rpc("Partitions.load", lambda: pyslurm.Partitions.load()).values():
        max_time = p.max_time
        out.append(PartitionInfo(
            name=p.name, state=_s(p.state), nodes=_s(p.nodes), total_nodes=int(p.total_nodes or 0),
            total_cpus=int(p.total_cpus or 0), priority_tier=int(p.priority_tier or 0),
            preempt_mode=_s(p.preempt_mode), default=bool(p.is_default),
            max_time="UNLIMITED" if max_time in (None, "UNLIMITED") else format_duration(int(max_time) * 60),
            grace_time=int(p.preemption_grace_time or 0), qos=_s(p.qos) or "N/A",
            allow_accounts=",".join(p.allowed_accounts or ["ALL"]),
        ))
    return out


_NO_VAL = 0xFFFFFFFE


def _db_tres(tres) -> dict[str, str]:
    """pyslurm.db TrackableResources -> sacct's AllocTRES dict ({"cpu": "1", "gres/gpu:h100": "1"})."""
    from gpuhpc.slurm.parsers import tres_mem

    out: dict[str, str] = {}
    if not tres:
        return out
    for key, res in tres.to_dict(flatten_limits=True).items():
        count = getattr(res, "count", None)
        if not isinstance(count, int) or count <= 0:
            continue
        out[key] = tres_mem(count) if key == "mem" else str(count)
    return out


def _local(epoch) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S") if epoch else "Unknown"


def accounting(*, job_ids=(), user: str | None = None, all_users: bool = False, since: str | None = None,
               until: str | None = None) -> list:
    """``pyslurm.db.Jobs.load(JobFilter)`` -> AcctRow s, one per job (allocation), as ``sacct -X``
    selects and prints them (without ``--duplicates``: pyslurm has no such filter; the client
    reads those through the JSON or text transport)."""
    import datetime as dt
    import getpass

    from gpuhpc.slurm.durations import format_duration
    from gpuhpc.slurm.parsers import AcctRow
    from gpuhpc.slurm.state import SlurmState

    pyslurm = _pyslurm()
    import pyslurm.db  # noqa: F401 - the accounting half

    ids = [int(j.split("_")[0].split(".")[0]) for j in job_ids if j.split("_")[0].split(".")[0].isdigit()]
    kwargs: dict = {}
    if ids:
        kwargs["ids"] = ids
    if not all_users:
        kwargs["users"] = [user or getpass.getuser()]
    if since:
        kwargs["start_time"] = dt.datetime.fromisoformat(since)
    elif not ids:                       # sacct's default window: since midnight
        kwargs["start_time"] = dt.datetime.combine(dt.date.today(), dt.time())
    if until:
        kwargs["end_time"] = dt.datetime.fromisoformat(until)
    jobs = _rpc("db.Jobs.load", lambda: pyslurm.db.Jobs.load(pyslurm.db.JobFilter(**kwargs)))
    rows = []
    for job in jobs.values():
        raw = str(job.id)
        if job.array_id and job.array_task_id is not None:
            job_id = f"{job.array_id}_{job.array_task_id}"
        elif job.array_id and job.array_tasks_waiting:
            job_id = f"{job.array_id}_[{job.array_tasks_waiting}]"
        elif job.heterogeneous_id and job.heterogeneous_offset not in (None, _NO_VAL):
            job_id = f"{job.heterogeneous_id}+{job.heterogeneous_offset}"
        else:
            job_id = raw
        if job_ids and not {job_id, raw, str(job.array_id or "")} & {str(j) for j in job_ids}:
            continue
        limit = job.time_limit
        rows.append(AcctRow(
            job_id=job_id, job_id_raw=raw, name=_s(job.name), state=SlurmState.parse(_s(job.state)),
            elapsed_s=int(job.elapsed_time or 0), submit=_local(job.submit_time), start=_local(job.start_time),
            end=_local(job.end_time), alloc_tres=_db_tres(job.allocated_tres), req_tres=_db_tres(job.requested_tres),
            partition=_s(job.partition), account=_s(job.account), user=_s(job.user_name), nodelist=_s(job.nodelist),
            exit_code=f"{job.exit_code or 0}:{job.exit_code_signal or 0}", restarts=int(job.requeue_count or 0),
            time_limit="UNLIMITED" if limit is None or isinstance(limit, str) else format_duration(int(limit) * 60),
            qos=_s(job.qos), cluster=_s(job.cluster),
        ))
    return rows

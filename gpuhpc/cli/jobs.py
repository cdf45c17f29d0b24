"""``gpuhpc jobs``, ``status``, ``logs``, ``cancel``: follow and manage your jobs.

These run often and from scripts, so they start fast: plain click commands, no rich.
"""
from __future__ import annotations

import functools
import re
import sys
from typing import Any

import click

from gpuhpc.cli.main import help_for


def _gpus_per_node(tres_per_node: str) -> int:
    """squeue's %b: ``gres:gpu:h100:8``, ``gres/gpu:h100=8``, ``gpu:2``, ``N/A``."""
    total = 0
    for item in (tres_per_node or "").split(","):
        item = item.strip()
        m = re.match(r"^(?:gres[:/])?gpu(?::[^:=]+)?[:=](\d+)$", item)
        if m:
            total += int(m.group(1))
    return total


def _elapsed_s(text: str) -> int:
    from gpuhpc.errors import UserInputError
    from gpuhpc.slurm.durations import reported_seconds

    try:
        return reported_seconds(text) or 0
    except UserInputError:
        return 0


def job_rows(user: str | None = None) -> list[dict[str, Any]]:
    """The user's jobs from squeue (pending, running, and recently finished)."""
    import getpass

    from gpuhpc.slurm.client import SlurmClient

    rows = []
    client = SlurmClient()
    # over SSH "my jobs" are the remote login's (GPUHPC_SSH_HOST=user@host), not the laptop user's
    me = getattr(client.runner, "user", None) or getpass.getuser()
    queue = client.queue(user=user or me)
    # a user's jobs repeat the same few GPU requests and, once ended, elapsed times
    per_node = functools.cache(_gpus_per_node)
    elapsed = functools.cache(_elapsed_s)
    for r in sorted(queue, key=lambda q: (int(q.job_id_raw) if q.job_id_raw.isdigit() else 0, q.job_id)):
        gpus = per_node(r.tres_per_node) * max(1, r.nodes)
        el = elapsed(r.elapsed)
        rows.append({
            "job_id": r.job_id, "name": r.name, "state": r.state.state.value, "raw_state": r.state.raw,
            "partition": r.partition, "account": r.account, "nodes": r.nodes, "gpus": gpus,
            "elapsed": r.elapsed, "elapsed_s": el, "time_limit": r.time_limit,
            "gpu_hours": round(gpus * el / 3600.0, 3), "reason": r.reason, "nodelist": r.nodelist,
        })
        if r.reason and "Minutes" in r.reason:       # a budget may hold it: say so in words
            from gpuhpc.ledger import budget

            text = budget.explain_reason(r.reason, account=r.account, user=me, partition=r.partition,
                                         tres_per_node=r.tres_per_node, nodes=r.nodes,
                                         time_limit_s=_elapsed_s(r.time_limit) or None)
            if text:
                rows[-1]["budget"] = text
                rows[-1]["reason"] = f"{r.reason}: {text}"
    return rows


_json = click.option("--json", "json_out", is_flag=True, help="JSON on stdout")


@click.command("jobs", help=help_for("jobs"))
@_json
@click.option("--user", "-u", help="whose jobs (default: you)")
def jobs(json_out: bool, user: str | None) -> int:
    rows = job_rows(user)
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json(rows)
        return 0
    sys.stdout.write(_table(rows))
    return 0


_COLUMNS = (("JOBID", "job_id"), ("NAME", "name"), ("STATE", "raw_state"), ("PARTITION", "partition"),
            ("NODES", "nodes"), ("GPUS", "gpus"), ("ELAPSED", "elapsed"), ("GPU-H", "gpu_hours"),
            ("REASON", "reason"))
_RIGHT = {"NODES", "GPUS", "GPU-H"}


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _printable(value: Any) -> str:
    """One line with no control characters, whatever a job name (anyone's) holds: no newline
    breaks a row, no escape sequence reaches the terminal."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return _CONTROL.sub("?", " ".join(text.split()))


def _table(rows: list[dict[str, Any]]) -> str:
    """Plain aligned columns, like squeue's (rich would cost more start-up than the command)."""
    cols = []
    for head, key in _COLUMNS:
        if key == "gpu_hours":
            cells = [f"{r[key]:.2f}" for r in rows]
        elif key == "reason":
            cells = ["" if r[key] == "None" else _printable(r[key]) for r in rows]
        else:
            cells = [_printable(r[key]) for r in rows]
        width = max(map(len, cells), default=0)
        width = max(width, len(head))
        just = str.rjust if head in _RIGHT else str.ljust
        cols.append([just(c, width) for c in [head, *cells]])
    return "".join("  ".join(line).rstrip() + "\n" for line in zip(*cols))


@click.command("status", help=help_for("status"))
@click.argument("job_id", metavar="JOB_ID")
@_json
def status(job_id: str, json_out: bool) -> int:
    from gpuhpc.jobs.handle import Job

    info = Job(job_id).status()
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json(info)
        return 0
    width = max(len(k) for k in info)
    for k, v in info.items():
        if v not in (None, "", {}):
            sys.stdout.write(f"{k:<{width}}  {_printable(v)}\n")
    return 0


@click.command("logs", help=help_for("logs"))
@click.argument("job_id", metavar="JOB_ID")
@click.option("--follow", "-f", is_flag=True, help="keep printing until the job ends, through its requeues")
@click.option("--rank", metavar="N", help="only rank N's output (a multi-rank job's task N; gpuhpc's own lines kept)")
@click.option("--json", "json_out", is_flag=True, help="JSON {job_id, path, text} (with --rank: and rank)")
def logs(job_id: str, follow: bool, rank: str | None, json_out: bool) -> int:
    from gpuhpc.errors import GpuhpcError
    from gpuhpc.jobs.handle import Job

    job = Job(job_id)
    if rank is not None:
        return _rank_logs(job, rank, follow, json_out)
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json({"job_id": job.job_id, "path": job.log_path(), "text": job.logs()})
        return 0
    if not follow:
        if not job.log_path():
            raise GpuhpcError(f"no log file found for job {job.job_id}")
        sys.stdout.write(job.logs())
        return 0
    out = sys.stdout.buffer
    for chunk in job.follow_log():
        out.write(chunk)
        out.flush()
    return 0


def _rank_logs(job, rank: str, follow: bool, json_out: bool) -> int:
    """``gpuhpc logs JOB --rank N`` (gpuhpc.jobs.logs: the rank is checked before anything is read)."""
    from gpuhpc.errors import GpuhpcError
    from gpuhpc.jobs.logs import RankLog, check_rank

    check_rank(rank)                    # not a number, negative: before asking Slurm
    log = RankLog(job, rank)
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json({"job_id": job.job_id, "rank": log.rank, "path": log.file,
                    "text": log.text().decode("utf-8", errors="replace")})
        return 0
    if not follow:
        if not log.file:
            raise GpuhpcError(f"no log file found for job {job.job_id}")
        sys.stdout.buffer.write(log.text())
        return 0
    out = sys.stdout.buffer
    for chunk in log.follow():
        out.write(chunk)
        out.flush()
    return 0


def not_cancellable(client, job_ids: list[str]) -> dict[str, str]:
    """Why each of ``job_ids`` cannot be cancelled (``scancel`` of an unknown or ended job
    prints nothing and exits 0): "no such job" or "already ended (STATE)". One squeue call;
    sacct only for the ids squeue does not know."""
    live: dict[str, list] = {}
    for r in client.queue(job_ids=job_ids):
        for key in {r.job_id, r.job_id_raw, r.array_job_id}:
            live.setdefault(key, []).append(r)
    why = {j: f"already ended ({live[j][0].state.raw})" for j in job_ids
           if j in live and all(r.state.is_finished for r in live[j])}
    gone = [j for j in job_ids if j not in live]
    if gone:
        ended = {}
        for a in client.accounting(job_ids=gone):
            ended.setdefault(a.job_id, a.state.raw)
            ended.setdefault(a.array_job_id, a.state.raw)
        why.update({j: f"already ended ({ended[j]})" if j in ended else "no such job" for j in gone})
    return why


@click.command("cancel", help=help_for("cancel"))
@click.argument("job_ids", metavar="JOB_ID...", nargs=-1, required=True)
@_json
def cancel(job_ids: tuple[str, ...], json_out: bool) -> int:
    from gpuhpc.jobs.handle import Job
    from gpuhpc.slurm.client import SlurmClient

    client = SlurmClient()
    jobs = [Job(j, client=client) for j in job_ids]      # validates every id before cancelling any
    why = not_cancellable(client, [j.job_id for j in jobs])
    for job in jobs:
        if job.job_id not in why:
            job.cancel()
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json([{"job_id": j.job_id, "cancelled": j.job_id not in why,
                     **({"error": why[j.job_id]} if j.job_id in why else {})} for j in jobs])
    else:
        for j in jobs:
            if j.job_id in why:
                sys.stderr.write(f"error: job {j.job_id}: {why[j.job_id]}\n")
            else:
                sys.stdout.write(f"cancelled {j.job_id}\n")
    return 1 if why else 0


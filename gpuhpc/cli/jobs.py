"""``gpuhpc jobs``, ``status``, ``logs``, ``cancel``: follow and manage your jobs."""
from __future__ import annotations

import re
import sys
import time
from typing import Any

import typer


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
    for r in sorted(queue, key=lambda q: (int(q.job_id_raw) if q.job_id_raw.isdigit() else 0, q.job_id)):
        gpus = _gpus_per_node(r.tres_per_node) * max(1, r.nodes)
        el = _elapsed_s(r.elapsed)
        rows.append({
            "job_id": r.job_id, "name": r.name, "state": r.state.state.value, "raw_state": r.state.raw,
            "partition": r.partition, "account": r.account, "nodes": r.nodes, "gpus": gpus,
            "elapsed": r.elapsed, "elapsed_s": el, "time_limit": r.time_limit,
            "gpu_hours": round(gpus * el / 3600.0, 3), "reason": r.reason, "nodelist": r.nodelist,
        })
    return rows


def register(app: typer.Typer) -> None:
    @app.command("jobs")
    def jobs_cmd(
        json_out: bool = typer.Option(False, "--json", help="JSON on stdout"),
        user: str = typer.Option(None, "--user", "-u", help="whose jobs (default: you)"),
    ) -> None:
        """Your jobs: state, elapsed time and GPU-hours so far."""
        rows = job_rows(user)
        if json_out:
            from gpuhpc.cli._console import print_json

            print_json(rows)
            return
        from rich.table import Table

        from gpuhpc.cli._console import console

        t = Table(box=None, header_style="bold")
        for col in ("JOBID", "NAME", "STATE", "PARTITION", "NODES", "GPUS", "ELAPSED", "GPU-H", "REASON"):
            t.add_column(col, justify="right" if col in ("NODES", "GPUS", "GPU-H") else "left")
        for r in rows:
            t.add_row(r["job_id"], r["name"], r["raw_state"], r["partition"], str(r["nodes"]), str(r["gpus"]),
                      r["elapsed"], f"{r['gpu_hours']:.2f}", r["reason"] if r["reason"] != "None" else "",
                      )
        console().print(t)

    @app.command("status")
    def status_cmd(
        job_id: str = typer.Argument(..., help="job id"),
        json_out: bool = typer.Option(False, "--json", help="JSON on stdout"),
    ) -> None:
        """One job's state (raw Slurm state kept), restarts, resources and log file."""
        from gpuhpc.jobs.api import Job

        job = Job(job_id)
        info = job.info()
        info["restarts"] = job.restarts() if info.get("source") != "none" else 0
        info["finished"] = job.done() if info.get("source") != "none" else False
        info["log"] = job.log_path()
        if info.get("source") == "none":
            from gpuhpc.errors import GpuhpcError

            raise GpuhpcError(f"job {job.job_id} not found in squeue or sacct")
        if json_out:
            from gpuhpc.cli._console import print_json

            print_json(info)
            return
        width = max(len(k) for k in info)
        for k, v in info.items():
            if v not in (None, "", {}):
                sys.stdout.write(f"{k:<{width}}  {v}\n")

    @app.command("logs")
    def logs_cmd(
        job_id: str = typer.Argument(..., help="job id"),
        follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the job ends"),
        json_out: bool = typer.Option(False, "--json", help="JSON {job_id, path, text}"),
    ) -> None:
        """Print a job's output (the --output file, found via scontrol or the log dir)."""
        from gpuhpc.errors import GpuhpcError
        from gpuhpc.jobs.api import Job

        job = Job(job_id)
        path = job.log_path()
        if json_out:
            from gpuhpc.cli._console import print_json

            print_json({"job_id": job.job_id, "path": path, "text": job.logs()})
            return
        if not follow:
            if not path:
                raise GpuhpcError(f"no log file found for job {job.job_id}")
            sys.stdout.write(job.logs())
            return
        pos = 0
        last_check = 0.0
        while True:
            path = path or job.log_path()
            if path:
                text = job.read_text(path)
                chunk, pos = text[pos:], len(text)
                if chunk:
                    sys.stdout.write(chunk)
                    sys.stdout.flush()
            now = time.monotonic()
            if now - last_check > 3:
                last_check = now
                if job.done():
                    break
            time.sleep(0.5)

    @app.command("cancel")
    def cancel_cmd(
        job_ids: list[str] = typer.Argument(..., help="job id(s)"),
        json_out: bool = typer.Option(False, "--json", help="JSON on stdout"),
    ) -> None:
        """Cancel job(s) (scancel)."""
        from gpuhpc.jobs.api import Job

        jobs = [Job(j) for j in job_ids]      # validates every id before cancelling any
        for job in jobs:
            job.cancel()
        if json_out:
            from gpuhpc.cli._console import print_json

            print_json([{"job_id": j.job_id, "cancelled": True} for j in jobs])
        else:
            for j in jobs:
                sys.stdout.write(f"cancelled {j.job_id}\n")

"""``gpuhpc profile JOBID``: a profiled job's traces (one per rank and restart) and the command
that opens each. With ``--cluster NAME`` (a laptop) it lists them on the cluster, where they are
(:class:`gpuhpc.cli._oncluster.OnClusterCommand`)."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli._oncluster import OnClusterCommand
from gpuhpc.cli.main import help_for


def trace_dir(job_id: str, client=None) -> str:
    """``<log dir>/profile`` of the job: the directory of its StdOut (scontrol while slurmctld
    knows it), else this user's default log dir."""
    import os

    from gpuhpc.jobs.profile import profile_dir

    try:
        from gpuhpc.slurm.client import SlurmClient

        rec = (client or SlurmClient()).show_job(job_id) or {}
    except Exception:           # Slurm cannot say: the default log dir
        rec = {}
    out = rec.get("StdOut", "")
    if out.startswith("/"):
        return profile_dir(os.path.dirname(out))
    from gpuhpc.jobs.spec import default_log_dir

    return profile_dir(default_log_dir())


@click.command("profile", cls=OnClusterCommand, help=help_for("profile"))
@click.argument("job_id", metavar="JOBID")
@click.option("--dir", "directory", metavar="DIR", help="Where the traces are (default: <the job's log dir>/profile).")
@click.option("--json", "as_json", is_flag=True, help="The traces and their open commands as JSON.")
def profile(job_id: str, directory: str | None, as_json: bool) -> int:
    from gpuhpc.errors import GpuhpcError, UserInputError
    from gpuhpc.jobs.profile import open_command, traces

    if not job_id.replace("_", "").isdigit():
        raise UserInputError(f"not a job id: {job_id!r}", field="JOBID")
    d = directory or trace_dir(job_id)
    found = traces(d, job_id)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"job_id": job_id, "directory": d,
                    "traces": [{"path": str(p), "open": open_command(p)} for p in found]})
        return 0 if found else 1
    if not found:
        raise GpuhpcError(f"no traces of job {job_id} in {d} (submitted with --profile nsys|torch?)")
    for p in found:
        sys.stdout.write(f"{p}\n    {open_command(p)}\n")
    return 0

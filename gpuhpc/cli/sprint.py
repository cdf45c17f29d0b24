"""``gpuhpc sprint FILE``: run a profiling sprint (a grid sweep) and print its table. With
``--cluster NAME`` (a laptop) it runs on the cluster (:class:`gpuhpc.cli._oncluster.OnClusterCommand`),
from the code snapshot, FILE validated here first."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli._oncluster import OnClusterCommand
from gpuhpc.cli.main import help_for


@click.command("sprint", cls=OnClusterCommand, help=help_for("sprint"))
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="The table, recommendation and bottlenecks as JSON.")
@click.option("--html", "html_path", metavar="FILE", help="Also write the HTML report (table and charts) here.")
@click.option("--timeout", type=float, default=3600, show_default=True, help="Seconds to wait for the trials.")
@click.option("--no-utilisation", is_flag=True, help="Skip the per-trial efficiency reports (sacct/Prometheus).")
def sprint(file: str, as_json: bool, html_path: str | None, timeout: float, no_utilisation: bool) -> int:
    from gpuhpc.sprints.report import render_html, text_table
    from gpuhpc.sprints.run import sprint as run_sprint
    from gpuhpc.sprints.spec import load_file

    spec = load_file(file)                  # exit 2 before anything is submitted
    try:
        res = run_sprint(spec, timeout=timeout, utilisation=not no_utilisation)
    except TimeoutError as exc:
        from gpuhpc.errors import GpuhpcError

        raise GpuhpcError(str(exc)) from None
    if html_path:
        from gpuhpc.fsutil import write_atomic

        write_atomic(html_path, render_html(res), 0o644)
    for note in res.notes:
        sys.stderr.write(f"note: {note}\n")
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(res.to_dict())
    else:
        sys.stdout.write(text_table(res))
    return 0 if res.best else 1

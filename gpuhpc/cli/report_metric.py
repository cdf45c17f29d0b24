"""``gpuhpc report-metric NAME VALUE [--step N]``: :func:`gpuhpc.report` for shell jobs and
sweep trials (plain click, no rich: a trial may call it every step)."""
from __future__ import annotations

import click

from gpuhpc.cli.main import help_for


@click.command("report-metric", short_help=help_for("report-metric"),
               help="Record a metric of the running job (a sweep trial's objective, throughput): one line "
                    "appended to the trial's metrics file / the job's metrics file. NAME: an identifier "
                    "(e.g. loss); VALUE: a finite number.")
@click.argument("name", metavar="NAME")
@click.argument("value", metavar="VALUE")
@click.option("--step", type=int, metavar="N", help="training step (>= 0)")
def report_metric(name: str, value: str, step: int | None) -> int:
    import math

    from gpuhpc.errors import UserInputError

    if not name.isidentifier():
        raise UserInputError(f"{name!r} is not an identifier", field="NAME")
    try:
        number = float(value)
    except ValueError:
        raise UserInputError(f"{value!r} is not a number", field="VALUE") from None
    if not math.isfinite(number):
        raise UserInputError("not a finite number", field="VALUE")
    if step is not None and step < 0:
        raise UserInputError("must be >= 0", field="--step")
    from gpuhpc.ledger.metrics import report

    report(step=step, **{name: number})
    return 0

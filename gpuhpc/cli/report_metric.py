"""``gpuhpc report-metric NAME VALUE [--step N]``: :func:`gpuhpc.report` for shell jobs and
sweep trials (argparse, no typer: a trial may call it every step)."""
from __future__ import annotations


def _run(argv: list[str]) -> int:
    import math

    from gpuhpc.cli._args import ArgParser, parse
    from gpuhpc.errors import UserInputError

    p = ArgParser("gpuhpc report-metric",
                  description="Record a metric of the running job (a sweep trial's objective, throughput): "
                              "one line appended to the trial's metrics file / the job's metrics file.")
    p.add_argument("name", metavar="NAME", help="metric name (an identifier, e.g. loss)")
    p.add_argument("value", metavar="VALUE", help="a finite number")
    p.add_argument("--step", type=int, metavar="N", help="training step (>= 0)")
    ns = parse(p, argv)
    if isinstance(ns, int):
        return ns
    if not ns.name.isidentifier():
        raise UserInputError(f"{ns.name!r} is not an identifier", field="NAME")
    try:
        value = float(ns.value)
    except ValueError:
        raise UserInputError(f"{ns.value!r} is not a number", field="VALUE") from None
    if not math.isfinite(value):
        raise UserInputError("not a finite number", field="VALUE")
    if ns.step is not None and ns.step < 0:
        raise UserInputError("must be >= 0", field="--step")
    from gpuhpc.ledger.metrics import report

    report(step=ns.step, **{ns.name: value})
    return 0


def main(argv: list[str], debug: bool = False) -> int:
    """``gpuhpc report-metric ...`` (``argv[0]`` is the command)."""
    from gpuhpc.cli import run_guarded

    return run_guarded(lambda: _run(argv[1:]), lambda: debug)

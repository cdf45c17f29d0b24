"""The typer CLI: the only package that imports typer and rich."""


def entry() -> int:
    """Console-script entry point. ``gpuhpc submit`` takes a fast path that imports neither
    typer nor rich (its start-up time is benchmarked against raw sbatch); everything else
    goes through the typer app in :mod:`gpuhpc.cli.main`."""
    import sys

    if sys.argv[1:2] == ["submit"] and "--debug" not in sys.argv[2:3]:
        from gpuhpc.cli.submit import fast_main

        return fast_main(sys.argv[2:])
    from gpuhpc.cli.main import main

    return main()

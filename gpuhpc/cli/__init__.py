"""The typer CLI: the only package that imports typer and rich."""


def run_guarded(call, debug=lambda: False) -> int:
    """Run ``call()`` and map gpuhpc's errors to exit codes: a ``GpuhpcError`` prints one line
    (``error: ...``) and returns its code (2 = bad input), Ctrl-C returns 130. With
    ``--debug``/``GPUHPC_DEBUG`` the exception propagates with its traceback. Typer-free, so
    the ``submit`` fast path shares it."""
    import os
    import sys

    from gpuhpc.errors import GpuhpcError

    try:
        return call() or 0
    except GpuhpcError as exc:
        if debug() or os.environ.get("GPUHPC_DEBUG"):
            raise
        sys.stderr.write(f"error: {exc.one_line()}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130


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

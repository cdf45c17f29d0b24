"""The click CLI (:mod:`gpuhpc.cli.main`): the only package that imports click and rich."""


def run_guarded(call, debug=lambda: False) -> int:
    """Run ``call()`` and map gpuhpc's errors to exit codes: a ``GpuhpcError`` prints one line
    (``error: ...``) and returns its code (2 = bad input), Ctrl-C returns 130, any other
    exception prints one line and returns 1. With ``--debug``/``GPUHPC_DEBUG`` the exception
    propagates with its traceback. Every command runs under it (:func:`gpuhpc.cli.main.main`)."""
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
    except Exception as exc:        # a bug: one line, the traceback only on request
        if debug() or os.environ.get("GPUHPC_DEBUG"):
            raise
        sys.stderr.write(f"error: unexpected {type(exc).__name__}: {exc} (run with --debug for a traceback)\n")
        return 1


def columns() -> int:
    """The terminal's width as shutil.get_terminal_size() finds it (``COLUMNS`` first), without
    importing shutil."""
    import os
    import sys

    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


def entry() -> int:
    """Console-script entry point (:func:`gpuhpc.cli.main.main`): it imports only the module
    of the command that runs."""
    from gpuhpc.cli.main import main

    return main()

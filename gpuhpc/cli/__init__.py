"""The click CLI (:mod:`gpuhpc.cli.main`): the only package that imports click and rich."""


def entry() -> int:
    """Console-script entry point (:func:`gpuhpc.cli.main.main`): it imports only the module
    of the command that runs."""
    from gpuhpc.cli.main import main

    return main()

from pathlib import Path

import pytest

from gpuhpc.cli.main import main


@pytest.fixture(scope="session")
def ndr_path(shared_fixtures) -> Path:
    return shared_fixtures / "ibnetdiscover" / "ndr-dgx-multirail.out"


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (rc, stdout, stderr)."""
    def run(*argv: str):
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run
